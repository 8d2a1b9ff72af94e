package e2e

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// longE2E gates the long e2e runs (make e2e-long, run by .ci/run): they
// take minutes of real fires, too long for the default suite.
func longE2E(t *testing.T) {
	t.Helper()
	if os.Getenv("SHARDD_E2E_LONG") == "" {
		t.Skip("a long e2e run: make e2e-long (SHARDD_E2E_LONG=1)")
	}
}

// failingFire reports whether the deps test's parent fails its item 3 at
// fire f: one fire a minute, at :30.
func failingFire(f time.Time) bool { return f.Unix()/10%6 == 3 }

// childRun is one start of the child, as its script saw it.
type childRun struct {
	item       int
	parentFire time.Time
	attempt    int
	source     string
	at         time.Time
}

func readChildRuns(t *testing.T, path string) []childRun {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []childRun
	s := bufio.NewScanner(f)
	for s.Scan() {
		fs := strings.Fields(s.Text())
		if len(fs) != 5 {
			t.Fatalf("child line %q", s.Text())
		}
		item, _ := strconv.Atoi(fs[0])
		pf, err := time.Parse(time.RFC3339, fs[1])
		if err != nil {
			t.Fatalf("child line %q: parent fire: %v", s.Text(), err)
		}
		attempt, _ := strconv.Atoi(fs[2])
		ns, _ := strconv.ParseInt(fs[4], 10, 64)
		out = append(out, childRun{item: item, parentFire: pf, attempt: attempt, source: fs[3], at: time.Unix(0, ns)})
	}
	return out
}

// A 4-item parent every 10 s (runs of 3 s, failover on) and a 2-item child
// (dependsOn: [parent]) on 3 processes; the owner of a parent item is
// killed -9 mid-run. For every parent fire in the window: when its 4 items
// succeeded (a killed item's failover re-run included), each child item
// runs exactly once for it, after the last parent item ended and within
// TTL + 2 s of it; when item 3 failed (one fire a minute), the child runs
// nothing for it and each child item records SKIPPED/upstream-failed
// naming that fire. The per-fire ledger checks both jobs (G1-G4).
func TestDependenciesUnderFaults(t *testing.T) {
	longE2E(t)
	dir := t.TempDir()
	e := startEtcd(t)
	cli := e.client()
	fail := `f=$(date -d "$SHARDD_FIRE_TIME" +%s); [ $SHARDD_ITEM = 3 ] && [ $((f / 10 % 6)) = 3 ] && exit 1; exit 0`
	childLine := `echo "$SHARDD_ITEM $SHARDD_PARENT_FIRE $SHARDD_ATTEMPT $SHARDD_SOURCE $(date +%s%N)" >> "$LEDGER_DIR/child"` + "\n"
	cfg := `jobs:
  - name: parent
    cron: "@every 10s"
    shardingTotalCount: 4
    failover: true
    script:
      command: ` + etcdtest.YAMLQuote(ledgerScript+fail) + `
      env: {LEDGER_DIR: ` + etcdtest.YAMLQuote(dir) + `, LEDGER_SLEEP: "3"}
  - name: child
    dependsOn: [parent]
    shardingTotalCount: 2
    failover: true
    script:
      command: ` + etcdtest.YAMLQuote(childLine+ledgerScript) + `
      env: {LEDGER_DIR: ` + etcdtest.YAMLQuote(dir) + `, LEDGER_SLEEP: "0.2"}
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
		cm := etcdtest.StoredMap(cli, "child")
		return agreed(t, cli, "parent", map[string][]int{"a": {0, 3}, "b": {1}, "c": {2}}, procs["a"], procs["b"], procs["c"]) &&
			cm != nil && len(cm.Instances) == 3
	})
	from := time.Now()
	bound := ttl + 2*time.Second
	at := func(offset time.Duration) { // offset past the next multiple of 10 s
		next := time.Now().Truncate(10 * time.Second).Add(10*time.Second + offset)
		if time.Until(next) < 500*time.Millisecond {
			next = next.Add(10 * time.Second)
		}
		time.Sleep(time.Until(next))
	}
	at(0)
	// 1 s into the runs of a later fire, one that is not failing by
	// design: its failover re-run is judged as a success.
	next := time.Now().Truncate(10 * time.Second).Add(10 * time.Second)
	for failingFire(next) || time.Until(next) < 500*time.Millisecond {
		next = next.Add(10 * time.Second)
	}
	time.Sleep(time.Until(next.Add(time.Second)))
	m := etcdtest.StoredMap(cli, "parent")
	victim := procs[m.Owner(0)]
	victim.stop(syscall.SIGKILL)
	failures := []ledger.Failure{{At: time.Now(), Instance: victim.name}}
	t.Logf("killed %s (owner of parent/0) mid-run at %s", victim.name, time.Now().Format(time.RFC3339Nano))
	// Run until a failing fire (one a minute) and a fire after it are done.
	deadline := time.Now().Add(70 * time.Second)
	time.Sleep(time.Until(deadline))
	to := time.Now()
	for _, p := range procs {
		if p != victim {
			p.stop(syscall.SIGTERM)
		}
	}

	events := ledgerEvents(t, dir)
	every10, err := schedule.Parse("@every 10s", nil)
	if err != nil {
		t.Fatal(err)
	}
	r := ledger.Check(events, ledger.Options{
		Jobs:  map[string]ledger.Job{"parent": {Items: 4, Schedule: every10, Failover: true}, "child": {Items: 2}},
		Bound: bound, From: from, To: to, Failures: failures, Faults: faultWindows(failures, bound),
		Records: policyRecords(t, []*proc{procs["a"], procs["b"], procs["c"]}),
	})
	t.Logf("ledger: %s", r)
	for _, v := range r.Violations {
		t.Error(v)
	}
	if r.CutRuns < 1 {
		t.Errorf("no cut run judged: the kill was to cut parent/0's run: %s", r)
	}

	// The parent's fires: per item, its last run's end.
	type fireEnds struct {
		ended map[int]time.Time
		rerun bool
	}
	fires := map[time.Time]*fireEnds{}
	for _, ev := range events {
		if ev.Job != "parent" {
			continue
		}
		fe := fires[ev.Fire]
		if fe == nil {
			fe = &fireEnds{ended: map[int]time.Time{}}
			fires[ev.Fire] = fe
		}
		if ev.Kind == "start" && ev.Attempt > 1 {
			fe.rerun = true
		}
		if ev.Kind == "end" && ev.At.After(fe.ended[ev.Item]) {
			fe.ended[ev.Item] = ev.At
		}
	}
	runs := readChildRuns(t, filepath.Join(dir, "child"))
	hist, err := admin.New(cli, keyspace.NewKeys("")).Records(context.Background(), "child")
	if err != nil {
		t.Fatal(err)
	}
	judged, failed, reran := 0, 0, 0
	var delays []time.Duration // from a parent fire's last item's end to a child item's start
	for fire, fe := range fires {
		// Judge the fires whose runs began after the cluster agreed and
		// whose child is due before the processes stopped.
		if fire.Before(from) || fire.Add(3*time.Second+2*bound).After(to) {
			continue
		}
		judged++
		var forFire []childRun
		for _, c := range runs {
			if c.parentFire.Equal(fire) {
				forFire = append(forFire, c)
			}
		}
		if failingFire(fire) {
			failed++
			if len(forFire) > 0 {
				t.Errorf("parent fire %s failed (item 3), yet the child ran for it: %+v", fire.Format(time.RFC3339), forFire)
			}
			recorded := 0
			for _, h := range hist {
				if h.State == keyspace.StateSkipped && h.Reason == keyspace.SkipUpstreamFailed && strings.Contains(h.Error, fire.UTC().Format(time.RFC3339)) {
					recorded++
				}
			}
			if recorded != 2 {
				t.Errorf("parent fire %s failed: %d child items recorded upstream-failed for it, want 2", fire.Format(time.RFC3339), recorded)
			}
			continue
		}
		if len(fe.ended) != 4 {
			t.Errorf("parent fire %s: %d items ended, want 4", fire.Format(time.RFC3339), len(fe.ended))
			continue
		}
		if fe.rerun {
			reran++
		}
		var last time.Time
		for _, end := range fe.ended {
			if end.After(last) {
				last = end
			}
		}
		var items []int
		for _, c := range forFire {
			if c.attempt != 1 || c.source != keyspace.SourceUpstream {
				t.Errorf("parent fire %s: child run %+v, want attempt 1 UPSTREAM", fire.Format(time.RFC3339), c)
			}
			if c.at.Before(last) {
				t.Errorf("parent fire %s: child item %d started %s before the last parent item ended", fire.Format(time.RFC3339), c.item, last.Sub(c.at))
			}
			delays = append(delays, c.at.Sub(last))
			if d := c.at.Sub(last); d > bound {
				t.Errorf("parent fire %s: child item %d started %s after the last parent item ended, want within %s", fire.Format(time.RFC3339), c.item, d, bound)
			}
			items = append(items, c.item)
		}
		slices.Sort(items)
		if !slices.Equal(items, []int{0, 1}) {
			t.Errorf("parent fire %s succeeded: the child's items ran %v for it, want each of [0 1] once", fire.Format(time.RFC3339), items)
		}
	}
	slices.Sort(delays)
	if len(delays) > 0 {
		t.Logf("child start after the parent fire's last item ended: p50 %s, max %s (%d child runs)", delays[len(delays)/2], delays[len(delays)-1], len(delays))
	}
	t.Logf("judged %d parent fires: %d failed by design, %d with a failover re-run", judged, failed, reran)
	if judged < 5 || failed < 1 || reran < 1 {
		t.Errorf("judged %d parent fires (%d failed, %d re-run); want at least 5, one failed, one re-run after the kill", judged, failed, reran)
	}
}

// drainQueueScript drains its item's queue file three records an
// iteration, sleeping 1 s each, and exits 100 while records remain. Its
// cursor is kept with the fence that wrote it: a run whose fence is older
// than the cursor's is a stale owner and stops (the pattern docs/dependencies.md
// recommends); each processed record is logged with the fence and instance.
const drainQueueScript = `q="$QDIR/queue.$SHARDD_ITEM"; c="$QDIR/cursor.$SHARDD_ITEM"
read n fence 2>/dev/null < "$c" || { n=0; fence=0; }
if [ "$fence" -gt "$SHARDD_FENCE" ]; then echo "stale $SHARDD_ITEM $SHARDD_FENCE $fence" >> "$QDIR/stale"; exit 1; fi
total=$(wc -l < "$q"); end=$((n+3)); [ $end -gt $total ] && end=$total
sed -n "$((n+1)),${end}p" "$q" | while read r; do echo "$r $SHARDD_ITEM $SHARDD_FENCE $SHARDD_INSTANCE $SHARDD_ITERATION" >> "$QDIR/done"; done
echo "$end $SHARDD_FENCE" > "$c.tmp" && mv "$c.tmp" "$c"
sleep 1
[ $end -lt $total ] && exit 100
exit 0
`

// A streaming job drains two queues of 30 records (one per item, 3 an
// iteration) on one instance; a second instance joins mid-stream and the
// map gives it item 1: the first instance's stream of item 1 stops between
// two iterations, before it would run on a map that moved the item, and
// the new owner continues from the cursor at its next fire. Every record
// is processed exactly once, the fences of each item only grow along its
// queue, and no run found itself stale.
func TestStreamingJoin(t *testing.T) {
	longE2E(t)
	dir := t.TempDir()
	for item := range 2 {
		var q strings.Builder
		for i := range 30 {
			q.WriteString("r" + strconv.Itoa(item) + "-" + strconv.Itoa(i) + "\n")
		}
		os.WriteFile(filepath.Join(dir, "queue."+strconv.Itoa(item)), []byte(q.String()), 0o644)
	}
	cfg := `jobs:
  - name: drain
    cron: "@every 3s"
    shardingTotalCount: 2
    dataflow: {streaming: true}
    script:
      command: ` + etcdtest.YAMLQuote(drainQueueScript) + `
      env: {QDIR: ` + etcdtest.YAMLQuote(dir) + `}
`
	path := filepath.Join(dir, "jobs.yaml")
	os.WriteFile(path, []byte(cfg), 0o644)
	e := startEtcd(t)
	cli := e.client()
	a := startShardd(t, e, "a", path)
	etcdtest.Eventually(t, 15*time.Second, "a to stream both items", func() bool {
		return len(lines(filepath.Join(dir, "done"))) >= 6
	})
	b := startShardd(t, e, "b", path)
	etcdtest.Eventually(t, 20*time.Second, "the map to give b item 1", func() bool {
		return agreed(t, cli, "drain", map[string][]int{"a": {0}, "b": {1}}, a, b)
	})
	etcdtest.Eventually(t, 40*time.Second, "both queues drained", func() bool {
		return len(lines(filepath.Join(dir, "done"))) == 60
	})
	time.Sleep(4 * time.Second) // a fire more: nothing left to process
	a.stop(syscall.SIGTERM)
	b.stop(syscall.SIGTERM)

	if stale := lines(filepath.Join(dir, "stale")); len(stale) > 0 {
		t.Errorf("runs found a newer fence on their cursor (a stale owner ran): %v", stale)
	}
	seen := map[string]int{}
	lastFence := map[string]int64{}
	ranOn := map[string]map[string]bool{"0": {}, "1": {}}
	for _, l := range lines(filepath.Join(dir, "done")) {
		f := strings.Split(l, "_")
		if len(f) != 5 {
			t.Fatalf("done line %q", l)
		}
		seen[f[0]]++
		fence, _ := strconv.ParseInt(f[2], 10, 64)
		if fence < lastFence[f[1]] {
			t.Errorf("record %s of item %s processed under fence %d after fence %d", f[0], f[1], fence, lastFence[f[1]])
		}
		lastFence[f[1]] = fence
		ranOn[f[1]][f[3]] = true
	}
	for item := range 2 {
		for i := range 30 {
			r := "r" + strconv.Itoa(item) + "-" + strconv.Itoa(i)
			if seen[r] != 1 {
				t.Errorf("record %s processed %d times, want once", r, seen[r])
			}
		}
	}
	if !ranOn["1"]["a"] || !ranOn["1"]["b"] {
		t.Errorf("item 1's records were processed on %v; want a before the join and b after", ranOn["1"])
	}
	if len(a.find(msg("streaming run stopped"))) == 0 {
		t.Errorf("a never logged a stopped stream: the join did not stop item 1's loop")
	}
}

// lines returns the lines of the file at path, each with its spaces made _.
func lines(path string) []string {
	b, _ := os.ReadFile(path)
	return strings.Fields(strings.ReplaceAll(string(b), " ", "_"))
}
