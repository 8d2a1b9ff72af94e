package engine

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/faultproxy"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/shard"
)

// A read and the watch's events fold into the same set whatever order they
// come in: a deletion delivered before a read that still had the key wins,
// a put the read missed is kept, and a gap empties the set until a read
// begun after it folds in.
func TestTriggerSetFoldsAReadAndItsEventsInAnyOrder(t *testing.T) {
	t.Parallel()
	tr := func(id string, rev int64) keyspace.Trigger { return keyspace.Trigger{ID: id, Rev: rev, ModRev: rev} }
	ids := func(s *triggerSet) string {
		var out []string
		for _, t := range s.pending() {
			out = append(out, t.ID)
		}
		return strings.Join(out, ",")
	}
	var s triggerSet
	t1, t2, t3 := tr("t1", 10), tr("t2", 20), tr("t3", 30)
	s.apply("t0", &keyspace.Trigger{ID: "t0", Rev: 5, ModRev: 5}, 5)
	s.apply("t0", nil, 6) // deleted before any read began: no read can bring it back
	gen := s.begin()
	if !s.apply("t2", &t2, 20) || s.apply("t2", &t2, 20) {
		t.Fatal("a new put must say added, once")
	}
	s.apply("t1", nil, 25) // t1 deleted at 25, delivered before the read at 22 that still has it
	if s.complete {
		t.Fatal("complete before any read")
	}
	if !s.fill(gen, []keyspace.Trigger{t1, t2}) {
		t.Fatal("the read did not fold in")
	}
	if got := ids(&s); got != "t2" {
		t.Fatalf("after the read: %s, want t2 (t1's deletion is newer than the read)", got)
	}
	s.apply("t3", &t3, 30)
	s.apply("t2", nil, 31)
	if got := ids(&s); got != "t3" {
		t.Fatalf("after events: %s, want t3", got)
	}
	gen = s.begin()
	s.lost()
	if s.complete || ids(&s) != "" {
		t.Fatal("a gap must empty the set")
	}
	if s.fill(gen, []keyspace.Trigger{t3}) {
		t.Fatal("a read begun before the gap folded in")
	}
	if gen = s.begin(); s.fill(gen, nil) {
		t.Fatal("a failed read made the set complete")
	}
	gen = s.begin()
	s.apply("t4", &keyspace.Trigger{ID: "t4", Rev: 40, ModRev: 40}, 40)
	if !s.fill(gen, []keyspace.Trigger{t3}) || ids(&s) != "t3,t4" || len(s.keys) != 2 {
		t.Fatalf("after the gap's read: %s complete %v (%d keys), want t3,t4", ids(&s), s.complete, len(s.keys))
	}
}

// An item has nothing left to serve when its record served the trigger (a
// newer one counts: triggers are served oldest first) or it is disabled,
// which the deleting Txn must check.
func TestUnservedCountsRecordsAndDisabledItems(t *testing.T) {
	t.Parallel()
	rec := func(trigger int64) *keyspace.ItemRecord {
		return &keyspace.ItemRecord{State: keyspace.StateDone, Trigger: trigger}
	}
	items := keyspace.JobItems{Items: map[int]keyspace.ItemState{
		0: {Record: rec(50)}, 1: {Record: rec(70)}, 2: {Record: rec(10), Disabled: true}, 3: {Record: rec(10)},
	}}
	for _, tc := range []struct {
		tr   keyspace.Trigger
		left bool
		off  []int
	}{
		{keyspace.Trigger{Rev: 50, Items: []int{0, 1}}, false, nil},
		{keyspace.Trigger{Rev: 50, Items: []int{0, 2}}, false, []int{2}},
		{keyspace.Trigger{Rev: 60, Items: []int{0}}, true, nil},
		{keyspace.Trigger{Rev: 50}, true, nil},                      // item 3 is still to serve it
		{keyspace.Trigger{Rev: 50, Items: []int{1, 9}}, false, nil}, // no item 9
	} {
		left, off := unserved(tc.tr, 4, items)
		if left != tc.left || !slices.Equal(off, tc.off) {
			t.Errorf("trigger %d of items %v: left %v off %v, want %v %v", tc.tr.Rev, tc.tr.Items, left, off, tc.left, tc.off)
		}
	}
}

// Two triggers waiting for one item are served one run each, oldest first,
// and deleted once served.
func TestTriggersAreServedOldestFirstOncePerItem(t *testing.T) {
	t.Parallel()
	f := newFakeNode(t, "jobs:\n  - name: j\n    script: \"true\"\n", map[string][]int{"a": {0}})
	f.set(0, keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: noon, Sched: noon, State: keyspace.StateDone, Attempt: 1, End: noon}})
	clock := &fakeClock{now: noon.Add(time.Minute)}
	j, wait := loopOn(f, clock, nil)
	f.putTrigger(keyspace.Trigger{ID: "b-second", Param: "first"}) // ids sort the other way round
	f.putTrigger(keyspace.Trigger{ID: "a-first", Param: "second"})
	for range 4 {
		j.reconcile(context.Background())
		wait()
	}
	var params []string
	for _, c := range f.claims {
		params = append(params, c.Param)
	}
	if !slices.Equal(params, []string{"first", "second"}) || len(f.triggers) != 0 {
		t.Fatalf("runs by parameter: %q (want first, second), left in etcd: %d", params, len(f.triggers))
	}
}

// slowJob's runs append "item instance source param" to dir/runs; a run
// whose parameter is slowN sleeps N seconds.
func slowJob(dir string, total int) string {
	return fmt.Sprintf(`jobs:
  - name: j
    shardingTotalCount: %d
    failover: true
    script: 'echo "$SHARDD_ITEM $SHARDD_INSTANCE $SHARDD_SOURCE $SHARDD_TRIGGER_PARAMETER" >> %s/runs; case "$SHARDD_TRIGGER_PARAMETER" in slow*) sleep "${SHARDD_TRIGGER_PARAMETER#slow}";; esac'
`, total, dir)
}

// servedBy counts, per item, the runs of dir/runs with parameter param.
func servedBy(dir, param string) map[string]int {
	m := map[string]int{}
	for _, l := range lines(filepath.Join(dir, "runs")) {
		if f := strings.Split(l, "_"); len(f) == 4 && f[3] == param {
			m[f[0]]++
		}
	}
	return m
}

// waitTriggerGone waits until the trigger's key is deleted (served by
// every item).
func waitTriggerGone(t *testing.T, cli *clientv3.Client, tr admin.Triggered) {
	t.Helper()
	etcdtest.Eventually(t, 20*time.Second, "trigger "+tr.ID+" deleted once served", func() bool {
		resp, err := cli.Get(context.Background(), keyspace.NewKeys("").Trigger("j", tr.ID))
		return err == nil && len(resp.Kvs) == 0
	})
}

// A trigger queued behind a long run on a is served by b for the item the
// run held when b joins and takes the item: b reads the triggers in etcd,
// it does not only watch for new ones.
func TestTriggerQueuedBehindARunIsServedByTheItemsNewOwner(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := slowJob(dir, 2)
	a := instance(t, srv, "a", yaml)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "a's map", func() bool { v, _ := a.View("j"); return v.Map != nil && len(v.Map.Instances) == 1 })
	tr1, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "j", Param: "slow5"})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr1.Busy) != 0 {
		t.Errorf("the first trigger says items %v are running; nothing was", tr1.Busy)
	}
	etcdtest.Eventually(t, 10*time.Second, "both items running the first trigger", func() bool { return len(servedBy(dir, "slow5")) == 2 })
	tr2, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "j", Param: "T2"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tr2.Busy, []int{0, 1}) {
		t.Errorf("a trigger while both items run says items %v are busy, want [0 1] (it is queued behind them)", tr2.Busy)
	}
	b := instance(t, srv, "b", yaml)
	etcdtest.Eventually(t, 10*time.Second, "item 1 moved to b", func() bool {
		v, _ := b.View("j")
		return v.Map != nil && slices.Equal(v.Map.ItemsOf("b"), []int{1})
	})
	etcdtest.Eventually(t, 25*time.Second, "T2 on both items", func() bool { return len(servedBy(dir, "T2")) == 2 })
	waitTriggerGone(t, cli, tr2)
	if s := servedBy(dir, "T2"); s["0"] != 1 || s["1"] != 1 {
		t.Errorf("trigger T2 (every item) was served %v times per item, want once each; runs %q", s, lines(filepath.Join(dir, "runs")))
	}
	if !slices.Contains(lines(filepath.Join(dir, "runs")), "1_b_MANUAL_T2") {
		t.Errorf("item 1's new owner b did not serve T2: runs %q", lines(filepath.Join(dir, "runs")))
	}
}

// A trigger queued behind a run survives the instance's restart: the run
// is cut at shutdown and failed over, then the trigger runs, once.
func TestTriggerQueuedBehindARunSurvivesARestart(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := slowJob(dir, 1)
	short := func(o *Options) { o.ShutdownGrace = 200 * time.Millisecond }
	a, stopA := startInstance(t, srv.Client(), "a", yaml, short)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "a's map", func() bool { v, _ := a.View("j"); return v.Map != nil && len(v.Map.Instances) == 1 })
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "j", Param: "slow3"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "the first trigger's run", func() bool { return len(servedBy(dir, "slow3")) == 1 })
	tr2, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "j", Param: "T2"})
	if err != nil {
		t.Fatal(err)
	}
	stopA() // the run is killed at shutdown, T2 not served
	if n := len(servedBy(dir, "T2")); n != 0 {
		t.Fatalf("T2 ran before the restart (%d)", n)
	}
	startInstance(t, srv.Client(), "a", yaml, short)
	etcdtest.Eventually(t, 25*time.Second, "T2 after the restart", func() bool { return servedBy(dir, "T2")["0"] >= 1 })
	waitTriggerGone(t, cli, tr2)
	runs := lines(filepath.Join(dir, "runs"))
	if servedBy(dir, "T2")["0"] != 1 || !slices.Contains(runs, "0_a_FAILOVER_slow3") {
		t.Errorf("runs %q: want the cut run failed over, then T2 once", runs)
	}
}

// A trigger queued behind a run survives a reload that removes the job and
// adds it back: the new job loop reads it from etcd.
func TestTriggerQueuedBehindARunSurvivesAReload(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := slowJob(dir, 1)
	c, err := config.Parse("jobs.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	a, eng, _ := startEngine(t, srv.Client(), "a", yaml)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "a's map", func() bool { v, _ := a.View("j"); return v.Map != nil && len(v.Map.Instances) == 1 })
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "j", Param: "slow3"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "the first trigger's run", func() bool { return len(servedBy(dir, "slow3")) == 1 })
	tr2, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "j", Param: "T2"})
	if err != nil {
		t.Fatal(err)
	}
	hasLoop := func() bool {
		eng.mu.Lock()
		defer eng.mu.Unlock()
		_, ok := eng.jobs["j"]
		return ok
	}
	a.SetJobs(nil)
	eng.Resync()
	etcdtest.Eventually(t, 5*time.Second, "the job's loop removed", func() bool { return !hasLoop() })
	a.SetJobs(c.Jobs)
	eng.Resync()
	etcdtest.Eventually(t, 5*time.Second, "the job's loop back", hasLoop)
	etcdtest.Eventually(t, 25*time.Second, "T2 after the reload", func() bool { return servedBy(dir, "T2")["0"] >= 1 })
	waitTriggerGone(t, cli, tr2)
	if s1, s2 := servedBy(dir, "slow3")["0"], servedBy(dir, "T2")["0"]; s1 != 1 || s2 != 1 {
		t.Errorf("runs %q: want the first run once (it went on through the reload), then T2 once", lines(filepath.Join(dir, "runs")))
	}
}

// `shardd enable child` returns, then the parent fires and succeeds, while
// the child's map, which only its (cut-off) leader rewrites, still says
// disabled: the child's instance must not drop the upstream trigger on
// that view (the drop's Txn compares the disable mark, gone in etcd), and
// the child runs once its new map comes.
func TestUpstreamTriggerKeptWhenTheChildIsEnabledBeforeItsMapSaysSo(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := `jobs:
  - name: parent
    script: 'echo "$SHARDD_INSTANCE" >> ` + dir + `/parent'
  - name: child
    dependsOn: [parent]
    script: 'echo "$SHARDD_PARENT_FIRE" >> ` + dir + `/child'
`
	// l leads the child's map (the preferred candidate) and runs nothing;
	// it reaches etcd through a proxy.
	lid := "l0"
	for i := 0; shard.Pick("child", []string{lid, "r"}) != lid; i++ {
		lid = "l" + string(rune('a'+i))
	}
	proxy, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	c, err := config.Parse("jobs.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	lnode, err := coord.New(coord.Options{Client: srv.Client("http://" + proxy.Addr()), ID: lid, TTL: 2 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, c.Jobs)
	if err != nil {
		t.Fatal(err)
	}
	lctx, lcancel := context.WithCancel(context.Background())
	ldone := make(chan struct{})
	go func() { defer close(ldone); lnode.Run(lctx) }()
	t.Cleanup(func() { lcancel(); <-ldone })
	r := instance(t, srv, "r", yaml)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 20*time.Second, "both instances in both maps", func() bool {
		pv, _ := r.View("parent")
		cv, _ := r.View("child")
		return pv.Map != nil && len(pv.Map.Instances) == 2 && cv.Map != nil && len(cv.Map.Instances) == 2
	})
	for _, job := range []string{"parent", "child"} { // r runs both; l only leads
		if _, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: job, Item: -1, Instance: lid}, true, false); err != nil {
			t.Fatal(err)
		}
	}
	etcdtest.Eventually(t, 20*time.Second, "r alone runs both jobs, l leads the child", func() bool {
		pv, _ := r.View("parent")
		cv, _ := r.View("child")
		return pv.Map != nil && slices.Equal(pv.Map.Instances, []string{"r"}) && len(pv.Children["child"].Parents) == 1 &&
			cv.Map != nil && slices.Equal(cv.Map.Instances, []string{"r"}) && cv.Map.Leader == lid
	})
	if _, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "child", Item: -1}, true, false); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "r sees the child disabled", func() bool { cv, _ := r.View("child"); return cv.Map != nil && cv.Map.Disabled })

	// The child's leader is cut off; the operator enables the child, then
	// the parent fires (a manual trigger) and succeeds.
	proxy.Blackhole()
	res, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "child", Item: -1}, false, false)
	if err != nil || !res.Changed {
		t.Fatalf("enable child: %+v %v", res, err)
	}
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "the parent's run", func() bool { return len(lines(filepath.Join(dir, "parent"))) == 1 })
	etcdtest.Eventually(t, 10*time.Second, "the parent's fire complete", func() bool {
		resp, err := cli.Get(ctx, keys.LastSuccess("parent"))
		return err == nil && len(resp.Kvs) == 1
	})
	if cv, _ := r.View("child"); cv.Map == nil || !cv.Map.Disabled {
		t.Log("the child's map was rewritten before the parent fire completed: the race was not reached this time")
	}
	etcdtest.Eventually(t, 20*time.Second, "r to lead the child and enable its map", func() bool {
		cv, _ := r.View("child")
		return cv.Map != nil && !cv.Map.Disabled
	})
	etcdtest.Eventually(t, 15*time.Second, "the child's run", func() bool { return len(lines(filepath.Join(dir, "child"))) >= 1 })
	etcdtest.Eventually(t, 10*time.Second, "the child's trigger deleted once served", func() bool {
		resp, err := cli.Get(ctx, keys.Triggers("child"), clientv3.WithPrefix())
		return err == nil && len(resp.Kvs) == 0
	})
	if n := len(lines(filepath.Join(dir, "child"))); n != 1 {
		t.Errorf("the child was enabled before the parent fire, which succeeded; it ran %d times (want 1)", n)
	}
}

// A job loop acting on a view that says the job is disabled, while etcd
// says it is enabled (a map its leader has not rewritten after an enable),
// drops no trigger: the drop's Txn compares the disable mark. Once etcd
// says disabled, the same view drops it.
func TestTriggerNotDroppedOnAViewThatLagsAnEnable(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	a, eng, _ := startEngine(t, srv.Client(), "a", slowJob(dir, 1))
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "a's map", func() bool { v, _ := a.View("j"); return v.Map != nil && len(v.Map.Instances) == 1 })
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "j", Param: "slow5"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "the first trigger's run", func() bool { return len(servedBy(dir, "slow5")) == 1 })
	tr2, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "j", Param: "T2"}) // waits behind it
	if err != nil {
		t.Fatal(err)
	}
	eng.mu.Lock()
	j := eng.jobs["j"]
	eng.mu.Unlock()
	etcdtest.Eventually(t, 5*time.Second, "the loop to know T2", func() bool {
		return j.loadTriggers(ctx) && slices.ContainsFunc(j.pendingTriggers(), func(tr keyspace.Trigger) bool { return tr.Rev == tr2.Rev })
	})
	stale, _ := a.View("j")
	m := *stale.Map
	m.Disabled, stale.Map = true, &m
	j.dropDisabled(ctx, stale)
	if resp, err := cli.Get(ctx, keys.Trigger("j", tr2.ID)); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("T2 dropped on a view that says disabled while etcd says enabled (%v)", err)
	}
	if _, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "j", Item: -1}, true, false); err != nil {
		t.Fatal(err)
	}
	j.dropDisabled(ctx, stale)
	waitTriggerGone(t, cli, tr2) // dropped: by this call, or by the loop's own reconcile
	if n := servedBy(dir, "T2")["0"]; n != 0 {
		t.Errorf("T2 ran %d times", n)
	}
}

// Per-fire RANDOM: a manual run's "fire" is each instance's own time.Now(),
// so each instance draws the owner independently; often nobody owns it (the
// trigger then waits for the next sweep), sometimes both do.
func TestRegressionManualTriggerOwnerPerFire(t *testing.T) {
	t.Parallel()
	c, err := config.Parse("jobs.yaml", []byte("jobs:\n  - name: j\n    cron: \"@every 10s\"\n    strategy: RANDOM\n    script: \"true\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	v := coord.JobView{Job: c.Jobs[0], Map: &keyspace.ShardMap{Instances: []string{"a", "b"}, PerFire: true, Total: 1}}
	own := func(id string, now time.Time) bool {
		j := &jobLoop{e: &Engine{opts: Options{Node: idOnly{id: id}}}}
		mine, _ := j.ownership(context.Background(), v)(0, now, keyspace.SourceManual)
		return mine
	}
	nobody, both := 0, 0
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const n = 1000
	for i := range n {
		t0 := base.Add(time.Duration(i) * 7919 * time.Microsecond)
		a, b := own("a", t0), own("b", t0.Add(3*time.Millisecond)) // the two reconciles, 3ms apart
		if !a && !b {
			nobody++
		}
		if a && b {
			both++
		}
	}
	t.Logf("of %d triggers: nobody owns %d, both own %d", n, nobody, both)
	if nobody > 0 {
		t.Errorf("%d of %d manual triggers owned by no instance at their first reconcile", nobody, n)
	}
}

// The trigger delay runs from the fire to the first attempt's start, not
// to the last retry's.
func TestTriggerDelayWithRetries(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	var mu sync.Mutex
	var runs []Run
	yaml := `jobs:
  - name: slowfail
    cron: "@every 10s"
    retries: 1
    retryBackoff: 100ms
    script: "sleep 1; exit 1"
`
	instance(t, srv, "a", yaml, func(o *Options) {
		o.Observe = func(r Run) { mu.Lock(); runs = append(runs, r); mu.Unlock() }
	})
	etcdtest.Eventually(t, 30*time.Second, "a run", func() bool { mu.Lock(); defer mu.Unlock(); return len(runs) > 0 })
	mu.Lock()
	r := runs[0]
	mu.Unlock()
	if d := r.Started.Sub(r.Fire); d < 0 || d > 900*time.Millisecond {
		t.Errorf("trigger delay %s (fire %s, started %s), want the first attempt's, well under the 1 s the first try ran", d, r.Fire, r.Started)
	}
}

// An item enabled wakes the job (OnChange, the disable marks): a trigger
// that more disabled items than one Txn can compare (MaxTriggerGuardItems)
// would leave unserved stays, and the items run it once enabled. Nothing
// else wakes this job (no schedule; the sweep is off here).
func TestEnabledItemServesAWaitingTrigger(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	total := coord.MaxTriggerGuardItems + 2
	yaml := fmt.Sprintf("jobs:\n  - name: wide\n    shardingTotalCount: %d\n    script: %s\n", total, etcdtest.YAMLQuote(strings.ReplaceAll(ledgerTo(path), "$1", "start")))
	node := instance(t, srv, "a", yaml)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 10*time.Second, "the map", func() bool {
		v, _ := node.View("wide")
		return v.Map != nil && len(v.Map.ItemsOf("a")) == total
	})
	adm := admin.New(cli, keys)
	for item := 1; item < total; item++ {
		if _, err := adm.SetDisabled(ctx, admin.Target{Job: "wide", Item: item}, true, false); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := adm.Trigger(ctx, admin.TriggerRequest{Job: "wide", By: "test"}); err != nil {
		t.Fatal(err)
	}
	ran := func(item int) bool {
		for _, ev := range events(t, path) {
			if ev.Item == item {
				return true
			}
		}
		return false
	}
	etcdtest.Eventually(t, 10*time.Second, "item 0's run of the trigger", func() bool { return ran(0) })
	time.Sleep(time.Second)
	if n := len(events(t, path)); n != 1 {
		t.Fatalf("%d runs, want item 0's alone while the others are disabled", n)
	}
	if _, err := adm.SetDisabled(ctx, admin.Target{Job: "wide", Item: 1}, false, false); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 5*time.Second, "item 1's run of the trigger, once enabled", func() bool { return ran(1) })
}
