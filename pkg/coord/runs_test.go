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
)

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
