package coord

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// txnBatcher sends the small Txns of many jobs (registration, candidacy,
// a leader's read and map write, a view's first read, the claims of runs
// due at the same instant) to etcd together:
// group commit, as the completer does for outcomes. A request that comes
// while fewer than maxInflight batches are on their way is sent at once;
// those that come meanwhile wait and go together in the next batch, one
// Txn whose If is every request's Compares and whose Then every request's
// operations, in order. At a cold start of 10,000 jobs, each with about
// nine requests per instance, that is what keeps etcd's work to the
// number of batches rather than of requests; an instance with little to
// do sends each request alone, as before.
//
// Each request keeps its own meaning:
//
//	pending --taken into a batch--> sent
//	sent --the batch's If held--> answered: Succeeded, its own slice of the responses
//	sent --the If failed, or etcd refused the batch (a lease gone, a key
//	       written twice)--> split: each half sent again, down to the
//	       request alone, which gets its own answer (its Else)
//	sent --no answer (etcd unreachable, timeout)--> answered with the error:
//	       the outcome is unknown, as for a Txn of its own
//	pending or split --its ctx ends--> withdrawn: never sent (again); a
//	       split sends only what nothing of was applied
//
// Reads go with reads, writes with writes: a Txn that only reads is served
// by etcd's read path, many at once, while one that writes is applied in
// order with every other write, its reads with it (measured at a cold
// start of 10,000 jobs: the reads of mixed batches were a quarter of
// etcd's CPU, in its apply loop).
//
// A batch holds at most maxBatchOps Compares and maxBatchOps operations
// (etcd's --max-txn-ops default is 128) and about maxBatchBytes of keys
// and values (--max-request-bytes is 1.5 MiB). A request that deletes a
// range goes alone.
//
// No key one request of a batch writes is compared, read or written by
// another (such a request waits for the next batch): etcd checks every
// Compare of a Txn before any of its writes, and answers every read of
// it at the Txn's revision, so a request guarded by, or reading, another's
// key would be judged or answered as no serial order of the two could
// (both of two mutually exclusive creates succeeding; a read older than
// the revision its answer carries, which the rewind checks take for etcd
// going back). With the keys of the requests apart, each is answered as
// if it had been sent alone at the batch's revision.
//
// A batch is sent with none of its callers' context values: a request
// that carries one that matters (a recovery's, let through while
// Revisions is rewound) is sent alone, with its own context.
type txnBatcher struct {
	cli         *clientv3.Client
	timeout     time.Duration // each batch's bound
	maxInflight int

	// base bounds the batches sent: cancelled by close (the node's Run
	// returned), which waits for the drains, so that no goroutine of
	// the batcher outlives its node.
	base   context.Context
	cancel context.CancelFunc
	drains sync.WaitGroup

	mu       sync.Mutex
	pending  []*batchedTxn
	inflight int
	closed   bool // after close, each request is sent alone, at once

	// requests counts the requests made, commits the Txns sent, for tests
	// and benchmarks.
	requests, commits atomic.Int64
	// beforeSend, when set (tests), is called before each Txn is sent.
	beforeSend func(batch []*batchedTxn)
}

const (
	maxBatchOps   = 128
	maxBatchBytes = 512 << 10
	// batchesInflight bounds the batches on their way at once: enough to
	// keep etcd's pipeline full, few enough that requests wait and join.
	batchesInflight = 4
	// maxBatchScan bounds how far into the pending requests take looks
	// for ones that fit the batch, so that a long line costs each batch
	// a bounded scan.
	maxBatchScan = 4 * maxBatchOps
)

type batchedTxn struct {
	ctx        context.Context // its caller's: ended, it is not sent (again)
	ifs        []clientv3.Cmp
	then, els  []clientv3.Op
	writes     []string  // keys it puts or deletes
	reads      []keySpan // keys and ranges it compares or reads
	readOnly   bool      // only Gets, no Compares: a batch of its own kind
	alone      bool      // it deletes a range: never with others
	size       int       // bytes of keys and values
	done       chan txnAnswer
	withdrawn  bool // its caller gave up before it was sent (under mu)
	taken      bool // in a batch (under mu)
	answerOnce sync.Once
}

type txnAnswer struct {
	resp *clientv3.TxnResponse
	err  error
}

func newTxnBatcher(cli *clientv3.Client, timeout time.Duration) *txnBatcher {
	base, cancel := context.WithCancel(context.Background())
	return &txnBatcher{cli: cli, timeout: timeout, maxInflight: batchesInflight, base: base, cancel: cancel}
}

// close ends the batches on their way (their requests get the error) and
// waits for the batcher's goroutines; later requests go alone, each with
// its caller's context.
func (b *txnBatcher) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cancel()
	b.drains.Wait()
}

// Txn is clientv3's Txn(ctx).If(ifs...).Then(then...).Else(els...).Commit(),
// sent with others'.
func (b *txnBatcher) Txn(ctx context.Context, ifs []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	b.requests.Add(1)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if isRecovering(ctx) {
		b.commits.Add(1)
		return b.cli.Txn(ctx).If(ifs...).Then(then...).Else(els...).Commit()
	}
	r := &batchedTxn{ctx: ctx, ifs: ifs, then: then, els: els, done: make(chan txnAnswer, 1)}
	for _, ops := range [][]clientv3.Op{then, els} {
		for _, op := range ops {
			r.size += len(op.KeyBytes()) + len(op.ValueBytes())
			switch {
			case op.IsTxn() || (op.IsDelete() && len(op.RangeBytes()) > 0):
				r.alone = true
			case op.IsPut() || op.IsDelete():
				r.writes = append(r.writes, string(op.KeyBytes()))
			}
		}
	}
	r.readOnly = len(ifs) == 0 && len(els) == 0 && len(r.writes) == 0 && !r.alone
	if !r.readOnly { // reads among reads never conflict: only a write batch checks them
		for _, c := range ifs {
			pc := c.GetCompare()
			r.reads = append(r.reads, keySpan{string(pc.Key), string(pc.RangeEnd)})
		}
		for _, ops := range [][]clientv3.Op{then, els} {
			for _, op := range ops {
				if op.IsGet() {
					r.reads = append(r.reads, keySpan{string(op.KeyBytes()), string(op.RangeBytes())})
				}
			}
		}
	}
	if len(ifs) > maxBatchOps || len(then) > maxBatchOps || len(els) > maxBatchOps || r.size > maxBatchBytes {
		r.alone = true
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		b.commits.Add(1)
		return b.cli.Txn(ctx).If(ifs...).Then(then...).Else(els...).Commit()
	}
	b.pending = append(b.pending, r)
	start := b.inflight < b.maxInflight
	if start {
		b.inflight++
		b.drains.Add(1)
	}
	b.mu.Unlock()
	if start {
		go func() {
			defer b.drains.Done()
			b.drain()
		}()
	}
	select {
	case a := <-r.done:
		return a.resp, a.err
	case <-ctx.Done():
		b.mu.Lock()
		if !r.taken {
			r.withdrawn = true
		}
		b.mu.Unlock()
		return nil, ctx.Err()
	}
}

// Get is clientv3's Get, sent with others'.
func (b *txnBatcher) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := b.Txn(ctx, nil, []clientv3.Op{clientv3.OpGet(key, opts...)}, nil)
	if err != nil {
		return nil, err
	}
	rr := resp.Responses[0].GetResponseRange()
	return &clientv3.GetResponse{Header: resp.Header, Kvs: rr.Kvs, More: rr.More, Count: rr.Count}, nil
}

// drain sends batches while requests are pending.
func (b *txnBatcher) drain() {
	for {
		batch := b.take()
		if batch == nil {
			return
		}
		b.send(batch)
	}
}

// take removes the next batch from pending, or, when none is pending,
// ends the caller's drain (nil).
func (b *txnBatcher) take() []*batchedTxn {
	b.mu.Lock()
	defer b.mu.Unlock()
	var batch, rest []*batchedTxn
	ifs, ops, size := 0, 0, 0
	var keys batchKeys
	// scanned counts the live requests looked at. Withdrawn ones are
	// dropped, not counted: a line of them (callers that gave up while etcd
	// was slow) would end the drain with an empty batch and leave the live
	// ones behind it unsent. Each is dropped once, so the scan stays bounded.
	scanned := 0
	for i, r := range b.pending {
		if r.withdrawn {
			continue
		}
		if scanned >= maxBatchScan || ops >= maxBatchOps {
			rest = append(rest, b.pending[i:]...)
			break
		}
		scanned++
		fits := len(batch) == 0 ||
			(!r.alone && !batch[0].alone && r.readOnly == batch[0].readOnly && ifs+len(r.ifs) <= maxBatchOps &&
				ops+len(r.then) <= maxBatchOps && size+r.size <= maxBatchBytes && !keys.conflict(r))
		if !fits {
			rest = append(rest, r)
			continue
		}
		batch = append(batch, r)
		ifs, ops, size = ifs+len(r.ifs), ops+len(r.then), size+r.size
		keys.add(r)
		r.taken = true
	}
	b.pending = rest
	if len(batch) == 0 {
		b.inflight--
		return nil
	}
	return batch
}

// keySpan is a key, or a range of keys [key, end) in etcd's terms (end
// "\x00": every key from key on).
type keySpan struct{ key, end string }

func (s keySpan) contains(k string) bool {
	switch s.end {
	case "":
		return k == s.key
	case "\x00":
		return k >= s.key
	}
	return s.key <= k && k < s.end
}

// batchKeys are the keys the requests of a batch write, and those they
// compare or read.
type batchKeys struct {
	written map[string]bool
	reads   []keySpan
}

// conflict reports whether r writes a key the batch touches, or touches
// one it writes (see txnBatcher).
func (k *batchKeys) conflict(r *batchedTxn) bool {
	for _, w := range r.writes {
		if k.written[w] || slices.ContainsFunc(k.reads, func(s keySpan) bool { return s.contains(w) }) {
			return true
		}
	}
	for _, s := range r.reads {
		for w := range k.written {
			if s.contains(w) {
				return true
			}
		}
	}
	return false
}

func (k *batchKeys) add(r *batchedTxn) {
	if k.written == nil {
		k.written = map[string]bool{}
	}
	for _, w := range r.writes {
		k.written[w] = true
	}
	if len(r.writes) > 0 || len(k.written) > 0 { // reads among reads never conflict
		k.reads = append(k.reads, r.reads...)
	}
}

// send commits batch as one Txn and answers each of its requests, but
// those whose callers gave up: nothing of them was sent, or nothing of
// them applied (a split), so they are answered with their ctx's error.
func (b *txnBatcher) send(batch []*batchedTxn) {
	if b.beforeSend != nil {
		b.beforeSend(batch)
	}
	batch = slices.DeleteFunc(batch, func(r *batchedTxn) bool {
		if err := r.ctx.Err(); err != nil {
			r.answer(txnAnswer{err: err})
			return true
		}
		return false
	})
	if len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(b.base, b.timeout)
	defer cancel()
	b.commits.Add(1)
	if len(batch) == 1 {
		r := batch[0]
		resp, err := b.cli.Txn(ctx).If(r.ifs...).Then(r.then...).Else(r.els...).Commit()
		r.answer(txnAnswer{resp, err})
		return
	}
	nifs, nops := 0, 0
	for _, r := range batch {
		nifs, nops = nifs+len(r.ifs), nops+len(r.then)
	}
	// Sized once: an Op is a large struct, and growing these by appends
	// was a seventh of an instance's allocations at a cold start.
	ifs, then := make([]clientv3.Cmp, 0, nifs), make([]clientv3.Op, 0, nops)
	for _, r := range batch {
		ifs = append(ifs, r.ifs...)
		then = append(then, r.then...)
	}
	resp, err := b.cli.Txn(ctx).If(ifs...).Then(then...).Commit()
	switch {
	case err == nil && resp.Succeeded:
		off := 0
		for _, r := range batch {
			r.answer(txnAnswer{resp: &clientv3.TxnResponse{Header: resp.Header, Succeeded: true,
				Responses: resp.Responses[off : off+len(r.then) : off+len(r.then)]}})
			off += len(r.then)
		}
	case err == nil || refused(err):
		// Some request's guard failed, or one of them made etcd refuse
		// the whole: nothing was written. Find which, by halves; each
		// request alone gets its own answer.
		half := len(batch) / 2
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			b.send(batch[:half])
		}()
		b.send(batch[half:])
		wg.Wait()
	default:
		for _, r := range batch {
			r.answer(txnAnswer{err: err})
		}
	}
}

func (r *batchedTxn) answer(a txnAnswer) {
	r.answerOnce.Do(func() { r.done <- a })
}

// refused reports whether err is etcd's refusal of a Txn it did not apply
// for what one of its requests asked (a lease that is gone, a key written
// twice, too many operations, too large a request): another batch without
// that request may succeed. An error that leaves the outcome unknown (no
// answer, a timeout), or that every request would meet (the NOSPACE alarm,
// a history that went back), is not.
func refused(err error) bool {
	if errors.Is(err, ErrRewound) {
		return false
	}
	code := status.Code(err)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	}
	switch code {
	case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.OutOfRange:
		return true
	}
	return false
}
