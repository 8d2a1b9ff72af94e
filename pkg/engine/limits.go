package engine

import "context"

// semaphore bounds concurrent runs; a nil semaphore bounds nothing. A run
// takes and gives back the same value, even when the job's maxConcurrency
// changes (and its semaphore is replaced) while it runs.
type semaphore chan struct{}

func newSemaphore(n int) semaphore {
	if n <= 0 {
		return nil
	}
	return make(semaphore, n)
}

// acquire takes a slot of every semaphore, in order, or none of them if
// ctx ends first.
func acquire(ctx context.Context, sems ...semaphore) bool {
	for i, s := range sems {
		if s == nil {
			continue
		}
		select {
		case s <- struct{}{}:
		case <-ctx.Done():
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
