package engine

import (
	"context"
	"time"
)

// The safety net. Every reason for a job to reconcile has an event that
// wakes it (doc.go, "What wakes a job"), so an idle job costs nothing:
// no timer, no read. The sweep is there for the event this process might
// miss all the same, a bug rather than a fault (a gap of the watch wakes
// every job it could concern): it wakes each job, round-robin, for a
// reconcile that reads its items even where it owns none, at most once
// per Sweep and at most SweepRate jobs a second all together. Its cost is
// therefore bounded per second whatever the job count; at 10,000 jobs and
// the defaults a round takes 200 s.

// sweepTick is how often the sweep hands out its reconciles.
const sweepTick = 100 * time.Millisecond

// clockRetry is how often a job that this host's clock may not fire
// (maxTimeDiffSeconds) looks again: a skew changes with no event.
const clockRetry = 5 * time.Second

// sweep runs the safety net until ctx is done.
func (e *Engine) sweep(ctx context.Context) {
	if e.opts.Sweep < 0 {
		return
	}
	t := time.NewTicker(sweepTick)
	defer t.Stop()
	var round []*jobLoop // the jobs of this round not swept yet
	var size, credit float64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if len(round) == 0 {
			if round = e.loops(); len(round) == 0 {
				continue
			}
			size = float64(len(round))
		}
		perTick := min(float64(e.opts.SweepRate), size/e.opts.Sweep.Seconds()) * sweepTick.Seconds()
		credit = min(credit+perTick, max(perTick, 1))
		for ; credit >= 1 && len(round) > 0; credit-- {
			j := round[0]
			round = round[1:]
			j.mustRead.Store(true)
			j.poke() // no-op for a loop stopped since the round began
		}
	}
}

// loops returns the engine's job loops, in no set order.
func (e *Engine) loops() []*jobLoop {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*jobLoop, 0, len(e.jobs))
	for _, j := range e.jobs {
		out = append(out, j)
	}
	return out
}
