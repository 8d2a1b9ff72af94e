package coord

import (
	"context"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// completer groups the outcomes of runs into shared Txns by group commit:
// an outcome that comes while no Txn of outcomes is in flight is written at
// once; those that come while one is are written together by the next
// (and, for a backlog of a full Txn or more, by up to flushesInflight at
// once).
// Each keeps its own guard (its claim's fence); when a shared Txn's guards
// fail, each outcome is written on its own, so that one taken-over item
// does not fail the others.
//
// Siblings, the runs of one claim Txn (one fence), were released together
// and often end together: an outcome whose siblings are still running waits
// for them, at most siblingLinger, and the last one writes them all in one
// Txn (measured: an outcome Txn per item execution without it, for the
// items of a job that an instance runs at each fire). Only siblings wait.
//
// The completer knows nothing of etcd: it writes each batch through write
// (Node.writeOutcomes), so that its grouping is tested on its own.
type completer struct {
	// write writes a batch's outcomes and sends each one's error on its
	// done channel. Up to flushesInflight writes are in flight at once.
	write func(batch []*completion)

	mu       sync.Mutex
	flushing int // flushes writing, at most flushesInflight
	pending  []*completion
	// siblings counts, by fence, the runs of a shared claim whose outcome
	// has not come yet.
	siblings map[int64]int
	// linger is how long an outcome waits for its siblings' (0:
	// siblingLinger).
	linger time.Duration
}

// siblingLinger bounds how long an outcome waits for its siblings'.
const siblingLinger = 5 * time.Millisecond

// maxSiblingFences bounds the fences expect tracks: claims whose runs never
// report an outcome here (a run that never started is recorded elsewhere)
// would otherwise stay; past it the map starts over (their outcomes are
// then written without waiting).
const maxSiblingFences = 4096

// expect records that count runs were claimed together under fence. The
// claims of several jobs may share a fence (they went in one batched Txn):
// their counts add up.
func (c *completer) expect(fence int64, count int) {
	if count < 2 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.siblings == nil || len(c.siblings) >= maxSiblingFences {
		c.siblings = map[int64]int{}
	}
	c.siblings[fence] += count
}

// kick starts a flush of what is pending, if none is in progress.
func (c *completer) kick() {
	c.mu.Lock()
	if c.flushing > 0 || len(c.pending) == 0 {
		c.mu.Unlock()
		return
	}
	c.flushing++
	c.mu.Unlock()
	c.drain()
}

type completion struct {
	rec   keyspace.ItemRecord
	fence int64
	done  chan error // buffered(1)
}

// flushesInflight bounds the outcome Txns on their way at once: at a
// storm of thousands of runs, one at a time made their outcomes wait for
// each other for seconds (measured: 3,300 outcomes an instance, 104 Txns
// in turn), and the next fire's claims wait for the outcomes.
const flushesInflight = 4

// completionsPerTxn bounds a shared Txn: up to 4 writes per outcome
// (record, history, marker, and a failure's last-failure key) within
// etcd's default --max-txn-ops of 128.
const completionsPerTxn = 32

// do writes rec's outcome, guarded by fence, with others' if they come
// together; it returns finish's error for it, or ctx's when ctx ends first
// (a shutdown's bound: the write goes on, guarded by the fence). The
// caller that finds no flush in progress starts a goroutine that writes
// batches while there are some, so that no run's caller is held by
// others' outcomes, nor past its ctx by its own.
func (c *completer) do(ctx context.Context, rec keyspace.ItemRecord, fence int64) error {
	req := &completion{rec: rec, fence: fence, done: make(chan error, 1)}
	c.mu.Lock()
	c.pending = append(c.pending, req)
	waiting := 0 // siblings still running
	if left, ok := c.siblings[fence]; ok {
		if waiting = left - 1; waiting > 0 {
			c.siblings[fence] = waiting
		} else {
			delete(c.siblings, fence)
		}
	}
	// One flush at a time groups best; another starts only for a backlog
	// of a full Txn or more (a storm's outcomes), up to flushesInflight.
	flusher := waiting == 0 && (c.flushing == 0 || (len(c.pending) >= completionsPerTxn && c.flushing < flushesInflight))
	if flusher {
		c.flushing++
	}
	c.mu.Unlock()
	switch {
	case flusher:
		go c.drain()
	case waiting > 0:
		// The last sibling, or this timer, writes it.
		linger := c.linger
		if linger == 0 {
			linger = siblingLinger
		}
		time.AfterFunc(linger, func() {
			c.mu.Lock()
			delete(c.siblings, fence) // late siblings do not wait
			c.mu.Unlock()
			c.kick()
		})
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// flushOne writes the next batch of pending outcomes and says whether more
// are pending (else the completer is idle again).
func (c *completer) flushOne() (more bool) {
	c.mu.Lock()
	batch := c.pending[:min(len(c.pending), completionsPerTxn)]
	c.pending = c.pending[len(batch):]
	c.mu.Unlock()
	if len(batch) > 0 {
		c.write(batch)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		c.flushing--
		return false
	}
	return true
}

// drain writes pending outcomes until none is left.
func (c *completer) drain() {
	for c.flushOne() {
	}
}
