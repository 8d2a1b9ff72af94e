package coord

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestPacer(t *testing.T) {
	fast := func(p *pacer) { p.release(time.Now(), nil) }
	slow := func(p *pacer) { p.release(time.Now().Add(-time.Hour), nil) }
	failed := func(p *pacer) { p.release(time.Now(), errors.New("etcd: too many requests")) }
	const from = 4 * minPace // grown well above the floor
	for _, tc := range []struct {
		name  string
		steps []func(*pacer)
		min   float64
		max   float64
	}{
		{"a round of fast answers adds one", repeat(fast, from), from + 0.9, from + 1},
		{"many fast answers grow it, to the cap", repeat(fast, 1_000_000), maxPace, maxPace},
		// After a first fast answer: the base latency is known (microseconds).
		{"a slow answer halves it", []func(*pacer){fast, slow}, from / 2, from/2 + 0.1},
		{"a failure halves it", []func(*pacer){fast, failed}, from / 2, from/2 + 0.1},
		{"answers of one round halve it once", append([]func(*pacer){fast}, repeat(slow, 4)...), from / 2, from/2 + 0.1},
		// An etcd whose every answer is slower than the threshold but steady
		// (a slow disk) is not falling behind: the first answer, with no base
		// to compare with, halves the bound; the next ones grow it.
		{"steady slow answers do not pin it", repeat(func(p *pacer) { p.release(time.Now().Add(-2*time.Second), nil) }, 16), from/2 + 0.2, from/2 + 0.3},
		{"rounds of failures halve it each, never below the floor", repeat(func(p *pacer) { time.Sleep(time.Millisecond); failed(p) }, 10), minPace, minPace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPacer(time.Second)
			p.bound = from
			for _, step := range tc.steps {
				p.inFlight++
				step(p)
			}
			if got := p.limit(); got < tc.min || got > tc.max {
				t.Errorf("bound %.2f, want in [%.2f, %.2f]", got, tc.min, tc.max)
			}
		})
	}
}

func repeat(f func(*pacer), n int) []func(*pacer) {
	out := make([]func(*pacer), n)
	for i := range out {
		out[i] = f
	}
	return out
}

// acquire takes at most bound slots; a release lets a waiter in; a waiter
// whose context ends gives up.
func TestPacerBoundsRegistrations(t *testing.T) {
	p := newPacer(time.Second)
	ctx := context.Background()
	for range startPace {
		if !p.acquire(ctx) {
			t.Fatal("acquire under the bound failed")
		}
	}
	got := make(chan bool, 1)
	go func() { got <- p.acquire(ctx) }()
	select {
	case <-got:
		t.Fatal("acquired beyond the bound")
	case <-time.After(50 * time.Millisecond):
	}
	p.release(time.Now(), nil)
	if !<-got {
		t.Fatal("the waiter did not get the slot given back")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if p.acquire(cctx) {
		t.Error("acquired with an ended context")
	}
}
