package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/faultproxy"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// A claim of several items (ClaimAll) gives them one fence: a kill of one
// item that arrives before its run registered stops that item's run, not
// the first of the claim to register.
func TestPendingKillStopsOnlyItsItem(t *testing.T) {
	t.Parallel()
	var l localRuns
	now := time.Now()
	if l.kill(0, 42, operatorKill{by: "token:alice"}, now) {
		t.Fatal("nothing registered yet: the kill must be pending")
	}
	ctx1, cancel1 := context.WithCancelCause(context.Background())
	defer cancel1(nil)
	defer l.register(1, 42, cancel1, now)()
	if cause := context.Cause(ctx1); cause != nil {
		t.Errorf("a kill of item 0 (fence 42) stopped item 1's run of the same claim: cause %v", cause)
	}
	ctx0, cancel0 := context.WithCancelCause(context.Background())
	defer cancel0(nil)
	defer l.register(0, 42, cancel0, now)()
	if context.Cause(ctx0) == nil {
		t.Errorf("item 0's run, the one the operator killed, was not stopped")
	}
}

// The same against a real etcd: a 2-item job with a BEFORE listener claims
// both items in one Txn (one fence), then runs the listener (2 s) before
// the items' runs register. A kill of item 0 meanwhile stops item 0 only.
func TestKillDuringBeforeListenerStopsItsItem(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	before := filepath.Join(dir, "before")
	script := `echo "$SHARDD_ITEM $SHARDD_FENCE" >> ` + filepath.Join(dir, "starts") + `; sleep 3`
	yaml := "jobs:\n  - name: grp\n    cron: '0/6 * * * * ?'\n    shardingTotalCount: 2\n    failover: true\n    script: " + etcdtest.YAMLQuote(script) +
		"\n    listeners:\n      before: " + etcdtest.YAMLQuote("date +%s%N >> "+before+"; sleep 2") + "\n"
	instance(t, srv, "a", yaml)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "the BEFORE listener of a fire", func() bool {
		b, _ := os.ReadFile(before)
		return len(b) > 0
	})
	k, err := admin.New(cli, keys).Kill(ctx, admin.KillRequest{Job: "grp", Items: []int{0}, By: "token:alice"})
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	res, err := admin.New(cli, keys).WaitKill(wctx, "grp", k.Kill)
	if err != nil || res[0].State != keyspace.StateKilled || res[0].Reason != keyspace.ReasonOperator {
		t.Errorf("kill asked for %+v; WaitKill says %+v (%v), want KILLED/operator", k.Runs, res, err)
	}
	hist, err := admin.New(cli, keys).Records(ctx, "grp")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range hist {
		if r.Fence != k.Runs[0].Fence {
			continue
		}
		t.Logf("run of fence %d: item %d %s/%s killedBy %q", r.Fence, r.Item, r.State, r.Reason, r.KilledBy)
		if r.Item != 0 && r.Reason == keyspace.ReasonOperator {
			t.Errorf("the kill of item 0 (fence %d) stopped item %d: %s/%s by %s", r.Fence, r.Item, r.State, r.Reason, r.KilledBy)
		}
		if r.Item == 0 && r.Reason != keyspace.ReasonOperator {
			t.Errorf("item 0, the run killed, ended %s/%s: not stopped", r.State, r.Reason)
		}
	}
}

// When the killed run's fires came meanwhile (an every-second job), the
// item's next run (misfire: true) or a SKIPPED/busy record (misfire: false)
// replaces the KILLED/operator record within milliseconds: WaitKill (what
// `shardd kill` and the API say) finds the run's own record in the history.
func TestWaitKillFindsAKilledRunInTheHistory(t *testing.T) {
	t.Parallel()
	for _, misfire := range []bool{true, false} {
		t.Run("misfire="+map[bool]string{true: "true", false: "false"}[misfire], func(t *testing.T) {
			srv := etcdtest.Shared(t)
			m := "true"
			if !misfire {
				m = "false"
			}
			instance(t, srv, "a", "jobs:\n  - name: sec\n    cron: '* * * * * ?'\n    misfire: "+m+"\n    script: 'sleep 30'\n")
			cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
			etcdtest.Eventually(t, 15*time.Second, "a run", func() bool {
				items, err := cli.Get(ctx, keys.RunningItem("sec", 0))
				return err == nil && len(items.Kvs) == 1
			})
			time.Sleep(1500 * time.Millisecond) // a fire comes while it runs
			k, err := admin.New(cli, keys).Kill(ctx, admin.KillRequest{Job: "sec", By: "token:alice"})
			if err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			// WaitKill right after the put, as `shardd kill` and the API do.
			res, err := admin.New(cli, keys).WaitKill(wctx, "sec", k.Kill)
			hist, _ := admin.New(cli, keys).Records(ctx, "sec")
			var truth string
			for _, r := range hist {
				if r.Fence == k.Runs[0].Fence {
					truth = r.State + "/" + r.Reason
				}
			}
			if truth != "KILLED/operator" || err != nil || res[0].State != keyspace.StateKilled || res[0].Reason != keyspace.ReasonOperator {
				t.Errorf("the run ended %q in the history; WaitKill says %+v, err %v; want KILLED/operator in both", truth, res[0], err)
			}
		})
	}
}

// The owner of a run is cut off from etcd when an operator kills the run:
// the kill request never reaches it, and it fences (killing the run as a
// fence). Once back, the run is not failed over: the kill request in etcd
// names it, and the record says KILLED/operator, as WaitKill reports.
func TestKillOfACutOffOwnerIsNotFailedOver(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	p, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	starts := filepath.Join(t.TempDir(), "starts")
	script := `echo "$SHARDD_SOURCE $SHARDD_FENCE" >> ` + starts + `; sleep 30`
	node := instanceWith(t, srv.Client("http://"+p.Addr()), "a", "jobs:\n  - name: long\n    failover: true\n    script: "+etcdtest.YAMLQuote(script)+"\n")
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 10*time.Second, "a's map", func() bool {
		v, _ := node.View("long")
		return v.Map != nil && len(v.Map.ItemsOf("a")) == 1
	})
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "long", By: "test"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "the run", func() bool { return len(lines(starts)) == 1 })
	p.Blackhole()
	k, err := admin.New(cli, keys).Kill(ctx, admin.KillRequest{Job: "long", By: "token:alice"})
	if err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "a to fence", func() bool { return !node.Up() })
	time.Sleep(3 * time.Second) // the lease (TTL 2s) expires
	p.Restore()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := admin.New(cli, keys).WaitKill(wctx, "long", k.Kill)
	if err != nil || res[0].State != keyspace.StateKilled || res[0].Reason != keyspace.ReasonOperator || !strings.Contains(res[0].Error, "cut off before the kill reached it") {
		t.Errorf("WaitKill: %+v (%v), want KILLED/operator, cut off before the kill reached it", res, err)
	}
	time.Sleep(2 * time.Second) // a failover would have come at once
	got := lines(starts)
	if len(got) > 1 {
		t.Errorf("the run an operator killed (fence %d) was run again: %v", k.Runs[0].Fence, got[1:])
	}
}

// A trigger queued behind a long run waits in etcd until its item served
// it: when the item moves (a reshard) before the run ends, the new owner
// runs it, whatever the instances' clocks say (they jump a minute ahead
// here, as a run of more than a minute would take: the trigger's lease,
// an hour, is etcd's to count).
func TestQueuedTriggerServedAfterTheItemMoves(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	starts := filepath.Join(t.TempDir(), "starts")
	script := `echo "$SHARDD_TRIGGER_PARAMETER" >> ` + starts + `; sleep 6`
	var offset atomic.Int64
	clock := func(o *Options) {
		o.Now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	}
	yaml := "jobs:\n  - name: long\n    script: " + etcdtest.YAMLQuote(script) + "\n"
	a := instance(t, srv, "a", yaml, clock)
	b := instance(t, srv, "b", yaml, clock)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	var owner string
	etcdtest.Eventually(t, 10*time.Second, "the map over a and b", func() bool {
		v, _ := a.View("long")
		if v.Map == nil || len(v.Map.Instances) != 2 {
			return false
		}
		for id, items := range v.Map.Items {
			if len(items) == 1 {
				owner = id
			}
		}
		return owner != ""
	})
	_ = b
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "long", Param: "T1", By: "test"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "T1 to run", func() bool { return len(lines(starts)) == 1 })
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "long", Param: "T2", By: "test"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	offset.Store(int64(61 * time.Second)) // T2 is a minute old; T1 still runs
	time.Sleep(500 * time.Millisecond)
	if _, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "long", Item: -1, Instance: owner}, true, false); err != nil {
		t.Fatal(err)
	}
	// T1 ends (6 s); the other instance owns the item now and runs T2.
	etcdtest.Eventually(t, 20*time.Second, "T2 to run on the item's new owner", func() bool { return len(lines(starts)) == 2 })
}
