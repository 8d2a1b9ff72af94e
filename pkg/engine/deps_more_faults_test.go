package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

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
		if r, ok := req.(*pb.RangeRequest); ok && string(r.Key) == keys.Children("p1") && len(r.RangeEnd) == 0 && os.Getenv("REV2_NOFAULT") == "" && failed.Add(1) == 1 {
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
	time.Sleep(5 * time.Second)
	if got := lines(filepath.Join(dir, "child")); len(got) != 0 {
		t.Fatalf("child (dependsOn: [p2]) ran after a fire of p1: %v", got)
	}
}
