package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/ledger"
)

// ledgerScript appends start/end lines to the ledger and holds the item's
// lock file while it runs; finding the lock held is an observed overlap.
const ledgerScript = `exec 9>>"$LEDGER_DIR/lock.$SHARDD_JOB.$SHARDD_ITEM"
ctx="$SHARDD_JOB $SHARDD_ITEM $SHARDD_FIRE_TIME $SHARDD_ATTEMPT $SHARDD_FENCE $SHARDD_INSTANCE $SHARDD_SOURCE"
flock -n 9 || echo "overlap $ctx $(date +%s%N)" >> "$LEDGER_DIR/ledger"
echo "start $ctx $(date +%s%N) $SHARDD_SKIPPED" >> "$LEDGER_DIR/ledger"
sleep "$LEDGER_SLEEP"
echo "end $ctx $(date +%s%N) $SHARDD_SKIPPED" >> "$LEDGER_DIR/ledger"
`

func writeLedgerConfig(t *testing.T, dir string) string {
	job := func(name, cron string, items int, sleep string) string {
		return `  - name: ` + name + `
    cron: "` + cron + `"
    shardingTotalCount: ` + strconv.Itoa(items) + `
    failover: true
    script:
      command: ` + etcdtest.YAMLQuote(ledgerScript) + `
      env: {LEDGER_DIR: ` + etcdtest.YAMLQuote(dir) + `, LEDGER_SLEEP: "` + sleep + `"}
`
	}
	cfg := "jobs:\n" +
		job("tick", "@every 1s", 6, "0.3") +
		// Periods longer than the failure bound: a lost fire or a failover
		// that waits for the next fire shows as a miss.
		job("ten", "@every 10s", 3, "4") +
		job("calendar", "7,37 * * * * ?", 2, "1") // fixed times: :07 and :37 of every minute
	path := filepath.Join(dir, "jobs.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// The guarantees under faults, per due fire: 3 instances run a 6-item job
// every second, a 3-item job every 10s whose runs take 4s, and a 2-item job
// at fixed times (:07 and :37 of every minute), failover on. Faults: the
// instance running a 10s item is killed -9 mid-run, the one running another is paused
// (SIGSTOP) mid-run for 2 x TTL, and the owner of a calendar item is killed
// 1s before its fire. The ledger the jobs write must show no overlap (G1),
// no duplicate (G2), every due fire started within TTL + 2s (stretched to
// the fault's bound for fires due meanwhile), every cut run re-run within
// TTL + 2s of its fault (G3), and fences increasing per item (G4).
func TestExecutionGuaranteesUnderFaults(t *testing.T) {
	faultTest(t)
	dir := t.TempDir()
	e := startEtcd(t)
	cli := e.client()
	cfg := writeLedgerConfig(t, dir)
	procs := map[string]*proc{}
	for _, n := range []string{"a", "b", "c"} {
		procs[n] = startShardd(t, e, n, cfg)
	}
	etcdtest.Eventually(t, 15*time.Second, "agreement", func() bool {
		return agreed(t, cli, "tick", map[string][]int{"a": {0, 1}, "b": {2, 3}, "c": {4, 5}}, procs["a"], procs["b"], procs["c"]) &&
			agreed(t, cli, "ten", map[string][]int{"a": {0}, "b": {1}, "c": {2}}, procs["a"], procs["b"], procs["c"])
	})
	from := time.Now()
	var failures []ledger.Failure
	owner := func(job string, item int) *proc {
		m := etcdtest.StoredMap(cli, job)
		if m == nil {
			t.Fatalf("no map of %s", job)
		}
		return procs[m.Owner(item)]
	}
	// running is the instance the ledger shows running job/item now: a
	// fault meant to cut a run hits the process that runs it, not the one
	// a map read a moment later names (a map may move between the two).
	running := func(job string, item int) *proc {
		var p *proc
		etcdtest.Eventually(t, 3*time.Second, job+"/"+strconv.Itoa(item)+" running", func() bool {
			p = nil
			if name := openRun(t, filepath.Join(dir, "ledger"), job, item); name != "" {
				p = procs[name]
			}
			return p != nil
		})
		return p
	}
	// at waits until offset past the next multiple of period.
	at := func(period, offset time.Duration) {
		next := time.Now().Truncate(period).Add(period + offset)
		if time.Until(next) < 500*time.Millisecond {
			next = next.Add(period)
		}
		time.Sleep(time.Until(next))
	}
	bound := ttl + 2*time.Second

	// 1. kill -9 the owner of ten/0 one second into its 4s run.
	at(10*time.Second, time.Second)
	victim := running("ten", 0)
	victim.stop(syscall.SIGKILL)
	failures = append(failures, ledger.Failure{At: time.Now(), Instance: victim.name})
	t.Logf("killed %s (running ten/0) mid-run at %s", victim.name, time.Now().Format(time.RFC3339Nano))
	survivors := []*proc{}
	for _, p := range procs {
		if p != victim {
			survivors = append(survivors, p)
		}
	}
	time.Sleep(bound + time.Second)

	// 2. pause the owner of a ten item mid-run for 2 x TTL.
	at(10*time.Second, 1500*time.Millisecond)
	paused := running("ten", 1)
	paused.signal(syscall.SIGSTOP)
	failures = append(failures, ledger.Failure{At: time.Now(), Instance: paused.name})
	t.Logf("paused %s (running ten/1) mid-run at %s", paused.name, time.Now().Format(time.RFC3339Nano))
	time.Sleep(2 * ttl)
	paused.signal(syscall.SIGCONT)
	t.Logf("resumed %s at %s", paused.name, time.Now().Format(time.RFC3339Nano))
	time.Sleep(bound + time.Second)

	// 3. kill -9 the owner of calendar/0 one second before its fire.
	next := time.Now().Truncate(time.Minute)
	for _, sec := range []int{7, 37, 67, 97} {
		if f := next.Add(time.Duration(sec) * time.Second); time.Until(f) > 2*time.Second {
			next = f
			break
		}
	}
	time.Sleep(time.Until(next.Add(-time.Second)))
	victim2 := owner("calendar", 0)
	victim2.stop(syscall.SIGKILL)
	failures = append(failures, ledger.Failure{At: time.Now(), Instance: victim2.name})
	t.Logf("killed %s (owner of calendar/0) 1s before the fire of %s", victim2.name, next.Format(time.RFC3339))
	time.Sleep(time.Until(next.Add(bound + 8*time.Second)))
	to := time.Now()
	for _, p := range survivors {
		if p != victim2 {
			p.stop(syscall.SIGTERM)
		}
	}

	if d := os.Getenv("SHARDD_E2E_KEEP"); d != "" { // keep the ledger for a look
		b, _ := os.ReadFile(filepath.Join(dir, "ledger"))
		os.WriteFile(filepath.Join(d, "ledger"), b, 0o644)
	}
	f, err := os.Open(filepath.Join(dir, "ledger"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	events, err := ledger.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	r := ledger.Check(events, ledger.Options{
		Jobs: map[string]ledger.Job{
			"tick":     {Items: 6, Schedule: mustSchedule(t, "@every 1s"), Failover: true},
			"ten":      {Items: 3, Schedule: mustSchedule(t, "@every 10s"), Failover: true},
			"calendar": {Items: 2, Schedule: mustSchedule(t, "7,37 * * * * ?"), Failover: true},
		},
		Bound: bound, From: from, To: to, Failures: failures, Records: policyRecords(t, []*proc{procs["a"], procs["b"], procs["c"]}),
		// Fires due during a fault are judged against the fault's bound.
		Faults: faultWindows(failures, bound),
	})
	t.Logf("ledger: %s; failover latencies %v", r, r.FailoverLatencies)
	for _, v := range r.Violations {
		t.Error(v)
	}
	if r.Starts < 100 {
		t.Errorf("too few runs to judge: %s", r)
	}
	if r.CutRuns < 2 {
		t.Errorf("%d cut runs judged; the kill and the pause cut ten's runs mid-way: %s", r.CutRuns, r)
	}
	calendarFire := false
	for _, ev := range events {
		calendarFire = calendarFire || ev.Job == "calendar" && ev.Item == 0 && ev.Kind == "start" && ev.Fire.Equal(next)
	}
	if !calendarFire {
		t.Errorf("the calendar fire %s after its owner was killed never ran", next.Format(time.RFC3339))
	}
}

// openRun returns the instance of job/item's last start in the ledger at
// path when that run has not ended, else "".
func openRun(t *testing.T, path, job string, item int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	events, err := ledger.Parse(f)
	if err != nil { // a line being written: read again
		return ""
	}
	var last *ledger.Event
	ended := false
	for i := range events {
		ev := &events[i]
		if ev.Job != job || ev.Item != item {
			continue
		}
		switch ev.Kind {
		case "start":
			last, ended = ev, false
		case "end":
			ended = ended || last != nil && ev.Fire.Equal(last.Fire) && ev.Attempt == last.Attempt
		}
	}
	if last == nil || ended {
		return ""
	}
	return last.Instance
}

// faultWindows are the spans during which a fault may delay a due fire:
// from each failure to its bound. A fire due inside must start by the
// window's end.
func faultWindows(failures []ledger.Failure, bound time.Duration) []ledger.Window {
	var out []ledger.Window
	for _, f := range failures {
		out = append(out, ledger.Window{From: f.At, To: f.At.Add(bound)})
	}
	return out
}
