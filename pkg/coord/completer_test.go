package coord

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// The completer's grouping on its own, without etcd: a write function that
// records each batch and can be held, as a slow Txn is.

// batches is a completer's write for tests: it records the items of each
// batch, waits for hold (when set) and answers each outcome with err.
type batches struct {
	mu    sync.Mutex
	got   [][]int
	hold  chan struct{} // when non-nil, each write waits for a receive
	delay time.Duration // each write takes this long
	err   error
}

func (b *batches) write(batch []*completion) {
	if b.hold != nil {
		<-b.hold
	}
	time.Sleep(b.delay)
	items := make([]int, len(batch))
	for i, c := range batch {
		items[i] = c.rec.Item
	}
	b.mu.Lock()
	b.got = append(b.got, items)
	b.mu.Unlock()
	for _, c := range batch {
		c.done <- b.err
	}
}

func (b *batches) sizes() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	var n []int
	for _, g := range b.got {
		n = append(n, len(g))
	}
	return n
}

func outcomeOf(item int) keyspace.ItemRecord {
	return keyspace.ItemRecord{Job: "orders", Item: item, State: keyspace.StateDone, Instance: "a", Attempt: 1}
}

// pendingCount is how many outcomes wait for the next write.
func (c *completer) pendingCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

func waitPending(t *testing.T, c *completer, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for c.pendingCount() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d outcomes pending after 5 s, want %d", c.pendingCount(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// An outcome that comes while no write is in flight is written at once, on
// its own, and its caller gets the write's answer.
func TestCompleterWritesALoneOutcomeAtOnce(t *testing.T) {
	t.Parallel()
	want := errors.New("guard failed")
	b := &batches{err: want}
	c := &completer{write: b.write}
	if err := c.do(context.Background(), outcomeOf(1), 10); !errors.Is(err, want) {
		t.Fatalf("do = %v, want the write's %v", err, want)
	}
	if got := b.sizes(); !equalInts(got, []int{1}) {
		t.Errorf("batches %v, want [1]", got)
	}
}

// Outcomes that come while a write is in flight, fewer than a Txn holds,
// are written together by the next one.
func TestCompleterGroupsOutcomesThatComeDuringAWrite(t *testing.T) {
	t.Parallel()
	b := &batches{hold: make(chan struct{})}
	c := &completer{write: b.write}
	ctx := context.Background()
	const late = completionsPerTxn - 1
	errs := make(chan error, late+1)
	go func() { errs <- c.do(ctx, outcomeOf(0), 1) }() // the first: written alone, held
	waitFlushing(t, c)
	for i := 1; i <= late; i++ {
		go func() { errs <- c.do(ctx, outcomeOf(i), int64(1+i)) }()
	}
	waitPending(t, c, late)
	close(b.hold)
	for range late + 1 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got, want := b.sizes(), []int{1, late}; !equalInts(got, want) {
		t.Errorf("batches %v, want %v: the outcomes that came during the first write in one Txn", got, want)
	}
}

// A backlog of a full Txn or more (a storm's outcomes) is written by more
// than one write at once, at most flushesInflight, each of at most
// completionsPerTxn; every outcome is written once.
func TestCompleterWritesABacklogInParallel(t *testing.T) {
	t.Parallel()
	var inflight, most atomic.Int32
	b := &batches{hold: make(chan struct{})}
	c := &completer{write: func(batch []*completion) {
		n := inflight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		b.write(batch)
		inflight.Add(-1)
	}}
	ctx := context.Background()
	const n = 6 * completionsPerTxn
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- c.do(ctx, outcomeOf(i), int64(1+i)) }()
	}
	deadline := time.Now().Add(5 * time.Second)
	for inflight.Load() < flushesInflight && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	close(b.hold)
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if m := most.Load(); m < 2 || m > flushesInflight {
		t.Errorf("at most %d writes at once, want 2 to %d", m, flushesInflight)
	}
	seen := map[int]bool{}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, g := range b.got {
		if len(g) > completionsPerTxn {
			t.Errorf("a write of %d outcomes, more than %d", len(g), completionsPerTxn)
		}
		for _, item := range g {
			if seen[item] {
				t.Errorf("item %d written twice", item)
			}
			seen[item] = true
		}
	}
	if len(seen) != n {
		t.Errorf("%d outcomes written, want %d", len(seen), n)
	}
}

// waitFlushing waits until a write is in flight and nothing is pending.
func waitFlushing(t *testing.T, c *completer) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		c.mu.Lock()
		busy, pending := c.flushing > 0, len(c.pending)
		c.mu.Unlock()
		if busy && pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no write in flight after 5 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// The runs of one claim (siblings) that end a moment apart are written in
// one Txn: the first waits for the others. A sibling that does not come is
// not waited for past siblingLinger.
func TestCompleterSiblingsShareATxn(t *testing.T) {
	t.Parallel()
	t.Run("all come", func(t *testing.T) {
		t.Parallel()
		b := &batches{}
		// A linger no loaded machine outlasts: the last sibling, not the
		// timer, writes the three (the test takes no longer for it).
		c := &completer{write: b.write, linger: time.Minute}
		c.expect(7, 3)
		errs := make(chan error, 3)
		for i := range 3 {
			go func() {
				time.Sleep(time.Duration(i) * time.Millisecond)
				errs <- c.do(context.Background(), outcomeOf(i), 7)
			}()
		}
		for range 3 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if got := b.sizes(); !equalInts(got, []int{3}) {
			t.Errorf("batches %v, want [3]: three siblings in one Txn", got)
		}
	})
	t.Run("one never comes", func(t *testing.T) {
		t.Parallel()
		b := &batches{}
		c := &completer{write: b.write}
		c.expect(8, 3)
		errs := make(chan error, 2)
		for i := range 2 {
			go func() { errs <- c.do(context.Background(), outcomeOf(i), 8) }()
		}
		for range 2 {
			select {
			case err := <-errs:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the outcomes of two siblings wait for a third that never comes")
			}
		}
		if got := b.sizes(); !equalInts(got, []int{2}) {
			t.Errorf("batches %v, want [2]", got)
		}
		c.mu.Lock()
		left := len(c.siblings)
		c.mu.Unlock()
		if left != 0 {
			t.Errorf("%d fences still tracked after their linger", left)
		}
	})
}

// A caller whose ctx ends (a shutdown's bound) returns; its outcome is still
// written, guarded by its fence.
func TestCompleterReturnsWhenCtxEnds(t *testing.T) {
	t.Parallel()
	b := &batches{hold: make(chan struct{})}
	c := &completer{write: b.write}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.do(ctx, outcomeOf(1), 1) }()
	waitFlushing(t, c)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("do = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		close(b.hold)
		t.Fatal("do did not return when its ctx ended: it waits for the write")
	}
	close(b.hold)
	deadline := time.Now().Add(5 * time.Second)
	for len(b.sizes()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the outcome of a caller that returned was not written")
		}
		time.Sleep(time.Millisecond)
	}
}

// The first caller starts the flusher, which writes others' outcomes until
// none is pending, long after its own landed. Under a steady stream of
// completions (many jobs ending) its caller (a run's goroutine, which holds
// the item "running" and its concurrency slots) still returns once its own
// outcome is written.
func TestCompleterCallerIsNotHeldByOthersOutcomes(t *testing.T) {
	t.Parallel()
	// The first write is held until the stream is on, then each takes an
	// etcd Txn's time.
	b := &batches{hold: make(chan struct{}), delay: 2 * time.Millisecond}
	c := &completer{write: b.write}
	ctx := context.Background()
	took := make(chan time.Duration, 1)
	go func() { // the first to come: its caller starts the flusher
		begun := time.Now()
		if err := c.do(ctx, outcomeOf(0), 0); err != nil {
			t.Error(err)
		}
		took <- time.Since(begun)
	}()
	waitFlushing(t, c)
	const stream = 2 * time.Second
	stop := time.Now().Add(stream)
	var wg sync.WaitGroup
	var item atomic.Int64
	item.Store(1000)
	for range 200 { // 200 runs ending, each followed by its item's next run
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				c.do(ctx, outcomeOf(int(item.Add(1))), 0)
			}
		}()
	}
	waitPending(t, c, completionsPerTxn)
	close(b.hold)
	own := <-took
	wg.Wait()
	if own > stream/2 {
		t.Errorf("the flusher's caller returned after %s of a %s stream of others' outcomes: it was held by them", own, stream)
	}
	if n := b.sizes(); len(n) < 3 {
		t.Errorf("%d writes during the stream: the stream did not keep the flusher busy", len(n))
	}
}
