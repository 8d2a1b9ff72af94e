package engine

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/faultproxy"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// longFaults gates the dependency fault tests: a minute of real faults,
// run by make e2e-long (and .ci/run), not the default suite.
// readsKey reports whether req, a unary etcd request, reads key (one key
// or, with a range end, the range starting at it): a Range, or a Txn
// holding one, as coord batches the reads of many jobs in one Txn.
func readsKey(req any, key string) bool {
	var ranges []*pb.RangeRequest
	switch r := req.(type) {
	case *pb.RangeRequest:
		ranges = append(ranges, r)
	case *pb.TxnRequest:
		for _, op := range r.Success {
			if rr := op.GetRequestRange(); rr != nil {
				ranges = append(ranges, rr)
			}
		}
	}
	for _, r := range ranges {
		if string(r.Key) == key {
			return true
		}
	}
	return false
}

func longFaults(t *testing.T) {
	t.Helper()
	if os.Getenv("SHARDD_E2E_LONG") == "" {
		t.Skip("a long fault test: make e2e-long (SHARDD_E2E_LONG=1)")
	}
}

// dyingNode is a real coord.Node whose instance "dies" right after the
// first Complete of a run of job: the record is written, the barrier note
// never is (kill -9 between the two), and the instance is stopped.
type dyingNode struct {
	*coord.Node
	job  string
	dead atomic.Bool
	die  func()
	once sync.Once
}

func (d *dyingNode) Complete(ctx context.Context, g *coord.Grant, o coord.Outcome) error {
	err := d.Node.Complete(ctx, g, o)
	d.dead.Store(true) // the instance runs only d.job
	d.once.Do(func() { go d.die() })
	return err
}

func (d *dyingNode) NoteOutcome(ctx context.Context, job string, total int, rec keyspace.ItemRecord, idx keyspace.ParentsOf) (keyspace.Barrier, bool, error) {
	if d.dead.Load() {
		return keyspace.Barrier{}, false, errors.New("dead")
	}
	return d.Node.NoteOutcome(ctx, job, total, rec, idx)
}

func wrapDying(job string, stop *func()) func(*Options) {
	return func(o *Options) {
		o.Node = &dyingNode{Node: o.Node.(*coord.Node), job: job, die: func() { (*stop)() }}
	}
}

// An instance that records a parent item's outcome and dies before noting
// it leaves the note to the item's next owner, also under per-fire
// strategies, whose maps name no owner: any member notes. The child runs
// once, within the bound.
func TestDepsPerFireUnnotedOutcome(t *testing.T) {
	t.Parallel()
	longFaults(t)
	for _, strategy := range []string{"AVG_ALLOCATION", "ROUND", "RANDOM", "FAILOVER"} {
		t.Run(strategy, func(t *testing.T) {
			srv := etcdtest.Shared(t)
			dir := t.TempDir()
			yaml := `jobs:
  - name: parent
    strategy: ` + strategy + `
    script: 'echo "$SHARDD_INSTANCE" >> ` + dir + `/parent'
  - name: child
    dependsOn: [parent]
    script: 'echo "$SHARDD_ITEM" >> ` + dir + `/child'
`
			// x alone runs both jobs (a child's file defines its parents).
			var stopX func()
			x, sx := startInstance(t, srv.Client(), "x", yaml, wrapDying("parent", &stopX))
			stopX = sx
			etcdtest.Eventually(t, 15*time.Second, "x's view of parent's children and maps", func() bool {
				v, _ := x.View("parent")
				cv, _ := x.View("child")
				return len(v.Children["child"].Parents) == 1 && v.Map != nil && len(v.Map.Instances) == 1 && cv.Map != nil
			})
			cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
			if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
				t.Fatal(err)
			}
			etcdtest.Eventually(t, 15*time.Second, "x to run the parent's item", func() bool { return len(lines(filepath.Join(dir, "parent"))) == 1 })
			end := time.Now()
			// x is gone; b takes its place.
			b := instance(t, srv, "b", yaml)
			etcdtest.Eventually(t, 15*time.Second, "b alone in the parent's map", func() bool {
				v, _ := b.View("parent")
				cv, _ := b.View("child")
				return v.Map != nil && len(v.Map.Instances) == 1 && v.Map.Instances[0] == "b" && len(v.Children["child"].Parents) == 1 && cv.Map != nil && len(cv.Map.Instances) == 1
			})
			deadline := end.Add(15 * time.Second) // far beyond TTL (2 s) + 2 s
			for time.Now().Before(deadline) && len(lines(filepath.Join(dir, "child"))) == 0 {
				time.Sleep(50 * time.Millisecond)
			}
			resp, _ := cli.Get(ctx, keys.Fires("parent"), clientv3.WithPrefix())
			var barriers []string
			for _, kv := range resp.Kvs {
				barriers = append(barriers, string(kv.Key)+"="+string(kv.Value))
			}
			if n := len(lines(filepath.Join(dir, "child"))); n != 1 {
				t.Fatalf("%s: the parent's fire completed DONE at %s on x (which died before noting it), but the child ran %d times after %s (want 1, within TTL+2s); barriers: %v",
					strategy, end.Format(time.RFC3339), n, time.Since(end).Round(time.Second), barriers)
			}
		})
	}
}

// An upstream trigger put while the child's instance is cut off, in a
// stretch of the watch that etcd compacted, is read again when the watch
// resumes (the hub's resync): the child runs for it, and a later trigger
// served first cannot make it look served.
func TestDepsUpstreamTriggerInACompactedWatchGap(t *testing.T) {
	t.Parallel()
	longFaults(t)
	srv := etcdtest.Start(t)
	dir := t.TempDir()
	yaml := fenceLoggingPair(dir)
	// p runs the parent (FIRST), z the child (LAST); z reaches etcd
	// through a proxy.
	proxy, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	p := instance(t, srv, "p", yaml)
	c, stopC := startInstance(t, srv.Client("http://"+proxy.Addr()), "z", yaml)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "views", func() bool {
		v, _ := p.View("parent")
		cv, _ := c.View("child")
		return len(v.Children["child"].Parents) == 1 && v.Map != nil && len(v.Map.ItemsOf("p")) == 1 && cv.Map != nil && len(cv.Map.ItemsOf("z")) == 1
	})
	childRuns := func() int { return len(lines(filepath.Join(dir, "child"))) }
	parentRuns := func() int { return len(lines(filepath.Join(dir, "parent"))) }

	// The child's connection to etcd stalls (a short partition, < TTL).
	proxy.Blackhole()
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "the upstream trigger in etcd", func() bool {
		resp, err := cli.Get(ctx, keys.Triggers("child"), clientv3.WithPrefix())
		return err == nil && len(resp.Kvs) == 1
	})
	// etcd compacts (auto-compaction, or an operator's defrag routine).
	put, err := cli.Put(ctx, "/unrelated", "x")
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("BREAK_NO_COMPACT") == "" { // the control: no compaction, the watch resumes, the child runs
		if _, err := cli.Compact(ctx, put.Header.Revision); err != nil {
			t.Fatal(err)
		}
	}
	// The partition heals: the connection is re-made, the watch resumes
	// from a compacted revision and the hub resyncs.
	proxy.Sever()
	proxy.Restore()
	t0 := time.Now()
	for time.Since(t0) < 10*time.Second && childRuns() == 0 {
		time.Sleep(50 * time.Millisecond)
	}
	if n := childRuns(); n != 1 {
		t.Errorf("stage 1: parent fire 1 completed (parent ran %d), the upstream trigger waits in etcd, but the child ran %d times within 10 s (want 1 within TTL+2s)", parentRuns(), n)
	}

	// A second parent fire: its trigger arrives by the watch and is served.
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 15*time.Second, "the child to run for parent fire 2", func() bool { return childRuns() >= 1 })
	// Restart the child's instance: it reads the waiting triggers.
	stopC()
	instance(t, srv, "z", yaml)
	time.Sleep(8 * time.Second)
	resp, _ := cli.Get(ctx, keys.Triggers("child"), clientv3.WithPrefix())
	if n := childRuns(); n != 2 {
		t.Errorf("stage 2: 2 successful parent fires (parent ran %d times), the child ran %d times even after its instance restarted (want 2); child triggers left in etcd: %d", parentRuns(), n, len(resp.Kvs))
	}
}

// A shardingTotalCount edit that shrinks the job while a fire runs does
// not complete the fire's barrier early: it counts the items of the fire's
// claims, and the runs left out of the new map note their outcomes when
// they end. The child runs after all of them.
func TestDepsTotalShrinkMidFire(t *testing.T) {
	t.Parallel()
	longFaults(t)
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	def := func(total int) string {
		return `jobs:
  - name: parent
    shardingTotalCount: ` + string(rune('0'+total)) + `
    script: 'if [ $SHARDD_ITEM -lt 2 ]; then sleep 2; else sleep 6; fi; echo "$SHARDD_ITEM $(date +%s%N)" >> ` + dir + `/parent'
  - name: child
    dependsOn: [parent]
    script: 'echo "$(date +%s%N)" >> ` + dir + `/child'
`
	}
	a := instance(t, srv, "a", def(4))
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "the children index", func() bool {
		v, _ := a.View("parent")
		return len(v.Children["child"].Parents) == 1 && v.Map != nil && v.Map.Total == 4
	})
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	// An operator deploys the job with 2 items on a new host.
	instance(t, srv, "e", def(2))
	etcdtest.Eventually(t, 15*time.Second, "all 4 parent items to end", func() bool { return len(lines(filepath.Join(dir, "parent"))) == 4 })
	time.Sleep(3 * time.Second)
	parent := lines(filepath.Join(dir, "parent"))
	child := lines(filepath.Join(dir, "child"))
	if len(child) > 0 {
		last := parent[len(parent)-1]
		if child[0] < last[strings.Index(last, "_")+1:] {
			t.Fatalf("the child ran at %s, before the parent fire's last item ended: parent items (item_endns) %v", child[0], parent)
		}
	}
	resp, _ := cli.Get(ctx, keys.Fires("parent"), clientv3.WithPrefix())
	for _, kv := range resp.Kvs {
		t.Logf("barrier %s = %s", kv.Key, kv.Value)
	}
	if len(child) != 1 {
		t.Fatalf("child ran %d times for 1 parent fire", len(child))
	}
}

// Under BROADCAST (one item per member) a member stopped mid-fire shrinks
// the map; the fire's barrier still counts the items of its claims, so the
// fire does not complete as a success without that member's item: the
// child does not run for it.
func TestDepsBroadcastMemberDies(t *testing.T) {
	t.Parallel()
	longFaults(t)
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := `jobs:
  - name: parent
    strategy: BROADCAST
    failover: false
    script: 'echo "start $SHARDD_INSTANCE" >> ` + dir + `/parent; sleep 3; echo "end $SHARDD_INSTANCE" >> ` + dir + `/parent'
  - name: child
    dependsOn: [parent]
    script: 'echo "$SHARDD_PARENT_JOB" >> ` + dir + `/child'
`
	a := instance(t, srv, "a", yaml)
	instance(t, srv, "b", yaml)
	_, stopX := startInstance(t, srv.Client(), "x", yaml, func(o *Options) { o.ShutdownGrace = 100 * time.Millisecond })
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "3 members and the children index", func() bool {
		v, _ := a.View("parent")
		return len(v.Children["child"].Parents) == 1 && v.Map != nil && v.Map.Total == 3
	})
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "the 3 parent items to start", func() bool { return len(lines(filepath.Join(dir, "parent"))) == 3 })
	stopX() // x goes down mid-fire: its item is killed (failover: false)
	time.Sleep(8 * time.Second)
	recs := childRecords(t, a, "parent")
	var states []string
	for _, r := range recs {
		states = append(states, r.Instance+":"+string(r.State)+"/"+string(r.Reason))
	}
	resp, _ := cli.Get(ctx, keys.Fires("parent"), clientv3.WithPrefix())
	for _, kv := range resp.Kvs {
		t.Logf("barrier %s = %s", kv.Key, kv.Value)
	}
	if got := lines(filepath.Join(dir, "child")); len(got) != 0 {
		t.Fatalf("an item of the parent fire was killed (parent records %v; runs %v), yet the child ran %d times (want 0: the fire is not complete without that item)", states, lines(filepath.Join(dir, "parent")), len(got))
	}
}

// Two parents completing at once on two
// instances fire the child once per round.
func TestDepsTwoParentsAtOnce(t *testing.T) {
	t.Parallel()
	longFaults(t)
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := `jobs:
  - name: pa
    strategy: FIRST
    script: 'sleep 0.3'
  - name: pb
    strategy: LAST
    script: 'sleep 0.3'
  - name: both
    dependsOn: [pa, pb]
    script: 'echo "$SHARDD_PARENT_JOB" >> ` + dir + `/both'
`
	a := instance(t, srv, "a", yaml)
	instance(t, srv, "b", yaml)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "maps", func() bool {
		va, _ := a.View("pa")
		vb, _ := a.View("pb")
		return len(va.Children["both"].Parents) == 2 && len(vb.Children["both"].Parents) == 2 && va.Map != nil && len(va.Map.ItemsOf("a")) == 1 && vb.Map != nil && len(vb.Map.ItemsOf("b")) == 1
	})
	const rounds = 8
	for r := 1; r <= rounds; r++ {
		var wg sync.WaitGroup
		for _, j := range []string{"pa", "pb"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: j}); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		time.Sleep(2500 * time.Millisecond)
		if got := lines(filepath.Join(dir, "both")); len(got) != r {
			t.Fatalf("round %d: the child ran %d times: %v", r, len(got), got)
		}
	}
}

// A parent with as many children as allowed (config.MaxChildren): its
// completing note's Txn, one trigger per child, stays within etcd's
// --max-txn-ops (128); the parent runs on, and every child runs once per
// fire. (More children are refused by validate.)
func TestDepsManyChildren(t *testing.T) {
	t.Parallel()
	longFaults(t)
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	kids := config.MaxChildren
	var b strings.Builder
	b.WriteString("jobs:\n  - name: parent\n    script: 'echo x >> " + dir + "/parent'\n")
	for i := range kids {
		fmt.Fprintf(&b, "  - name: kid%03d\n    dependsOn: [parent]\n    script: 'echo %d >> %s/kids'\n", i, i, dir)
	}
	a := instance(t, srv, "a", b.String())
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 60*time.Second, "the children index", func() bool {
		v, _ := a.View("parent")
		return len(v.Children) == kids && v.Map != nil
	})
	for i := 1; i <= 2; i++ {
		if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
	}
	p, k := len(lines(filepath.Join(dir, "parent"))), len(lines(filepath.Join(dir, "kids")))
	resp, _ := cli.Get(ctx, keys.Fires("parent"), clientv3.WithPrefix())
	for _, kv := range resp.Kvs {
		t.Logf("barrier %s = %s", kv.Key, kv.Value)
	}
	if p != 2 || k != 2*kids {
		t.Fatalf("2 manual triggers of a parent with %d children: the parent ran %d times (want 2), the children ran %d times (want %d)", kids, p, k, 2*kids)
	}
}

// A host publishes an edit of the child (dependsOn [p1] -> [p2]) and its
// first write of p1's children index fails: p1's index keeps the child,
// but a fire of p1 reads the child's registered definition and does not
// trigger it.
func TestDepsDependsOnEditWithAStaleIndex(t *testing.T) {
	t.Parallel()
	longFaults(t)
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	def := func(parent string) string {
		return `jobs:
  - name: p1
    script: 'true'
  - name: p2
    script: 'true'
  - name: child
    dependsOn: [` + parent + `]
    script: 'echo "$SHARDD_PARENT_JOB" >> ` + dir + `/child'
`
	}
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	a, stopA := startInstance(t, srv.Client(), "a", def("p1"))
	etcdtest.Eventually(t, 15*time.Second, "p1's children index", func() bool {
		v, _ := a.View("p1")
		return len(v.Children["child"].Parents) == 1
	})
	stopA()
	var failed atomic.Int32
	icpt := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if readsKey(req, srv.WireKey(keys.Children("p1"))) && os.Getenv("REV2_NOFAULT") == "" && failed.Add(1) == 1 {
			return status.Error(codes.Unavailable, "lost reply (test)")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	b, _ := startInstance(t, srv.ClientWith([]grpc.DialOption{grpc.WithUnaryInterceptor(icpt)}), "b", def("p2"))
	etcdtest.Eventually(t, 15*time.Second, "b's view: child depends on p2, p2's index", func() bool {
		v, _ := b.View("child")
		p2, _ := b.View("p2")
		c, _ := b.View("child")
		return v.Job != nil && len(v.Job.DependsOn) == 1 && v.Job.DependsOn[0] == "p2" && len(p2.Children["child"].Parents) == 1 && c.Map != nil
	})
	time.Sleep(2 * time.Second)
	resp, _ := cli.Get(ctx, keys.Children("p1"))
	if len(resp.Kvs) > 0 {
		t.Logf("p1's children index: %s (index reads failed: %d)", resp.Kvs[0].Value, failed.Load())
	}
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "p1"}); err != nil {
		t.Fatal(err)
	}
	if failed.Load() == 0 && os.Getenv("REV2_NOFAULT") == "" {
		t.Fatal("no read of p1's children index was failed: the fault this test is about never happened")
	}
	time.Sleep(5 * time.Second)
	if got := lines(filepath.Join(dir, "child")); len(got) != 0 {
		t.Fatalf("child (dependsOn: [p2]) ran after a fire of p1: %v", got)
	}
}

// A watch gap resynced while loadTriggers' read is in flight: the read
// may predate the gap, so the triggers are read again before any is
// served, and the trigger put in the gap runs the child.
func TestDepsResyncDuringLoadTriggers(t *testing.T) {
	t.Parallel()
	longFaults(t)
	srv := etcdtest.Start(t)
	dir := t.TempDir()
	yaml := fenceLoggingPair(dir)
	keys := keyspace.NewKeys("")
	proxy, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	held, release := make(chan struct{}), make(chan struct{})
	var n atomic.Int32
	icpt := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if readsKey(req, srv.WireKey(keys.Triggers("child"))) && n.Add(1) == 1 {
			close(held)
			if os.Getenv("REV2_NOHOLD") == "" {
				<-release // the reply of loadTriggers' read is slow
			}
		}
		return err
	}
	p := instance(t, srv, "p", yaml)
	etcdtest.Eventually(t, 15*time.Second, "p's views", func() bool {
		v, _ := p.View("parent")
		return len(v.Children["child"].Parents) == 1 && v.Map != nil && len(v.Map.ItemsOf("p")) == 1
	})
	cli, ctx := srv.Client(), context.Background()
	instanceWith(t, srv.ClientWith([]grpc.DialOption{grpc.WithUnaryInterceptor(icpt)}, "http://"+proxy.Addr()), "z", yaml)
	select {
	case <-held:
	case <-time.After(20 * time.Second):
		t.Fatal("z never read the child's triggers")
	}
	// While the reply is on its way: a gap in z's watch, compacted, in which
	// parent fire 1 completes.
	proxy.Blackhole()
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "upstream trigger 1", func() bool {
		resp, err := cli.Get(ctx, keys.Triggers("child"), clientv3.WithPrefix())
		return err == nil && len(resp.Kvs) == 1
	})
	put, _ := cli.Put(ctx, "/unrelated", "x")
	if _, err := cli.Compact(ctx, put.Header.Revision); err != nil {
		t.Fatal(err)
	}
	proxy.Sever()
	proxy.Restore()
	time.Sleep(2500 * time.Millisecond) // z's hub resumes, finds the revision compacted, resyncs
	close(release)
	time.Sleep(time.Second)
	// Parent fire 2: its trigger reaches z by the watch.
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(6 * time.Second)
	resp, _ := cli.Get(ctx, keys.Triggers("child"), clientv3.WithPrefix())
	if got := lines(filepath.Join(dir, "child")); len(got) != 2 {
		t.Fatalf("2 successful parent fires (parent runs %v), child ran %d times: %v; child triggers left in etcd: %d",
			strings.Join(lines(filepath.Join(dir, "parent")), ","), len(got), got, len(resp.Kvs))
	}
}

// The completing note's Txn applies, its reply is lost
// (every time for the first 3 completing Txns): the child runs once per
// parent fire.
func TestDepsLostCompletingReply(t *testing.T) {
	t.Parallel()
	longFaults(t)
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	var dropped atomic.Int32
	icpt := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if tr, ok := req.(*pb.TxnRequest); ok && err == nil {
			fires, triggers := false, false
			for _, op := range tr.Success {
				if p := op.GetRequestPut(); p != nil {
					k := string(p.Key)
					fires = fires || strings.Contains(k, "/fires/")
					triggers = triggers || strings.Contains(k, "/triggers/u")
				}
			}
			if fires && triggers && dropped.Add(1) <= 3 {
				return status.Error(codes.Unavailable, "reply lost (test)")
			}
		}
		return err
	}
	cli := srv.ClientWith([]grpc.DialOption{grpc.WithUnaryInterceptor(icpt)})
	a, _ := startInstance(t, cli, "a", depsJobs(dir))
	keys, ctx := keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 15*time.Second, "index", func() bool {
		v, _ := a.View("parent")
		c, _ := a.View("child")
		return len(v.Children["child"].Parents) == 1 && v.Map != nil && c.Map != nil
	})
	for i := 1; i <= 2; i++ {
		if _, err := admin.New(srv.Client(), keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(4 * time.Second)
		if got := lines(filepath.Join(dir, "child")); len(got) != 2*i {
			t.Fatalf("fire %d: child runs %v (want %d), completing replies dropped %d", i, got, 2*i, dropped.Load())
		}
	}
	t.Logf("completing replies dropped: %d", dropped.Load())
}

// Under BROADCAST, a member rejoining right after a fire runs its item of
// the fire with a larger map: the fire's barrier waits for that item too
// (notes take the larger total), so the child never runs before every item
// of the fire ended, nor after one of them failed.
func TestDepsBroadcastRejoin(t *testing.T) {
	t.Parallel()
	longFaults(t)
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := `jobs:
  - name: parent
    strategy: BROADCAST
    cron: "*/4 * * * * ?"
    script: 'S=$(date +%s%N); if [ "$SHARDD_INSTANCE" = c ]; then sleep 3; echo "$SHARDD_FIRE_TIME c $SHARDD_ITEM $S $(date +%s%N) FAIL" >> ` + dir + `/parent; exit 1; fi; sleep 1.5; echo "$SHARDD_FIRE_TIME $SHARDD_INSTANCE $SHARDD_ITEM $S $(date +%s%N) ok" >> ` + dir + `/parent'
  - name: child
    dependsOn: [parent]
    script: 'echo "$SHARDD_PARENT_FIRE $(date +%s%N)" >> ` + dir + `/child'
`
	a := instance(t, srv, "a", yaml)
	instance(t, srv, "b", yaml)
	_, stopC := startInstance(t, srv.Client(), "c", yaml)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 20*time.Second, "3 members and the children index", func() bool {
		v, _ := a.View("parent")
		return len(v.Children["child"].Parents) == 1 && v.Map != nil && v.Map.Total == 3
	})
	// c runs at least one fire (item 2 gets a record), then leaves.
	etcdtest.Eventually(t, 20*time.Second, "c to run a parent item", func() bool {
		for _, l := range lines(filepath.Join(dir, "parent")) {
			if strings.Contains(l, "_c_") {
				return true
			}
		}
		return false
	})
	time.Sleep(500 * time.Millisecond)
	stopC()
	etcdtest.Eventually(t, 20*time.Second, "the map to shrink to 2", func() bool {
		v, _ := a.View("parent")
		return v.Map != nil && v.Map.Total == 2
	})
	violation := func() (string, bool) {
		parent := lines(filepath.Join(dir, "parent"))
		for _, c := range lines(filepath.Join(dir, "child")) {
			f := strings.Split(c, "_")
			for _, p := range parent {
				g := strings.Split(p, "_")
				if g[0] == f[0] && (g[5] == "FAIL" || g[4] > f[1]) {
					return "child run " + c + " for parent fire " + f[0] + ", whose item ran as " + p + " (fire_instance_item_startns_endns_outcome)", true
				}
			}
		}
		return "", false
	}
	for try := 0; try < 4; try++ {
		// Rejoin just after a fire: a and b have claimed it under the 2-item map.
		time.Sleep(time.Until(time.Now().Truncate(4 * time.Second).Add(4*time.Second + 150*time.Millisecond)))
		_, stopC = startInstance(t, srv.Client(), "c", yaml)
		time.Sleep(6 * time.Second)
		if why, bad := violation(); bad {
			resp, _ := cli.Get(ctx, keys.Fires("parent"), clientv3.WithPrefix())
			for _, kv := range resp.Kvs {
				t.Logf("barrier %s = %s", kv.Key, kv.Value)
			}
			t.Logf("parent runs: %v", lines(filepath.Join(dir, "parent")))
			t.Logf("child runs: %v", lines(filepath.Join(dir, "child")))
			t.Fatalf("try %d: %s", try, why)
		}
		stopC()
		time.Sleep(5 * time.Second)
	}
	t.Logf("no violation seen; parent runs %v child runs %v", lines(filepath.Join(dir, "parent")), lines(filepath.Join(dir, "child")))
}

// fenceLoggingPair is a parent (FIRST) that appends its fence to
// dir/parent and a child (LAST, dependsOn parent) that appends the parent
// fire it serves to dir/child.
func fenceLoggingPair(dir string) string {
	return `jobs:
  - name: parent
    strategy: FIRST
    script: 'echo "$SHARDD_FENCE" >> ` + dir + `/parent'
  - name: child
    strategy: LAST
    dependsOn: [parent]
    script: 'echo "$SHARDD_PARENT_FIRE" >> ` + dir + `/child'
`
}
