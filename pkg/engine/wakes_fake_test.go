package engine

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runner"
)

// flakyReads is a fakeNode whose next readFails item reads fail.
type flakyReads struct {
	*fakeNode
	readFails atomic.Int32
}

func (f *flakyReads) ReadItems(ctx context.Context, job string) (keyspace.JobItems, error) {
	if f.readFails.Add(-1) >= 0 {
		return keyspace.JobItems{}, errors.New("etcd hiccup")
	}
	return f.fakeNode.ReadItems(ctx, job)
}

func reviewLoop(node Node, name string, clock *fakeClock) (*jobLoop, func()) {
	e := New(Options{Node: node, Now: clock.Now, TTL: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Sweep: -1})
	e.work = func(ctx context.Context, c runner.Context) runner.Result {
		now := clock.Now()
		return runner.Result{OK: true, Start: now, Started: now, End: now}
	}
	j := newJobLoop(e, name)
	e.jobs[name] = j // the job's current loop (wakeCurrent, readAfter)
	j.baseline = clock.Now().Add(-time.Hour)
	j.slot = e.sched.NewSlot(context.Background(), j.reconcile)
	e.sched.Add(j.slot)
	poked(j)
	return j, e.runs.Wait
}

const reviewJob = "jobs:\n  - name: j\n    cron: \"@every 10s\"\n    script: \"true\"\n"

// A late claim's marker wakes an idle job (ownMarker sets mustRead); the
// read that wake makes fails; the retry 500 ms later reads too and adopts
// the claim. Found by review: the failed pass consumed the flag, and the
// retry, idle, read nothing.
func TestMustReadOutlivesAFailedRead(t *testing.T) {
	t.Parallel()
	f := newFakeNode(t, reviewJob, map[string][]int{"a": {}, "b": {0}}) // a owns nothing: idle
	f.set(0, keyspace.ItemState{Record: &keyspace.ItemRecord{Item: 0, Fire: noon, Sched: noon, State: keyspace.StateRunning, Attempt: 1, Instance: "a"},
		RunningBy: "a", RunningMine: true}) // a claim of a's session that applied late
	n := &flakyReads{fakeNode: f}
	n.readFails.Store(1)
	clock := &fakeClock{now: noon.Add(time.Second)}
	j, wait := reviewLoop(n, "j", clock)
	j.ownMarker(0) // the marker's put event
	next := j.reconcile(context.Background())
	if want := clock.Now().Add(500 * time.Millisecond); !next.Equal(want) {
		t.Fatalf("after a failed read: next %v, want %v", next, want)
	}
	clock.set(noon.Add(1500 * time.Millisecond))
	j.reconcile(context.Background()) // the retry the failed read asked for
	wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.outcomes) != 1 {
		t.Fatalf("the late claim was not adopted after a failed read: %d outcomes, item %+v (it holds item 0 for as long as the session lives)", len(f.outcomes), f.items[0])
	}
}

// A claim whose reply is lost but which applied: its marker's event comes
// while the claim's goroutine still counts the item as running here, so
// ownMarker ignores it; the item moves away meanwhile. The claim's error
// makes the job read again (readAfter), idle or not, and adopt it. Found
// by review: the later look was idle, and nothing adopted the claim.
func TestClaimOfUnknownOutcomeIsAdoptedAfterTheItemMoved(t *testing.T) {
	t.Parallel()
	f := newFakeNode(t, reviewJob, map[string][]int{"a": {0}, "b": {}})
	f.set(0, keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: noon, Sched: noon, State: keyspace.StateDone, Attempt: 1, End: noon.Add(time.Second)}})
	clock := &fakeClock{now: noon.Add(10 * time.Second)}
	var j *jobLoop
	f.claimErr = func(c coord.Claim) error { // f.mu is held
		// The Txn applies; its reply is lost.
		f.rev++
		rec := keyspace.ItemRecord{Job: c.Job, Item: c.Item, Fire: c.Fire, State: keyspace.StateRunning, Instance: f.id, Attempt: c.Attempt, Source: c.Source, Sched: c.Sched, Fence: f.rev}
		f.items[c.Item] = keyspace.ItemState{Record: &rec, Rev: f.rev, RunningBy: f.id, RunningMine: true}
		// A member joins: the item moves to b.
		m := *f.view.Map
		m.Epoch, m.Items = 2, map[string][]int{"a": {}, "b": {0}}
		f.view.Map, f.view.MapRev = &m, 6
		j.ownMarker(c.Item)                            // the marker's put event, delivered now
		return errors.New("context deadline exceeded") // outcome unknown (or a read-back that said not applied)
	}
	var wait func()
	j, wait = reviewLoop(f, "j", clock)
	j.reconcile(context.Background())
	wait()                            // the claim "failed"
	j.reconcile(context.Background()) // the pokeAfter(500ms) the failure asked for
	wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.outcomes) != 1 {
		t.Fatalf("the claim that applied was never adopted: %d outcomes, item %+v", len(f.outcomes), f.items[0])
	}
}

// A view whose definition this instance may not run (coord.JobView's
// Refusal: an applied definition it does not accept, a selector that does
// not match) runs nothing, not even a listener, which runs before any
// claim: found by review, a refused definition's listeners.before ran in
// the moment before its task left the job. The same view without the
// refusal runs.
func TestRefusedViewRunsNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	marker := filepath.Join(dir, "before")
	yaml := "jobs:\n  - name: j\n    cron: \"@every 10s\"\n    script: \"true\"\n    listeners:\n      before: " + etcdtest.YAMLQuote("echo ran >> "+marker) + "\n"
	f := newFakeNode(t, yaml, map[string][]int{"a": {0}})
	f.view.Refusal = errors.New("script.command is a shell string, which can run anything")
	f.set(0, keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: noon, Sched: noon, State: keyspace.StateDone, Attempt: 1, End: noon.Add(time.Second)}})
	clock := &fakeClock{now: noon.Add(10 * time.Second)} // the next fire is due
	j, wait := reviewLoop(f, "j", clock)
	j.reconcile(context.Background())
	wait()
	f.mu.Lock()
	claims := len(f.claims)
	f.mu.Unlock()
	if _, err := os.Stat(marker); err == nil || claims > 0 {
		t.Fatalf("a refused view: %d claims, listener ran %v", claims, err == nil)
	}
	f.mu.Lock()
	f.view.Refusal = nil
	f.mu.Unlock()
	j.reconcile(context.Background())
	wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.claims) == 0 {
		t.Fatal("the same view without the refusal claimed nothing: the test would see nothing")
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the same view without the refusal ran no listener: %v", err)
	}
}
