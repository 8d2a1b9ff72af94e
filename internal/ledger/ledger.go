// Package ledger checks shardd's guarantees against an execution ledger: a
// file that the jobs under test append to themselves, one line per event.
//
//	start <job> <item> <fire> <attempt> <fence> <instance> <source> <unix-nanos> [<skipped>]
//	end   <job> <item> <fire> <attempt> <fence> <instance> <source> <unix-nanos> [<skipped>]
//	overlap <job> <item> <fire> <attempt> <fence> <instance> <source> <unix-nanos> [<skipped>]
//
// "overlap" is written by a job that found its item's lock file held by
// another run (flock -n): a direct observation of two concurrent runs.
// skipped is $SHARDD_SKIPPED: the fires before this one that the run
// stands for (coalesced by the misfire policy).
//
// G3 is checked per (job, item, due fire): a fire is accounted for only by a
// run of that very fire (NORMAL, MISFIRE or FAILOVER) or by a run of a later
// fire that says it coalesced it (skipped), started within the bound of the
// fire's due time. A run of a later fire that does not count it does not
// stand in for it: for an hourly job the next fire is an hour away. A run
// cut by a failure (a start with no end) of a job with failover on must be
// re-run, attempt+1, within the bound of the failure.
package ledger

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Event is one ledger line.
type Event struct {
	Kind     string // start, end or overlap
	Job      string
	Item     int
	Fire     time.Time
	Attempt  int
	Fence    int64
	Instance string
	Source   string
	At       time.Time
	// Skipped counts the fires before Fire the run stands for.
	Skipped int
}

// Parse reads a ledger; a torn or malformed line is an error naming its number.
func Parse(r io.Reader) ([]Event, error) {
	var out []Event
	s := bufio.NewScanner(r)
	for n := 1; s.Scan(); n++ {
		f := strings.Fields(s.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) != 9 && len(f) != 10 {
			return nil, fmt.Errorf("ledger line %d: %d fields, want 9 or 10: %q", n, len(f), s.Text())
		}
		skipped := 0
		if len(f) == 10 {
			var err error
			if skipped, err = strconv.Atoi(f[9]); err != nil {
				return nil, fmt.Errorf("ledger line %d: skipped: %v", n, err)
			}
		}
		item, err1 := strconv.Atoi(f[2])
		fire, err2 := time.Parse(time.RFC3339, f[3])
		attempt, err3 := strconv.Atoi(f[4])
		fence, err4 := strconv.ParseInt(f[5], 10, 64)
		at, err5 := strconv.ParseInt(f[8], 10, 64)
		for _, err := range []error{err1, err2, err3, err4, err5} {
			if err != nil {
				return nil, fmt.Errorf("ledger line %d: %v", n, err)
			}
		}
		out = append(out, Event{Kind: f[0], Job: f[1], Item: item, Fire: fire, Attempt: attempt, Fence: fence, Instance: f[6], Source: f[7], At: time.Unix(0, at), Skipped: skipped})
	}
	return out, s.Err()
}

// Options say what the checker expects.
type Options struct {
	// Jobs are the jobs checked for misses, by name.
	Jobs map[string]Job
	// Bound is G3's bound: a due fire must start within Bound of its due
	// time, and a cut run be re-run within Bound of its failure.
	Bound time.Duration
	// From and To delimit the window checked for misses.
	From, To time.Time
	// Faults lists windows in which G3's bound does not apply as is (etcd
	// without a leader, two failures in a row): a fire due inside one must
	// still start, but by the window's end if that is later than due+Bound.
	Faults []Window
	// Failures are the faults injected: a run cut short is judged against
	// the first failure of its instance after it started (or, with none,
	// the first failure of every instance).
	Failures []Failure
	// Records are shardd's explicit records of fires not run by policy
	// (misfire skips, cut runs of failover: false jobs), from its logs.
	Records []Record
}

// WhyKilled marks a Record of a run killed by a failure (a fence, the end
// of a shutdown grace): for a job with failover off, its explicit record.
const WhyKilled = "killed"

// Record says that Count fires of an item, the last at Through, were
// recorded as not run by an explicit policy, at At.
type Record struct {
	Job     string
	Item    int
	Through time.Time
	Count   int
	At      time.Time
	Why     string
}

// Failure is one injected fault: when it began and the instance it hit
// ("" for all of them, such as an etcd member's crash). A graceful stop
// cuts, at the end of its grace (At), only the runs that had started
// before the stop began (StartedBefore; zero: any run).
type Failure struct {
	At            time.Time
	Instance      string
	StartedBefore time.Time
}

// Job is what the checker needs of a job.
type Job struct {
	Items int
	// Schedule gives the job's due fires.
	Schedule interface{ Next(time.Time) time.Time }
	// Failover: runs cut by a failure must be re-run.
	Failover bool
}

// Window is a span of time.
type Window struct{ From, To time.Time }

// Report counts what was checked and every violation found.
type Report struct {
	Starts, Ends, Items, FiresChecked int
	// FiresInFaults counts the checked fires due inside fault windows;
	// FiresUnjudged the fires whose deadline is past the ledger's end.
	FiresInFaults, FiresUnjudged int
	Failovers, Misfires          int
	// FiresRun counts the checked fires that started a run of their own;
	// FiresCoalesced those a later run stood for (misfire policy).
	FiresRun, FiresCoalesced int
	// FiresByJob counts the checked fires of each job.
	FiresByJob map[string]int
	// FiresRecorded counts the checked fires shardd recorded as not run by
	// an explicit policy (Options.Records) within the bound.
	FiresRecorded int
	// CutRunsUnattributed counts runs cut short with no injected failure
	// to date the cut (a session that fenced on its own on a loaded host).
	CutRunsUnattributed int
	// CutRuns counts the runs cut by a failure that were judged (failover
	// on); FailoverLatencies how long after the failure each was re-run.
	CutRuns           int
	FailoverLatencies []time.Duration `json:"-"`
	// RerunsAfterEnd counts failover attempts of runs whose work had ended
	// although shardd had not recorded it (its instance was cut off or
	// paused before it could): allowed by G2, the at-least-once edge that
	// jobs cover with idempotence or the fence token.
	RerunsAfterEnd  int
	Overlaps        int `json:"g1Overlaps"`
	Duplicates      int `json:"g2Duplicates"`
	Misses          int `json:"g3Misses"`
	FenceInversions int `json:"g4FenceInversions"`
	Violations      []string
}

// OK reports whether no guarantee was violated.
func (r Report) OK() bool {
	return r.Overlaps+r.Duplicates+r.Misses+r.FenceInversions == 0
}

func (r Report) String() string {
	return fmt.Sprintf("%d starts, %d ends, %d items, %d due fires checked (%d run, %d coalesced, %d recorded not run by policy, %d in fault windows), %d cut runs judged (%d unattributed), %d failovers (%d of runs that had ended), %d misfire runs; G1 overlaps %d, G2 duplicates %d, G3 misses %d, G4 fence inversions %d",
		r.Starts, r.Ends, r.Items, r.FiresChecked, r.FiresRun, r.FiresCoalesced, r.FiresRecorded, r.FiresInFaults, r.CutRuns, r.CutRunsUnattributed, r.Failovers, r.RerunsAfterEnd, r.Misfires, r.Overlaps, r.Duplicates, r.Misses, r.FenceInversions)
}

type key struct {
	job  string
	item int
}

type run struct {
	start, end *Event
}

// Check verifies G1-G4 over events.
func Check(events []Event, o Options) Report {
	var r Report
	violate := func(counter *int, format string, args ...any) {
		*counter++
		if len(r.Violations) < 100 {
			r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
		}
	}
	runs := map[key][]*run{}
	byFence := map[string]*run{}
	var last time.Time // the ledger's last record
	for i := range events {
		ev := &events[i]
		if ev.At.After(last) {
			last = ev.At
		}
		k := key{ev.Job, ev.Item}
		id := fmt.Sprintf("%s/%d/%d", ev.Job, ev.Item, ev.Fence)
		switch ev.Kind {
		case "start":
			r.Starts++
			if prev := byFence[id]; prev != nil && prev.end == nil {
				violate(&r.Overlaps, "G1: %s item %d: fence %d started again while its first start had not ended", ev.Job, ev.Item, ev.Fence)
			}
			rn := &run{start: ev}
			runs[k] = append(runs[k], rn)
			byFence[id] = rn
			switch ev.Source {
			case "FAILOVER":
				r.Failovers++
			case "MISFIRE":
				r.Misfires++
			}
		case "end":
			r.Ends++
			if rn := byFence[id]; rn != nil {
				rn.end = ev
			}
		case "overlap":
			violate(&r.Overlaps, "G1: %s item %d fire %s on %s found the item's lock held", ev.Job, ev.Item, ev.Fire.Format(time.RFC3339), ev.Instance)
		}
	}
	keys := make([]key, 0, len(runs))
	for k := range runs {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].job < keys[j].job || keys[i].job == keys[j].job && keys[i].item < keys[j].item
	})
	for _, k := range keys {
		rs := runs[k]
		sort.Slice(rs, func(i, j int) bool { return rs[i].start.At.Before(rs[j].start.At) })
		// G1 by time: a run starts after the previous one ended.
		for i := 1; i < len(rs); i++ {
			if prev := rs[i-1]; prev.end != nil && rs[i].start.At.Before(prev.end.At) {
				violate(&r.Overlaps, "G1: %s item %d: run fence %d started %s before run fence %d ended", k.job, k.item, rs[i].start.Fence, prev.end.At.Sub(rs[i].start.At), prev.start.Fence)
			}
		}
		// G2: a fire starts once, except failover attempts of a run that died.
		byFire := map[time.Time][]*run{}
		for _, rn := range rs {
			byFire[rn.start.Fire] = append(byFire[rn.start.Fire], rn)
		}
		for fire, same := range byFire {
			for i := 1; i < len(same); i++ {
				prev, cur := same[i-1], same[i]
				if cur.start.Source != "FAILOVER" || cur.start.Attempt <= prev.start.Attempt {
					violate(&r.Duplicates, "G2: %s item %d fire %s started twice (attempt %d %s, then attempt %d %s)",
						k.job, k.item, fire.Format(time.RFC3339), prev.start.Attempt, prev.start.Source, cur.start.Attempt, cur.start.Source)
				} else if prev.end != nil {
					r.RerunsAfterEnd++
				}
			}
		}
		// G4: fences strictly increase in start order.
		for i := 1; i < len(rs); i++ {
			if rs[i].start.Fence <= rs[i-1].start.Fence {
				violate(&r.FenceInversions, "G4: %s item %d: fence %d after fence %d", k.job, k.item, rs[i].start.Fence, rs[i-1].start.Fence)
			}
		}
	}
	// deadline is t+Bound, stretched to the end of any fault window t is in.
	deadline := func(t time.Time) (time.Time, bool) {
		d, in := t.Add(o.Bound), false
		for _, w := range o.Faults {
			if !t.Before(w.From) && !t.After(w.To) {
				in = true
				if w.To.After(d) {
					d = w.To
				}
			}
		}
		return d, in
	}
	jobs := make([]string, 0, len(o.Jobs))
	for name := range o.Jobs {
		jobs = append(jobs, name)
	}
	sort.Strings(jobs)
	for _, name := range jobs {
		job := o.Jobs[name]
		for item := 0; item < job.Items; item++ {
			r.Items++
			rs := runs[key{name, item}]
			if job.Schedule != nil {
				var recs []Record
				for _, rec := range o.Records {
					// A run killed by a failure accounts for its fire only
					// where failover is off; elsewhere it must be re-run.
					if rec.Job == name && rec.Item == item && !(rec.Why == WhyKilled && job.Failover) {
						recs = append(recs, rec)
					}
				}
				r.checkFires(name, item, job.Schedule, rs, recs, o, last, deadline, violate)
			}
			if job.Failover {
				r.checkCutRuns(name, item, rs, o, last, deadline, violate)
			}
		}
	}
	return r
}

// checkFires accounts for every due fire of one item (G3 per fire).
func (r *Report) checkFires(job string, item int, sched interface{ Next(time.Time) time.Time }, rs []*run, recs []Record, o Options, last time.Time,
	deadline func(time.Time) (time.Time, bool), violate func(*int, string, ...any)) {
	// fires between a and b, a included, b not.
	between := func(a, b time.Time) int {
		n := 0
		for f := a; f.Before(b) && n <= 1<<20; f = sched.Next(f) {
			n++
		}
		return n
	}
	for due := sched.Next(o.From); !due.IsZero() && !due.After(o.To.Add(-o.Bound)); due = sched.Next(due) {
		dl, inFault := deadline(due)
		// A fire that comes while a run of its item is still going cannot
		// start before that run ends (G1): its bound counts from the end
		// (for a run cut short, from the start of the run after it).
		if busy := busyUntil(rs, due, o.Bound, o.Failures); !busy.IsZero() {
			if d, in := deadline(busy); d.After(dl) {
				dl, inFault = d, inFault || in
			}
		}
		if dl.After(last) {
			r.FiresUnjudged++ // the ledger ends before the deadline
			continue
		}
		r.FiresChecked++
		if r.FiresByJob == nil {
			r.FiresByJob = map[string]int{}
		}
		r.FiresByJob[job]++
		if inFault {
			r.FiresInFaults++
		}
		ran, coalesced := false, false
		for _, rn := range rs {
			s := rn.start
			if s.At.After(dl) {
				continue
			}
			if s.Fire.Equal(due) {
				ran = true
				break
			}
			if s.Fire.After(due) && s.Skipped > 0 && between(due, s.Fire) <= s.Skipped {
				coalesced = true
			}
		}
		recorded := false
		for _, rec := range recs {
			if !rec.At.After(dl) && !due.After(rec.Through) && between(due, rec.Through) < rec.Count {
				recorded = true
			}
		}
		switch {
		case ran:
			r.FiresRun++
		case coalesced:
			r.FiresCoalesced++
		case recorded:
			r.FiresRecorded++
		default:
			violate(&r.Misses, "G3: %s item %d: fire %s neither started nor was coalesced by %s (%s after it)", job, item, due.Format(time.RFC3339), dl.Format("15:04:05.000"), dl.Sub(due))
		}
	}
}

// busyUntil returns when the item stopped being busy with the run in
// progress at t, or zero if none was. A run ends at its end line; a run cut
// short (no end) at the start of the run after it. A run whose next run is
// its failover re-run (the same fire, a later attempt, started within bound
// of the run's end) goes on in that re-run: the item is busy until the
// re-run ends, and so on down the chain. That covers a run cut by a failure
// and a run that ended but whose instance was cut off before it could
// record the end (G2's one exception: nobody can tell the two apart);
// checkCutRuns judges, separately, that each re-run of a cut run came in
// time. A run that ended before t, unrecorded because its instance failed
// (a failure of its instance, or of all, from its start to the re-run),
// goes on the same way in a re-run that starts after t: from the start
// of the run to the end of its re-run, the system could not tell the item
// free (its marker held it until the lease expired, then the re-run did).
func busyUntil(rs []*run, t time.Time, bound time.Duration, failures []Failure) time.Time {
	endOf := func(i int) (time.Time, bool) {
		switch {
		case rs[i].end != nil:
			return rs[i].end.At, true
		case i+1 < len(rs):
			return rs[i+1].start.At, true
		}
		return time.Time{}, false
	}
	for i, rn := range rs {
		if rn.start.At.After(t) {
			break
		}
		end, ok := endOf(i)
		if !ok {
			continue
		}
		rerun := func(j int, end time.Time) bool { // rs[j+1] is rs[j]'s failover re-run
			next := rs[j+1].start
			return next.Fire.Equal(rs[j].start.Fire) && next.Attempt > rs[j].start.Attempt && !next.At.After(end.Add(bound))
		}
		if !end.After(t) && !(rn.end != nil && i+1 < len(rs) && rerun(i, end) && rs[i+1].start.At.After(t) && cutOff(rn.start, rs[i+1].start.At, failures)) {
			continue
		}
		for j := i; j+1 < len(rs); j++ {
			if !rerun(j, end) {
				break
			}
			e, ok := endOf(j + 1)
			if !ok {
				break
			}
			end = e
		}
		return end
	}
	return time.Time{}
}

// cutOff reports whether the instance of the run started by s failed (a
// failure of it, or of all) between about its start and until.
func cutOff(s *Event, until time.Time, failures []Failure) bool {
	from := s.At.Add(-500 * time.Millisecond)
	for _, f := range failures {
		if f.At.Before(from) || f.At.After(until) || (!f.StartedBefore.IsZero() && !s.At.Before(f.StartedBefore)) {
			continue
		}
		if f.Instance == s.Instance || f.Instance == "" {
			return true
		}
	}
	return false
}

// checkCutRuns checks that every run cut by a failure (a start with no
// end) was re-run, attempt+1, within the bound of the failure.
func (r *Report) checkCutRuns(job string, item int, rs []*run, o Options, last time.Time,
	deadline func(time.Time) (time.Time, bool), violate func(*int, string, ...any)) {
	for _, rn := range rs {
		s := rn.start
		if rn.end != nil || s.At.Before(o.From) || s.At.After(o.To) {
			continue
		}
		// The fault that cut it: the first of its own instance from about
		// its start on (a script writes its start line a little after it
		// was let go), else the first one that hit every instance.
		var own, all time.Time
		from := s.At.Add(-500 * time.Millisecond)
		for _, f := range o.Failures {
			if f.At.Before(from) || (!f.StartedBefore.IsZero() && !s.At.Before(f.StartedBefore)) {
				continue
			}
			switch f.Instance {
			case s.Instance:
				if own.IsZero() || f.At.Before(own) {
					own = f.At
				}
			case "":
				if all.IsZero() || f.At.Before(all) {
					all = f.At
				}
			}
		}
		failure := own
		if failure.IsZero() {
			failure = all
		}
		if failure.IsZero() {
			r.CutRunsUnattributed++
			continue
		}
		dl, _ := deadline(failure)
		if dl.After(last) {
			continue
		}
		r.CutRuns++
		var rerun *Event
		for _, other := range rs {
			o := other.start
			if o.Fire.Equal(s.Fire) && o.Attempt > s.Attempt && o.Source == "FAILOVER" && (rerun == nil || o.At.Before(rerun.At)) {
				rerun = o
			}
		}
		switch {
		case rerun == nil:
			violate(&r.Misses, "G3: %s item %d: run of fire %s (attempt %d, fence %d) cut by the failure at %s was never re-run", job, item, s.Fire.Format(time.RFC3339), s.Attempt, s.Fence, failure.Format("15:04:05.000"))
		case rerun.At.After(dl):
			violate(&r.Misses, "G3: %s item %d: run of fire %s cut by the failure at %s re-run %s after it, past %s", job, item, s.Fire.Format(time.RFC3339), failure.Format("15:04:05.000"), rerun.At.Sub(failure).Round(time.Millisecond), dl.Format("15:04:05.000"))
		default:
			r.FailoverLatencies = append(r.FailoverLatencies, rerun.At.Sub(failure))
		}
	}
}

// Percentile returns the p-th percentile (0-100) of ds, 0 when empty.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}
