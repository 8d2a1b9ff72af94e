// Package ledger checks shardd's guarantees against an execution ledger: a
// file that the jobs under test append to themselves, one line per event.
//
//	start <job> <item> <fire> <attempt> <fence> <instance> <source> <unix-nanos>
//	end   <job> <item> <fire> <attempt> <fence> <instance> <source> <unix-nanos>
//	overlap <job> <item> <fire> <attempt> <fence> <instance> <source> <unix-nanos>
//
// "overlap" is written by a job that found its item's lock file held by
// another run (flock -n): a direct observation of two concurrent runs.
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
		if len(f) != 9 {
			return nil, fmt.Errorf("ledger line %d: %d fields, want 9: %q", n, len(f), s.Text())
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
		out = append(out, Event{Kind: f[0], Job: f[1], Item: item, Fire: fire, Attempt: attempt, Fence: fence, Instance: f[6], Source: f[7], At: time.Unix(0, at)})
	}
	return out, s.Err()
}

// Options say what the checker expects.
type Options struct {
	// Items lists, per job, its item count; every item is checked for misses.
	Items map[string]int
	// Period is the job's fire interval (jobs firing @every Period).
	Period time.Duration
	// Bound is G3's bound: from any due fire, the item must start a run of
	// that fire or a later one within Bound.
	Bound time.Duration
	// From and To delimit the window checked for misses.
	From, To time.Time
	// Faults lists windows in which G3's bound does not apply as is (etcd
	// without a leader, two failures in a row): a fire due inside one must
	// still start, but by the window's end if that is later than due+Bound.
	Faults []Window
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
	return fmt.Sprintf("%d starts, %d ends, %d items, %d due fires checked (%d in fault windows), %d failovers (%d of runs that had ended), %d misfire runs; G1 overlaps %d, G2 duplicates %d, G3 misses %d, G4 fence inversions %d",
		r.Starts, r.Ends, r.Items, r.FiresChecked, r.FiresInFaults, r.Failovers, r.RerunsAfterEnd, r.Misfires, r.Overlaps, r.Duplicates, r.Misses, r.FenceInversions)
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
	// G3: from every due fire, a run of that fire or a later one starts
	// within the bound.
	for job, n := range o.Items {
		for item := 0; item < n; item++ {
			r.Items++
			rs := runs[key{job, item}]
		fires:
			for due := o.From.Truncate(o.Period).Add(o.Period); !due.After(o.To.Add(-o.Bound)); due = due.Add(o.Period) {
				deadline := due.Add(o.Bound)
				inFault := false
				for _, w := range o.Faults {
					if !due.Before(w.From) && !due.After(w.To) {
						inFault = true
						if w.To.After(deadline) {
							deadline = w.To
						}
					}
				}
				if deadline.After(last) {
					r.FiresUnjudged++ // the ledger ends before the deadline
					continue fires
				}
				r.FiresChecked++
				if inFault {
					r.FiresInFaults++
				}
				ok := false
				for _, rn := range rs {
					if !rn.start.Fire.Before(due) && !rn.start.At.After(deadline) {
						ok = true
						break
					}
				}
				if !ok {
					violate(&r.Misses, "G3: %s item %d: no run of fire %s or later started by %s (%s after it)", job, item, due.Format(time.RFC3339), deadline.Format("15:04:05.000"), deadline.Sub(due))
				}
			}
		}
	}
	return r
}
