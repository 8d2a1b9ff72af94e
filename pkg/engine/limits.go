package engine

import (
	"sync"
	"time"
)

// semaphore bounds concurrent runs; a nil semaphore bounds nothing. A run
// takes and gives back the same value, even when the job's maxConcurrency
// changes (and its semaphore is replaced) while it runs.
//
// Slots are taken when the reconcile decides on a run, never waited for: a
// decision that waited for a slot would be stale when it got one (a fire
// older than the misfire window, a fire a later decision coalesces). An
// item without a slot is decided again when a slot is given back.
type semaphore chan struct{}

func newSemaphore(n int) semaphore {
	if n <= 0 {
		return nil
	}
	return make(semaphore, n)
}

// tryAcquire takes a slot of every semaphore, in order, without waiting,
// or none of them.
func tryAcquire(sems ...semaphore) bool {
	for i, s := range sems {
		if s == nil {
			continue
		}
		select {
		case s <- struct{}{}:
		default:
			release(sems[:i]...)
			return false
		}
	}
	return true
}

// release gives back a slot of every semaphore.
func release(sems ...semaphore) {
	for _, s := range sems {
		if s != nil {
			<-s
		}
	}
}

// readyLatency keeps, for this instance's last runs, how long it took from
// the reconcile that decided on the run (its read of the items) to the
// work being ready to start (claimed, and its process waiting behind its
// gate): the lead of claims ahead of the fire is derived from it.
type readyLatency struct {
	mu     sync.Mutex
	recent [32]time.Duration
	n      int
}

func (c *readyLatency) observe(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recent[c.n%len(c.recent)] = d
	c.n++
}

// Bounds of the lead: before any claim is measured it is defaultLead.
const (
	minLead     = 10 * time.Millisecond
	maxLead     = 250 * time.Millisecond
	defaultLead = 50 * time.Millisecond
	// margin is added to the lead for what the samples may not show.
	margin = 2 * time.Millisecond
)

// lead is how long before a fire its items are read and claimed and their
// work prepared: twice the slowest recent time this took, plus a margin.
func (c *readyLatency) lead() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 {
		return defaultLead
	}
	slowest := time.Duration(0)
	for _, d := range c.recent[:min(c.n, len(c.recent))] {
		slowest = max(slowest, d)
	}
	return min(max(2*slowest+margin, minLead), maxLead)
}
