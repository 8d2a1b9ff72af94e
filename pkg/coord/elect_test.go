package coord

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

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
	etcdtest.Eventually(t, 5*time.Second, "a's candidate key", candidates(2))
	c := startNode(t, srv, "c", js)
	etcdtest.Eventually(t, 5*time.Second, "c's candidate key", candidates(3))
	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	cli.Delete(ctx, ghost) // the leader (another process) resigns
	d := 5 * time.Second
	start := time.Now()
	for time.Since(start) < d {
		if agreed(t, cli, "orders", map[string][]int{"c": {0, 1, 2, 3}}, c) {
			t.Logf("c owns every item %s after the old leader resigned; leader %s", time.Since(start), etcdtest.LeaderOf(cli, "orders"))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("no map for c %s after the old leader resigned; oldest candidate %q, a leading=%v", d, etcdtest.LeaderOf(cli, "orders"), func() bool { v, _ := a.View("orders"); return v.Leading }())
}

// A session lost while etcd stays unreachable: the instance goes on
// retrying (and says so) although a waiting campaign's cleanup, which
// concurrency.Election does without a deadline, blocks until etcd is back.
func TestReconnectDoesNotWaitForAStuckCampaign(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	a := startNode(t, srv, "a", reviewV(t, 2))
	b := startNode(t, srv, "b", reviewV(t, 2))
	runsTotal(t, cli, 2, a, b)
	waiting := a // the candidate that does not lead waits in Campaign
	if v, _ := a.View("orders"); v.Leading {
		waiting = b
	}
	waiting.proxy.Blackhole()
	defer waiting.proxy.Restore()
	etcdtest.Eventually(t, 3*testTTL, "the fence", func() bool { return !waiting.Up() })
	etcdtest.Eventually(t, 3*testTTL, "a reconnect attempt while etcd is still unreachable", func() bool {
		return strings.Contains(waiting.log.String(), "session ended; reconnecting")
	})
}

func TestJudgeElection(t *testing.T) {
	t.Parallel()
	const own, lease = "jobs/orders/leader/a", clientv3.LeaseID(0xa)
	key := func(k string, created int64, l clientv3.LeaseID) candidateKey {
		return candidateKey{key: k, created: created, lease: l}
	}
	cases := []struct {
		name      string
		found     []candidateKey
		wantOlder []string
		wantStale bool
	}{
		{"alone", []candidateKey{key(own, 10, lease)}, nil, false},
		{"behind two", []candidateKey{key("x", 3, 1), key("y", 7, 2), key(own, 10, lease)}, []string{"x", "y"}, false},
		{"younger ones do not count", []candidateKey{key(own, 10, lease), key("z", 12, 3)}, nil, false},
		{"own key gone (#11051: the lease expired)", []candidateKey{key("x", 3, 1)}, nil, true},
		{"own key re-created", []candidateKey{key(own, 11, lease)}, nil, true},
		{"own key under another lease", []candidateKey{key(own, 10, 0xb)}, nil, true},
		{"nothing found", nil, nil, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			older, err := judgeElection(c.found, own, 10, lease)
			if stale := errors.Is(err, errStaleCandidate); stale != c.wantStale {
				t.Fatalf("err = %v, want stale %v", err, c.wantStale)
			}
			if !slices.Equal(older, c.wantOlder) {
				t.Errorf("older = %q, want %q", older, c.wantOlder)
			}
		})
	}
}

// A waiting candidate is woken by the deletion of the last key it waits for,
// not by that of a younger key or of one of several ahead; before a look
// has answered, by any deletion.
func TestOlderKeysWakeOnlyForTheLast(t *testing.T) {
	t.Parallel()
	var o olderKeys
	if !o.deleted("x") {
		t.Error("before any look: a deletion does not wake")
	}
	o.set([]string{"x", "y"})
	for _, step := range []struct {
		key        string
		wake, done bool
	}{
		{"z", false, false}, // younger: not waited for
		{"x", false, false}, // y is still ahead
		{"x", false, false}, // twice
		{"y", true, true},
		{"q", false, true},
	} {
		if got := o.deleted(step.key); got != step.wake {
			t.Errorf("deleted(%q) woke %v, want %v", step.key, got, step.wake)
		}
		if got := o.cleared(); got != step.done {
			t.Errorf("after deleting %q: cleared %v, want %v", step.key, got, step.done)
		}
	}
	o.forget()
	if o.cleared() || !o.deleted("anything") {
		t.Error("after forget: cleared, or a deletion does not wake")
	}
}

// A candidate behind an older key leads once that key goes, on the state
// its look read with the election: the map is written in the next round
// trip. The deletion of a younger candidate's key on the way changes
// nothing.
func TestCandidateLeadsOnItsElectionRead(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli := srv.Client()
	keys := keyspace.NewKeys("")
	ctx := context.Background()
	lg, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	ghost := keys.Leader("orders") + "ghost" // the leader: another process
	if _, err := cli.Put(ctx, ghost, "ghost", clientv3.WithLease(lg.ID)); err != nil {
		t.Fatal(err)
	}
	a := startNode(t, srv, "a", jobs(t, "jobs:\n"+job("orders", 4)))
	count := func(n int64) func() bool {
		return func() bool {
			r, err := cli.Get(ctx, keys.Leader("orders"), clientv3.WithPrefix(), clientv3.WithCountOnly())
			return err == nil && r.Count == n
		}
	}
	etcdtest.Eventually(t, 5*time.Second, "a's candidate key", count(2))
	younger := keys.Leader("orders") + "younger"
	if _, err := cli.Put(ctx, younger, "younger", clientv3.WithLease(lg.ID)); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 5*time.Second, "a to wait for the ghost", func() bool {
		return strings.Contains(a.log.String(), "election: waiting for older candidates")
	})
	cli.Delete(ctx, younger)
	cli.Delete(ctx, ghost)
	etcdtest.Eventually(t, 5*time.Second, "a's map", func() bool { return agreed(t, cli, "orders", map[string][]int{"a": {0, 1, 2, 3}}, a) })
	log := a.log.String()
	if !strings.Contains(log, "leading job") || !strings.Contains(log, "read_with_election=true") {
		t.Errorf("a did not lead on its election's read:\n%s", log)
	}
}
