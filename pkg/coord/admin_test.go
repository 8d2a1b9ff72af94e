package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// The operator commands check their target against etcd and refuse with
// an error of the right kind, changing nothing.
func TestOperatorCommandsCheckTheirTarget(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t) // of its own: it checks that refused commands leave the revision as it was
	cli := srv.Client()
	keys := keyspace.NewKeys("")
	ctx := context.Background()
	a := startNode(t, srv, "a", jobs(t, "jobs:\n"+job("orders", 3)+job("off", 1, "    disabled: true\n")))
	etcdtest.Eventually(t, 10*time.Second, "orders' map", func() bool { m := etcdtest.StoredMap(cli, "orders"); return m != nil && m.Total == 3 })
	etcdtest.Eventually(t, 10*time.Second, "off's map", func() bool { m := etcdtest.StoredMap(cli, "off"); return m != nil && m.Disabled })
	revBefore := func() int64 {
		resp, err := cli.Get(ctx, "/")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}

	rev := revBefore()
	for _, tc := range []struct {
		name string
		err  error
		want string
		do   func() error
	}{
		{"trigger an unknown job", admin.ErrUnknownJob, `no job "nope" in the cluster at prefix /shardd (jobs: off, orders)`, func() error {
			_, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "nope", By: "t"})
			return err
		}},
		{"trigger a typo of a job", admin.ErrUnknownJob, `no job "order" in the cluster at prefix /shardd (did you mean orders?)`, func() error {
			_, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "order", By: "t"})
			return err
		}},
		{"trigger item 7 of 3", admin.ErrBadTarget, `job "orders" has items 0-2; there is no item 7`, func() error {
			_, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "orders", Items: []int{7}, By: "t"})
			return err
		}},
		{"trigger item -3", admin.ErrBadTarget, "items are numbered from 0", func() error {
			_, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "orders", Items: []int{-3}, By: "t"})
			return err
		}},
		{"trigger a job disabled in its definition", admin.ErrRefused, `job "off" is disabled in its definition (disabled: true, registered by a`, func() error {
			_, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "off", By: "t"})
			return err
		}},
		{"disable an unknown job", admin.ErrUnknownJob, `no job "nope"`, func() error {
			_, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "nope", Item: -1}, true, false)
			return err
		}},
		{"disable item 5 of 3", admin.ErrBadTarget, "there is no item 5", func() error {
			_, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "orders", Item: 5}, true, false)
			return err
		}},
		{"disable an instance that does not run the job", admin.ErrBadTarget, "instance ghost does not run job orders (its instances: a)", func() error {
			_, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "orders", Item: -1, Instance: "ghost"}, true, false)
			return err
		}},
		{"remove a job still defined", admin.ErrRefused, `job "orders" is still defined by live instances (a)`, func() error {
			_, err := admin.New(cli, keys).Remove(ctx, "orders")
			return err
		}},
		{"history of an unknown job", admin.ErrUnknownJob, `no job "nope"`, func() error {
			_, err := admin.New(cli, keys).History(ctx, "nope", -1)
			return err
		}},
	} {
		err := tc.do()
		if !errors.Is(err, tc.err) || !strings.Contains(fmt.Sprint(err), tc.want) {
			t.Errorf("%s: %v, want %v with %q", tc.name, err, tc.err, tc.want)
		}
	}
	if now := revBefore(); now != rev {
		t.Errorf("refused commands wrote to etcd: revision %d -> %d", rev, now)
	}

	// Enabling a job its definition disables is refused, and says where.
	if _, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "off", Item: -1}, false, false); !errors.Is(err, admin.ErrRefused) ||
		!strings.Contains(err.Error(), "stays disabled: its definition says disabled: true") {
		t.Errorf("enable off: %v", err)
	}
	// Disabling twice says so; an item that is disabled cannot be triggered.
	if res, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "orders", Item: 1}, true, false); err != nil || !res.Changed || res.Message != "disabled item 1 of job orders" {
		t.Errorf("disable item 1: %+v %v", res, err)
	}
	if res, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "orders", Item: 1}, true, false); err != nil || res.Changed || !strings.Contains(res.Message, "already disabled") {
		t.Errorf("disable item 1 again: %+v %v", res, err)
	}
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "orders", Items: []int{1}, By: "t"}); !errors.Is(err, admin.ErrRefused) {
		t.Errorf("trigger of a disabled item: %v", err)
	}
	tr, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "orders", By: "t"})
	if err != nil || !slices.Equal(tr.Runs, []int{0, 2}) || !slices.Equal(tr.Disabled, []int{1}) || tr.Rev == 0 {
		t.Errorf("trigger every item with item 1 disabled: %+v %v", tr, err)
	}
	// --force disables an instance before it first starts.
	if res, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "orders", Item: -1, Instance: "ghost"}, true, true); err != nil || !res.Changed || strings.Contains(res.Message, "warning") {
		t.Errorf("forced disable of ghost: %+v %v", res, err)
	}
	// Disabling the job's last enabled instance works, and warns that the
	// job's fires are not run.
	if res, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "orders", Item: -1, Instance: "a"}, true, false); err != nil || !res.Changed ||
		!strings.Contains(res.Message, "warning: no enabled instance is left to run job orders") {
		t.Errorf("disable of the last instance: %+v %v", res, err)
	}
	if res, err := admin.New(cli, keys).SetDisabled(ctx, admin.Target{Job: "orders", Item: -1, Instance: "a"}, false, false); err != nil || !res.Changed {
		t.Errorf("enable a again: %+v %v", res, err)
	}

	// Once no instance defines the job, it can be removed, and is gone.
	a.stop(t)
	st, err := admin.New(cli, keys).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range st.Jobs {
		if j.Name == "orders" && (j.Status != admin.StatusNoInstances || !slices.Equal(j.DisabledInstances, []string{"ghost"})) {
			t.Errorf("orders with no instance: %+v", j)
		}
	}
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "orders", By: "t"}); !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), "no live instance") {
		t.Errorf("trigger with no instance: %v", err)
	}
	if n, err := admin.New(cli, keys).Remove(ctx, "orders"); err != nil || n == 0 {
		t.Fatalf("remove: %d keys, %v", n, err)
	}
	if _, err := admin.New(cli, keys).History(ctx, "orders", -1); !errors.Is(err, admin.ErrUnknownJob) {
		t.Errorf("history after remove: %v", err)
	}
}

// Status reads many jobs in batched Txns: every job is there, each with
// its own map, definition and leader (not a neighbour's).
func TestStatusOfManyJobs(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli := srv.Client()
	const n = 100 // more than two of readJobKeys' Txns
	var b strings.Builder
	b.WriteString("jobs:\n")
	for i := range n {
		b.WriteString(job(fmt.Sprintf("job-%03d", i), i%5+1))
	}
	startNode(t, srv, "a", jobs(t, b.String()))
	etcdtest.Eventually(t, 30*time.Second, "every map", func() bool {
		for i := range n {
			if m := etcdtest.StoredMap(cli, fmt.Sprintf("job-%03d", i)); m == nil || m.Total != i%5+1 {
				return false
			}
		}
		return true
	})
	st, err := admin.New(cli, keyspace.NewKeys("")).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Jobs) != n {
		t.Fatalf("%d jobs in the status, want %d", len(st.Jobs), n)
	}
	for i, js := range st.Jobs {
		name := fmt.Sprintf("job-%03d", i)
		var def struct {
			Name string `json:"name"`
		}
		if js.Definition != nil {
			json.Unmarshal(js.Definition.Job, &def)
		}
		if js.Name != name || js.Total != i%5+1 || len(js.Items) != i%5+1 || js.Leader != "a" || def.Name != name || js.Status != admin.StatusOK {
			t.Errorf("job %d: %s total %d items %d leader %q definition of %q status %s", i, js.Name, js.Total, len(js.Items), js.Leader, def.Name, js.Status)
		}
	}
}

// remove must not succeed while a leaving instance still leads the job:
// its reconcile would see the config missing and write it back. remove
// refuses while an election key exists; a leaving instance does not
// campaign again, so once it resigned remove works, and stays done.
func TestRemoveWaitsForALeavingLeader(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli := srv.Client()
	a := startNode(t, srv, "a", reviewV(t, 3))
	runsTotal(t, cli, 3, a)
	etcdtest.Eventually(t, 5*time.Second, "a leads", func() bool { v, _ := a.View("orders"); return v.Leading })
	if err := a.Leave(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Withdrawn but still leading (a shutdown in progress): refused.
	if _, err := admin.New(cli, keyspace.NewKeys("")).Remove(context.Background(), "orders"); !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), "leads or campaigns") {
		t.Fatalf("remove while a leads: %v", err)
	}
	a.stop(t) // the shutdown ends: a resigns and revokes
	n, err := admin.New(cli, keyspace.NewKeys("")).Remove(context.Background(), "orders")
	if err != nil {
		t.Fatalf("remove: %v", err)
	}
	t.Logf("remove deleted %d keys", n)
	time.Sleep(time.Second)
	resp, err := cli.Get(context.Background(), keyspace.NewKeys("").Config("orders"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) > 0 {
		t.Errorf("remove said it deleted the job, but the leaving leader wrote its config back")
	}
}

// FindRuns finds a job's runs, finished and in progress, by item and by
// fence; ReadInstance finds where the instance that ran one is.
func TestFindRuns(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 3)
	ctx := context.Background()
	fire := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)

	// One claim of items 0 and 1 (one fence); item 0 ends, item 1 runs on.
	res := n.ClaimAll(ctx, claimsOf(t, n, 2, fire))
	for _, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	shared := res[0].Grant.Fence
	if res[1].Grant.Fence != shared {
		t.Fatalf("the claim of two items gave fences %d and %d", shared, res[1].Grant.Fence)
	}
	if err := n.Complete(ctx, res[0].Grant, Outcome{State: keyspace.StateDone, ExitCode: 0, Start: fire, End: fire}); err != nil {
		t.Fatal(err)
	}
	// Item 0 runs again, under a fence of its own, and ends.
	read, _ := n.ReadItems(ctx, "orders")
	g, err := n.Claim(ctx, Claim{Job: "orders", Item: 0, Fire: fire.Add(time.Minute), Attempt: 1, Source: keyspace.SourceManual, Prev: read.Items[0], Sched: fire})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Complete(ctx, g, Outcome{State: keyspace.StateFailed, ExitCode: 1, Start: fire, End: fire}); err != nil {
		t.Fatal(err)
	}
	again := g.Fence

	runs := func(item int, fence int64) string {
		t.Helper()
		recs, err := adminOf(n).FindRuns(ctx, "orders", item, fence)
		if err != nil {
			t.Fatal(err)
		}
		var s []string
		for _, r := range recs {
			s = append(s, fmt.Sprintf("%d-%d %s %s", r.Fence, r.Item, r.State, r.Instance))
		}
		return strings.Join(s, ", ")
	}
	for _, tc := range []struct {
		item  int
		fence int64
		want  string
	}{
		{-1, 0, fmt.Sprintf("%d-0 FAILED a, %d-0 DONE a, %d-1 RUNNING a", again, shared, shared)},
		{0, 0, fmt.Sprintf("%d-0 FAILED a, %d-0 DONE a", again, shared)},
		{1, 0, fmt.Sprintf("%d-1 RUNNING a", shared)},
		{-1, shared, fmt.Sprintf("%d-0 DONE a, %d-1 RUNNING a", shared, shared)},
		{1, again, ""},
		{2, 0, ""},
	} {
		if got := runs(tc.item, tc.fence); got != tc.want {
			t.Errorf("FindRuns(item %d, fence %d) = %q, want %q", tc.item, tc.fence, got, tc.want)
		}
	}

	if _, err := adminOf(n).FindRuns(ctx, "order", -1, 0); !errors.Is(err, admin.ErrUnknownJob) || !strings.Contains(err.Error(), "did you mean orders?") {
		t.Errorf("unknown job: %v", err)
	}
	if _, err := adminOf(n).FindRuns(ctx, "orders", 3, 0); !errors.Is(err, admin.ErrBadTarget) {
		t.Errorf("item out of range: %v", err)
	}
	if total, ok, err := admin.New(n.cli, n.keys).ItemCount(ctx, "orders"); total != 3 || !ok || err != nil {
		t.Errorf("ItemCount(orders) = %d, %v, %v", total, ok, err)
	}
	if _, _, err := admin.New(n.cli, n.keys).ItemCount(ctx, "nope"); !errors.Is(err, admin.ErrUnknownJob) {
		t.Errorf("ItemCount(nope): %v", err)
	}
	info, ok, err := adminOf(n).Instance(ctx, "a")
	if err != nil || !ok || info.ID != "a" || info.Host != "test" {
		t.Errorf("Instance(a) = %+v, %v, %v", info, ok, err)
	}
	if _, ok, err := adminOf(n).Instance(ctx, "gone"); ok || err != nil {
		t.Errorf("Instance(gone) = %v, %v; want not live", ok, err)
	}
}
