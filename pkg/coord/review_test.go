package coord

// Regression tests from the adversarial review of the performance work ([3/8]):
// each failed before its fix.

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// The completer's flusher is a caller of Complete: it writes other runs'
// outcomes until none is pending, long after its own outcome landed. Under
// a steady stream of completions (many jobs ending), its caller (a run's
// goroutine, which holds its item "running" and its concurrency slots)
// does not return.
func TestCompleteIsNotHeldByOthersOutcomes(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 1)
	ctx := context.Background()
	var c completer
	rec := func(item int) keyspace.ItemRecord {
		return keyspace.ItemRecord{Job: "orders", Item: item, State: keyspace.StateDone, Instance: "a", Attempt: 1, End: time.Now().UTC()}
	}
	// More than completionsPerTxn outcomes always pending, for 3 s.
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	var item atomic.Int64
	item.Store(1000)
	mine := make(chan time.Duration, 1)
	var ownLanded atomic.Int64
	wg.Add(1)
	go func() { // the first to come: it becomes the flusher
		defer wg.Done()
		begun := time.Now()
		go func() {
			for time.Since(begun) < 10*time.Second {
				r, err := n.cli.Get(ctx, n.keys.Item("orders", 0))
				if err == nil && len(r.Kvs) > 0 {
					ownLanded.Store(int64(time.Since(begun)))
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		if err := c.do(ctx, n.Node, rec(0), 0); err != nil && !errors.Is(err, ErrClaimLost) {
			t.Errorf("own outcome: %v", err)
		}
		mine <- time.Since(begun)
	}()
	time.Sleep(time.Millisecond)
	for range 200 { // 200 runs ending, each followed by its item's next run
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				c.do(ctx, n.Node, rec(int(item.Add(1))), 0)
			}
		}()
	}
	took := <-mine
	wg.Wait()
	t.Logf("own outcome in etcd after %s; Complete returned after %s", time.Duration(ownLanded.Load()), took)
	if took > time.Second {
		t.Errorf("the flusher's Complete returned after %s (its own outcome landed after %s): its run was held by others' outcomes",
			took, time.Duration(ownLanded.Load()))
	}
}

// A failed guard's reply carries etcd's current revision, which may be a
// write outside jobs/ (this instance's key, another app, another --prefix):
// the hub never delivers it until some later jobs/ event, so every
// ReadItems of every job on this node waits cacheWait (200 ms) and then
// reads etcd anyway.
func TestRefusedClaimDoesNotStallCachedReads(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	n := startNode(t, srv, "a", jobs(t, "jobs:\n"+job("orders", 2)+job("other", 2)))
	waitFor(t, 10*time.Second, "a's membership", func() bool {
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

// The pacer cuts on latency alone: when etcd's base latency for one
// registration (a read, the publish Txn, the member Txn: 2-3 round trips
// with fsync) is above TTL/10 (200 ms at --ttl 2s, 1 s at the default),
// every answer was "slow", the bound fell to 1 and never grew again:
// registrations were serialized however idle etcd was. Steady answers must
// let it grow.
func TestPacerNotPinnedBySteadyLatency(t *testing.T) {
	t.Parallel()
	p := newPacer(20 * time.Millisecond) // TTL/10 of a 200 ms TTL, to keep the test short
	var wg sync.WaitGroup
	var peak, inFlight atomic.Int64
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			granted := make(chan struct{}, 1)
			tk := &ticket{wake: func() { granted <- struct{}{} }}
			if !p.take(tk) {
				<-granted
			}
			if v := inFlight.Add(1); v > peak.Load() {
				peak.Store(v)
			}
			begun := time.Now()
			time.Sleep(25 * time.Millisecond) // an idle etcd with a 25 ms answer
			inFlight.Add(-1)
			p.release(tk, begun, nil)
		}()
	}
	wg.Wait()
	t.Logf("bound after 64 registrations answered in 25 ms each: %.2f", p.limit())
	if p.limit() <= startPace {
		t.Errorf("bound %.2f: steady answers slower than the threshold did not let it grow past %d", p.limit(), startPace)
	}
}

// A candidate waiting behind an older key when Leave is called withdraws
// its key: once the older key goes (the leader, another process, resigns
// or dies), the next candidate leads. A leaving candidate that kept its key
// blocked the election until it stopped (review of the job tasks).
func TestLeavingCandidateDoesNotBlockTheElection(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli := srv.Client()
	keys := keyspace.NewKeys("")
	ctx := context.Background()
	lg, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	ghost := keys.Leader("orders") + "ghost"
	if _, err := cli.Put(ctx, ghost, "ghost", clientv3.WithLease(lg.ID)); err != nil {
		t.Fatal(err)
	}
	js := jobs(t, "jobs:\n"+job("orders", 4))
	a := startNode(t, srv, "a", js)
	candidates := func(n int) func() bool {
		return func() bool {
			r, err := cli.Get(ctx, keys.Leader("orders"), clientv3.WithPrefix(), clientv3.WithCountOnly())
			return err == nil && r.Count == int64(n)
		}
	}
	waitFor(t, 5*time.Second, "a's candidate key", candidates(2))
	c := startNode(t, srv, "c", js)
	waitFor(t, 5*time.Second, "c's candidate key", candidates(3))
	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	cli.Delete(ctx, ghost) // the leader (another process) resigns
	d := 5 * time.Second
	start := time.Now()
	for time.Since(start) < d {
		if agreed(t, cli, "orders", map[string][]int{"c": {0, 1, 2, 3}}, c) {
			t.Logf("c owns every item %s after the old leader resigned; leader %s", time.Since(start), leaderOf(t, cli, "orders"))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("no map for c %s after the old leader resigned; oldest candidate %q, a leading=%v", d, leaderOf(t, cli, "orders"), func() bool { v, _ := a.View("orders"); return v.Leading }())
}
