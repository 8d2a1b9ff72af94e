package coord

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/stacks"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// recorder collects what a subscription sees.
type recorder struct {
	mu      sync.Mutex
	keys    []string
	revs    []int64
	resyncs int
}

func (r *recorder) event(ev *clientv3.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, string(ev.Kv.Key))
	r.revs = append(r.revs, ev.Kv.ModRevision)
}

func (r *recorder) resync() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resyncs++
}

func (r *recorder) snapshot() ([]string, []int64, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.keys...), append([]int64(nil), r.revs...), r.resyncs
}

func startHub(t *testing.T, cli *clientv3.Client, keys keyspace.Keys, from int64) *hub {
	t.Helper()
	h := newHub(cli, keys, func(msg string, err error, attrs ...any) { t.Logf("hub: %s: %v %v", msg, err, attrs) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.runFrom(ctx, from)
	}()
	t.Cleanup(func() { cancel(); <-done })
	if !h.waitReady(ctx) {
		t.Fatal("hub not ready")
	}
	return h
}

// The hub routes each event to the subscribers of its job and prefix only,
// in revision order, and stops after cancel.
func TestHubRoutesByJobAndPrefix(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli := srv.Client()
	defer cli.Close()
	keys := keyspace.NewKeys("/hubtest")
	h := startHub(t, cli, keys, 0)

	var shardsA, membersA, shardsB recorder
	cancelA := h.subscribe("a", keys.Shards("a"), shardsA.event, shardsA.resync)
	h.subscribe("a", keys.Members("a"), membersA.event, membersA.resync)
	h.subscribe("b", keys.Shards("b"), shardsB.event, shardsB.resync)

	ctx := context.Background()
	put := func(key string) {
		if _, err := cli.Put(ctx, key, "v"); err != nil {
			t.Fatal(err)
		}
	}
	put(keys.Shards("a"))
	put(keys.Member("a", "i1"))
	put(keys.Item("a", 0)) // nobody subscribes to items
	put(keys.Shards("b"))
	put(keys.Shards("ab")) // a job whose name extends "a"
	put(keys.Shards("a"))
	if _, err := cli.Delete(ctx, keys.Member("a", "i1")); err != nil {
		t.Fatal(err)
	}
	put("/hubtest/instances/i1") // outside the jobs keyspace
	etcdtest.Eventually(t, 5*time.Second, "a's events", func() bool { k, _, _ := membersA.snapshot(); return len(k) == 2 })

	keysA, revsA, _ := shardsA.snapshot()
	if want := []string{keys.Shards("a"), keys.Shards("a")}; fmt.Sprint(keysA) != fmt.Sprint(want) {
		t.Errorf("a/shards subscriber saw %v, want %v", keysA, want)
	}
	if len(revsA) == 2 && revsA[0] >= revsA[1] {
		t.Errorf("events out of revision order: %v", revsA)
	}
	if k, _, _ := shardsB.snapshot(); len(k) != 1 || k[0] != keys.Shards("b") {
		t.Errorf("b/shards subscriber saw %v, want only %s", k, keys.Shards("b"))
	}

	cancelA()
	put(keys.Shards("a"))
	put(keys.Shards("b"))
	etcdtest.Eventually(t, 5*time.Second, "b's second event", func() bool { k, _, _ := shardsB.snapshot(); return len(k) == 2 })
	if k, _, _ := shardsA.snapshot(); len(k) != 2 {
		t.Errorf("a cancelled subscription still got events: %v", k)
	}
}

// A watch resumed at a compacted revision cannot replay what it missed:
// the hub tells every subscriber to re-read, then delivers what follows.
func TestHubResyncsAfterCompaction(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	defer cli.Close()
	keys := keyspace.NewKeys("/hubtest")
	ctx := context.Background()
	first, err := cli.Put(ctx, keys.Shards("a"), "1")
	if err != nil {
		t.Fatal(err)
	}
	last, err := cli.Put(ctx, keys.Shards("a"), "2")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, last.Header.Revision); err != nil {
		t.Fatal(err)
	}

	var r recorder
	h := newHub(cli, keys, func(string, error, ...any) {})
	h.subscribe("a", keys.Shards("a"), r.event, r.resync)
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); h.runFrom(hctx, first.Header.Revision-1) }()
	defer func() { cancel(); <-done }()

	etcdtest.Eventually(t, 10*time.Second, "a resync", func() bool { _, _, n := r.snapshot(); return n == 1 })
	resp, err := cli.Put(ctx, keys.Shards("a"), "3")
	if err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 5*time.Second, "the event after the resync", func() bool { k, _, _ := r.snapshot(); return len(k) == 1 })
	if _, revs, _ := r.snapshot(); revs[0] != resp.Header.Revision {
		t.Errorf("delivered revision %d, want %d (the put after the resync)", revs[0], resp.Header.Revision)
	}
}

// watchers reads etcd's own count of watchers from its /metrics.
func watchers(t *testing.T, srv *etcdtest.Server) int {
	t.Helper()
	resp, err := http.Get(srv.Endpoint() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	s := bufio.NewScanner(resp.Body)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "etcd_debugging_mvcc_watcher_total "); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int(n)
		}
	}
	t.Fatal("etcd_debugging_mvcc_watcher_total not in etcd's /metrics")
	return 0
}

// An instance holds one watch of the jobs keyspace however many jobs it
// runs, leads or waits to lead: etcd's watcher count does not grow with
// the jobs. A candidate waiting behind another one waits on that watch
// (elect.go), not on a watch of its own as concurrency.Election's Campaign
// does; when the leader leaves, it leads. Not parallel: it counts the
// process's goroutines.
func TestWatchersDoNotGrowWithJobs(t *testing.T) {
	srv := etcdtest.Start(t)
	var yaml strings.Builder
	yaml.WriteString("jobs:\n")
	const count = 40
	for i := range count {
		yaml.WriteString(job(fmt.Sprintf("j%02d", i), 2))
	}
	before := watchers(t, srv)
	first := startNode(t, srv, "first", jobs(t, yaml.String()))
	cli := srv.Client()
	defer cli.Close()
	mapsOf := func(want ...string) func() bool {
		return func() bool {
			maps, err := admin.New(cli, first.Keys()).Maps(context.Background())
			if err != nil || len(maps) != count {
				return false
			}
			for _, m := range maps {
				if !slices.Equal(m.Instances, want) {
					return false
				}
			}
			return true
		}
	}
	etcdtest.Eventually(t, 30*time.Second, "every job's map", mapsOf("first"))
	// Leader of every job, map watcher of every job: still one watcher.
	if got := watchers(t, srv) - before; got > 2 {
		t.Errorf("etcd has %d watchers for one instance with %d jobs; want at most 2 (the jobs watch, the instances watch)", got, count)
	}
	startNode(t, srv, "second", jobs(t, yaml.String()))
	etcdtest.Eventually(t, 30*time.Second, "every job's map of both", mapsOf("first", "second"))
	if got := watchers(t, srv) - before; got > 4 {
		t.Errorf("etcd has %d watchers for two instances with %d jobs, one waiting to lead each; want at most 4", got, count)
	}
	// No goroutine per job either: the jobs' tasks are stepped by each
	// node's scheduler, and an idle one holds none (a goroutine per job
	// was 80 more here). Left: per node, Run's session loop, the hub, the
	// scheduler's loop, the membership log, the etcd checks (rewind.go),
	// the applied catalog (applied.go) and the session's keepalive; and
	// this test's own two.
	var inCoord int
	etcdtest.Eventually(t, 10*time.Second, "the nodes' goroutines to settle", func() bool {
		inCoord = stacks.Count("shardd/pkg/coord.")
		return inCoord <= 2*7+2
	})
	t.Logf("goroutines in coord for 2 nodes with %d jobs each: %d", count, inCoord)
	led := map[string]int{}
	for i := range count {
		led[etcdtest.LeaderOf(cli, fmt.Sprintf("j%02d", i))]++
	}
	if led["first"] == 0 || led["first"]+led["second"] != count {
		t.Fatalf("leaders of the %d jobs: %v; want first to lead some, and every job led", count, led)
	}
	first.stop(t)
	etcdtest.Eventually(t, 30*time.Second, "the waiting candidate to lead every job and drop the first", mapsOf("second"))

}
