package engine

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// scheduler runs the jobs' reconciles: one timer for all jobs (a heap of
// their next wake-ups) and a worker per reconcile in progress (a few
// finished ones wait to be reused), none per idle job ([3/8]: with 10,000 jobs, a goroutine and a timer per job were
// most of an idle instance's memory). A job's reconciles never overlap: a
// poke during one makes it run again at once after.
//
// A job's states:
//
//	waiting (in the heap, at its next wake-up) --due or poked--> reconciling (a goroutine)
//	reconciling --returns next--> waiting at next (at once if poked meanwhile)
//	waiting or reconciling --remove--> removed (remove waits for a reconcile in progress)
type scheduler struct {
	now func() time.Time

	mu      sync.Mutex
	waiting wakeHeap
	changed chan struct{} // buffered(1): the heap's head may be earlier
	running sync.WaitGroup

	// work hands due slots to idle workers. A worker that finished waits
	// for more for a while (at most maxIdleWorkers wait), so that a steady
	// stream of reconciles reuses a few goroutines and their grown stacks
	// instead of starting one each (stack growth was a tenth of an idle
	// instance's CPU with 10,000 jobs); a burst starts as many as it needs.
	work chan *slot
	quit chan struct{} // closed when run returns
	idle int           // workers waiting on work (under mu)
}

// Workers: at most maxIdleWorkers wait for work, each at most workerIdle.
const (
	maxIdleWorkers = 8
	workerIdle     = 10 * time.Second
)

// slot is a job's place in the scheduler; its fields are the scheduler's
// (under its mu).
type slot struct {
	fn      func(context.Context) time.Time // the reconcile: returns when to run it again
	ctx     context.Context
	cancel  context.CancelFunc
	at      time.Time
	index   int  // in the heap; -1 when not in it
	busy    bool // a reconcile is in progress
	again   bool // poked while busy
	removed bool
	idle    chan struct{} // closed when a removed slot's reconcile ended
}

func newScheduler(now func() time.Time) *scheduler {
	return &scheduler{now: now, changed: make(chan struct{}, 1), work: make(chan *slot), quit: make(chan struct{})}
}

// newSlot is a slot for reconcile (which returns when to run it again);
// ctx bounds its runs. add schedules it.
func (s *scheduler) newSlot(ctx context.Context, reconcile func(context.Context) time.Time) *slot {
	jctx, cancel := context.WithCancel(ctx)
	return &slot{fn: reconcile, ctx: jctx, cancel: cancel, index: -1, idle: make(chan struct{})}
}

// add schedules sl's first reconcile, at once.
func (s *scheduler) add(sl *slot) {
	s.mu.Lock()
	sl.at = s.now()
	heap.Push(&s.waiting, sl)
	s.mu.Unlock()
	s.notify()
}

// remove stops sl's reconciles, waiting for one in progress to end.
func (s *scheduler) remove(sl *slot) {
	s.mu.Lock()
	sl.removed = true
	sl.cancel()
	if sl.index >= 0 {
		heap.Remove(&s.waiting, sl.index)
	}
	busy := sl.busy
	s.mu.Unlock()
	if busy {
		<-sl.idle
	}
}

// wakeAt makes sl reconcile at t, or earlier if it was to already; a
// zero t is at once (after the reconcile in progress, if any).
func (s *scheduler) wakeAt(sl *slot, t time.Time) {
	s.mu.Lock()
	switch {
	case sl == nil || sl.removed:
	case sl.busy:
		if !t.After(s.now()) {
			sl.again = true
		} else {
			time.AfterFunc(t.Sub(s.now()), func() { s.wakeAt(sl, time.Time{}) })
		}
	case sl.index >= 0 && t.Before(sl.at):
		sl.at = t
		heap.Fix(&s.waiting, sl.index)
	}
	s.mu.Unlock()
	s.notify()
}

func (s *scheduler) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// run starts the reconciles that are due until ctx is done, then waits for
// those in progress.
func (s *scheduler) run(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		s.mu.Lock()
		now := s.now()
		for len(s.waiting) > 0 && !s.waiting[0].at.After(now) {
			sl := heap.Pop(&s.waiting).(*slot)
			sl.busy = true
			s.running.Add(1)
			s.dispatch(sl)
		}
		wait := time.Hour
		if len(s.waiting) > 0 {
			wait = max(s.waiting[0].at.Sub(now), time.Millisecond)
		}
		s.mu.Unlock()
		t.Reset(wait)
		select {
		case <-ctx.Done():
			s.running.Wait()
			close(s.quit)
			return
		case <-s.changed:
		case <-t.C:
		}
		t.Stop()
	}
}

// dispatch hands sl to an idle worker, or starts one. s.mu is held (a
// send to a worker waiting on work never blocks).
func (s *scheduler) dispatch(sl *slot) {
	select {
	case s.work <- sl:
	default:
		go s.worker(sl)
	}
}

// worker reconciles sl, then waits for more work while few others do.
func (s *scheduler) worker(sl *slot) {
	var t *time.Timer
	for {
		s.reconcile(sl)
		s.mu.Lock()
		if s.idle >= maxIdleWorkers {
			s.mu.Unlock()
			return
		}
		s.idle++
		s.mu.Unlock()
		if t == nil {
			t = time.NewTimer(workerIdle)
			defer t.Stop()
		} else {
			t.Reset(workerIdle)
		}
		select {
		case sl = <-s.work:
			s.mu.Lock()
			s.idle--
			s.mu.Unlock()
			continue
		case <-t.C:
		case <-s.quit:
		}
		s.mu.Lock()
		s.idle--
		s.mu.Unlock()
		return
	}
}

// reconcile runs one reconcile of sl's job and schedules the next.
func (s *scheduler) reconcile(sl *slot) {
	defer s.running.Done()
	next := sl.fn(sl.ctx)
	s.mu.Lock()
	sl.busy = false
	switch {
	case sl.removed:
		close(sl.idle)
	case sl.ctx.Err() != nil: // the engine stops: no more reconciles
	default:
		sl.at = next
		if sl.again {
			sl.at, sl.again = s.now(), false
		}
		heap.Push(&s.waiting, sl)
	}
	s.mu.Unlock()
	s.notify()
}

// wakeHeap orders slots by their wake-up time.
type wakeHeap []*slot

func (h wakeHeap) Len() int           { return len(h) }
func (h wakeHeap) Less(a, b int) bool { return h[a].at.Before(h[b].at) }
func (h wakeHeap) Swap(a, b int) {
	h[a], h[b] = h[b], h[a]
	h[a].index, h[b].index = a, b
}
func (h *wakeHeap) Push(x any) {
	sl := x.(*slot)
	sl.index = len(*h)
	*h = append(*h, sl)
}
func (h *wakeHeap) Pop() any {
	old := *h
	sl := old[len(old)-1]
	old[len(old)-1] = nil
	sl.index = -1
	*h = old[:len(old)-1]
	return sl
}
