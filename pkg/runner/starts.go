package runner

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// Starts bounds how many scripts this process forks at once, and lets
// them start in the order they came due (their fire, or the time they
// were prepared for). Forking a script (the fork and exec of its gate or
// its command) is paid by this process and the machine's cores, not by
// the script: a storm of a thousand runs due at the same second that all
// forked at once would share the cores a thousand ways, and each start
// would take as long as the last. Bounded, the earliest start first and
// a storm degrades evenly, in their order. Only the fork holds a slot:
// not the watchdog's registration (which waits for the watchdog's restart
// if it died) nor the run.
//
// A nil *Starts bounds nothing.
type Starts struct {
	mu      sync.Mutex
	free    int
	waiting startWaiters
	seq     uint64
}

// NewStarts returns a bound of n starts at once (n <= 0: no bound, nil).
func NewStarts(n int) *Starts {
	if n <= 0 {
		return nil
	}
	return &Starts{free: n}
}

// take waits for a slot, first come the waiters due earliest, and
// returns its release (idempotent), or ctx's cause if ctx ended first.
func (s *Starts) take(ctx context.Context, fire time.Time) (func(), error) {
	if s == nil {
		return func() {}, nil
	}
	s.mu.Lock()
	if s.free > 0 && len(s.waiting) == 0 {
		s.free--
		s.mu.Unlock()
		return s.releaser(), nil
	}
	w := &startWaiter{fire: fire, seq: s.seq, ready: make(chan struct{})}
	s.seq++
	heap.Push(&s.waiting, w)
	s.mu.Unlock()
	select {
	case <-w.ready:
		return s.releaser(), nil
	case <-ctx.Done():
		s.mu.Lock()
		defer s.mu.Unlock()
		if w.index >= 0 {
			heap.Remove(&s.waiting, w.index)
			return nil, context.Cause(ctx)
		}
		// Given a slot as ctx ended: give it on.
		s.handOn()
		return nil, context.Cause(ctx)
	}
}

func (s *Starts) releaser() func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.handOn()
		})
	}
}

// handOn gives a slot given back to the first waiter, or frees it.
func (s *Starts) handOn() {
	if len(s.waiting) == 0 {
		s.free++
		return
	}
	w := heap.Pop(&s.waiting).(*startWaiter)
	close(w.ready)
}

type startWaiter struct {
	fire  time.Time
	seq   uint64 // arrival, among waiters of one fire
	ready chan struct{}
	index int // in the heap; -1 once given a slot
}

// startWaiters is a heap of waiters, the earliest fire first.
type startWaiters []*startWaiter

func (h startWaiters) Len() int { return len(h) }
func (h startWaiters) Less(i, j int) bool {
	if !h[i].fire.Equal(h[j].fire) {
		return h[i].fire.Before(h[j].fire)
	}
	return h[i].seq < h[j].seq
}
func (h startWaiters) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *startWaiters) Push(x any) {
	w := x.(*startWaiter)
	w.index = len(*h)
	*h = append(*h, w)
}
func (h *startWaiters) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	w.index = -1
	*h = old[:len(old)-1]
	return w
}
