package coord

import (
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
//
// Registrations wait in line without a goroutine: a job's registration
// step takes a ticket; a ticket granted later is handed its slot and its
// wake is called, which makes the job's step run again.
type pacer struct {
	slow time.Duration

	mu       sync.Mutex
	base     time.Duration // 0: no answer yet
	bound    float64
	inFlight int
	cut      time.Time // when the bound was last halved
	line     []*ticket // waiting for a slot, in order
}

// ticket is one registration's place in the pacer's line. A dropped
// ticket is not taken again.
type ticket struct {
	wake    func() // called, outside the pacer's lock, once a queued ticket is granted a slot
	queued  bool
	granted bool // holds a slot
	dropped bool
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

// take reports whether t holds a slot: granted now, or earlier while it
// waited in line. Otherwise t waits in line and t.wake is called once it is
// granted one.
func (p *pacer) take(t *ticket) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case t.granted:
		return true
	case t.queued || t.dropped:
		return false
	case len(p.line) == 0 && float64(p.inFlight) < p.bound:
		t.granted = true
		p.inFlight++
		return true
	}
	t.queued = true
	p.line = append(p.line, t)
	return false
}

// release gives t's slot back with how the registration went: begun at
// start, failed with err (nil: answered).
func (p *pacer) release(t *ticket, start time.Time, err error) {
	p.mu.Lock()
	if !t.granted {
		p.mu.Unlock()
		return
	}
	t.granted = false
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
	wakes := p.grant()
	p.mu.Unlock()
	for _, w := range wakes {
		w()
	}
}

// drop takes t out of the line for good, and gives back a slot it holds
// unused (no answer to learn from).
func (p *pacer) drop(t *ticket) {
	p.mu.Lock()
	t.dropped, t.queued = true, false // grant skips it
	var wakes []func()
	if t.granted {
		t.granted = false
		p.inFlight--
		wakes = p.grant()
	}
	p.mu.Unlock()
	for _, w := range wakes {
		w()
	}
}

// grant hands free slots to the tickets at the head of the line and
// returns their wakes. p.mu is held.
func (p *pacer) grant() []func() {
	var wakes []func()
	for len(p.line) > 0 && float64(p.inFlight) < p.bound {
		t := p.line[0]
		p.line[0] = nil
		p.line = p.line[1:]
		if t.dropped {
			continue
		}
		t.queued, t.granted = false, true
		p.inFlight++
		if t.wake != nil {
			wakes = append(wakes, t.wake)
		}
	}
	if len(p.line) == 0 {
		p.line = nil // let a drained line's array go
	}
	return wakes
}

// limit is the current bound (for tests and logs).
func (p *pacer) limit() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bound
}
