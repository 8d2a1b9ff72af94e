package engine

// Regression tests from the adversarial review of the performance work:
// each failed before its fix.

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runner"
)

// A fire claimed ahead whose claim reply was lost and that applied late is
// adopted by the next reconcile: it starts at its fire, not at once.
func TestAdoptedClaimMadeAheadWaitsForItsFire(t *testing.T) {
	at := func(s float64) time.Time { return noon.Add(time.Duration(s * float64(time.Second))) }
	cases := []struct {
		name string
		st   keyspace.ItemState
	}{
		{"adopted ahead claim (reply lost, applied late)",
			keyspace.ItemState{Record: &keyspace.ItemRecord{Item: 0, Fire: at(10), Sched: at(10), State: keyspace.StateRunning, Attempt: 1, Source: keyspace.SourceNormal, Instance: "a"}, RunningBy: "a", RunningMine: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeNode(t, "jobs:\n  - name: j\n    cron: \"@every 10s\"\n    failover: true\n    script: \"true\"\n", map[string][]int{"a": {0}})
			f.set(0, tc.st)
			clock := &fakeClock{now: at(9.8)} // 200 ms before the fire
			j, wait := loopOn(f, clock, nil)
			var mu sync.Mutex
			var got []runner.Context
			var when []time.Time
			j.e.work = func(ctx context.Context, c runner.Context) runner.Result {
				mu.Lock()
				got, when = append(got, c), append(when, clock.Now())
				mu.Unlock()
				now := clock.Now()
				return runner.Result{OK: true, Start: now, Started: now, End: now}
			}
			j.reconcile(context.Background())
			wait()
			mu.Lock()
			defer mu.Unlock()
			if len(got) == 0 {
				t.Fatalf("no run")
			}
			c := got[0]
			if c.StartAt.IsZero() && when[0].Before(c.Fire) {
				t.Errorf("fire %s (attempt %d, %s) handed to the runner at %s with no StartAt: the work starts %s before its fire",
					c.Fire.Format("15:04:05.000"), c.Attempt, c.Source, when[0].Format("15:04:05.000"), c.Fire.Sub(when[0]))
			}
		})
	}
}

// A claim that is not won (ErrNotUp: the session is up but the job not yet
// registered in it, as after every reconnect until the pacer reaches the
// job; or ErrClaimLost) asks for a later reconcile; the end of the attempt
// must not reconcile the job again at once (it did: with the item cache
// serving reads from memory, nothing in the loop waited and the job spun).
func TestClaimNotUpDoesNotSpin(t *testing.T) {
	f := newFakeNode(t, "jobs:\n  - name: j\n    cron: \"@every 10s\"\n    script: \"true\"\n", map[string][]int{"a": {0}})
	f.set(0, keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: noon, Sched: noon, State: keyspace.StateDone, Attempt: 1, End: noon.Add(time.Second)}})
	f.claimErr = func(coord.Claim) error { return coord.ErrNotUp }
	clock := &fakeClock{now: noon.Add(10*time.Second + 50*time.Millisecond)}
	j, _ := loopOn(f, clock, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); j.e.sched.Run(ctx) }()
	j.poke()
	time.Sleep(500 * time.Millisecond)
	cancel()
	<-done
	j.e.runs.Wait()
	f.mu.Lock()
	n := len(f.claims)
	f.mu.Unlock()
	t.Logf("%d claims in 500 ms", n)
	if n > 10 {
		t.Errorf("%d claims of one item in 500 ms (backoff asked: 100 ms): the job's reconcile spins", n)
	}
}
