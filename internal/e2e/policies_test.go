package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/ledger"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/schedule"
)

// limitScript runs for 2s holding an exclusive lock on a file of its own;
// at its start it counts the other runs of the job whose lock is held (a
// lock goes with the process, whatever kills it), probing each with a
// shared lock, which other probes do not block: finding
// clusterConcurrency (2) others is an observed excess.
const limitScript = `me="$DIR/active.$SHARDD_ITEM.$SHARDD_FENCE"
exec 9>"$me"
flock -n 9
n=0
for f in "$DIR"/active.*; do
  [ "$f" = "$me" ] && continue
  flock -n -s "$f" true || n=$((n+1)) # shared: other runs' probes do not count
done
[ $n -ge 2 ] && echo "limit $SHARDD_ITEM $SHARDD_FENCE $n" >> "$DIR/limit"
echo "$SHARDD_ITEM $SHARDD_FIRE_TIME $SHARDD_SKIPPED" >> "$DIR/limited"
sleep 2
`

// The scheduling policies per due fire (docs/policies.md), on 3 instances
// with faults during runs (kill -9 of the instance running a queued item,
// SIGSTOP of another for 2 x TTL):
//
//   - queue: overlap bufferAll, bufferLimit 3, runs longer than its period:
//     every due fire runs once, in order, or is recorded skipped
//     (buffer-full, too-old); never two runs of an item at once.
//   - holiday: every second, on days its calendar excludes (today and
//     tomorrow): nothing runs, and the fires are recorded SKIPPED/calendar.
//   - jittered: jitter 3s: each item's run starts at its fire plus the
//     offset every instance computes; G1-G4 as for any job.
//   - busy: overlap skip, runs longer than its period: the fires that come
//     while it runs are recorded busy; G1-G4 hold with those records.
//   - listed: two crons (every 2s and every 3s): G1-G4 over their union,
//     a second both give fires once.
//   - windowed: every second until activeUntil (12 s in): no fire after
//     it runs.
//   - catchup: catchUpWindow 1s: the fires its items miss while their
//     owner is down are recorded too-old, the rest run; G1-G4 hold.
//   - delayed: fixedDelay 2s, runs of 1s: each item's next fire is its
//     previous run's end plus 2s (rounded up to a second), kept across
//     the faults; never two runs at once.
//   - limited: 6 items every 3s whose runs take 2s, clusterConcurrency 2:
//     never more than 2 run at once (a lock each run holds, counted at
//     each start), every item gets its turn, and status shows items
//     waiting.
//   - flaky: every run fails, pauseAfterFailures 3: after its third failed
//     fire the job is disabled by itself (audited as job:flaky), says
//     PAUSED in status, and its onFailure command hears PAUSED once; no
//     fire after the pause runs.
//   - replaced: overlap replace, runs longer than its period: each newer
//     fire stops the run (KILLED/replaced) and then runs, never both at
//     once; every due fire starts.
//
// And the same policies on jobs whose period (10 s) is longer than the
// failure bound, so that no later fire can stand for a lost one: the
// kill comes while their runs go, the pause half a second before one of
// their fires, each on an instance that owns one of their items; each
// run cut must be run again, and every fire must run within the bound (or be recorded: slowcatchup's catch-up window is shorter than a
// failover, so its fire there is too-old); slowdelayed's next fire is its
// run's end plus 6 s, and must start by then plus the bound.
//
// The ledger is checked up to the end of the fault windows: the fires due
// while an instance is dead or stopped are the ones that matter.
func TestSchedulingPoliciesUnderFaults(t *testing.T) {
	faultTest(t)
	dir := t.TempDir()
	e := startEtcd(t)
	cli := e.client()
	now := time.Now().UTC()
	activeUntil := now.Add(12 * time.Second).Truncate(time.Second)
	today, tomorrow := strings.ToUpper(now.Weekday().String()[:3]), strings.ToUpper(now.Add(24 * time.Hour).Weekday().String()[:3])
	const slow = "*/10 * * * * ?"
	job := func(name, cron string, items int, sleep, extra string) string {
		return `  - name: ` + name + `
    cron: "` + cron + `"
    shardingTotalCount: ` + fmt.Sprint(items) + `
    failover: true
` + extra + `    script:
      command: ` + etcdtest.YAMLQuote(ledgerScript) + `
      env: {LEDGER_DIR: ` + etcdtest.YAMLQuote(dir) + `, LEDGER_SLEEP: "` + sleep + `"}
`
	}
	cfg := "calendars:\n  now:\n    weekdays: [" + today + ", " + tomorrow + "]\njobs:\n" +
		job("queue", "@every 2s", 2, "2.6", "    overlap: bufferAll\n    bufferLimit: 3\n") +
		job("holiday", "* * * * * ?", 1, "0", "    excludeCalendars: [now]\n") +
		job("jittered", "@every 4s", 3, "0.2", "    jitter: 3s\n") +
		job("busy", "@every 3s", 1, "4", "    overlap: skip\n") +
		strings.Replace(job("listed", "", 2, "0.1", "    cron: [\"*/2 * * * * ?\", \"*/3 * * * * ?\"]\n"), "    cron: \"\"\n", "", 1) +
		job("windowed", "* * * * * ?", 1, "0", "    activeUntil: "+activeUntil.Format(time.RFC3339)+"\n") +
		job("catchup", "@every 2s", 3, "0.1", "    catchUpWindow: 1s\n") +
		job("replaced", "@every 3s", 2, "5", "    overlap: replace\n") +
		strings.Replace(job("delayed", "", 2, "1", "    fixedDelay: 2s\n"), "    cron: \"\"\n", "", 1) +
		// Periods longer than the failure bound.
		job("slowbuffer", slow, 3, "0.3", "    overlap: bufferAll\n") +
		job("slowskip", slow, 3, "0.3", "    overlap: skip\n") +
		job("slowreplace", slow, 3, "0.3", "    overlap: replace\n") +
		job("slowjitter", slow, 3, "0.3", "    jitter: 3s\n") +
		job("slowcatchup", slow, 3, "0.3", "    catchUpWindow: 1s\n") +
		job("slowlimited", slow, 3, "0.5", "    clusterConcurrency: 1\n") +
		strings.Replace(job("slowlisted", "", 3, "0.3", "    cron: [\""+slow+"\", \"*/20 * * * * ?\"]\n"), "    cron: \"\"\n", "", 1) +
		strings.Replace(job("slowdelayed", "", 3, "0.5", "    fixedDelay: 6s\n"), "    cron: \"\"\n", "", 1) +
		`  - name: limited
    cron: "@every 3s"
    shardingTotalCount: 6
    clusterConcurrency: 2
    failover: true
    script:
      command: ` + etcdtest.YAMLQuote(limitScript) + `
      env: {DIR: ` + etcdtest.YAMLQuote(dir) + `}
` +
		`  - name: flaky
    cron: "*/2 * * * * ?"
    shardingTotalCount: 2
    pauseAfterFailures: 3
    script:
      command: ` + etcdtest.YAMLQuote(`echo "$SHARDD_ITEM $SHARDD_FIRE_TIME" >> "$DIR/flaky"; exit 1`) + `
      env: {DIR: ` + etcdtest.YAMLQuote(dir) + `}
    onFailure:
      command: ` + etcdtest.YAMLQuote(`echo "$SHARDD_RESULT" >> `+etcdtest.YAMLQuote(filepath.Join(dir, "notified"))) + `
`
	path := filepath.Join(dir, "jobs.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	procs := map[string]*proc{}
	for _, n := range []string{"a", "b", "c"} {
		procs[n] = startShardd(t, e, n, path)
	}
	etcdtest.Eventually(t, 15*time.Second, "agreement", func() bool {
		return agreed(t, cli, "jittered", map[string][]int{"a": {0}, "b": {1}, "c": {2}}, procs["a"], procs["b"], procs["c"])
	})
	from := time.Now()
	ledgerPath := filepath.Join(dir, "ledger")
	// running is the live instance the ledger shows running job/item.
	running := func(job string, item int, dead *proc) *proc {
		var p *proc
		etcdtest.Eventually(t, 10*time.Second, job+" running", func() bool {
			p = nil
			if name := openRun(t, ledgerPath, job, item); name != "" {
				p = procs[name]
			}
			return p != nil && p != dead
		})
		return p
	}
	var failures []ledger.Failure
	bound := ttl + 2*time.Second
	// checkBound is the ledger's bound: a failover's, plus jitter (3 s).
	checkBound := bound + 3*time.Second
	adm := admin.New(cli, keyspace.NewKeys(""))
	etcdtest.Eventually(t, 10*time.Second, "limited's items waiting in status", func() bool {
		js, err := adm.JobStatus(t.Context(), "limited")
		return err == nil && len(js.Jobs) == 1 && js.Jobs[0].Slots != nil && js.Jobs[0].Slots.Limit == 2 && len(js.Jobs[0].Slots.Waiting) > 0
	})
	// Each fault comes at a fire of the slow jobs: the kill 0.2 s after
	// one, while their runs (0.3 s) go, once the queue has filled (5 s);
	// the pause half a second before the next, so that it is due while
	// its owner is stopped.
	slowSchedule := mustSchedule(t, slow)
	atSlowFire := func(after time.Time, offset time.Duration) time.Time {
		if now := time.Now(); now.After(after) {
			after = now
		}
		fire := slowSchedule.Next(after.Add(-offset))
		time.Sleep(time.Until(fire.Add(offset)))
		return fire
	}

	fire := atSlowFire(from.Add(5*time.Second), 200*time.Millisecond)
	victim := running("queue", 0, nil)
	victim.stop(syscall.SIGKILL)
	failures = append(failures, ledger.Failure{At: time.Now(), Instance: victim.name})
	t.Logf("killed %s (running queue/0) at %s, during the slow jobs' fire %s", victim.name, time.Now().Format(time.RFC3339Nano), fire.Format(time.RFC3339))

	fire = atSlowFire(time.Now(), -500*time.Millisecond)
	paused := running("queue", 1, victim)
	paused.signal(syscall.SIGSTOP)
	failures = append(failures, ledger.Failure{At: time.Now(), Instance: paused.name})
	t.Logf("paused %s (running queue/1) at %s, before the slow jobs' fire %s", paused.name, time.Now().Format(time.RFC3339Nano), fire.Format(time.RFC3339))
	time.Sleep(2 * ttl)
	paused.signal(syscall.SIGCONT)
	// Until every fire due in the pause's window has had its bound: the
	// window is checkBound long, and a fire at its end has checkBound more.
	pauseEnd := failures[1].At.Add(checkBound)
	time.Sleep(time.Until(pauseEnd.Add(checkBound + time.Second)))
	to := time.Now()
	for _, p := range procs {
		if p != victim {
			p.stop(syscall.SIGTERM)
		}
	}

	f, err := os.Open(ledgerPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	events, err := ledger.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	if d := os.Getenv("SHARDD_E2E_KEEP"); d != "" {
		b, _ := os.ReadFile(ledgerPath)
		os.WriteFile(filepath.Join(d, "policies-ledger"), b, 0o644)
	}
	records := policyRecords(t, []*proc{procs["a"], procs["b"], procs["c"]})

	// G1-G4 for the jobs whose fires each run or are recorded skipped
	// within the bound (jittered: its bound stretched by the jitter).
	checked := map[string]ledger.Job{
		"jittered": {Items: 3, Schedule: mustSchedule(t, "@every 4s"), Failover: true},
		"busy":     {Items: 1, Schedule: mustSchedule(t, "@every 3s"), Failover: true},
		"catchup":  {Items: 3, Schedule: mustSchedule(t, "@every 2s"), Failover: true},
		"listed":   {Items: 2, Schedule: schedule.Union{mustSchedule(t, "*/2 * * * * ?"), mustSchedule(t, "*/3 * * * * ?")}, Failover: true},
	}
	slowJobs := []string{"slowbuffer", "slowskip", "slowreplace", "slowjitter", "slowcatchup", "slowlimited"}
	for _, name := range slowJobs {
		checked[name] = ledger.Job{Items: 3, Schedule: slowSchedule, Failover: true}
	}
	checked["slowlisted"] = ledger.Job{Items: 3, Schedule: schedule.Union{slowSchedule, mustSchedule(t, "*/20 * * * * ?")}, Failover: true}
	faults := faultWindows(failures, checkBound)
	r := ledger.Check(events, ledger.Options{
		Jobs:  checked,
		Bound: checkBound, From: from, To: to.Add(-time.Second), Failures: failures, Records: records,
		Faults: faults,
	})
	t.Logf("ledger: %s; per job %v", r, r.FiresByJob)
	for _, v := range r.Violations {
		t.Error(v)
	}
	// The fires that matter were judged: each slow job's three items had a
	// fire half a second into the pause's window, and the kill cut runs.
	if want := 3 * (len(slowJobs) + 1); r.FiresInFaults < want {
		t.Errorf("%d fires judged in the fault windows, want at least %d (the slow jobs' fires there)", r.FiresInFaults, want)
	}
	if r.CutRuns == 0 {
		t.Error("no run cut by the kill was judged")
	}
	for name := range checked {
		if r.FiresByJob[name] == 0 {
			t.Errorf("no fire of %s was judged", name)
		}
	}

	// windowed: no fire after activeUntil ran; fires before it did.
	windowedRuns := 0
	for _, ev := range events {
		if ev.Job == "windowed" && ev.Kind == "start" {
			windowedRuns++
			if ev.Fire.After(activeUntil) {
				t.Errorf("windowed ran fire %s, after its activeUntil %s", ev.Fire.Format(time.RFC3339), activeUntil.Format(time.RFC3339))
			}
		}
	}
	tooOld := 0
	for _, p := range procs {
		tooOld += len(p.find(func(m map[string]any) bool { return m["job"] == "catchup" && m["why"] == "too-old" }))
	}
	t.Logf("catchup: %d records of fires too old to run", tooOld)
	if windowedRuns < 5 {
		t.Errorf("windowed ran %d fires before its activeUntil", windowedRuns)
	}

	// jittered: each first attempt starts at its fire plus its offset
	// (away from the faults, where its item may move and run late).
	jitterChecked := 0
	for _, ev := range events {
		if ev.Job != "jittered" || ev.Kind != "start" || ev.Attempt != 1 || ev.Source != "NORMAL" {
			continue
		}
		want := ev.Fire.Add(schedule.JitterOffset("jittered", ev.Item, ev.Fire, 3*time.Second))
		if slices.ContainsFunc(failures, func(f ledger.Failure) bool {
			return want.After(f.At.Add(-time.Second)) && want.Before(f.At.Add(bound+3*time.Second))
		}) {
			continue // its owner may be the instance a fault hit: it runs late, on another, as any fire
		}
		if late := ev.At.Sub(want); late < -50*time.Millisecond || late > 1500*time.Millisecond {
			t.Errorf("jittered item %d fire %s started at %s, want %s (its offset)", ev.Item, ev.Fire.Format(time.RFC3339), ev.At.Format(time.RFC3339Nano), want.Format(time.RFC3339Nano))
		}
		jitterChecked++
	}
	if jitterChecked < 6 {
		t.Errorf("only %d jittered runs to check", jitterChecked)
	}

	// holiday: nothing ran; its fires are recorded excluded by the calendar.
	excluded := 0
	for _, rec := range records {
		if rec.Job == "holiday" {
			excluded += rec.Count
		}
	}
	for _, ev := range events {
		if ev.Job == "holiday" {
			t.Errorf("holiday ran on a day its calendar excludes: %+v", ev)
			break
		}
	}
	if span := int(to.Sub(from) / time.Second); excluded < span*8/10 {
		t.Errorf("holiday: %d fires recorded excluded in %d s of every-second fires", excluded, span)
	}
	calendarLogged := false
	for _, p := range procs {
		calendarLogged = calendarLogged || len(p.find(func(m map[string]any) bool { return m["job"] == "holiday" && m["why"] == "calendar" })) > 0
	}
	if !calendarLogged {
		t.Error("no record of holiday's fires says reason calendar")
	}

	// queue: per item, each due fire is run once (attempts aside), in
	// order, or is in a skip record; no two runs at once.
	queue := mustSchedule(t, "@every 2s")
	for item := range 2 {
		var started []time.Time
		var lastStart time.Time
		open := 0
		for _, ev := range events {
			if ev.Job != "queue" || ev.Item != item {
				continue
			}
			switch ev.Kind {
			case "overlap":
				t.Errorf("queue item %d: two runs at once: %+v", item, ev)
			case "start":
				if ev.Attempt == 1 {
					if !lastStart.IsZero() && !ev.Fire.After(lastStart) {
						t.Errorf("queue item %d: fire %s ran after fire %s: not in order", item, ev.Fire.Format(time.RFC3339), lastStart.Format(time.RFC3339))
					}
					lastStart = ev.Fire
					if slices.ContainsFunc(started, ev.Fire.Equal) {
						t.Errorf("queue item %d: fire %s ran twice", item, ev.Fire.Format(time.RFC3339))
					}
					started = append(started, ev.Fire)
				}
				open++
			}
		}
		skipped := map[time.Time]string{}
		for _, rec := range records {
			if rec.Job != "queue" || rec.Item != item {
				continue
			}
			// Count fires back from Through.
			f := rec.Through
			for k := 0; k < rec.Count; k++ {
				skipped[f.UTC()] = rec.Why
				f = f.Add(-2 * time.Second)
			}
		}
		if len(started) == 0 {
			t.Fatalf("queue item %d never ran", item)
		}
		// Every due fire from the first run to the last is accounted for.
		for f := queue.Next(started[0]); f.Before(lastStart); f = queue.Next(f) {
			if !slices.ContainsFunc(started, f.Equal) && skipped[f.UTC()] == "" {
				t.Errorf("queue item %d: fire %s neither ran nor was recorded skipped", item, f.Format(time.RFC3339))
			}
		}
		t.Logf("queue item %d: %d fires ran, %d recorded skipped", item, len(started), len(skipped))
	}
	bufferFull := 0
	for _, p := range procs {
		bufferFull += len(p.find(func(m map[string]any) bool { return m["job"] == "queue" && m["why"] == "buffer-full" }))
	}
	if bufferFull == 0 {
		t.Error("queue's runs outlast its period but no fire was recorded skipped (buffer-full)")
	}

	// replaced: never two runs at once; each due fire from the first start
	// to the last starts (or is coalesced into the next run, when its
	// owner was hit by a fault); runs are KILLED/replaced.
	every3 := mustSchedule(t, "@every 3s")
	for item := range 2 {
		var fires []time.Time
		coalesced := map[time.Time]bool{}
		for _, ev := range events {
			if ev.Job != "replaced" || ev.Item != item {
				continue
			}
			if ev.Kind == "overlap" {
				t.Errorf("replaced item %d: two runs at once: %+v", item, ev)
			}
			if ev.Kind == "start" {
				fires = append(fires, ev.Fire)
				f := ev.Fire
				for range ev.Skipped {
					f = f.Add(-3 * time.Second)
					coalesced[f.UTC()] = true
				}
			}
		}
		if len(fires) < 3 {
			t.Fatalf("replaced item %d: %d runs", item, len(fires))
		}
		for f := every3.Next(fires[0]); f.Before(fires[len(fires)-1]); f = every3.Next(f) {
			if !slices.ContainsFunc(fires, f.Equal) && !coalesced[f.UTC()] && !slices.ContainsFunc(records, func(r ledger.Record) bool { return r.Job == "replaced" && r.Item == item && !r.Through.Before(f) }) {
				t.Errorf("replaced item %d: fire %s never started", item, f.Format(time.RFC3339))
			}
		}
	}
	// delayed, slowdelayed: each run's fire is its previous run's end plus
	// the delay, and it starts by that fire's deadline (its bound, or the
	// end of a fault window it falls in); after the last run, no fire
	// whose deadline has passed is missing.
	deadline := func(fire time.Time) time.Time {
		d := fire.Add(checkBound)
		for _, w := range faults {
			if !fire.Before(w.From) && !fire.After(w.To) && w.To.After(d) {
				d = w.To
			}
		}
		return d
	}
	for _, fd := range []struct {
		job   string
		items int
		delay time.Duration
	}{{"delayed", 2, 2 * time.Second}, {"slowdelayed", 3, 6 * time.Second}} {
		checkFixedDelay(t, events, fd.job, fd.items, fd.delay, deadline, to.Add(-time.Second))
	}

	// flaky: it paused itself after three failed fires (completed fires:
	// one whose item was coalesced into a later run by a fault never
	// completes, and does not count), and no fire ran after the pause.
	js, err := adm.JobStatus(t.Context(), "flaky")
	if err != nil || len(js.Jobs) != 1 || js.Jobs[0].Paused == nil || js.Jobs[0].Paused.FailedInARow != 3 {
		t.Fatalf("status of flaky: %+v, %v; want PAUSED after 3 failed fires", js, err)
	}
	pausedAt := js.Jobs[0].Paused.PausedAt
	flakyRuns, _ := os.ReadFile(filepath.Join(dir, "flaky"))
	fires := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(string(flakyRuns)), "\n") {
		_, text, _ := strings.Cut(l, " ")
		fire, err := time.Parse(time.RFC3339, text)
		if err != nil {
			t.Fatalf("flaky's run line %q: %v", l, err)
		}
		fires[text] = true
		if fire.After(pausedAt) {
			t.Errorf("flaky ran fire %s after it paused at %s", text, pausedAt.Format(time.RFC3339Nano))
		}
	}
	if len(fires) < 3 {
		t.Errorf("flaky ran %d fires before it paused, want at least 3", len(fires))
	}
	notified, _ := os.ReadFile(filepath.Join(dir, "notified"))
	if got := strings.Count(string(notified), "PAUSED"); got != 1 {
		t.Errorf("onFailure heard PAUSED %d times, want once: %q", got, notified)
	}
	audit, err := adm.Audit(t.Context(), admin.AuditFilter{Job: "flaky"})
	if err != nil || len(audit) != 1 || audit[0].Actor != "job:flaky" {
		t.Errorf("audit of flaky: %+v, %v; want one entry by job:flaky", audit, err)
	}

	// limited: never above its limit; every item ran.
	if over, _ := os.ReadFile(filepath.Join(dir, "limit")); len(over) > 0 {
		t.Errorf("limited ran more than clusterConcurrency 2 at once:\n%s", over)
	}
	limitedRuns, _ := os.ReadFile(filepath.Join(dir, "limited"))
	perItem := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(limitedRuns)), "\n") {
		item, _, _ := strings.Cut(l, " ")
		perItem[item]++
	}
	for item := range 6 {
		if perItem[fmt.Sprint(item)] < 2 {
			t.Errorf("limited item %d ran %d times: every item must get its turn (%v)", item, perItem[fmt.Sprint(item)], perItem)
		}
	}

	replacedRuns := 0
	for _, p := range procs {
		replacedRuns += len(p.find(func(m map[string]any) bool {
			return m["job"] == "replaced" && m["reason"] == "replaced" && m["msg"] == "killed"
		}))
	}
	if replacedRuns < 4 {
		t.Errorf("only %d runs of replaced recorded KILLED/replaced; its runs outlast its period", replacedRuns)
	}
}

// checkFixedDelay checks a fixedDelay job's runs in the ledger: per item,
// each run's fire is its previous run's end plus delay (rounded up to a
// second), a re-run keeps its fire, never two runs at once, each fire
// starts by deadline(fire), and the fire after the last run is not due
// (its deadline is after to).
func checkFixedDelay(t *testing.T, events []ledger.Event, job string, items int, delay time.Duration, deadline func(time.Time) time.Time, to time.Time) {
	t.Helper()
	type run struct {
		fire, start, end time.Time
		attempt          int
	}
	for item := range items {
		var runs []*run
		byFence := map[int64]*run{}
		for _, ev := range events {
			if ev.Job != job || ev.Item != item {
				continue
			}
			switch ev.Kind {
			case "overlap":
				t.Errorf("%s item %d: two runs at once: %+v", job, item, ev)
			case "start":
				r := &run{fire: ev.Fire, start: ev.At, attempt: ev.Attempt}
				runs = append(runs, r)
				byFence[ev.Fence] = r
			case "end":
				if r := byFence[ev.Fence]; r != nil {
					r.end = ev.At
				}
			}
		}
		if len(runs) < 3 {
			t.Errorf("%s item %d: %d runs", job, item, len(runs))
			continue
		}
		for i := 1; i < len(runs); i++ {
			prev, r := runs[i-1], runs[i]
			if r.attempt > 1 {
				if !r.fire.Equal(prev.fire) {
					t.Errorf("%s item %d: attempt %d of fire %s follows fire %s: a re-run must keep its fire", job, item, r.attempt, r.fire, prev.fire)
				}
				continue
			}
			if prev.end.IsZero() {
				continue // cut by a fault: its re-run is next
			}
			earliest := prev.end.Add(delay)
			if r.fire.Before(earliest.Truncate(time.Second)) || r.fire.After(earliest.Add(1500*time.Millisecond)) {
				t.Errorf("%s item %d: fire %s after a run that ended %s: want its end + %s, rounded up to a second", job, item, r.fire.Format(time.RFC3339Nano), prev.end.Format(time.RFC3339Nano), delay)
			}
			if r.start.After(deadline(r.fire)) {
				t.Errorf("%s item %d: fire %s started at %s, after its deadline %s", job, item, r.fire.Format(time.RFC3339), r.start.Format(time.RFC3339Nano), deadline(r.fire).Format(time.RFC3339Nano))
			}
		}
		if last := runs[len(runs)-1]; !last.end.IsZero() {
			next := last.end.Add(delay).Truncate(time.Second).Add(time.Second)
			if deadline(next).Before(to) {
				t.Errorf("%s item %d: its last run ended %s; the fire after it (%s) never started by its deadline %s", job, item, last.end.Format(time.RFC3339Nano), next.Format(time.RFC3339), deadline(next).Format(time.RFC3339Nano))
			}
		}
	}
}
