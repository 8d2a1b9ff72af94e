// Package steps runs many slots' steps from one timer heap and a few
// reused goroutines.
package steps

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// Scheduler runs the steps of many slots (a job's reconcile in the engine,
// a job's registration, campaign or leadership in coord): one timer for all
// (a heap of their next wake-ups) and a worker per step in progress (a few
// finished ones wait to be reused), none per idle slot (with 10,000
// jobs, a goroutine and a timer per job were most of an idle instance's
// memory). A slot's steps never overlap: a wake during one makes it run
// again at once after.
//
// A slot's states:
//
//	waiting (in the heap, at its next wake-up) --due or woken--> stepping (a goroutine)
//	stepping --returns next--> waiting at next (at once if woken meanwhile)
//	waiting or stepping --Remove--> removed (Remove waits for a step in progress)
type Scheduler struct {
	now func() time.Time

	mu      sync.Mutex
	waiting wakeHeap
	changed chan struct{} // buffered(1): the heap's head may be earlier
	running sync.WaitGroup

	// work hands due slots to idle workers. A worker that finished waits
	// for more for a while (at most maxIdleWorkers wait), so that a steady
	// stream of steps reuses a few goroutines and their grown stacks
	// instead of starting one each (stack growth was a tenth of an idle
	// instance's CPU with 10,000 jobs); a burst starts as many as it needs.
	work chan *Slot
	quit chan struct{} // closed when run returns
	idle int           // workers waiting on work (under mu)
}

// Workers: at most maxIdleWorkers wait for work, each at most workerIdle.
const (
	maxIdleWorkers = 8
	workerIdle     = 10 * time.Second
)

// Slot is one unit of work's place in the scheduler (a job's); its fields
// are the scheduler's (under its mu).
type Slot struct {
	fn      func(context.Context) time.Time // the step: returns when to run it again
	ctx     context.Context
	cancel  context.CancelFunc
	at      time.Time
	index   int  // in the heap; -1 when not in it
	busy    bool // a step is in progress
	again   bool // woken while busy
	removed bool
	idle    chan struct{} // closed when a removed slot's step ended
}

func New(now func() time.Time) *Scheduler {
	return &Scheduler{now: now, changed: make(chan struct{}, 1), work: make(chan *Slot), quit: make(chan struct{})}
}

// Never, returned by a step, runs the slot again only when woken.
var Never = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)

// NewSlot is a slot for step, which returns when to run it again (Never:
// only when woken); ctx bounds its steps. Add schedules it.
func (s *Scheduler) NewSlot(ctx context.Context, step func(context.Context) time.Time) *Slot {
	jctx, cancel := context.WithCancel(ctx)
	return &Slot{fn: step, ctx: jctx, cancel: cancel, index: -1, idle: make(chan struct{})}
}

// Add schedules sl's first step, at once.
func (s *Scheduler) Add(sl *Slot) {
	s.mu.Lock()
	sl.at = s.now()
	heap.Push(&s.waiting, sl)
	s.mu.Unlock()
	s.notify()
}

// Remove stops sl's steps, waiting for one in progress to end.
func (s *Scheduler) Remove(sl *Slot) {
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

// WakeAt makes sl step at t, or earlier if it was to already; a
// zero t is at once (after the step in progress, if any).
func (s *Scheduler) WakeAt(sl *Slot, t time.Time) {
	s.mu.Lock()
	switch {
	case sl == nil || sl.removed:
	case sl.busy:
		if !t.After(s.now()) {
			sl.again = true
		} else {
			time.AfterFunc(t.Sub(s.now()), func() { s.WakeAt(sl, time.Time{}) })
		}
	case sl.index >= 0 && t.Before(sl.at):
		sl.at = t
		heap.Fix(&s.waiting, sl.index)
	}
	s.mu.Unlock()
	s.notify()
}

// Postpone moves sl's next step (if it is waiting) to t, and reports
// whether it was due at now: a test steps a slot by hand and sees what
// woke it.
func (s *Scheduler) Postpone(sl *Slot, now, t time.Time) (wasDue bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl.index < 0 {
		return false
	}
	wasDue = !sl.at.After(now)
	sl.at = t
	heap.Fix(&s.waiting, sl.index)
	return wasDue
}

func (s *Scheduler) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Run starts the steps that are due until ctx is done, then waits for
// those in progress.
func (s *Scheduler) Run(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		s.mu.Lock()
		now := s.now()
		for len(s.waiting) > 0 && !s.waiting[0].at.After(now) {
			sl := heap.Pop(&s.waiting).(*Slot)
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
func (s *Scheduler) dispatch(sl *Slot) {
	select {
	case s.work <- sl:
	default:
		go s.worker(sl)
	}
}

// worker steps sl, then waits for more work while few others do.
func (s *Scheduler) worker(sl *Slot) {
	var t *time.Timer
	for {
		s.step(sl)
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

// step runs one step of sl and schedules the next.
func (s *Scheduler) step(sl *Slot) {
	defer s.running.Done()
	next := sl.fn(sl.ctx)
	s.mu.Lock()
	sl.busy = false
	switch {
	case sl.removed:
		close(sl.idle)
	case sl.ctx.Err() != nil: // the slot's context ended: no more steps
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
type wakeHeap []*Slot

func (h wakeHeap) Len() int           { return len(h) }
func (h wakeHeap) Less(a, b int) bool { return h[a].at.Before(h[b].at) }
func (h wakeHeap) Swap(a, b int) {
	h[a], h[b] = h[b], h[a]
	h[a].index, h[b].index = a, b
}
func (h *wakeHeap) Push(x any) {
	sl := x.(*Slot)
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
