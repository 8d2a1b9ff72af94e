package engine

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runner"
)

// runLog collects the engine's "run" log records: whether each was
// claimed ahead of its fire.
type runLog struct {
	mu     sync.Mutex
	ahead  int
	onTime int
}

func (l *runLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *runLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *runLog) WithGroup(string) slog.Handler            { return l }
func (l *runLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "run" {
		return nil
	}
	ahead := false
	r.Attrs(func(a slog.Attr) bool {
		ahead = ahead || a.Key == "starts_in"
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	if ahead {
		l.ahead++
	} else {
		l.onTime++
	}
	return nil
}

// Runs are claimed ahead of their fire and start at it, never before.
func TestClaimsAheadOfTheFire(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	logs := &runLog{}
	yaml := `jobs:
  - name: tick
    cron: "* * * * * ?"
    shardingTotalCount: 2
    script: 'echo "$(date +%s%N) $SHARDD_FIRE_TIME" >> ` + dir + `/began-$SHARDD_ITEM'
`
	instance(t, srv, "a", yaml, func(o *Options) { o.Logger = slog.New(logs) })
	etcdtest.Eventually(t, 30*time.Second, "8 runs, one claimed ahead", func() bool {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		return logs.ahead > 0 && logs.ahead+logs.onTime >= 8
	})
	runs := 0
	for item := range 2 {
		b, _ := os.ReadFile(filepath.Join(dir, "began-"+strconv.Itoa(item)))
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.Fields(line)
			if len(f) != 2 {
				continue
			}
			ns, _ := strconv.ParseInt(f[0], 10, 64)
			fire, err := time.Parse(time.RFC3339, f[1])
			if err != nil {
				t.Fatal(err)
			}
			runs++
			t.Logf("item %d: fire %s began %s after it", item, fire.Format(time.TimeOnly), time.Unix(0, ns).Sub(fire))
			if began := time.Unix(0, ns); began.Before(fire) {
				t.Errorf("item %d: the fire of %s began at %s, before it", item, fire.Format(time.TimeOnly), began.Format("15:04:05.000000"))
			}
		}
	}
	if runs == 0 {
		t.Error("no run recorded its start")
	}
}

// A fire claimed ahead whose claim reply was lost and that applied late is
// adopted by the next reconcile: it starts at its fire, not at once.
func TestAdoptedClaimMadeAheadWaitsForItsFire(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
