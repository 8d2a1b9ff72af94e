package coord

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
)

// heldBatcher returns a batcher of one batch at a time whose first send
// waits until release is closed; sent is closed when it is waiting.
func heldBatcher(t *testing.T, cli *clientv3.Client) (b *txnBatcher, sent, release chan struct{}) {
	b = newTxnBatcher(cli, 5*time.Second)
	b.maxInflight = 1
	sent, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	b.beforeSend = func([]*batchedTxn) {
		once.Do(func() {
			close(sent)
			<-release
		})
	}
	return b, sent, release
}

func (b *txnBatcher) pendingLen() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.pending)
}

func waitBatchPending(t *testing.T, b *txnBatcher, n int) {
	t.Helper()
	etcdtest.Eventually(t, 5*time.Second, fmt.Sprintf("%d requests pending", n), func() bool { return b.pendingLen() >= n })
}

// Requests that come together go in few Txns, and each gets its own
// answer.
func TestBatchedTxnsShareTxns(t *testing.T) {
	t.Parallel()
	cli := etcdtest.Shared(t).Client()
	b := newTxnBatcher(cli, 5*time.Second)
	ctx := context.Background()
	const n = 400
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("batch/%03d", i)
			resp, err := b.Txn(ctx, nil, []clientv3.Op{clientv3.OpPut(key, fmt.Sprint(i)), clientv3.OpGet(key)}, nil)
			if err != nil {
				errs <- err
				return
			}
			kvs := resp.Responses[1].GetResponseRange().Kvs
			if !resp.Succeeded || len(resp.Responses) != 2 || len(kvs) != 1 || string(kvs[0].Value) != fmt.Sprint(i) {
				errs <- fmt.Errorf("request %d: answer %+v", i, resp)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	got, err := cli.Get(ctx, "batch/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if got.Count != n {
		t.Errorf("%d keys written, want %d", got.Count, n)
	}
	// 400 requests of 2 operations: at most 64 to a Txn.
	if c := b.commits.Load(); c > n/8 {
		t.Errorf("%d requests in %d Txns: they were not batched", n, c)
	}
	t.Logf("%d requests in %d Txns", n, b.commits.Load())
}

// A request whose guard fails, or that etcd refuses (its lease is gone),
// gets its own answer; the others in its batch are written.
func TestBatchedTxnGuardsAreEachRequests(t *testing.T) {
	t.Parallel()
	cli := etcdtest.Shared(t).Client()
	ctx := context.Background()
	if _, err := cli.Put(ctx, "guard/b", "there"); err != nil {
		t.Fatal(err)
	}
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	b, sent, release := heldBatcher(t, cli)
	go b.Txn(ctx, nil, []clientv3.Op{clientv3.OpPut("guard/first", "")}, nil)
	<-sent
	type answer struct {
		resp *clientv3.TxnResponse
		err  error
	}
	absent := func(key string) clientv3.Cmp { return clientv3.Compare(clientv3.CreateRevision(key), "=", 0) }
	reqs := []struct {
		ifs       []clientv3.Cmp
		then, els []clientv3.Op
	}{
		{[]clientv3.Cmp{absent("guard/a")}, []clientv3.Op{clientv3.OpPut("guard/a", "1")}, nil},
		{[]clientv3.Cmp{absent("guard/b")}, []clientv3.Op{clientv3.OpPut("guard/b", "2")}, []clientv3.Op{clientv3.OpGet("guard/b")}},
		{[]clientv3.Cmp{absent("guard/c")}, []clientv3.Op{clientv3.OpPut("guard/c", "3")}, nil},
		{nil, []clientv3.Op{clientv3.OpPut("guard/d", "4", clientv3.WithLease(lease.ID))}, nil},
	}
	answers := make([]chan answer, len(reqs))
	for i, r := range reqs {
		answers[i] = make(chan answer, 1)
		go func() {
			resp, err := b.Txn(ctx, r.ifs, r.then, r.els)
			answers[i] <- answer{resp, err}
		}()
	}
	waitBatchPending(t, b, len(reqs))
	close(release)
	for i, want := range []string{"ok", "else", "ok", "lease"} {
		a := <-answers[i]
		switch want {
		case "ok":
			if a.err != nil || !a.resp.Succeeded {
				t.Errorf("request %d: %+v, %v; want it written", i, a.resp, a.err)
			}
		case "else":
			if a.err != nil || a.resp.Succeeded || len(a.resp.Responses) != 1 || string(a.resp.Responses[0].GetResponseRange().Kvs[0].Value) != "there" {
				t.Errorf("request %d: %+v, %v; want its guard failed and its Else's read", i, a.resp, a.err)
			}
		case "lease":
			if !errors.Is(a.err, rpctypes.ErrLeaseNotFound) {
				t.Errorf("request %d: %+v, %v; want etcd's lease not found", i, a.resp, a.err)
			}
		}
	}
	for key, want := range map[string]string{"guard/a": "1", "guard/b": "there", "guard/c": "3", "guard/d": ""} {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if len(resp.Kvs) > 0 {
			got = string(resp.Kvs[0].Value)
		}
		if got != want {
			t.Errorf("%s = %q, want %q", key, got, want)
		}
	}
}

// Two requests that write the same key never share a Txn (etcd refuses a
// Txn that writes a key twice): both are written, one after the other.
func TestBatchedTxnsNeverWriteAKeyTwice(t *testing.T) {
	t.Parallel()
	cli := etcdtest.Shared(t).Client()
	ctx := context.Background()
	b, sent, release := heldBatcher(t, cli)
	go b.Txn(ctx, nil, []clientv3.Op{clientv3.OpPut("twice/first", "")}, nil)
	<-sent
	errs := make(chan error, 3)
	for _, v := range []string{"1", "2"} {
		go func() {
			_, err := b.Txn(ctx, nil, []clientv3.Op{clientv3.OpPut("twice/k", v)}, nil)
			errs <- err
		}()
	}
	go func() {
		_, err := b.Txn(ctx, nil, []clientv3.Op{clientv3.OpPut("twice/other", "")}, nil)
		errs <- err
	}()
	waitBatchPending(t, b, 3)
	close(release)
	for range 3 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	resp, err := cli.Get(ctx, "twice/k")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].Version != 2 {
		t.Errorf("twice/k: %+v, want written twice (version 2)", resp.Kvs)
	}
}

// A request whose caller gives up while it waits is never sent.
func TestBatchedTxnWithdrawnIsNotSent(t *testing.T) {
	t.Parallel()
	cli := etcdtest.Shared(t).Client()
	ctx := context.Background()
	b, sent, release := heldBatcher(t, cli)
	go b.Txn(ctx, nil, []clientv3.Op{clientv3.OpPut("withdrawn/first", "")}, nil)
	<-sent
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := b.Txn(cctx, nil, []clientv3.Op{clientv3.OpPut("withdrawn/k", "")}, nil)
		done <- err
	}()
	waitBatchPending(t, b, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Txn = %v, want context.Canceled", err)
	}
	close(release)
	// A request after it: once it is answered, the withdrawn one would
	// have been sent before it.
	if _, err := b.Txn(ctx, nil, []clientv3.Op{clientv3.OpPut("withdrawn/after", "")}, nil); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, "withdrawn/k")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Error("a request withdrawn while pending was written")
	}
}
