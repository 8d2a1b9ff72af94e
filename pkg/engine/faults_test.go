package engine

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

func txnTouches(req any, running bool, del bool) bool {
	tr, ok := req.(*pb.TxnRequest)
	if !ok {
		return false
	}
	for _, op := range tr.Success {
		if del {
			if d := op.GetRequestDeleteRange(); d != nil && strings.Contains(string(d.Key), "/running/") {
				return true
			}
		} else if p := op.GetRequestPut(); p != nil && strings.Contains(string(p.Key), "/running/") {
			return true
		}
	}
	return false
}

func starts(path string) int {
	b, _ := os.ReadFile(path)
	return strings.Count(string(b), "start ")
}

// failCompletions makes the first n completion transactions (those that
// delete a running marker) fail with etcd's "too many requests".
func failCompletions(n int32) grpc.DialOption {
	var failures atomic.Int32
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if txnTouches(req, true, true) && failures.Add(1) <= n {
			return rpctypes.ErrGRPCRequestTooManyRequests
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
}

const everySecondJob = "jobs:\n  - name: j\n    cron: \"@every 1s\"\n    script: "

// Three quick failures of the completion Txn ("too many requests", an etcd
// leader election) once left the record RUNNING and the marker under the
// live session: the item never ran again. Complete now retries until the
// write lands.
func TestFailedCompletionIsRetried(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	cli := srv.ClientWith([]grpc.DialOption{failCompletions(3)})
	script := `sh -c '` + strings.ReplaceAll(ledgerTo(path), "$1", "start") + `'`
	node := instanceWith(t, cli, "a", everySecondJob+etcdtest.YAMLQuote(script)+"\n")
	etcdtest.Eventually(t, 15*time.Second, "first run", func() bool { return starts(path) >= 1 })
	time.Sleep(6 * time.Second)
	st, err := node.ReadItem(context.Background(), "j", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("runs in ~6s after the failed Complete: %d; item: state=%s runningBy=%q fire=%s", starts(path), st.Record.State, st.RunningBy, st.Record.Fire)
	if n := starts(path); n < 5 {
		t.Errorf("%d runs of an every-second job in ~7s: the item is wedged after its completion write failed", n)
	}
	recs, err := admin.New(srv.Client(), keyspace.NewKeys("")).Records(context.Background(), "j")
	if err != nil || len(recs) == 0 || recs[0].State != keyspace.StateDone {
		t.Errorf("the first run's record is not DONE after its completion was retried: %+v, %v", recs, err)
	}
}

// A claim whose reply is lost and whose Txn applies after the read-back
// said it had not: the marker appears under the live session with no run
// here. The next reconcile adopts the claim and runs it.
func TestLateAppliedClaimIsAdopted(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	var once atomic.Bool
	icpt := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if txnTouches(req, true, false) && once.CompareAndSwap(false, true) {
			go func() { // delivered late, as a held packet / queued proposal would be
				time.Sleep(300 * time.Millisecond)
				invoker(context.Background(), method, req, new(pb.TxnResponse), cc, opts...)
			}()
			return status.Error(codes.Unavailable, "injected: connection lost after the request was sent")
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	cli := srv.ClientWith([]grpc.DialOption{icpt})
	script := `sh -c '` + strings.ReplaceAll(ledgerTo(path), "$1", "start") + `'`
	node := instanceWith(t, cli, "a", everySecondJob+etcdtest.YAMLQuote(script)+"\n")
	etcdtest.Eventually(t, 15*time.Second, "the delayed claim", func() bool { return once.Load() })
	time.Sleep(7 * time.Second)
	st, err := node.ReadItem(context.Background(), "j", 0)
	if err != nil {
		t.Fatal(err)
	}
	rec := "<none>"
	if st.Record != nil {
		rec = st.Record.State + " " + st.Record.Fire.String()
	}
	t.Logf("runs in ~7s: %d; item: %s runningBy=%q", starts(path), rec, st.RunningBy)
	if n := starts(path); n < 5 {
		t.Errorf("%d runs of an every-second job in ~7s: the item is wedged by a claim that applied after its read-back", n)
	}
}
