package coord

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// claimNext claims item 0 of orders for fire on n's current read.
func claimNext(t *testing.T, n *testNode, fire time.Time) *Grant {
	t.Helper()
	read, err := n.ReadItems(context.Background(), "orders")
	if err != nil {
		t.Fatal(err)
	}
	g, err := n.Claim(context.Background(), Claim{Job: "orders", Item: 0, Fire: fire, Attempt: 1, Source: keyspace.SourceNormal, Prev: read.Items[0], Sched: fire})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// killKeys counts the kill requests of orders in etcd.
func killKeys(t *testing.T, n *testNode) int64 {
	t.Helper()
	resp, err := n.opts.Client.Get(context.Background(), n.keys.Kills("orders"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// A kill confirmed on a page that showed item 0's run with fence F names
// F: when F has ended and the next fire's run holds the item, the kill is
// refused, saying how F ended and what runs now, and nothing is asked to
// stop (a kill of the next run would record it KILLED/operator, never to be
// re-run: a lost fire). The same kill of the run in progress asks for it.
func TestKillNamingAnEndedRunStopsNothing(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 1)
	ctx := context.Background()
	fire := time.Now().Truncate(time.Second)
	g1 := claimNext(t, n, fire)
	// The page the operator looks at: JobRuns as the console reads it.
	runs, err := adminOf(n).JobRuns(ctx, []string{"orders"})
	if err != nil {
		t.Fatal(err)
	}
	shown, on := runs["orders"].Records[0].Fence, runs["orders"].Running[0]
	if shown != g1.Fence || on != "a" {
		t.Fatalf("the page shows item 0 running on %q with fence %d, want a and %d", on, shown, g1.Fence)
	}
	// The run ends; the next fire's run starts.
	if err := n.Complete(ctx, g1, Outcome{State: keyspace.StateDone, Start: fire, End: time.Now()}); err != nil {
		t.Fatal(err)
	}
	next := fire.Add(time.Minute)
	g2 := claimNext(t, n, next)

	// The operator confirms the kill of the run the page showed.
	k, err := adminOf(n).Kill(ctx, admin.KillRequest{Job: "orders", Items: []int{0}, Fence: shown, Instance: on, By: "token:alice"})
	if err == nil {
		t.Fatalf("the kill confirmed on a page showing fence %d asked to stop %+v (fence %d is the next fire's run, %s)", shown, k.Runs, g2.Fence, next.UTC())
	}
	for _, want := range []string{fmt.Sprintf("the run of item 0 with fence %d has ended (DONE at ", shown), fmt.Sprintf("item 0 now runs fence %d on a", g2.Fence), "nothing killed"} {
		if !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), want) {
			t.Errorf("kill of the ended run: %v, want refused saying %q", err, want)
		}
	}
	if c := killKeys(t, n); c != 0 {
		t.Errorf("%d kill requests in etcd after a refused kill, want none", c)
	}

	// A kill of the run in progress, named, asks for that run.
	k, err = adminOf(n).Kill(ctx, admin.KillRequest{Job: "orders", Items: []int{0}, Fence: g2.Fence, Instance: "a", By: "token:alice"})
	if err != nil || len(k.Runs) != 1 || k.Runs[0] != (keyspace.KillRun{Item: 0, Fence: g2.Fence, Instance: "a"}) {
		t.Fatalf("kill of the run in progress, fence %d: %+v, %v", g2.Fence, k.Runs, err)
	}
	// Without a fence, a kill names the run in progress when it is
	// recorded (and says which).
	k, err = adminOf(n).Kill(ctx, admin.KillRequest{Job: "orders", Items: []int{0}, By: "token:alice"})
	if err != nil || len(k.Runs) != 1 || k.Runs[0].Fence != g2.Fence {
		t.Fatalf("kill without a fence: %+v, %v, want fence %d", k.Runs, err, g2.Fence)
	}
	// Once the item's runs have all ended, a named fence says so too.
	if err := n.Complete(ctx, g2, Outcome{State: keyspace.StateFailed, Start: next, End: time.Now(), Err: "exit status 1"}); err != nil {
		t.Fatal(err)
	}
	_, err = adminOf(n).Kill(ctx, admin.KillRequest{Job: "orders", Items: []int{0}, Fence: shown, By: "token:alice"})
	if !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), fmt.Sprintf("fence %d has ended (DONE at ", shown)) || !strings.Contains(err.Error(), "item 0 is not running now") {
		t.Errorf("kill of an ended run, nothing running: %v", err)
	}
}

// A fence names one item's run: a request naming a fence without exactly
// one item, a bad fence, or an instance without a fence is refused as a
// bad target; a run named on the wrong instance is refused.
func TestKillRequestNamingARunIsChecked(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 2)
	ctx := context.Background()
	g := claimNext(t, n, time.Now().Truncate(time.Second))
	for _, tc := range []struct {
		r    admin.KillRequest
		kind error
		want string
	}{
		{admin.KillRequest{Job: "orders", Fence: g.Fence}, admin.ErrBadTarget, "a fence names the run of one item"},
		{admin.KillRequest{Job: "orders", Items: []int{0, 1}, Fence: g.Fence}, admin.ErrBadTarget, "a fence names the run of one item"},
		{admin.KillRequest{Job: "orders", Items: []int{0}, Fence: -3}, admin.ErrBadTarget, "fence -3: fences are positive"},
		{admin.KillRequest{Job: "orders", Items: []int{0}, Instance: "a"}, admin.ErrBadTarget, "instance a names a run with its fence"},
		{admin.KillRequest{Job: "orders", Items: []int{0}, Fence: g.Fence, Instance: "b"}, admin.ErrRefused, fmt.Sprintf("the run of item 0 with fence %d is on a, not b: nothing killed", g.Fence)},
		{admin.KillRequest{Job: "orders", Items: []int{1}, Fence: g.Fence}, admin.ErrRefused, fmt.Sprintf("the run of item 1 with fence %d is not running (item 1 has no such run in its history); item 1 is not running now", g.Fence)},
	} {
		_, err := adminOf(n).Kill(ctx, tc.r)
		if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("kill %+v: %v, want %v saying %q", tc.r, err, tc.kind, tc.want)
		}
	}
	if c := killKeys(t, n); c != 0 {
		t.Errorf("%d kill requests in etcd after refused kills, want none", c)
	}
}

// overlap replace's request (Replace) is put once per run, only while that
// run holds its item, and read back by Kills with its reason: a run that
// ended is not asked, so the next one is never stopped for a fire it
// serves.
func TestReplaceAsksOnlyTheRunningRunOnce(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 1)
	ctx := context.Background()
	fire := time.Now().Truncate(time.Second)
	g1 := claimNext(t, n, fire)
	for range 2 {
		asked, err := n.Replace(ctx, "orders", 0, g1.Fence, "a", fire.Add(time.Second))
		if err != nil || !asked {
			t.Fatalf("Replace of the running run: asked %v, err %v", asked, err)
		}
	}
	if c := killKeys(t, n); c != 1 {
		t.Fatalf("%d kill requests after two Replace calls of one run, want 1", c)
	}
	kills, err := n.Kills(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if k := kills[keyspace.KillKey{Item: 0, Fence: g1.Fence}]; k.Reason != keyspace.ReasonReplaced || !strings.Contains(k.By, "the fire of ") {
		t.Fatalf("Kills reads the request as %+v, want reason replaced, by the fire", k)
	}
	if err := n.Complete(ctx, g1, Outcome{State: keyspace.StateKilled, Reason: keyspace.ReasonReplaced, ExitCode: -1, Start: fire, End: time.Now()}); err != nil {
		t.Fatal(err)
	}
	g2 := claimNext(t, n, fire.Add(time.Second))
	if asked, err := n.Replace(ctx, "orders", 0, g1.Fence, "a", fire.Add(2*time.Second)); err != nil || asked {
		t.Fatalf("Replace of a run that ended: asked %v, err %v; want nothing asked", asked, err)
	}
	if c := killKeys(t, n); c != 1 {
		t.Fatalf("%d kill requests, want the first one only (none for the ended run's successor %d)", c, g2.Fence)
	}
}
