package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Three instances agree; a crash, a graceful stop and a join each move items
// within the bounds operators are promised.
func TestMembershipThroughProcessFaults(t *testing.T) {
	faultTest(t)
	e := startEtcd(t)
	cli := e.client()
	cfg := writeConfig(t, "orders:10")
	a := startShardd(t, e, "a", cfg)
	b := startShardd(t, e, "b", cfg)
	c := startShardd(t, e, "c", cfg)
	etcdtest.Eventually(t, 15*time.Second, "three instances to agree", func() bool {
		return agreed(t, cli, "orders", map[string][]int{"a": {0, 1, 2, 9}, "b": {3, 4, 5}, "c": {6, 7, 8}}, a, b, c)
	})

	c.stop(syscall.SIGKILL)
	d := etcdtest.Eventually(t, ttl+5*time.Second, "the survivors to take c's items", func() bool {
		return agreed(t, cli, "orders", map[string][]int{"a": {0, 1, 2, 3, 4}, "b": {5, 6, 7, 8, 9}}, a, b)
	})
	t.Logf("kill -9: converged in %s (TTL %s)", d.Round(time.Millisecond), ttl)
	if d > ttl+time.Second {
		t.Errorf("kill -9: converged in %s, want <= TTL + 1s", d)
	}

	b.signal(syscall.SIGTERM)
	d = etcdtest.Eventually(t, 5*time.Second, "a to take b's items", func() bool {
		return agreed(t, cli, "orders", map[string][]int{"a": {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}}, a)
	})
	t.Logf("SIGTERM: converged in %s", d.Round(time.Millisecond))
	if d > time.Second {
		t.Errorf("SIGTERM: converged in %s, want <= 1s", d)
	}
	// Wait, without a second signal: one during b's last clean-up (slower
	// under -race) would kill it by the signal.
	b.wait(syscall.SIGTERM.String())
	if b.err != nil {
		t.Errorf("b exited with %v after SIGTERM, want 0", b.err)
	}

	f := startShardd(t, e, "f", cfg)
	d = etcdtest.Eventually(t, 5*time.Second, "the newcomer to own items", func() bool {
		return agreed(t, cli, "orders", map[string][]int{"a": {0, 1, 2, 3, 4}, "f": {5, 6, 7, 8, 9}}, a, f)
	})
	ownedAt := time.Now()
	up := f.find(msg("session up"))
	if len(up) == 0 {
		t.Fatal("f never logged its session")
	}
	upAt, _ := time.Parse(time.RFC3339Nano, up[0]["time"].(string))
	t.Logf("join: owned items %s after the process started, %s after its session came up", d.Round(time.Millisecond), ownedAt.Sub(upAt).Round(time.Millisecond))
	if since := ownedAt.Sub(upAt); since > time.Second {
		t.Errorf("join: owned items %s after its session came up, want <= 1s", since)
	}
}

// A killed leader is replaced within TTL + 1s; a paused leader that wakes up
// after its lease expired writes nothing.
func TestLeaderKillAndPause(t *testing.T) {
	faultTest(t)
	e := startEtcd(t)
	cli := e.client()
	cfg := writeConfig(t, "orders:6")
	procs := map[string]*proc{}
	for _, n := range []string{"a", "b", "c"} {
		procs[n] = startShardd(t, e, n, cfg)
	}
	all := func(names ...string) []*proc {
		var out []*proc
		for _, n := range names {
			out = append(out, procs[n])
		}
		return out
	}
	etcdtest.Eventually(t, 15*time.Second, "agreement", func() bool {
		return agreed(t, cli, "orders", map[string][]int{"a": {0, 1}, "b": {2, 3}, "c": {4, 5}}, all("a", "b", "c")...)
	})

	// kill -9 of the leader.
	first := etcdtest.LeaderOf(cli, "orders")
	procs[first].stop(syscall.SIGKILL)
	d := etcdtest.Eventually(t, ttl+5*time.Second, "a new leader", func() bool {
		l := etcdtest.LeaderOf(cli, "orders")
		return l != "" && l != first
	})
	t.Logf("leader kill -9: new leader in %s", d.Round(time.Millisecond))
	if d > ttl+time.Second {
		t.Errorf("new leader after %s, want <= TTL + 1s", d)
	}
	var alive []string
	for n := range procs {
		if n != first {
			alive = append(alive, n)
		}
	}
	want := map[string][]int{}
	for i, n := range sortedNames(alive) {
		want[n] = []int{i * 3, i*3 + 1, i*3 + 2}
	}
	etcdtest.Eventually(t, 5*time.Second, "the survivors' map", func() bool { return agreed(t, cli, "orders", want, all(alive...)...) })

	// Record every map written from now on.
	type write struct {
		epoch  int64
		leader string
		at     time.Time
	}
	var writes []write
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for wr := range cli.Watch(wctx, keyspace.NewKeys("").Shards("orders")) {
			for _, ev := range wr.Events {
				if m := decode(ev.Kv.Value); m != nil {
					writes = append(writes, write{m.Epoch, m.Leader, time.Now()})
				}
			}
		}
	}()

	// SIGSTOP the leader for 2 x TTL; meanwhile a newcomer joins, so the
	// paused leader wakes up to events it would act on.
	paused := etcdtest.LeaderOf(cli, "orders")
	procs[paused].signal(syscall.SIGSTOP)
	pausedAt := time.Now()
	procs["d"] = startShardd(t, e, "d", cfg)
	time.Sleep(2 * ttl) // the fault's duration, not a wait for an event
	procs[paused].signal(syscall.SIGCONT)
	names := append(alive, "d")
	want = map[string][]int{}
	for i, n := range sortedNames(names) {
		want[n] = []int{i * 2, i*2 + 1}
	}
	etcdtest.Eventually(t, 20*time.Second, "all three to agree after the pause", func() bool {
		return agreed(t, cli, "orders", want, all(names...)...)
	})
	stopWatch()
	<-watchDone

	if len(writes) == 0 {
		t.Fatal("no map was written during and after the pause")
	}
	var prev int64
	for _, w := range writes {
		if w.leader == paused && w.at.After(pausedAt) {
			t.Errorf("the paused leader %s wrote epoch %d after its pause", paused, w.epoch)
		}
		if w.epoch <= prev {
			t.Errorf("epoch %d after %d", w.epoch, prev)
		}
		prev = w.epoch
	}
	t.Logf("%d maps written after the pause, none by the paused leader %s", len(writes), paused)
	p := procs[paused]
	if len(p.find(func(r map[string]any) bool {
		s, _ := r["err"].(string)
		return r["msg"] == "session lost: stopping leaderships and work" || strings.Contains(s, "shard map write rejected")
	})) == 0 {
		t.Errorf("the paused leader did not notice it was fenced")
	}
}

func sortedNames(names []string) []string {
	return slices.Sorted(slices.Values(names))
}

func decode(v []byte) *keyspace.ShardMap {
	var m keyspace.ShardMap
	if err := json.Unmarshal(v, &m); err != nil {
		return nil
	}
	return &m
}

// etcd stopped and restarted, and one instance's connection black-holed:
// every instance recovers by itself and the maps converge.
func TestEtcdRestartAndPartition(t *testing.T) {
	faultTest(t)
	e := startEtcd(t)
	cli := e.client()
	cfg := writeConfig(t, "orders:4", "billing:2")
	a := startShardd(t, e, "a", cfg)
	b := startShardd(t, e, "b", cfg)
	orders := map[string][]int{"a": {0, 1}, "b": {2, 3}}
	billing := map[string][]int{"a": {0}, "b": {1}}
	converged := func() bool {
		return agreed(t, cli, "orders", orders, a, b) && agreed(t, cli, "billing", billing, a, b)
	}
	etcdtest.Eventually(t, 15*time.Second, "agreement", converged)

	e.signal(syscall.SIGKILL)
	time.Sleep(ttl + time.Second) // etcd stays down longer than the TTL
	e.start()
	d := etcdtest.Eventually(t, 30*time.Second, "recovery after the etcd restart", converged)
	t.Logf("etcd restart: recovered %s after etcd came back", d.Round(time.Millisecond))
	for _, p := range []*proc{a, b} {
		if len(p.find(msg("session lost: stopping leaderships and work"))) == 0 {
			t.Errorf("%s did not fence itself while etcd was down", p.name)
		}
	}

	b.proxy.Blackhole()
	etcdtest.Eventually(t, ttl+5*time.Second, "a alone", func() bool {
		return agreed(t, cli, "orders", map[string][]int{"a": {0, 1, 2, 3}}, a)
	})
	b.proxy.Restore()
	d = etcdtest.Eventually(t, 30*time.Second, "recovery after the partition", converged)
	t.Logf("partition: recovered %s after the connection came back", d.Round(time.Millisecond))
	// Only the two current sessions hold leases.
	resp, err := cli.Leases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Leases) != 2 {
		t.Errorf("%d leases, want 2: old leases were not revoked", len(resp.Leases))
	}
}

// Fifty jobs on three instances: leaderships spread, all maps converge.
func TestFiftyJobs(t *testing.T) {
	parallel(t)
	e := startEtcd(t)
	cli := e.client()
	var jobs []string
	for i := 0; i < 50; i++ {
		jobs = append(jobs, fmt.Sprintf("job-%02d:3", i))
	}
	cfg := writeConfig(t, jobs...)
	a := startShardd(t, e, "a", cfg)
	b := startShardd(t, e, "b", cfg)
	c := startShardd(t, e, "c", cfg)
	want := map[string][]int{"a": {0}, "b": {1}, "c": {2}}
	d := etcdtest.Eventually(t, 60*time.Second, "50 maps to converge", func() bool {
		for i := 0; i < 50; i++ {
			if !agreed(t, cli, fmt.Sprintf("job-%02d", i), want, a, b, c) {
				return false
			}
		}
		return true
	})
	// Leaderships move to their preferred instances once the maps are
	// current: wait for the spread.
	leaders := map[string]int{}
	spread := etcdtest.Eventually(t, 20*time.Second, "leaderships to spread", func() bool {
		leaders = map[string]int{}
		for i := 0; i < 50; i++ {
			leaders[etcdtest.LeaderOf(cli, fmt.Sprintf("job-%02d", i))]++
		}
		return leaders["a"] >= 5 && leaders["b"] >= 5 && leaders["c"] >= 5
	})
	t.Logf("50 jobs converged in %s; leaderships spread %s later: %v", d.Round(time.Millisecond), spread.Round(time.Millisecond), leaders)
}

// Garbage written by hand into the map and config keys: clear errors, the
// leader repairs, nobody crashes.
func TestMalformedKeys(t *testing.T) {
	parallel(t)
	e := startEtcd(t)
	cli := e.client()
	cfg := writeConfig(t, "orders:4")
	a := startShardd(t, e, "a", cfg)
	b := startShardd(t, e, "b", cfg)
	want := map[string][]int{"a": {0, 1}, "b": {2, 3}}
	etcdtest.Eventually(t, 15*time.Second, "agreement", func() bool { return agreed(t, cli, "orders", want, a, b) })
	keys := keyspace.NewKeys("")
	before := etcdtest.StoredMap(cli, "orders").Epoch
	ctx := context.Background()
	mustPut(t, cli, keys.Shards("orders"), "{not json")
	mustPut(t, cli, keys.Config("orders"), `{"job": 42}`)
	etcdtest.Eventually(t, 10*time.Second, "the map's repair", func() bool {
		m := etcdtest.StoredMap(cli, "orders")
		return m != nil && m.Epoch > before && agreed(t, cli, "orders", want, a, b)
	})
	// The config is repaired by its own write, which may come a little
	// after the map's.
	etcdtest.Eventually(t, 10*time.Second, "the config's repair", func() bool {
		resp, err := cli.Get(ctx, keys.Config("orders"))
		return err == nil && len(resp.Kvs) == 1 && strings.Contains(string(resp.Kvs[0].Value), `"shardingTotalCount":4`)
	})
	var logged bool
	for _, p := range []*proc{a, b} {
		logged = logged || len(p.find(func(r map[string]any) bool { return strings.Contains(fmt.Sprint(r["msg"]), "malformed") })) > 0
		select {
		case <-p.exited:
			t.Errorf("%s exited: %v", p.name, p.err)
		default:
		}
	}
	if !logged {
		t.Error("no instance logged the malformed values")
	}
}

func mustPut(t *testing.T, cli *clientv3.Client, key, val string) {
	t.Helper()
	if _, err := cli.Put(context.Background(), key, val); err != nil {
		t.Fatal(err)
	}
}

// shardd status reads etcd directly and shows OK, then CRASHED while a
// killed instance still owns items, then OK again.
func TestStatusCommand(t *testing.T) {
	parallel(t)
	e := startEtcd(t)
	cli := e.client()
	cfg := writeConfig(t, "orders:4")
	a := startShardd(t, e, "a", cfg)
	b := startShardd(t, e, "b", cfg)
	etcdtest.Eventually(t, 15*time.Second, "agreement", func() bool {
		return agreed(t, cli, "orders", map[string][]int{"a": {0, 1}, "b": {2, 3}}, a, b)
	})
	status := func() admin.ClusterStatus {
		out, err := exec.Command(bin.shardd, "status", "--etcd", e.clientURL, "-o", "json").Output()
		if err != nil {
			t.Fatalf("shardd status: %v", err)
		}
		var st admin.ClusterStatus
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatalf("status output is not JSON: %v\n%s", err, out)
		}
		return st
	}
	st := status()
	if len(st.Jobs) != 1 || st.Jobs[0].Status != admin.StatusOK || st.Jobs[0].Leader == "" || len(st.Jobs[0].Items) != 4 || len(st.Instances) != 2 {
		t.Fatalf("status = %+v", st)
	}
	if st.Jobs[0].Items[2].Instance != "b" {
		t.Errorf("item 2 on %q, want b", st.Jobs[0].Items[2].Instance)
	}

	b.stop(syscall.SIGKILL)
	// Until the lease expires b is still a member, but its instance key is
	// gone only with the lease too; CRASHED shows when the map names an
	// instance that has no instance key. Delete it by hand to see it now.
	mustDelete(t, cli, keyspace.NewKeys("").Instance("b"))
	if st := status(); st.Jobs[0].Status != admin.StatusCrashed {
		t.Errorf("status after b died = %s, want CRASHED", st.Jobs[0].Status)
	}
	etcdtest.Eventually(t, ttl+5*time.Second, "a alone", func() bool {
		return agreed(t, cli, "orders", map[string][]int{"a": {0, 1, 2, 3}}, a)
	})
	if st := status(); st.Jobs[0].Status != admin.StatusOK {
		t.Errorf("status after resharding = %s, want OK", st.Jobs[0].Status)
	}
}

func mustDelete(t *testing.T, cli *clientv3.Client, key string) {
	t.Helper()
	if _, err := cli.Delete(context.Background(), key); err != nil {
		t.Fatal(err)
	}
}

// etcd unreachable at start: shardd retries with clear logs and joins once
// etcd is there, without crashing.
func TestEtcdUnreachableAtStart(t *testing.T) {
	parallel(t)
	e := newEtcd(t)
	cfg := writeConfig(t, "orders:2")
	a := startShardd(t, e, "a", cfg)
	etcdtest.Eventually(t, 20*time.Second, "two failed attempts logged", func() bool {
		return len(a.find(msg("cannot reach etcd; retrying")))+len(a.find(msg("session ended; reconnecting"))) >= 2
	})
	select {
	case <-a.exited:
		t.Fatalf("shardd exited while etcd was unreachable: %v", a.err)
	default:
	}
	e.start()
	cli := e.client()
	etcdtest.Eventually(t, 15*time.Second, "a to join once etcd is up", func() bool {
		return agreed(t, cli, "orders", map[string][]int{"a": {0, 1}}, a)
	})
	a.stop(syscall.SIGTERM)
	if a.err != nil {
		t.Errorf("exit after SIGTERM: %v", a.err)
	}
}
