package engine

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
