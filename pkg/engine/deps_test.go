package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// depsJobs are a parent of 3 items whose item 1 fails when its trigger's
// parameter is "fail", and a child of 2 items: each run appends a line to
// its own file.
func depsJobs(dir string) string {
	return `jobs:
  - name: parent
    shardingTotalCount: 3
    script: 'echo "$SHARDD_ITEM $SHARDD_FENCE" >> ` + dir + `/parent; [ "$SHARDD_TRIGGER_PARAMETER" = fail ] && [ $SHARDD_ITEM = 1 ] && exit 3; exit 0'
  - name: child
    dependsOn: [parent]
    shardingTotalCount: 2
    script: 'echo "$SHARDD_ITEM $SHARDD_SOURCE $SHARDD_PARENT_JOB $SHARDD_PARENT_FIRE" >> ` + dir + `/child'
`
}

// childRecords returns the child's history, oldest first.
func childRecords(t *testing.T, node *coord.Node, job string) []keyspace.ItemRecord {
	t.Helper()
	recs, err := node.History(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// A child runs each of its items once per completed, successful fire of
// its parent, wherever the parent's items ran, with the parent's name and
// fire in its environment; a failed parent fire is recorded on the child
// as SKIPPED/upstream-failed and runs nothing; a manual trigger with
// NoPropagate does not reach the child.
func TestChildRunsOncePerParentFire(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := depsJobs(dir)
	a := instance(t, srv, "a", yaml)
	instance(t, srv, "b", yaml)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "the parent's children index and both maps", func() bool {
		v, _ := a.View("parent")
		c, _ := a.View("child")
		return len(v.Children["child"].Parents) == 1 && v.Map != nil && len(v.Map.Instances) == 2 && c.Map != nil && len(c.Map.Instances) == 2
	})
	// The status of one job, as the console reads it, links the graph.
	for job, want := range map[string]string{"parent": "[] [child] []", "child": "[parent] [] []"} {
		st, err := admin.New(cli, keys).JobStatus(ctx, job)
		if err != nil || len(st.Jobs) != 1 {
			t.Fatalf("status of %s: %v", job, err)
		}
		j := st.Jobs[0]
		if got := fmt.Sprint(j.DependsOn, j.Children, j.Problems); got != want {
			t.Errorf("status of %s: dependsOn, children, problems = %s, want %s", job, got, want)
		}
	}
	trigger := func(r admin.TriggerRequest) {
		t.Helper()
		r.Job = "parent"
		if _, err := admin.New(cli, keys).Trigger(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	childLines := func() []string { return lines(filepath.Join(dir, "child")) }

	trigger(admin.TriggerRequest{})
	etcdtest.Eventually(t, 15*time.Second, "the child's 2 items to run", func() bool { return len(childLines()) == 2 })
	for _, l := range childLines() {
		if f := strings.Split(l, "_"); len(f) != 4 || f[1] != keyspace.SourceUpstream || f[2] != "parent" || f[3] == "" {
			t.Errorf("child run %q: want item UPSTREAM parent <fire>", l)
		}
	}
	if n := len(lines(filepath.Join(dir, "parent"))); n != 3 {
		t.Errorf("parent ran %d items, want 3", n)
	}

	// Not propagated: the parent runs, the child does not.
	trigger(admin.TriggerRequest{NoPropagate: true})
	etcdtest.Eventually(t, 15*time.Second, "the parent's second fire", func() bool { return len(lines(filepath.Join(dir, "parent"))) == 6 })

	// A failing item blocks the child for that fire, and the child says so.
	trigger(admin.TriggerRequest{Param: "fail"})
	etcdtest.Eventually(t, 15*time.Second, "the child's items to record the failed parent fire", func() bool {
		n := 0
		for _, r := range childRecords(t, a, "child") {
			if r.State == keyspace.StateSkipped && r.Reason == keyspace.SkipUpstreamFailed {
				n++
			}
		}
		return n == 2
	})
	for _, r := range childRecords(t, a, "child") {
		if r.Reason == keyspace.SkipUpstreamFailed && !strings.Contains(r.Error, "item(s) [1] failed") {
			t.Errorf("upstream-failed record says %q, want it to name item 1", r.Error)
		}
	}

	// One more good fire: one more child run per item, and no other.
	trigger(admin.TriggerRequest{})
	etcdtest.Eventually(t, 15*time.Second, "the child's items to run again", func() bool { return len(childLines()) == 4 })
	time.Sleep(2 * time.Second) // a second run of the child would show by now
	if got := childLines(); len(got) != 4 {
		t.Errorf("child ran %d times, want 4 (2 items x 2 successful propagated parent fires): %v", len(got), got)
	}
	// Served upstream triggers are deleted.
	etcdtest.Eventually(t, 10*time.Second, "the child's served triggers to be deleted", func() bool {
		resp, err := cli.Get(ctx, keys.Triggers("child"), clientv3.WithPrefix())
		return err == nil && len(resp.Kvs) == 0
	})
}

// An upstream trigger put while no instance of the child runs is served
// when one starts: it is durable in etcd, read at start.
func TestUpstreamTriggerWaitsForTheChild(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := depsJobs(dir)
	parentOnly := yaml[:strings.Index(yaml, "  - name: child")]
	a := instance(t, srv, "a", parentOnly)
	_, stopB := startInstance(t, srv.Client(), "b", yaml)
	etcdtest.Eventually(t, 15*time.Second, "the parent's children index", func() bool {
		v, _ := a.View("parent")
		return len(v.Children["child"].Parents) == 1
	})
	stopB()
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "b to leave the parent", func() bool {
		v, _ := a.View("parent")
		return v.Map != nil && slices.Equal(v.Map.Instances, []string{"a"})
	})
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 15*time.Second, "the upstream trigger in etcd", func() bool {
		resp, err := cli.Get(ctx, keys.Triggers("child"), clientv3.WithPrefix())
		return err == nil && len(resp.Kvs) == 1
	})
	time.Sleep(time.Second)
	if n := len(lines(filepath.Join(dir, "child"))); n != 0 {
		t.Fatalf("the child ran %d times with no instance of it up", n)
	}
	instance(t, srv, "c", yaml)
	etcdtest.Eventually(t, 20*time.Second, "the child's items to run on c", func() bool { return len(lines(filepath.Join(dir, "child"))) == 2 })
}

// A child of two parents fires when each has a successful fire it has not
// consumed: after A alone, nothing; after B too, once; then A again,
// nothing until B again.
func TestChildOfTwoParents(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := `jobs:
  - name: pa
    script: "true"
  - name: pb
    shardingTotalCount: 2
    script: "true"
  - name: both
    dependsOn: [pa, pb]
    script: 'echo "$SHARDD_PARENT_JOB" >> ` + dir + `/both'
`
	a := instance(t, srv, "a", yaml)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "both parents' children index", func() bool {
		va, _ := a.View("pa")
		vb, _ := a.View("pb")
		return len(va.Children["both"].Parents) == 2 && len(vb.Children["both"].Parents) == 2
	})
	runs := func() []string { return lines(filepath.Join(dir, "both")) }
	fire := func(job string) {
		t.Helper()
		before := len(childRecords(t, a, job))
		if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: job}); err != nil {
			t.Fatal(err)
		}
		etcdtest.Eventually(t, 15*time.Second, job+"'s fire to end", func() bool {
			n := 0
			for _, r := range childRecords(t, a, job) {
				if r.State == keyspace.StateDone {
					n++
				}
			}
			return n > before
		})
		time.Sleep(1500 * time.Millisecond) // the child's run, if any, is done by now
	}
	fire("pa")
	if got := runs(); len(got) != 0 {
		t.Fatalf("after pa alone the child ran: %v", got)
	}
	fire("pb")
	if got := runs(); !slices.Equal(got, []string{"pb"}) {
		t.Fatalf("after pa then pb: child runs %v, want one, triggered by pb", got)
	}
	fire("pa")
	if got := runs(); len(got) != 1 {
		t.Fatalf("after pa again: child runs %v, want still one", got)
	}
	fire("pb")
	if got := runs(); !slices.Equal(got, []string{"pb", "pb"}) {
		t.Fatalf("after pb again: child runs %v, want two", got)
	}
}

// An instance that records its items' outcomes and dies before noting
// them (forgetNotes: it never notes) leaves the notes to the items' next
// owner: the parent fire completes when the other instance takes the
// items over, and the child runs once.
func TestUnnotedOutcomesAreNotedByTheNextOwner(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := depsJobs(dir)
	_, stopA := startInstance(t, srv.Client(), "a", yaml, func(o *Options) { o.forgetNotes = true })
	b := instance(t, srv, "b", yaml)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "the parent's items on both instances", func() bool {
		v, _ := b.View("parent")
		return len(v.Children["child"].Parents) == 1 && v.Map != nil && len(v.Map.ItemsOf("a")) > 0 && len(v.Map.ItemsOf("b")) > 0
	})
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 15*time.Second, "the parent's 3 items to run", func() bool { return len(lines(filepath.Join(dir, "parent"))) == 3 })
	time.Sleep(2 * time.Second)
	if n := len(lines(filepath.Join(dir, "child"))); n != 0 {
		t.Fatalf("the child ran %d times though a's outcomes were never noted", n)
	}
	stopA() // its items move to b, whose reconcile notes their records
	etcdtest.Eventually(t, 20*time.Second, "the child's 2 items to run", func() bool { return len(lines(filepath.Join(dir, "child"))) == 2 })
	time.Sleep(time.Second)
	if n := len(lines(filepath.Join(dir, "child"))); n != 2 {
		t.Errorf("the child ran %d times, want 2 (once per item)", n)
	}
}

// Disabling an item of a parent warns that its children will record
// upstream-failed for each fire; disabling an item of a job without
// children does not.
func TestDisablingAParentItemWarnsOfItsChildren(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	a := instance(t, srv, "a", depsJobs(t.TempDir()))
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "the parent's children index", func() bool {
		v, _ := a.View("parent")
		return len(v.Children["child"].Parents) == 1
	})
	res, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "parent", Item: 0}, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Message, "warning: jobs run after parent's fires (child)") || !strings.Contains(res.Message, "upstream-failed") {
		t.Errorf("disabling a parent's item: %q, want a warning naming the child", res.Message)
	}
	res, err = admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "child", Item: 0}, true, false)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(res.Message, "warning") {
		t.Errorf("disabling an item of a job without children warns: %q", res.Message)
	}
}

// A disabled child does not run its parents' fires, then or when enabled:
// the upstream triggers that reach it are dropped, as its own fires are
// recorded skipped.
func TestDisabledChildDropsUpstreamTriggers(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	a := instance(t, srv, "a", depsJobs(dir))
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "the parent's children index", func() bool {
		v, _ := a.View("parent")
		return len(v.Children["child"].Parents) == 1
	})
	if _, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "child", Item: -1}, true, false); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "the child disabled in a's view", func() bool {
		v, _ := a.View("child")
		return v.Map != nil && v.Map.Disabled
	})
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 15*time.Second, "the parent's fire to complete (its lastsuccess is put with the child's trigger)", func() bool {
		resp, err := cli.Get(ctx, keys.LastSuccess("parent"))
		return err == nil && len(resp.Kvs) == 1
	})
	etcdtest.Eventually(t, 10*time.Second, "the child's trigger to be dropped", func() bool {
		resp, err := cli.Get(ctx, keys.Triggers("child"), clientv3.WithPrefix())
		return err == nil && len(resp.Kvs) == 0
	})
	if _, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "child", Item: -1}, false, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if n := len(lines(filepath.Join(dir, "child"))); n != 0 {
		t.Errorf("the child ran %d times for a parent fire that completed while it was disabled", n)
	}
	// Enabled, it runs after the next fire.
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 15*time.Second, "the enabled child's 2 items to run", func() bool { return len(lines(filepath.Join(dir, "child"))) == 2 })
}

// `shardd trigger parent --fire <past fire>` says the children run after
// it, and they do: the re-run is a fire of its own, asked for now, so a
// child that began to depend on the parent after the past fire runs for
// it, with the re-run fire's time.
func TestRerunOfAPastFireTriggersTheChildren(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := `jobs:
  - name: parent
    cron: "0 0 0 1 1 ?"
    shardingTotalCount: 2
    script: 'echo "$SHARDD_ITEM $SHARDD_SOURCE $SHARDD_FIRE_TIME" >> ` + dir + `/parent'
  - name: child
    dependsOn: [parent]
    script: 'echo "$SHARDD_PARENT_FIRE" >> ` + dir + `/child'
`
	a := instance(t, srv, "a", yaml)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "the parent's children index and both maps", func() bool {
		v, _ := a.View("parent")
		c, _ := a.View("child")
		return len(v.Children["child"].Parents) == 1 && v.Map != nil && c.Map != nil
	})
	past := time.Date(time.Now().UTC().Year(), 1, 1, 0, 0, 0, 0, time.UTC) // the parent's last scheduled fire, before the child's since
	res, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent", Fire: past.Format(time.RFC3339)})
	if err != nil {
		t.Fatal(err)
	}
	if res.NoPropagate || !slices.Equal(res.Children, []string{"child"}) {
		t.Fatalf("the trigger does not say the child runs after it: %+v", res)
	}
	etcdtest.Eventually(t, 15*time.Second, "the parent's 2 items to re-run the past fire", func() bool { return len(lines(filepath.Join(dir, "parent"))) == 2 })
	etcdtest.Eventually(t, 15*time.Second, "the child after the re-run", func() bool { return len(lines(filepath.Join(dir, "child"))) >= 1 })
	if got := lines(filepath.Join(dir, "child")); !slices.Equal(got, []string{past.Format(time.RFC3339)}) {
		t.Errorf("the child's runs got SHARDD_PARENT_FIRE %q, want once the re-run fire %s", got, past.Format(time.RFC3339))
	}
}

// A child deployed after a parent fire completed does not run for that
// fire: fires from before the child depended on the parent trigger nothing
// (the index entry's since).
func TestDepsNewChildSkipsOlderParentFires(t *testing.T) {
	t.Parallel()
	longFaults(t)
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	parentOnly := `jobs:
  - name: parent
    shardingTotalCount: 2
    script: 'echo "$SHARDD_ITEM" >> ` + dir + `/parent'
`
	withChild := parentOnly + `  - name: child
    dependsOn: [parent]
    script: 'echo "$SHARDD_PARENT_FIRE" >> ` + dir + `/child'
`
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	a, stopA := startInstance(t, srv.Client(), "a", parentOnly)
	etcdtest.Eventually(t, 15*time.Second, "parent map", func() bool { v, _ := a.View("parent"); return v.Map != nil })
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 15*time.Second, "the parent's fire", func() bool { return len(lines(filepath.Join(dir, "parent"))) == 2 })
	time.Sleep(3 * time.Second)
	stopA()
	deployed := time.Now()
	instance(t, srv, "a", withChild) // the child is deployed; the parent does not fire again
	time.Sleep(15 * time.Second)     // past the sweep (10 s)
	resp, _ := cli.Get(ctx, keys.Fires("parent"), clientv3.WithPrefix())
	for _, kv := range resp.Kvs {
		t.Logf("barrier %s = %s", kv.Key, kv.Value)
	}
	if got := lines(filepath.Join(dir, "child")); len(got) != 0 {
		t.Fatalf("the child, deployed at %s, ran %v for a parent fire that completed before it existed (parent ran %d items, all before the deploy)",
			deployed.UTC().Format(time.RFC3339), got, len(lines(filepath.Join(dir, "parent"))))
	}
}
