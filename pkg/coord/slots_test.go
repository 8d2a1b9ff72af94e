package coord

import (
	"context"
	"errors"
	"testing"
	"time"

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
