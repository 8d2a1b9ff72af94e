package engine

import (
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

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
