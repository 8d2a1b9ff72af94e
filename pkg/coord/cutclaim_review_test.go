package coord

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Review of cb408ac (the cut run's history record in the claim's Txn).

// cutItems deletes the running markers of items (their instance's lease
// gone), leaving the item records RUNNING.
func cutItems(t *testing.T, n *testNode, items int) {
	t.Helper()
	for item := range items {
		if _, err := n.cli.Delete(context.Background(), n.keys.RunningItem("orders", item)); err != nil {
			t.Fatal(err)
		}
	}
}

// A manual run's failover re-runs keep its parameter (up to 16 KiB, and
// JSON escapes <, > and & six-fold). The cut run's record doubles each
// failover claim's bytes while claimChunkEnd bounds only operations: a
// ClaimAll whose first claims fit etcd's --max-request-bytes (1.5 MiB)
// builds failover Txns that do not. claimTogether takes the refusal for an
// unknown outcome, reads each claim back (not applied: ErrClaimLost) and
// never tries them one by one: the engine decides again, gets the same
// chunk, forever. Each claim alone would be won.
func TestReviewFailoverClaimsOfABigParamExceedRequestBytes(t *testing.T) {
	t.Parallel()
	const items = 16
	n := ordersNode(t, items)
	ctx := context.Background()
	fire := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	param := strings.Repeat("a<", 8<<10) // 16 KiB, within MaxTriggerParam
	withParam := func(cs []Claim) []Claim {
		for i := range cs {
			cs[i].Param, cs[i].Source = param, keyspace.SourceManual
		}
		return cs
	}
	for i, r := range n.ClaimAll(ctx, withParam(claimsOf(t, n, items, fire))) {
		if r.Err != nil {
			t.Fatalf("first claim %d: %v", i, r.Err) // fits: 16 records
		}
	}
	cutItems(t, n, items)
	again := withParam(claimsOf(t, n, items, fire))
	for i := range again {
		again[i].Attempt = 2
	}
	failed := 0
	for _, r := range n.ClaimAll(ctx, again) {
		if r.Err != nil {
			failed++
			t.Logf("failover claim: %v", r.Err)
		}
	}
	if failed > 0 {
		t.Errorf("%d of %d failover claims not won (the Txn of 16 claims and 16 cut records is too large; alone each fits)", failed, items)
		if _, err := n.Claim(ctx, again[0]); err != nil {
			t.Errorf("the first failover claim alone: %v", err)
		}
	}
}

// A run that ended DONE, whose outcome write was still on its way when its
// instance's lease went (a partition, etcd briefly away): etcd cannot tell
// it from a cut run. The failover claim records KILLED/lost, in words that
// say only what etcd knows (the outcome was not recorded), not that the
// run died; the late DONE outcome's guard fails, and it writes nothing
// over that record.
func TestReviewARunThatEndedDoneIsRecordedKilled(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 1)
	ctx := context.Background()
	fire := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	g, err := n.Claim(ctx, claimsOf(t, n, 1, fire)[0])
	if err != nil {
		t.Fatal(err)
	}
	// The run ends DONE here; its Complete is delayed past the lease.
	cutItems(t, n, 1)
	c := claimsOf(t, n, 1, fire)[0]
	c.Attempt, c.Source = 2, keyspace.SourceFailover
	if _, err := n.Claim(ctx, c); err != nil {
		t.Fatal(err)
	}
	err = n.Complete(ctx, g, Outcome{State: keyspace.StateDone, Start: fire, End: fire.Add(time.Second)})
	t.Logf("the ended run's Complete: %v", err)
	recs, _ := n.History(ctx, "orders")
	if err == nil {
		t.Error("the late DONE outcome was written over the item its re-run holds")
	}
	for _, r := range recs {
		if r.Fence == g.Fence && (r.State != keyspace.StateKilled || !strings.Contains(r.Error, "its session ended before its outcome was recorded")) {
			t.Errorf("history says the run of fence %d was %s/%s (%q); want KILLED/lost saying its outcome was not recorded", g.Fence, r.State, r.Reason, r.Error)
		}
	}
}

// The rewind repair (rewind.go, repairJob) puts back a RUNNING record it
// knew, without its marker: its ModRevision is then the repair's revision,
// not the claim's. RunFence takes that revision for the run's fence, so the
// cut record names a fence no claim ever had (and its run's log, named by
// the real fence, does not merge with it).
func TestReviewCutRecordOfARepairedRecordHasTheRepairsRevision(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 1)
	ctx := context.Background()
	fire := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	g, err := n.Claim(ctx, claimsOf(t, n, 1, fire)[0])
	if err != nil {
		t.Fatal(err)
	}
	cur, err := n.cli.Get(ctx, n.keys.Item("orders", 0))
	if err != nil {
		t.Fatal(err)
	}
	// The repair's write: the known value put back, as repairJob does,
	// keeping its claim's revision as its fence.
	var known keyspace.ItemRecord
	json.Unmarshal(cur.Kvs[0].Value, &known)
	known.Fence = cur.Kvs[0].ModRevision
	val, _ := json.Marshal(known)
	if _, err := n.cli.Put(ctx, n.keys.Item("orders", 0), string(val)); err != nil {
		t.Fatal(err)
	}
	cutItems(t, n, 1)
	c := claimsOf(t, n, 1, fire)[0]
	c.Attempt, c.Source = 2, keyspace.SourceFailover
	if _, err := n.Claim(ctx, c); err != nil {
		t.Fatal(err)
	}
	recs, _ := n.History(ctx, "orders")
	for _, r := range recs {
		if r.State == keyspace.StateKilled && r.Fence != g.Fence {
			t.Errorf("the cut record's fence is %d; the run's claim was fence %d", r.Fence, g.Fence)
		}
	}
}
