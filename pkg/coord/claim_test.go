package coord

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
)

// A claim whose transaction ended with an unknown outcome is read back: if
// it applied, the caller gets its fence and runs it (else its running
// marker would hold the item for as long as the session lives); if it did
// not, the claim is lost and the caller decides again.
func TestClaimWithUnknownOutcomeIsReadBack(t *testing.T) {
	srv := etcdtest.Start(t)
	n := startNode(t, srv, "a", jobs(t, "jobs:\n"+job("orders", 2)))
	waitFor(t, 10*time.Second, "a's membership", func() bool { s, m := n.sessionFor("orders"); return s != nil && m != 0 })
	ctx := context.Background()
	s, _ := n.sessionFor("orders")
	fire := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)

	// Applied: a real claim, whose reply we pretend was lost.
	prev, err := n.ReadItem(ctx, "orders", 0)
	if err != nil {
		t.Fatal(err)
	}
	c := Claim{Job: "orders", Item: 0, Fire: fire, Attempt: 1, Source: "NORMAL", Prev: prev}
	g, err := n.Claim(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := n.cli.Get(ctx, n.keys.Item("orders", 0))
	if err != nil {
		t.Fatal(err)
	}
	written := resp.Kvs[0].Value
	if fence, err := n.readBackClaim(ctx, s, c, written); err != nil || fence != g.Fence {
		t.Errorf("applied claim read back as fence %d, %v; want fence %d", fence, err, g.Fence)
	}

	// Not applied: the record there is not the one this claim would write.
	c1 := Claim{Job: "orders", Item: 1, Fire: fire, Attempt: 1, Source: "NORMAL"}
	if _, err := n.readBackClaim(ctx, s, c1, []byte(`{"never":"written"}`)); !errors.Is(err, ErrClaimLost) {
		t.Errorf("claim that never applied: err = %v, want ErrClaimLost", err)
	}
	// Once the run is complete the record says DONE and the marker is
	// gone: nothing there is this claim's any more.
	if err := n.Complete(ctx, g, Outcome{State: StateDone, ExitCode: 0, Start: fire, End: fire}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.readBackClaim(ctx, s, c, written); !errors.Is(err, ErrClaimLost) {
		t.Errorf("claim whose marker is gone: err = %v, want ErrClaimLost", err)
	}
}
