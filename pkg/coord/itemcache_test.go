package coord

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// A failed guard's reply carries etcd's current revision, which may be a
// write outside jobs/ (this instance's key, another app, another --prefix):
// the hub never delivers it until some later jobs/ event, so every
// ReadItems of every job on this node waits cacheWait (200 ms) and then
// reads etcd anyway.
func TestRefusedClaimDoesNotStallCachedReads(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	n := startNode(t, srv, "a", jobs(t, "jobs:\n"+job("orders", 2)+job("other", 2)))
	etcdtest.Eventually(t, 10*time.Second, "a's membership", func() bool {
		s, m := n.sessionFor("orders")
		_, m2 := n.sessionFor("other")
		return s != nil && m != 0 && m2 != 0
	})
	ctx := context.Background()
	time.Sleep(time.Second) // maps written, quiet
	for _, j := range []string{"orders", "other"} {
		if _, err := n.ReadItems(ctx, j); err != nil { // fill the caches
			t.Fatal(err)
		}
	}
	timeRead := func(j string) time.Duration {
		begun := time.Now()
		if _, err := n.ReadItems(ctx, j); err != nil {
			t.Fatal(err)
		}
		return time.Since(begun)
	}
	t.Logf("cached read before: %s", timeRead("orders"))
	// A write outside jobs/, then a claim that loses its guard.
	if _, err := n.cli.Put(ctx, "/elsewhere/x", "y"); err != nil {
		t.Fatal(err)
	}
	items, _ := n.ReadItems(ctx, "orders")
	st := items.Items[0]
	st.Rev = 12345678 // stale
	if _, err := n.Claim(ctx, Claim{Job: "orders", Item: 0, Fire: time.Now(), Attempt: 1, Source: keyspace.SourceNormal, Prev: st, MapRev: 0, Sched: time.Now()}); !errors.Is(err, ErrClaimLost) {
		t.Fatalf("claim: %v", err)
	}
	var slow int
	for i := 0; i < 5; i++ {
		for _, j := range []string{"orders", "other"} {
			d := timeRead(j)
			t.Logf("read %s after the failed guard: %s", j, d)
			if d > 150*time.Millisecond {
				slow++
			}
		}
	}
	if slow > 0 {
		t.Errorf("%d of 10 reads waited ~cacheWait for a revision the jobs watch never delivers", slow)
	}
}
