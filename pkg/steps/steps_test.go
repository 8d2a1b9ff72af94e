package steps

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/stacks"
)

// The scheduler runs each slot's step at once, then when it asks, or
// when woken; one slot's steps never overlap, and a wake during one
// runs it again after; remove waits for a step in progress; an idle
// slot has no goroutine.
func TestScheduler(t *testing.T) {
	s, ctx := running(t)

	var runs, overlaps atomic.Int32
	var in atomic.Bool
	release := make(chan struct{})
	entered := make(chan struct{}, 16)
	busy := s.NewSlot(ctx, func(context.Context) time.Time {
		if in.Swap(true) {
			overlaps.Add(1)
		}
		runs.Add(1)
		entered <- struct{}{}
		<-release
		in.Store(false)
		return time.Now().Add(time.Hour)
	})
	s.Add(busy)
	<-entered // the first step, at once
	s.WakeAt(busy, time.Time{})
	s.WakeAt(busy, time.Time{}) // woken twice during it: once more after it
	release <- struct{}{}
	<-entered
	release <- struct{}{}
	select {
	case <-entered:
		t.Fatal("two wakes during a step ran it twice after")
	case <-time.After(100 * time.Millisecond):
	}
	if overlaps.Load() != 0 {
		t.Errorf("%d steps of one slot overlapped", overlaps.Load())
	}

	// Asked times, in order, from one timer.
	var mu sync.Mutex
	var order []int
	for i, d := range []time.Duration{60, 20, 40} {
		first := true
		sl := s.NewSlot(ctx, func(context.Context) time.Time {
			if first {
				first = false
				return time.Now().Add(d * time.Millisecond)
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			return time.Now().Add(time.Hour)
		})
		s.Add(sl)
	}
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	if len(order) != 3 || order[0] != 1 || order[1] != 2 || order[2] != 0 {
		t.Errorf("slots ran in the order %v, want [1 2 0] (20, 40, 60 ms)", order)
	}
	mu.Unlock()

	// remove waits for the step in progress, and no step follows.
	s.WakeAt(busy, time.Time{})
	<-entered
	removed := make(chan struct{})
	go func() { s.Remove(busy); close(removed) }()
	select {
	case <-removed:
		t.Fatal("remove returned during a step")
	case <-time.After(50 * time.Millisecond):
	}
	release <- struct{}{}
	<-removed
	n := runs.Load()
	s.WakeAt(busy, time.Time{})
	time.Sleep(50 * time.Millisecond)
	if runs.Load() != n {
		t.Error("a removed slot ran again")
	}
}

// Idle slots cost no goroutine.
func TestSchedulerIdleSlotsHaveNoGoroutine(t *testing.T) {
	s, ctx := running(t)
	var ran sync.WaitGroup
	ran.Add(1000)
	for range 1000 {
		first := true
		s.Add(s.NewSlot(ctx, func(context.Context) time.Time {
			if first {
				first = false
				ran.Done()
			}
			return time.Now().Add(time.Hour)
		}))
	}
	ran.Wait()
	time.Sleep(50 * time.Millisecond)
	s.mu.Lock()
	waiting := len(s.waiting)
	s.mu.Unlock()
	if waiting != 1000 {
		t.Fatalf("%d slots waiting, want 1000", waiting)
	}
	if g := stacks.Count("pkg/steps.(*Scheduler).step"); g != 0 {
		t.Errorf("%d step goroutines for 1,000 idle slots, want 0", g)
	}
	if g := stacks.Count("pkg/steps.(*Scheduler).worker"); g > maxIdleWorkers {
		t.Errorf("%d workers left waiting after a burst of 1,000 steps, want at most %d", g, maxIdleWorkers)
	}
}

// running returns a scheduler that runs until the test ends, and the
// context its slots should use.
func running(t *testing.T) (*Scheduler, context.Context) {
	s := New(time.Now)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s, ctx
}
