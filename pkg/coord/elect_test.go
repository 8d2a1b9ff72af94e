package coord

import (
	"context"
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
