package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/faultproxy"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// A watch gap resynced while loadTriggers' read is in flight: the read
// may predate the gap, so the triggers are read again before any is
// served, and the trigger put in the gap runs the child.
func TestDepsResyncDuringLoadTriggers(t *testing.T) {
	t.Parallel()
	longFaults(t)
	srv := etcdtest.Start(t)
	dir := t.TempDir()
	yaml := `jobs:
  - name: parent
    strategy: FIRST
    script: 'echo "$SHARDD_FENCE" >> ` + dir + `/parent'
  - name: child
    strategy: LAST
    dependsOn: [parent]
    script: 'echo "$SHARDD_PARENT_FIRE" >> ` + dir + `/child'
`
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
		if r, ok := req.(*pb.RangeRequest); ok && string(r.Key) == keys.Triggers("child") && n.Add(1) == 1 {
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
