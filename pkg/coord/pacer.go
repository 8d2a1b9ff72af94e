package coord

import (
	"context"
	"sync"
	"time"
)

// pacer bounds how many jobs register at once, by etcd's answers rather
// than a fixed number. Thousands of jobs registering together put etcd's
// apply queue thousands of entries behind ("too many requests"); the queue
// delays lease keepalives, and every instance fenced itself, re-registered
// and started over. A fixed bound (32) avoided that on one machine and
// wasted etcd's capacity on a faster one.
//
// The bound is additive-increase, multiplicative-decrease, like TCP's
// congestion window: each registration answered in time raises it by
// 1/bound (one per round of registrations), each slower one or failure
// halves it (at most once per round: the registrations already in flight
// answered late for the same reason). It stays between minPace and
// maxPace and starts at startPace. In time is within the larger of slow
// and twice the base latency (the fastest answer seen, drifting up slowly
// with later ones): an etcd whose every answer takes longer than slow
// (a slow disk, a far member) is not etcd falling behind, and must not pin
// the bound at one.
type pacer struct {
	slow time.Duration

	mu       sync.Mutex
	base     time.Duration // 0: no answer yet
	bound    float64
	inFlight int
	cut      time.Time // when the bound was last halved
	freed    broadcast // a slot freed or the bound grew
}

// The bound never goes below minPace: the fixed bound of earlier versions,
// which 10,000 jobs over three instances converged with on a 2-core
// machine; a floor of 1 serialized registrations under a load that was not
// etcd's (script forks starving the CPU), and 1,000 jobs did not converge
// in 2 minutes.
const (
	minPace   = 32
	startPace = 32
	maxPace   = 512
)

func newPacer(slow time.Duration) *pacer {
	return &pacer{slow: slow, bound: startPace}
}

// acquire waits for a slot, or until ctx is done (false).
func (p *pacer) acquire(ctx context.Context) bool {
	for ctx.Err() == nil {
		p.mu.Lock()
		if float64(p.inFlight) < p.bound {
			p.inFlight++
			p.mu.Unlock()
			return true
		}
		freed := p.freed.C()
		p.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
		}
	}
	return false
}

// release gives a slot back with how the registration went: begun at
// start, failed with err (nil: answered).
func (p *pacer) release(start time.Time, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight--
	took := time.Since(start)
	late := took > max(p.slow, 2*p.base)
	if err == nil {
		if p.base == 0 || took < p.base {
			p.base = took
		} else {
			p.base += (took - p.base) / 64
		}
	}
	switch {
	case err != nil || late:
		if start.After(p.cut) { // once per round: those begun before the cut knew no better
			p.bound = max(minPace, p.bound/2)
			p.cut = time.Now()
		}
	default:
		p.bound = min(maxPace, p.bound+1/p.bound)
	}
	p.freed.notify()
}

// limit is the current bound (for tests and logs).
func (p *pacer) limit() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bound
}
