package coord

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// A cluster slot is held by one run at a time: a second claim of the same
// slot (another item, another instance's pick) is lost; the run's outcome
// frees it; a waiting item's key is deleted by its claim, or by a skip of
// its fires.
func TestClusterSlotHeldByOneRun(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 3)
	ctx := context.Background()
	fire := time.Now().Truncate(time.Second)
	if err := n.Wait(ctx, "orders", 1, fire); err != nil {
		t.Fatal(err)
	}
	if err := n.Wait(ctx, "orders", 2, fire); err != nil {
		t.Fatal(err)
	}
	cs := claimsOf(t, n, 3, fire)
	cs[0].Slot, cs[1].Slot = 1, 1 // both take slot 0
	g0, err := n.Claim(ctx, cs[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Claim(ctx, cs[1]); !errors.Is(err, ErrClaimLost) {
		t.Fatalf("a second claim of a held slot: %v, want ErrClaimLost", err)
	}
	slots, err := n.ReadClusterSlots(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if !slots.Held[0] || len(slots.Held) != 1 || len(slots.Waiting) != 2 {
		t.Fatalf("slots %+v: want slot 0 held, items 1 and 2 waiting", slots)
	}
	if err := n.Complete(ctx, g0, Outcome{State: keyspace.StateDone, ExitCode: 0, Start: fire, End: time.Now()}); err != nil {
		t.Fatal(err)
	}
	cs = claimsOf(t, n, 3, fire)
	cs[1].Slot = 1
	if _, err := n.Claim(ctx, cs[1]); err != nil {
		t.Fatalf("the slot freed by the outcome: %v", err)
	}
	if err := n.Skip(ctx, Skip{Job: "orders", Item: 2, Fire: fire, Skipped: 1, Reason: keyspace.SkipTooOld, Prev: cs[2].Prev, Waited: true}); err != nil {
		t.Fatal(err)
	}
	slots, err = n.ReadClusterSlots(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if !slots.Held[0] || len(slots.Waiting) != 0 {
		t.Fatalf("slots %+v: want slot 0 held by item 1, nobody waiting (item 1 claimed, item 2's fires skipped)", slots)
	}
}

// A run's outcome frees its slot only if the slot is still its own: when
// its session ended (the slot went with its lease) and another run took the
// slot, the late outcome leaves that run's slot alone, so a third claim of
// it is lost (review of #30: N+1 runs held the slots).
func TestLateOutcomeLeavesAnotherRunsSlot(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 3)
	ctx := context.Background()
	fire := time.Now().Truncate(time.Second)
	cs := claimsOf(t, n, 3, fire)
	cs[0].Slot = 1
	g0, err := n.Claim(ctx, cs[0])
	if err != nil {
		t.Fatal(err)
	}
	old := n.currentLease()
	if _, err := n.opts.Client.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "a new session", func() bool {
		s, m := n.sessionFor("orders")
		return s != nil && m != 0 && s.lease != old
	})
	cs = claimsOf(t, n, 3, fire)
	cs[1].Slot = 1
	if _, err := n.Claim(ctx, cs[1]); err != nil {
		t.Fatalf("item 1 takes the slot the ended session gave back: %v", err)
	}
	if err := n.Complete(ctx, g0, Outcome{State: keyspace.StateKilled, Reason: keyspace.ReasonFence, ExitCode: -1, End: time.Now()}); err != nil {
		t.Fatal(err)
	}
	cs = claimsOf(t, n, 3, fire)
	cs[2].Slot = 1
	if _, err := n.Claim(ctx, cs[2]); !errors.Is(err, ErrClaimLost) {
		t.Fatalf("a third claim of the single slot: %v, want ErrClaimLost (item 1 holds it)", err)
	}
}

// overlap replace's requests live under a lease of their own, not the
// asker's session: they do not pile up, one per replaced run, for as long
// as the asker lives (review of #30).
func TestReplaceRequestExpires(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 1)
	ctx := context.Background()
	fire := time.Now().Truncate(time.Second)
	g := claimNext(t, n, fire)
	if asked, err := n.Replace(ctx, "orders", 0, g.Fence, "a", fire.Add(time.Minute)); err != nil || !asked {
		t.Fatalf("asked %v, err %v", asked, err)
	}
	resp, err := n.opts.Client.Get(ctx, n.keys.Kill("orders", keyspace.ReplaceKillID(0, g.Fence)))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the request: %v %v", resp, err)
	}
	lease := clientv3.LeaseID(resp.Kvs[0].Lease)
	if lease == n.currentLease() {
		t.Fatal("the request is under the session's lease: it would live as long as the asker")
	}
	ttl, err := n.opts.Client.TimeToLive(ctx, lease)
	if err != nil || ttl.TTL <= 0 || time.Duration(ttl.GrantedTTL)*time.Second > max(keyspace.KillTTL, 3*n.opts.TTL) {
		t.Fatalf("the request's lease: %+v, %v; want one of at most %s", ttl, err, max(keyspace.KillTTL, 3*n.opts.TTL))
	}
}

// A waiting key names the instance that put it, and its delete is guarded
// by the revision read: a key put again since (the item waits again, or
// another owner waits for it) stays.
func TestUnwaitKeepsAKeyPutAgain(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 2)
	ctx := context.Background()
	fire := time.Now().Truncate(time.Second)
	if err := n.Wait(ctx, "orders", 1, fire); err != nil {
		t.Fatal(err)
	}
	read := func() ClusterSlots {
		t.Helper()
		cs, err := n.ReadClusterSlots(ctx, "orders")
		if err != nil {
			t.Fatal(err)
		}
		return cs
	}
	first := read()
	if k := first.WaitingKeys[1]; k.Instance != n.ID() || k.Rev == 0 || !first.Waiting[1].Equal(fire) {
		t.Fatalf("the waiting key as read: %+v since %s; want this instance's, since %s", k, first.Waiting[1], fire)
	}
	if err := n.Wait(ctx, "orders", 1, fire.Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := n.Unwait(ctx, "orders", 1, first.WaitingKeys[1].Rev); err != nil {
		t.Fatal(err)
	}
	again := read()
	if _, ok := again.WaitingKeys[1]; !ok {
		t.Fatal("a delete guarded by an older revision deleted the key put again since")
	}
	if err := n.Unwait(ctx, "orders", 1, again.WaitingKeys[1].Rev); err != nil {
		t.Fatal(err)
	}
	if _, ok := read().WaitingKeys[1]; ok {
		t.Fatal("the key is still there after a delete at its revision")
	}
}
