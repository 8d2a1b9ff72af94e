package coord

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestPacer(t *testing.T) {
	t.Parallel()
	// answer gives back a slot taken at start, with err.
	answer := func(p *pacer, start time.Time, err error) {
		t := &ticket{}
		if !p.take(t) {
			panic("no slot for the test's registration")
		}
		p.release(t, start, err)
	}
	fast := func(p *pacer) { answer(p, time.Now(), nil) }
	slow := func(p *pacer) { answer(p, time.Now().Add(-time.Hour), nil) }
	failed := func(p *pacer) { answer(p, time.Now(), errors.New("etcd: too many requests")) }
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
		{"steady slow answers do not pin it", repeat(func(p *pacer) { answer(p, time.Now().Add(-2*time.Second), nil) }, 16), from/2 + 0.2, from/2 + 0.3},
		{"rounds of failures halve it each, never below the floor", repeat(func(p *pacer) { time.Sleep(time.Millisecond); failed(p) }, 10), minPace, minPace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPacer(time.Second)
			p.bound = from
			for _, step := range tc.steps {
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

// take grants at most bound slots; the others wait in line, in order,
// with no goroutine; a release grants the head of the line and calls its
// wake; a dropped ticket is skipped, and a slot it held is given back.
func TestPacerLine(t *testing.T) {
	t.Parallel()
	p := newPacer(time.Second)
	held := make([]*ticket, startPace)
	for i := range held {
		held[i] = &ticket{}
		if !p.take(held[i]) {
			t.Fatal("take under the bound failed")
		}
	}
	var woken []int
	line := make([]*ticket, 3)
	for i := range line {
		line[i] = &ticket{wake: func() { woken = append(woken, i) }}
		if p.take(line[i]) {
			t.Fatal("took a slot beyond the bound")
		}
	}
	if p.take(line[0]) {
		t.Fatal("a ticket in line took a slot on asking again")
	}
	p.drop(line[0]) // gone before its turn
	// A failed answer: the bound stays at its floor (a fast one would grow
	// it past 32 and let two in).
	failed := errors.New("etcd: too many requests")
	p.release(held[0], time.Now(), failed)
	if len(woken) != 1 || woken[0] != 1 {
		t.Fatalf("woken %v after one release, want [1] (0 was dropped)", woken)
	}
	if !p.take(line[1]) {
		t.Fatal("a granted ticket does not hold its slot")
	}
	p.drop(line[1]) // granted, then dropped unused: its slot goes to the next
	if len(woken) != 2 || woken[1] != 2 {
		t.Fatalf("woken %v, want [1 2]: a dropped ticket's slot goes to the next in line", woken)
	}
	p.release(held[1], time.Now(), failed)
	p.release(line[2], time.Now(), failed)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inFlight != startPace-2 || len(p.line) != 0 {
		t.Errorf("%d in flight, %d in line; want %d and 0", p.inFlight, len(p.line), startPace-2)
	}
}

// The pacer cuts on latency alone: when etcd's base latency for one
// registration (a read, the publish Txn, the member Txn: 2-3 round trips
// with fsync) is above TTL/10 (200 ms at --ttl 2s, 1 s at the default),
// every answer was "slow", the bound fell to 1 and never grew again:
// registrations were serialized however idle etcd was. Steady answers must
// let it grow.
func TestPacerNotPinnedBySteadyLatency(t *testing.T) {
	t.Parallel()
	p := newPacer(20 * time.Millisecond) // TTL/10 of a 200 ms TTL, to keep the test short
	var wg sync.WaitGroup
	var peak, inFlight atomic.Int64
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			granted := make(chan struct{}, 1)
			tk := &ticket{wake: func() { granted <- struct{}{} }}
			if !p.take(tk) {
				<-granted
			}
			if v := inFlight.Add(1); v > peak.Load() {
				peak.Store(v)
			}
			begun := time.Now()
			time.Sleep(25 * time.Millisecond) // an idle etcd with a 25 ms answer
			inFlight.Add(-1)
			p.release(tk, begun, nil)
		}()
	}
	wg.Wait()
	t.Logf("bound after 64 registrations answered in 25 ms each: %.2f", p.limit())
	if p.limit() <= startPace {
		t.Errorf("bound %.2f: steady answers slower than the threshold did not let it grow past %d", p.limit(), startPace)
	}
}
