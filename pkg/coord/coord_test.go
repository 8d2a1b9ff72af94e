package coord

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/faultproxy"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/shard"
)

const testTTL = 2 * time.Second

func jobs(t testing.TB, yaml string) []*config.Job {
	t.Helper()
	c, err := config.Parse("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return c.Jobs
}

func job(name string, total int, extra ...string) string {
	return fmt.Sprintf("  - name: %s\n    shardingTotalCount: %d\n    script: [/bin/true]\n%s", name, total, strings.Join(extra, ""))
}

// logBuffer collects a node's log for assertions.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type testNode struct {
	*Node
	stopOnce sync.Once
	proxy    *faultproxy.Proxy
	cli      *clientv3.Client
	log      *logBuffer
	cancel   context.CancelFunc
	done     chan error
}

// startNode runs a node whose etcd connection goes through its own proxy.
func startNode(t testing.TB, srv *etcdtest.Server, id string, js []*config.Job) *testNode {
	t.Helper()
	return startNodeWith(t, srv, id, js, nil)
}

// startNodeWith is startNode with the node's log handler wrapped by wrap
// (if not nil) and beforeRun called with the node before it runs.
func startNodeWith(t testing.TB, srv *etcdtest.Server, id string, js []*config.Job, wrap func(slog.Handler) slog.Handler, beforeRun ...func(*Node)) *testNode {
	t.Helper()
	p, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	cli := srv.Client("http://" + p.Addr())
	lb := &logBuffer{}
	var h slog.Handler = slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug})
	if wrap != nil {
		h = wrap(h)
	}
	n, err := New(Options{
		Client: cli, ID: id, TTL: testTTL,
		Info:   keyspace.InstanceInfo{Node: id, Host: "test", PID: 1},
		Logger: slog.New(h),
	}, js)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range beforeRun {
		f(n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tn := &testNode{Node: n, proxy: p, cli: cli, log: lb, cancel: cancel, done: make(chan error, 1)}
	go func() { tn.done <- n.Run(ctx) }()
	t.Cleanup(func() {
		tn.stop(t)
		p.Close()
		if t.Failed() {
			t.Logf("log of %s:\n%s", id, lb.String())
		}
	})
	return tn
}

// stop shuts the node down gracefully and waits for Run to return.
func (tn *testNode) stop(t testing.TB) {
	tn.stopOnce.Do(func() {
		tn.cancel()
		select {
		case err := <-tn.done:
			if err != nil {
				t.Errorf("%s: Run: %v", tn.ID(), err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s: Run did not return after cancel", tn.ID())
		}
	})
}

// agreed reports whether every node's view of job is the stored map and
// covers exactly want, with items as given.
func agreed(t testing.TB, cli *clientv3.Client, job string, want map[string][]int, nodes ...*testNode) bool {
	m := etcdtest.StoredMap(cli, job)
	if m == nil || !reflect.DeepEqual(m.Items, want) {
		return false
	}
	for _, n := range nodes {
		v, ok := n.View(job)
		if !ok || v.Map == nil || v.Map.Epoch != m.Epoch {
			return false
		}
	}
	return true
}

func TestMembershipChangesReshard(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli := srv.Client()
	js := jobs(t, "jobs:\n"+job("orders", 10))
	a := startNode(t, srv, "a", js)
	b := startNode(t, srv, "b", js)
	c := startNode(t, srv, "c", js)

	three := map[string][]int{"a": {0, 1, 2, 9}, "b": {3, 4, 5}, "c": {6, 7, 8}}
	etcdtest.Eventually(t, 10*time.Second, "3 instances to agree", func() bool { return agreed(t, cli, "orders", three, a, b, c) })

	// Graceful leave: the lease is revoked, the others reshard at once.
	c.stop(t)
	two := map[string][]int{"a": {0, 1, 2, 3, 4}, "b": {5, 6, 7, 8, 9}}
	d := etcdtest.Eventually(t, 5*time.Second, "2 instances after graceful leave", func() bool { return agreed(t, cli, "orders", two, a, b) })
	t.Logf("graceful leave converged in %s", d)
	if d > time.Second {
		t.Errorf("graceful leave took %s, want < 1s", d)
	}

	// Join: the newcomer owns items.
	e := startNode(t, srv, "e", js)
	twoPlusE := map[string][]int{"a": {0, 1, 2, 9}, "b": {3, 4, 5}, "e": {6, 7, 8}}
	etcdtest.Eventually(t, 5*time.Second, "join", func() bool { return agreed(t, cli, "orders", twoPlusE, a, b, e) })

	// Epochs only grow.
	if m := etcdtest.StoredMap(cli, "orders"); m.Epoch < 3 {
		t.Errorf("epoch %d after 3 changes", m.Epoch)
	}
}

func TestCrashedInstanceIsResharded(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	js := jobs(t, "jobs:\n"+job("orders", 6))
	a := startNode(t, srv, "a", js)
	b := startNode(t, srv, "b", js)
	c := startNode(t, srv, "c", js)
	etcdtest.Eventually(t, 10*time.Second, "agreement", func() bool {
		return agreed(t, cli, "orders", map[string][]int{"a": {0, 1}, "b": {2, 3}, "c": {4, 5}}, a, b, c)
	})

	// Cut c off from etcd: like a crash for the cluster, and c must notice.
	c.proxy.Blackhole()
	d := etcdtest.Eventually(t, testTTL+3*time.Second, "reshard after c is cut off", func() bool {
		return agreed(t, cli, "orders", map[string][]int{"a": {0, 1, 2}, "b": {3, 4, 5}}, a, b)
	})
	t.Logf("crash converged in %s (TTL %s)", d, testTTL)
	if d > testTTL+time.Second {
		t.Errorf("reshard took %s, want <= TTL + 1s", d)
	}
	etcdtest.Eventually(t, time.Second, "c to notice its session loss", func() bool {
		return !c.Up() && strings.Contains(c.log.String(), "session lost")
	})

	// c comes back by itself with a new session.
	c.proxy.Restore()
	etcdtest.Eventually(t, 15*time.Second, "c to rejoin", func() bool {
		return agreed(t, cli, "orders", map[string][]int{"a": {0, 1}, "b": {2, 3}, "c": {4, 5}}, a, b, c)
	})
}

// The session fences itself before etcd can expire its lease.
func TestSessionFencesBeforeServerExpiry(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	p, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cli := srv.Client("http://" + p.Addr())
	direct := srv.Client()

	s, err := openSession(context.Background(), cli, testTTL, time.Now, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.close(false)
	key := "/fence-test"
	if _, err := direct.Put(context.Background(), key, "x", clientv3.WithLease(s.lease)); err != nil {
		t.Fatal(err)
	}
	// Let a few keepalives succeed, then cut the connection.
	etcdtest.Eventually(t, 5*time.Second, "a keepalive", func() bool { return s.Deadline().Sub(time.Now()) > testTTL-fenceMargin(testTTL)-testTTL/3 })
	p.Blackhole()
	defer p.Restore()

	<-s.Fenced()
	fencedAt := time.Now()
	if !errors.Is(s.Err(), ErrFenced) {
		t.Fatalf("session ended with %v, want ErrFenced", s.Err())
	}
	// The key must still exist on the server: the fence came first.
	resp, err := direct.Get(context.Background(), key)
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("lease already expired on the server when the session fenced (%v)", err)
	}
	etcdtest.Eventually(t, 2*testTTL, "the server to expire the lease", func() bool {
		resp, err := direct.Get(context.Background(), key)
		return err == nil && len(resp.Kvs) == 0
	})
	t.Logf("fenced %s before the server expired the lease", time.Since(fencedAt))
}

// A leader that lost its lease cannot write the shard map: its transaction
// compares an election key that no longer exists.
func TestDeposedLeaderCannotWrite(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	js := jobs(t, "jobs:\n"+job("orders", 4))
	a := startNode(t, srv, "a", js)
	etcdtest.Eventually(t, 10*time.Second, "a to lead", func() bool { v, _ := a.View("orders"); return v.Leading && v.Map != nil })

	// Remember a's election key and revision, the fence of its writes.
	resp, err := cli.Get(context.Background(), keyspace.NewKeys("").Leader("orders"), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("leader keys: %v %v", resp, err)
	}
	staleKey, staleRev := string(resp.Kvs[0].Key), resp.Kvs[0].CreateRevision

	// a is cut off (as if paused) until its lease expires; b takes over.
	b := startNode(t, srv, "b", js)
	a.proxy.Blackhole()
	etcdtest.Eventually(t, testTTL+3*time.Second, "b to lead and reshard", func() bool {
		return agreed(t, cli, "orders", map[string][]int{"b": {0, 1, 2, 3}}, b)
	})
	before := etcdtest.StoredMap(cli, "orders")
	if before.Leader != "b" {
		t.Fatalf("map written by %q, want b", before.Leader)
	}

	// a wakes up and tries to write with its old leadership.
	a.proxy.Restore()
	l := &leader{n: a.Node, job: "orders", local: js[0], key: staleKey, rev: staleRev}
	st, err := l.read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st.members = []string{"a"} // a map that differs, so that a write is attempted
	err = l.reconcile(context.Background(), st)
	if !errors.Is(err, errNotLeader) {
		t.Fatalf("stale leader's write: %v, want errNotLeader", err)
	}
	if after := etcdtest.StoredMap(cli, "orders"); after.Epoch != before.Epoch || after.Leader != "b" {
		t.Errorf("map changed by the stale leader: %+v", after)
	}
}

func TestMalformedValuesAreRepaired(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli := srv.Client()
	js := jobs(t, "jobs:\n"+job("orders", 4))
	a := startNode(t, srv, "a", js)
	b := startNode(t, srv, "b", js)
	want := map[string][]int{"a": {0, 1}, "b": {2, 3}}
	etcdtest.Eventually(t, 10*time.Second, "agreement", func() bool { return agreed(t, cli, "orders", want, a, b) })
	good := etcdtest.StoredMap(cli, "orders")
	keys := keyspace.NewKeys("")

	for _, garbage := range []string{"not json", `{"epoch":0}`, `{"epoch":99,"total":4,"instances":["a"],"items":{"zz":[1]}}`, `{"epoch":99,"total":2,"instances":["a"],"items":{"a":[0,5]}}`} {
		if _, err := cli.Put(context.Background(), keys.Shards("orders"), garbage); err != nil {
			t.Fatal(err)
		}
		etcdtest.Eventually(t, 5*time.Second, "the leader to repair "+garbage, func() bool {
			m := etcdtest.StoredMap(cli, "orders")
			return m != nil && reflect.DeepEqual(m.Items, want) && m.Epoch > good.Epoch
		})
		// Views kept the last good map meanwhile and then took the repair.
		etcdtest.Eventually(t, 5*time.Second, "views to follow", func() bool { return agreed(t, cli, "orders", want, a, b) })
		good = etcdtest.StoredMap(cli, "orders")
	}

	// A deleted map comes back with a higher epoch.
	cli.Delete(context.Background(), keys.Shards("orders"))
	etcdtest.Eventually(t, 5*time.Second, "the map to be rewritten", func() bool {
		m := etcdtest.StoredMap(cli, "orders")
		return m != nil && m.Epoch > good.Epoch
	})

	// A malformed config is replaced by the local definition.
	cli.Put(context.Background(), keys.Config("orders"), `{"job": {"name": "orders", "shardingTotalCount": -1}}`)
	etcdtest.Eventually(t, 5*time.Second, "the config to be repaired", func() bool {
		resp, err := cli.Get(context.Background(), keys.Config("orders"))
		if err != nil || len(resp.Kvs) == 0 {
			return false
		}
		j, err := a.parseRegistered(keys.Config("orders"), "orders", resp.Kvs[0].Value, nil)
		return err == nil && j.ShardingTotalCount == 4
	})
	for _, n := range []*testNode{a, b} {
		if !strings.Contains(n.log.String(), "malformed") && n.ID() == etcdtest.LeaderOf(cli, "orders") {
			t.Errorf("leader %s did not log the malformed values", n.ID())
		}
	}
}

// startAgreedPair starts instances a and b of a 4-item job "orders" and
// waits until they agree on its map.
func startAgreedPair(t *testing.T) (*clientv3.Client, *testNode, *testNode) {
	t.Helper()
	srv := etcdtest.Shared(t)
	cli := srv.Client()
	js := jobs(t, "jobs:\n"+job("orders", 4))
	a := startNode(t, srv, "a", js)
	b := startNode(t, srv, "b", js)
	etcdtest.Eventually(t, 10*time.Second, "agreement", func() bool { return agreed(t, cli, "orders", map[string][]int{"a": {0, 1}, "b": {2, 3}}, a, b) })
	return cli, a, b
}

func TestDisabledInstanceAndJob(t *testing.T) {
	t.Parallel()
	cli, a, b := startAgreedPair(t)
	keys := keyspace.NewKeys("")
	ctx := context.Background()

	cli.Put(ctx, keys.DisabledInstance("orders", "b"), "")
	etcdtest.Eventually(t, 5*time.Second, "b disabled", func() bool { return agreed(t, cli, "orders", map[string][]int{"a": {0, 1, 2, 3}}, a, b) })
	cli.Delete(ctx, keys.DisabledInstance("orders", "b"))
	etcdtest.Eventually(t, 5*time.Second, "b enabled", func() bool { return agreed(t, cli, "orders", map[string][]int{"a": {0, 1}, "b": {2, 3}}, a, b) })

	cli.Put(ctx, keys.DisabledJob("orders"), "")
	etcdtest.Eventually(t, 5*time.Second, "job disabled", func() bool {
		m := etcdtest.StoredMap(cli, "orders")
		return m != nil && m.Disabled && len(m.Items) == 0
	})
	cli.Delete(ctx, keys.DisabledJob("orders"))
	etcdtest.Eventually(t, 5*time.Second, "job enabled", func() bool { return agreed(t, cli, "orders", map[string][]int{"a": {0, 1}, "b": {2, 3}}, a, b) })
}

func TestWatchesSurviveCompaction(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	js := jobs(t, "jobs:\n"+job("orders", 2))
	a := startNode(t, srv, "a", js)
	etcdtest.Eventually(t, 10*time.Second, "a alone", func() bool { return agreed(t, cli, "orders", map[string][]int{"a": {0, 1}}, a) })
	// Churn and compact everything up to now.
	var rev int64
	for i := 0; i < 20; i++ {
		r, err := cli.Put(context.Background(), "/churn", fmt.Sprint(i))
		if err != nil {
			t.Fatal(err)
		}
		rev = r.Header.Revision
	}
	if _, err := cli.Compact(context.Background(), rev); err != nil {
		t.Fatal(err)
	}
	b := startNode(t, srv, "b", js)
	etcdtest.Eventually(t, 10*time.Second, "b to join after compaction", func() bool {
		return agreed(t, cli, "orders", map[string][]int{"a": {0}, "b": {1}}, a, b)
	})
}

func TestEtcdRestart(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	js := jobs(t, "jobs:\n"+job("orders", 4)+job("billing", 2))
	a := startNode(t, srv, "a", js)
	b := startNode(t, srv, "b", js)
	cli := srv.Client()
	want := map[string][]int{"a": {0, 1}, "b": {2, 3}}
	etcdtest.Eventually(t, 10*time.Second, "agreement", func() bool { return agreed(t, cli, "orders", want, a, b) })

	srv.Stop()
	time.Sleep(testTTL + time.Second) // etcd is down for longer than the TTL: the sessions must fence
	srv.Restart()
	etcdtest.Eventually(t, 20*time.Second, "recovery after etcd restart", func() bool {
		return a.Up() && b.Up() && agreed(t, cli, "orders", want, a, b) &&
			agreed(t, cli, "billing", map[string][]int{"a": {0}, "b": {1}}, a, b)
	})
	// Both leases from before the outage are gone; only the new ones hold keys.
	resp, err := cli.Leases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Leases) != 2 {
		t.Errorf("%d leases after recovery, want 2 (old ones revoked)", len(resp.Leases))
	}
}

func TestDuplicateIDIsRejected(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	js := jobs(t, "jobs:\n"+job("orders", 2))
	a := startNode(t, srv, "a", js)
	etcdtest.Eventually(t, 10*time.Second, "a up", a.Up)

	cli := srv.Client()
	n, err := New(Options{Client: cli, ID: "a", TTL: testTTL, Info: keyspace.InstanceInfo{Host: "other", PID: 2}, Logger: slog.New(slog.DiscardHandler)}, js)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = n.Run(ctx)
	if !errors.Is(err, ErrDuplicateID) || !strings.Contains(err.Error(), `pid 1 on host "test"`) {
		t.Fatalf("Run = %v, want ErrDuplicateID naming the holder", err)
	}
	if !a.Up() {
		t.Error("the first instance lost its session")
	}
}

func TestManyJobsSpreadLeadership(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli := srv.Client()
	var yaml strings.Builder
	yaml.WriteString("jobs:\n")
	for i := 0; i < 50; i++ {
		yaml.WriteString(job(fmt.Sprintf("job-%02d", i), 3))
	}
	js := jobs(t, yaml.String())
	a := startNode(t, srv, "a", js)
	b := startNode(t, srv, "b", js)
	c := startNode(t, srv, "c", js)
	want := map[string][]int{"a": {0}, "b": {1}, "c": {2}}
	etcdtest.Eventually(t, 60*time.Second, "50 maps to converge", func() bool {
		for _, j := range js {
			if !agreed(t, cli, j.Name, want, a, b, c) {
				return false
			}
		}
		return true
	})
	leaders := map[string]int{}
	etcdtest.Eventually(t, 20*time.Second, "leaderships to spread", func() bool {
		leaders = map[string]int{}
		for _, j := range js {
			leaders[etcdtest.LeaderOf(cli, j.Name)]++
		}
		return leaders["a"] >= 5 && leaders["b"] >= 5 && leaders["c"] >= 5
	})
	t.Logf("leaderships: %v", leaders)
}

// aLeadsWhereBIsPreferred starts node "a" alone with a job that "b" is
// preferred to lead, waits until a leads it, and returns the job's name
// and a lease of 60 s for the test's fake "b" (revoked at cleanup).
func aLeadsWhereBIsPreferred(t *testing.T, cli *clientv3.Client, srv *etcdtest.Server, prefix string) (string, clientv3.LeaseID) {
	t.Helper()
	name := ""
	for i := 0; name == ""; i++ {
		if j := fmt.Sprintf("%s-%d", prefix, i); shard.Pick(j, []string{"a", "b"}) == "b" {
			name = j
		}
	}
	a := startNode(t, srv, "a", jobs(t, "jobs:\n"+job(name, 2)))
	etcdtest.Eventually(t, 10*time.Second, "a to lead", func() bool {
		return agreed(t, cli, name, map[string][]int{"a": {0, 1}}, a) && etcdtest.LeaderOf(cli, name) == "a"
	})
	lease, err := cli.Grant(context.Background(), 60)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Revoke(context.Background(), lease.ID) })
	return name, lease.ID
}

// A member and its candidate key that come in one burst (one settle, one
// read) make the leader write the map and then hand over to the preferred
// candidate in the same reconcile: no later event would make it yield
// (its own map write does not wake it), and it would lead until its next
// reconcile interval.
func TestLeaderYieldsAfterWritingTheMap(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli := srv.Client()
	name, lease := aLeadsWhereBIsPreferred(t, cli, srv, "yield")
	// "b" joins: its member key and its candidate key in one Txn.
	keys := keyspace.NewKeys("")
	if _, err := cli.Txn(context.Background()).Then(
		clientv3.OpPut(keys.Member(name, "b"), "", clientv3.WithLease(lease)),
		clientv3.OpPut(fmt.Sprintf("%s%x", keys.Leader(name), lease), "b", clientv3.WithLease(lease)),
	).Commit(); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "the map with b, and a handing over to b", func() bool {
		m := etcdtest.StoredMap(cli, name)
		return m != nil && len(m.Items["b"]) == 1 && etcdtest.LeaderOf(cli, name) == "b"
	})
}

// A leader does not hand over to a preferred candidate that is not a
// member: one that is leaving (Leave deletes its member key first, and
// withdraws its candidate key in answer to that) would drop the leadership
// it was handed, and the job would be without a leader meanwhile.
func TestLeaderDoesNotYieldToALeavingCandidate(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli := srv.Client()
	name, lease := aLeadsWhereBIsPreferred(t, cli, srv, "leaving")
	// "b" campaigns without a member key: it is leaving.
	keys := keyspace.NewKeys("")
	if _, err := cli.Put(context.Background(), fmt.Sprintf("%s%x", keys.Leader(name), lease), "b", clientv3.WithLease(lease)); err != nil {
		t.Fatal(err)
	}
	// The candidate key wakes a (after the 100 ms settle); a handover would
	// show at once, as b's key is then the oldest.
	time.Sleep(time.Second)
	if l := etcdtest.LeaderOf(cli, name); l != "a" {
		t.Fatalf("leader %q after a candidate without a member key came; want a to keep leading", l)
	}
}

func TestShardMapJSON(t *testing.T) {
	t.Parallel()
	m := &keyspace.ShardMap{Epoch: 3, Total: 3, Strategy: "AVG_ALLOCATION", Instances: []string{"a", "b"}, Items: map[string][]int{"a": {0, 1}, "b": {2}}}
	b, _ := json.Marshal(m)
	back, err := keyspace.DecodeShardMap(b)
	if err != nil || !back.SameAssignment(m) || back.Owner(2) != "b" {
		t.Fatalf("round trip: %v %+v", err, back)
	}
}

// Leave moves an instance's items away at once while its session (and the
// running markers under it) stays up.
func TestLeaveWithdrawsMembership(t *testing.T) {
	t.Parallel()
	cli, a, b := startAgreedPair(t)
	if err := a.Leave(context.Background()); err != nil {
		t.Fatal(err)
	}
	d := etcdtest.Eventually(t, 5*time.Second, "b alone", func() bool { return agreed(t, cli, "orders", map[string][]int{"b": {0, 1, 2, 3}}, a, b) })
	t.Logf("items moved %s after Leave", d)
	if !a.Up() {
		t.Error("Leave ended the session")
	}
}

// adminOf is the operator client of n's cluster, over n's connection (n
// is a *Node or a *testNode).
func adminOf(n interface{ node() *Node }) *admin.Client {
	nd := n.node()
	return admin.New(nd.opts.Client, nd.keys)
}

func (n *Node) node() *Node { return n }
