package coord

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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

func (b *txnBatcher) idle() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inflight == 0 && len(b.pending) == 0
}

// A request whose batch failed for another request's guard is not sent
// again in the split once its caller gave up (its ctx ended, and Txn
// returned ctx.Err()): the caller then cleans up as a caller of a Txn that
// was never applied would (jobTask.stop deletes the member key of a job
// that left the config, withdraw deletes the candidate key), and a resend
// would write the key afterwards, under the session's live lease: a ghost
// member key makes the job's leader give items to an instance that no
// longer runs the job; a ghost candidate key, the oldest, blocks the
// job's election. Found by review: the split sent them.
func TestBatchedTxnSplitDropsAbandonedRequests(t *testing.T) {
	t.Parallel()
	cli := etcdtest.Shared(t).Client()
	ctx := context.Background()
	if _, err := cli.Put(ctx, "abandon/exists", ""); err != nil {
		t.Fatal(err)
	}
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Revoke(context.Background(), lease.ID) })

	b := newTxnBatcher(cli, 5*time.Second)
	b.maxInflight = 1
	first, release := make(chan struct{}), make(chan struct{})
	splitting, resume := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	var splitOnce sync.Once
	b.beforeSend = func([]*batchedTxn) {
		switch n := calls.Add(1); {
		case n == 1: // a request alone, while the others gather
			close(first)
			<-release
		case n == 2: // the merged batch: its If fails for the first guard
		default: // the halves of the split
			splitOnce.Do(func() { close(splitting) })
			<-resume
		}
	}
	go b.Txn(ctx, nil, []clientv3.Op{clientv3.OpPut("abandon/first", "")}, nil)
	<-first

	fdone := make(chan struct{})
	go func() {
		defer close(fdone)
		b.Txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision("abandon/exists"), "=", 0)},
			[]clientv3.Op{clientv3.OpPut("abandon/f", "")}, nil)
	}()
	waitBatchPending(t, b, 1)
	member := "abandon/jobs/j/members/me"
	cand := fmt.Sprintf("abandon/jobs/j/leader/%x", lease.ID)
	mctx, mcancel := context.WithCancel(ctx)
	cctx, ccancel := context.WithCancel(ctx)
	mdone, cdone := make(chan error, 1), make(chan error, 1)
	go func() { // registerJob's member put
		_, err := b.Txn(mctx, nil, []clientv3.Op{clientv3.OpPut(member, "", clientv3.WithLease(lease.ID)), clientv3.OpGet(member)}, nil)
		mdone <- err
	}()
	waitBatchPending(t, b, 2)
	go func() { // candidate
		_, err := b.Txn(cctx, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(cand), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(cand, "me", clientv3.WithLease(lease.ID))}, []clientv3.Op{clientv3.OpGet(cand)})
		cdone <- err
	}()
	waitBatchPending(t, b, 3)
	close(release)
	<-splitting // the merged Txn failed, nothing applied; the halves wait

	// The task is removed (steps.Remove cancels its step's ctx): both
	// callers give up, and the task's stop cleans up.
	mcancel()
	ccancel()
	for _, ch := range []chan error{mdone, cdone} {
		if err := <-ch; !errors.Is(err, context.Canceled) {
			t.Fatalf("Txn = %v, want context.Canceled", err)
		}
	}
	if _, err := cli.Delete(ctx, member); err != nil { // jobTask.stop, the job left the config
		t.Fatal(err)
	}
	if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.LeaseValue(cand), "=", lease.ID)).Then(clientv3.OpDelete(cand)).Commit(); err != nil { // withdraw
		t.Fatal(err)
	}
	close(resume)
	<-fdone
	etcdtest.Eventually(t, 5*time.Second, "batcher idle", b.idle)

	for _, key := range []string{member, cand} {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Kvs) > 0 {
			t.Errorf("%s was written (lease %x) after its caller gave up and cleaned up: a ghost key under a live session", key, resp.Kvs[0].Lease)
		}
	}
}

// Merged, every request's Compares are evaluated before any request's
// operations, so two requests each guarded by the absence of the key the
// other creates would both succeed, which no serial order of the two
// allows: a request guarded by a key another of the batch writes waits
// for the next batch (batchKeys). Found by review: take checked only keys
// written twice.
func TestBatchedTxnsKeepGuardsOfEachOthersKeysApart(t *testing.T) {
	t.Parallel()
	cli := etcdtest.Shared(t).Client()
	ctx := context.Background()
	b, sent, release := heldBatcher(t, cli)
	go b.Txn(ctx, nil, []clientv3.Op{clientv3.OpPut("skew/first", "")}, nil)
	<-sent
	absent := func(key string) clientv3.Cmp { return clientv3.Compare(clientv3.CreateRevision(key), "=", 0) }
	type answer struct {
		ok  bool
		err error
	}
	answers := make(chan answer, 2)
	for _, kv := range [][2]string{{"skew/a", "skew/b"}, {"skew/b", "skew/a"}} {
		go func() {
			// Create kv[0] only if kv[1] does not exist.
			resp, err := b.Txn(ctx, []clientv3.Cmp{absent(kv[1])}, []clientv3.Op{clientv3.OpPut(kv[0], "")}, nil)
			answers <- answer{err == nil && resp.Succeeded, err}
		}()
	}
	waitBatchPending(t, b, 2)
	close(release)
	won := 0
	for range 2 {
		a := <-answers
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.ok {
			won++
		}
	}
	if won != 1 {
		t.Errorf("%d of the two mutually exclusive guarded creates succeeded, want 1 (serially, the second sees the first's key)", won)
	}
}

// A read of request B placed before request A's put of the same key in
// one merged Txn would return the value from before A's put, while B's
// answer carries the Txn's revision, at which A's put is; the rewind
// checks (followKey's fromRead, learnRead) take "a read at R older than a
// revision seen at or below R" for etcd going back. B's read of a key A
// writes keeps them in different batches. Found by review.
func TestBatchedTxnReadsAtItsRevision(t *testing.T) {
	t.Parallel()
	cli := etcdtest.Shared(t).Client()
	ctx := context.Background()
	if _, err := cli.Put(ctx, "rr/k", "old"); err != nil {
		t.Fatal(err)
	}
	b, sent, release := heldBatcher(t, cli)
	go b.Txn(ctx, nil, []clientv3.Op{clientv3.OpPut("rr/first", "")}, nil)
	<-sent
	type answer struct {
		resp *clientv3.TxnResponse
		err  error
	}
	bdone := make(chan answer, 1)
	go func() { // B: a write with a read of a key it does not write
		resp, err := b.Txn(ctx, nil, []clientv3.Op{clientv3.OpPut("rr/b", ""), clientv3.OpGet("rr/k")}, nil)
		bdone <- answer{resp, err}
	}()
	waitBatchPending(t, b, 1)
	adone := make(chan error, 1)
	go func() { // A: puts the key
		_, err := b.Txn(ctx, nil, []clientv3.Op{clientv3.OpPut("rr/k", "new")}, nil)
		adone <- err
	}()
	waitBatchPending(t, b, 2)
	close(release)
	if err := <-adone; err != nil {
		t.Fatal(err)
	}
	a := <-bdone
	if a.err != nil {
		t.Fatal(a.err)
	}
	rev := a.resp.Header.Revision
	got := a.resp.Responses[1].GetResponseRange().Kvs[0]
	at, err := cli.Get(ctx, "rr/k", clientv3.WithRev(rev))
	if err != nil {
		t.Fatal(err)
	}
	if want := at.Kvs[0]; got.ModRevision != want.ModRevision {
		t.Errorf("B's answer at revision %d reads rr/k=%q (ModRevision %d); at revision %d etcd has %q (ModRevision %d): "+
			"a reader that has seen the put at %d takes this for etcd going back", rev, got.Value, got.ModRevision, rev, want.Value, want.ModRevision, want.ModRevision)
	}
}

// A batch is sent under none of its callers' contexts, so a request
// marked recovering (let through while Revisions is rewound) is sent
// alone with its own: through the batcher it is let through as it is
// when sent directly. Found by review.
func TestBatchedTxnOfARecoveryKeepsItsContext(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	hist := NewRevisions()
	cli := srv.ClientWith(hist.interceptors())
	ctx := context.Background()
	if _, err := cli.Put(ctx, "ctxv/k", "v"); err != nil {
		t.Fatal(err)
	}
	hist.noteKeyRevision("ctxv/other", 5, 0) // etcd is seen to have gone back
	rctx := recovering(ctx)
	if _, err := cli.Get(rctx, "ctxv/k"); err != nil {
		t.Fatalf("direct recovering read: %v", err)
	}
	b := newTxnBatcher(cli, 5*time.Second)
	if _, err := b.Get(rctx, "ctxv/k"); err != nil {
		t.Errorf("batched recovering read: %v; want it let through as the direct one is", err)
	}
}

// A live request behind more than maxBatchScan withdrawn ones (callers that
// gave up while etcd was slow) is sent: take counted the withdrawn ones
// against its scan bound, returned an empty batch and ended the drain with
// the live request still pending, unsent until another request came or its
// caller's ctx ended.
func TestBatcherSendsPastWithdrawnRequests(t *testing.T) {
	t.Parallel()
	cli := etcdtest.Shared(t).Client()
	ctx := context.Background()
	b, sent, release := heldBatcher(t, cli)
	go b.Txn(ctx, nil, []clientv3.Op{clientv3.OpPut("stall/first", "")}, nil)
	<-sent
	const dead = maxBatchScan + 10
	cctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range dead {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.Txn(cctx, nil, []clientv3.Op{clientv3.OpPut(fmt.Sprintf("stall/dead/%04d", i), "")}, nil)
		}()
	}
	waitBatchPending(t, b, dead)
	cancel()
	wg.Wait() // every one of them withdrawn
	lctx, lcancel := context.WithTimeout(ctx, 5*time.Second)
	defer lcancel()
	done := make(chan error, 1)
	go func() {
		_, err := b.Txn(lctx, nil, []clientv3.Op{clientv3.OpPut("stall/live", "")}, nil)
		done <- err
	}()
	waitBatchPending(t, b, dead+1)
	close(release)
	if err := <-done; err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a live request behind %d withdrawn ones was never sent (drains: %v): %v", dead, b.idle(), err)
		}
		t.Fatal(err)
	}
}
