package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runner"
)

// fakeNode is an in-memory Node: one job, its items, a session that can be
// taken away, and a log of what the engine asked for. Its Claim and
// Complete apply the same guards as coord's transactions.
type fakeNode struct {
	mu       sync.Mutex
	id       string
	view     coord.JobView
	up       bool
	session  context.Context
	deadline time.Time
	items    map[int]keyspace.ItemState
	rev      int64
	grants   map[int64]keyspace.ItemRecord // by fence
	claims   []coord.Claim
	outcomes []coord.Outcome
	// claimErr, if set, fails a claim before it applies.
	claimErr func(coord.Claim) error
	// triggers are the job's trigger keys (no watch: the loop reads them).
	triggers []keyspace.Trigger
}

var _ Node = (*fakeNode)(nil)

func newFakeNode(t *testing.T, yaml string, owned map[string][]int) *fakeNode {
	t.Helper()
	c, err := config.Parse("jobs.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	job := c.Jobs[0]
	var instances []string
	for id := range owned {
		instances = append(instances, id)
	}
	slices.Sort(instances)
	m := &keyspace.ShardMap{Epoch: 1, Total: job.ShardingTotalCount, Instances: instances, Items: owned}
	return &fakeNode{id: "a", view: coord.JobView{Local: job, Job: job, Map: m, MapRev: 5}, up: true, session: context.Background(),
		items: map[int]keyspace.ItemState{}, rev: 100, grants: map[int64]keyspace.ItemRecord{}}
}

func (f *fakeNode) ID() string     { return f.id }
func (f *fakeNode) Jobs() []string { return []string{f.view.Job.Name} }
func (f *fakeNode) View(job string) (coord.JobView, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.view, job == f.view.Job.Name
}
func (f *fakeNode) Session() (context.Context, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.session, f.up
}
func (f *fakeNode) FenceDeadline() (time.Time, bool) { return f.deadline, f.up }
func (f *fakeNode) ReadItems(context.Context, string) (keyspace.JobItems, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := keyspace.JobItems{Rev: f.rev, Items: map[int]keyspace.ItemState{}}
	for i, st := range f.items {
		if st.Record != nil {
			r := *st.Record
			st.Record = &r
		}
		out.Items[i] = st
	}
	return out, nil
}

func (f *fakeNode) ClaimAll(ctx context.Context, claims []coord.Claim) []coord.ClaimResult {
	out := make([]coord.ClaimResult, len(claims))
	for i, c := range claims {
		out[i].Grant, out[i].Err = f.Claim(ctx, c)
	}
	return out
}

func (f *fakeNode) Claim(_ context.Context, c coord.Claim) (*coord.Grant, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claims = append(f.claims, c)
	if f.claimErr != nil {
		if err := f.claimErr(c); err != nil {
			return nil, err
		}
	}
	st := f.items[c.Item]
	if !f.up {
		return nil, coord.ErrNotUp
	}
	if st.Rev != c.Prev.Rev || st.RunningBy != "" || (c.MapRev != 0 && c.MapRev != f.view.MapRev) {
		return nil, coord.ErrClaimLost
	}
	f.rev++
	rec := keyspace.ItemRecord{Job: c.Job, Item: c.Item, Fire: c.Fire, State: keyspace.StateRunning, Instance: f.id, Attempt: c.Attempt,
		Source: c.Source, Skipped: c.Skipped, Sched: c.Sched, Trigger: c.Trigger, Fence: f.rev}
	if rec.Trigger == 0 && st.Record != nil {
		rec.Trigger = st.Record.Trigger
	}
	f.items[c.Item] = keyspace.ItemState{Record: &rec, Rev: f.rev, RunningBy: f.id, RunningMine: true}
	f.grants[f.rev] = rec
	return &coord.Grant{Fence: f.rev, Ctx: f.session}, nil
}

func (f *fakeNode) Adopt(_ context.Context, job string, item int, st keyspace.ItemState) (*coord.Grant, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.items[item]
	if cur.Rev != st.Rev || !cur.RunningMine || cur.Record == nil || cur.Record.State != keyspace.StateRunning {
		return nil, coord.ErrClaimLost
	}
	f.grants[cur.Rev] = *cur.Record
	return &coord.Grant{Fence: cur.Rev, Ctx: f.session}, nil
}

func (f *fakeNode) Complete(_ context.Context, g *coord.Grant, o coord.Outcome) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.outcomes = append(f.outcomes, o)
	rec := f.grants[g.Fence]
	if f.items[rec.Item].Rev != g.Fence {
		return coord.ErrClaimLost
	}
	rec.State, rec.Reason, rec.End = o.State, o.Reason, o.End
	f.rev++
	f.items[rec.Item] = keyspace.ItemState{Record: &rec, Rev: f.rev}
	return nil
}

func (f *fakeNode) Skip(_ context.Context, s coord.Skip) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.items[s.Item].Rev != s.Prev.Rev {
		return coord.ErrClaimLost
	}
	f.rev++
	f.items[s.Item] = keyspace.ItemState{Record: &keyspace.ItemRecord{Job: s.Job, Item: s.Item, Fire: s.Fire, Sched: s.Fire, State: keyspace.StateSkipped, Skipped: s.Skipped, Reason: s.Reason}, Rev: f.rev}
	return nil
}

func (f *fakeNode) Begin(_ context.Context, job string, items []int, sched time.Time, mapRev int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if mapRev != f.view.MapRev {
		return nil // the guard fails: nothing written
	}
	for _, item := range items {
		if f.items[item].Record == nil {
			f.rev++
			f.items[item] = keyspace.ItemState{Record: &keyspace.ItemRecord{Job: job, Item: item, Fire: sched, Sched: sched, State: keyspace.StateSkipped}, Rev: f.rev}
		}
	}
	return nil
}

func (f *fakeNode) Kills(context.Context, string) (map[keyspace.KillKey]keyspace.KillBy, error) {
	return map[keyspace.KillKey]keyspace.KillBy{}, nil
}
func (f *fakeNode) SettleKilled(context.Context, string, int, keyspace.ItemState, keyspace.KillBy) error {
	return errors.New("fakeNode: no kills")
}
func (f *fakeNode) ReadClusterSlots(context.Context, string) (coord.ClusterSlots, error) {
	return coord.ClusterSlots{}, errors.New("fakeNode: no cluster slots")
}
func (f *fakeNode) Wait(context.Context, string, int, time.Time) error {
	return errors.New("fakeNode: no cluster slots")
}
func (f *fakeNode) Unwait(context.Context, string, int, int64) error {
	return errors.New("fakeNode: no cluster slots")
}
func (f *fakeNode) Replace(context.Context, string, int, int64, string, time.Time) (bool, error) {
	return false, errors.New("fakeNode: no kills")
}

func (f *fakeNode) Settle(_ context.Context, job string, item int, st keyspace.ItemState) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.items[item].Rev != st.Rev || st.Record == nil {
		return coord.ErrClaimLost
	}
	rec := *st.Record
	rec.State, rec.Reason = keyspace.StateKilled, keyspace.ReasonLost
	f.rev++
	f.items[item] = keyspace.ItemState{Record: &rec, Rev: f.rev}
	return nil
}

func (f *fakeNode) History(context.Context, string) ([]keyspace.ItemRecord, error) { return nil, nil }

// The fake's jobs have no children and no parents: dependencies are tested
// against a real etcd (deps_test.go).
func (f *fakeNode) NoteOutcome(context.Context, string, int, keyspace.ItemRecord, keyspace.ParentsOf) (keyspace.Barrier, bool, error) {
	panic("fakeNode: NoteOutcome of a job with no children")
}
func (f *fakeNode) ReadTriggers(context.Context, string) ([]keyspace.Trigger, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.triggers), nil
}

// DeleteTrigger deletes tr; the fake's jobs and items are never disabled
// (decide's tests set st.Disabled on items they do not serve triggers of).
func (f *fakeNode) DeleteTrigger(_ context.Context, _ string, tr keyspace.Trigger, _ coord.TriggerGuard) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.triggers)
	f.triggers = slices.DeleteFunc(f.triggers, func(t keyspace.Trigger) bool { return t.Rev == tr.Rev })
	return len(f.triggers) < n, nil
}
func (f *fakeNode) OnChange(string, func(), func(int)) func()                    { return func() {} }
func (f *fakeNode) OnTrigger(string, func(keyspace.TriggerEvent), func()) func() { return func() {} }
func (f *fakeNode) OnKill(string, func(keyspace.Kill)) func()                    { return func() {} }

// putTrigger puts a trigger in the fake's etcd at a new revision.
func (f *fakeNode) putTrigger(tr keyspace.Trigger) keyspace.Trigger {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rev++
	tr.Rev, tr.ModRev = f.rev, f.rev
	f.triggers = append(f.triggers, tr)
	return tr
}

// set replaces an item's state in the fake's etcd.
func (f *fakeNode) set(item int, st keyspace.ItemState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rev++
	if st.Rev == 0 && st.Record != nil {
		st.Rev = f.rev
	}
	f.items[item] = st
}

// claimed lists the claims made as "item fire attempt source".
func (f *fakeNode) claimed() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, c := range f.claims {
		out = append(out, fmt.Sprintf("%d %s %d %s", c.Item, c.Fire.Format("15:04:05"), c.Attempt, c.Source))
	}
	slices.Sort(out) // runs claim in parallel
	return out
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// loopOn returns a job loop over f whose runs finish at once (or, when
// hold is not nil, say so on started and block until hold closes), and a
// function that waits for the runs launched so far.
func loopOn(f *fakeNode, clock *fakeClock, hold chan struct{}) (*jobLoop, func()) {
	return loopWith(f, clock, hold, nil)
}

func loopWith(f *fakeNode, clock *fakeClock, hold, started chan struct{}) (*jobLoop, func()) {
	e := New(Options{Node: f, Now: clock.Now, TTL: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Sweep: -1})
	e.work = func(ctx context.Context, c runner.Context) runner.Result {
		if started != nil {
			started <- struct{}{}
		}
		if hold != nil {
			<-hold
		}
		now := clock.Now()
		return runner.Result{OK: true, ExitCode: 0, Start: now, Started: now, End: now}
	}
	j := newJobLoop(e, f.view.Job.Name)
	j.baseline = clock.Now().Add(-time.Hour)
	j.slot = e.sched.NewSlot(context.Background(), j.reconcile)
	e.sched.Add(j.slot) // not run: the test reconciles, and sees what woke the job (poked)
	poked(j)
	return j, e.runs.Wait
}

// poked reports whether j was woken (its scheduler slot made due) since
// the last call.
func poked(j *jobLoop) bool {
	now := j.e.opts.Now()
	return j.e.sched.Postpone(j.slot, now, now.Add(24*time.Hour))
}

var noon = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// The reconcile's decisions over the fake, with an injected clock: no
// etcd, no sleeps.
func TestReconcileOnFake(t *testing.T) {
	t.Parallel()
	const every10 = "jobs:\n  - name: j\n    cron: \"@every 10s\"\n    shardingTotalCount: 2\n    failover: true\n    script: \"true\"\n"
	at := func(s float64) time.Time { return noon.Add(time.Duration(s * float64(time.Second))) }
	done := func(fire float64) keyspace.ItemState {
		return keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: at(fire), Sched: at(fire), State: keyspace.StateDone, Attempt: 1, End: at(fire + 1)}}
	}
	tests := []struct {
		name  string
		owned map[string][]int
		items map[int]keyspace.ItemState
		now   float64
		up    bool
		want  []string
	}{
		{"due fires of owned items are claimed on time", map[string][]int{"a": {0, 1}},
			map[int]keyspace.ItemState{0: done(0), 1: done(0)}, 10.05, true, []string{"0 12:00:10 1 NORMAL", "1 12:00:10 1 NORMAL"}},
		{"only owned items", map[string][]int{"a": {1}, "b": {0}},
			map[int]keyspace.ItemState{0: done(0), 1: done(0)}, 10.05, true, []string{"1 12:00:10 1 NORMAL"}},
		{"a cut run fails over at once, between fires", map[string][]int{"a": {0, 1}},
			map[int]keyspace.ItemState{0: {Record: &keyspace.ItemRecord{Fire: at(10), Sched: at(10), State: keyspace.StateRunning, Attempt: 1}}, 1: done(10)}, 13, true,
			[]string{"0 12:00:10 2 FAILOVER"}},
		{"a fire missed while the owner was dead runs late", map[string][]int{"a": {0, 1}},
			map[int]keyspace.ItemState{0: done(0), 1: done(10)}, 13, true, []string{"0 12:00:10 1 NORMAL"}},
		{"nothing without a session", map[string][]int{"a": {0, 1}},
			map[int]keyspace.ItemState{0: done(0), 1: done(0)}, 10.05, false, nil},
		{"the next fire is claimed ahead, within the lead", map[string][]int{"a": {0, 1}},
			map[int]keyspace.ItemState{0: done(0), 1: done(0)}, 9.98, true, []string{"0 12:00:10 1 NORMAL", "1 12:00:10 1 NORMAL"}},
		{"not beyond the lead (of two runs: about 100 ms before any is measured)", map[string][]int{"a": {0, 1}},
			map[int]keyspace.ItemState{0: done(0), 1: done(0)}, 9.8, true, nil},
		{"not a fire that would coalesce others: it waits for its time", map[string][]int{"a": {0}},
			map[int]keyspace.ItemState{0: {Record: &keyspace.ItemRecord{Fire: at(0), Sched: at(0), State: keyspace.StateDone, Attempt: 1, End: at(10.5)}}}, 9.98, true, nil},
		{"an item running elsewhere waits", map[string][]int{"a": {0, 1}},
			map[int]keyspace.ItemState{0: {Record: &keyspace.ItemRecord{Fire: at(0), Sched: at(0), State: keyspace.StateRunning, Attempt: 1}, RunningBy: "b"}, 1: done(10)}, 10.05, true, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeNode(t, every10, tc.owned)
			for i, st := range tc.items {
				f.set(i, st)
			}
			f.up = tc.up
			clock := &fakeClock{now: at(tc.now)}
			j, wait := loopOn(f, clock, nil)
			j.reconcile(context.Background())
			wait()
			if got := f.claimed(); !slices.Equal(got, tc.want) {
				t.Errorf("claims %q, want %q", got, tc.want)
			}
		})
	}
}

// A run of a failover: false job cut by a failure is recorded as such
// (KILLED, reason lost), not run again; the fire after it runs.
func TestReconcileSettlesACutRunWithoutFailover(t *testing.T) {
	t.Parallel()
	f := newFakeNode(t, "jobs:\n  - name: j\n    cron: \"@every 10s\"\n    failover: false\n    script: \"true\"\n", map[string][]int{"a": {0}})
	f.set(0, keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: noon, Sched: noon, State: keyspace.StateRunning, Attempt: 1}})
	clock := &fakeClock{now: noon.Add(10*time.Second + 50*time.Millisecond)}
	j, wait := loopOn(f, clock, nil)
	j.reconcile(context.Background())
	wait()
	if got := f.claimed(); len(got) != 0 {
		t.Fatalf("claims: %q; the cut run must be recorded first", got)
	}
	if r := f.items[0].Record; r.State != keyspace.StateKilled || r.Reason != keyspace.ReasonLost || !r.Fire.Equal(noon) {
		t.Fatalf("record after the reconcile: %+v", r)
	}
	j.reconcile(context.Background())
	wait()
	if got := f.claimed(); !slices.Equal(got, []string{"0 12:00:10 1 NORMAL"}) {
		t.Fatalf("claims: %q", got)
	}
}

// A fire that came while the instance had no session runs as soon as the
// session is back, although nothing about the map changed.
func TestReconcileCatchesUpAfterTheSessionReturns(t *testing.T) {
	t.Parallel()
	f := newFakeNode(t, "jobs:\n  - name: j\n    cron: \"@every 10s\"\n    script: \"true\"\n", map[string][]int{"a": {0}})
	f.set(0, keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: noon, Sched: noon, State: keyspace.StateDone, Attempt: 1, End: noon.Add(time.Second)}})
	clock := &fakeClock{now: noon.Add(10 * time.Second)}
	j, wait := loopOn(f, clock, nil)
	f.up = false
	j.reconcile(context.Background())
	wait()
	if got := f.claimed(); len(got) != 0 {
		t.Fatalf("claims without a session: %q", got)
	}
	clock.set(noon.Add(13 * time.Second))
	f.up = true
	j.reconcile(context.Background())
	wait()
	if got := f.claimed(); !slices.Equal(got, []string{"0 12:00:10 1 NORMAL"}) {
		t.Fatalf("claims after the session returned: %q", got)
	}
}

// A lost claim is decided again on the next reconcile with what etcd says
// then; a claim of this session whose run this process knows is never
// adopted, and one it does not know is.
func TestReconcileLostClaimAndAdoption(t *testing.T) {
	t.Parallel()
	f := newFakeNode(t, "jobs:\n  - name: j\n    cron: \"@every 10s\"\n    script: \"true\"\n", map[string][]int{"a": {0}})
	f.set(0, keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: noon, Sched: noon, State: keyspace.StateDone, Attempt: 1, End: noon.Add(time.Second)}})
	lost := 1
	f.claimErr = func(coord.Claim) error {
		if lost > 0 {
			lost--
			return coord.ErrClaimLost
		}
		return nil
	}
	clock := &fakeClock{now: noon.Add(10 * time.Second)}
	hold := make(chan struct{})
	j, wait := loopOn(f, clock, hold)
	j.reconcile(context.Background())
	wait() // the lost claim
	j.reconcile(context.Background())
	// The run is in progress (held): its RUNNING record and marker are
	// this session's; a reconcile now must not adopt it.
	j.reconcile(context.Background())
	close(hold)
	wait()
	if got := f.claimed(); !slices.Equal(got, []string{"0 12:00:10 1 NORMAL", "0 12:00:10 1 NORMAL"}) {
		t.Fatalf("claims: %q (want the lost one and its retry)", got)
	}
	f.mu.Lock()
	outcomes := len(f.outcomes)
	f.mu.Unlock()
	if outcomes != 1 {
		t.Fatalf("%d outcomes recorded, want 1: the run must not have been adopted a second time", outcomes)
	}
	// A claim of this session that applied after its reply was lost.
	f.set(0, keyspace.ItemState{Record: &keyspace.ItemRecord{Item: 0, Fire: noon.Add(20 * time.Second), Sched: noon.Add(20 * time.Second), State: keyspace.StateRunning, Attempt: 1, Instance: "a"},
		RunningBy: "a", RunningMine: true})
	clock.set(noon.Add(21 * time.Second))
	j.reconcile(context.Background())
	wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.outcomes) != 2 || f.items[0].Record.State != keyspace.StateDone || f.items[0].RunningBy != "" {
		t.Fatalf("the late-applied claim was not adopted and run: %d outcomes, item %+v", len(f.outcomes), f.items[0])
	}
}

// With maxConcurrency 1, one of two due items runs; the other is decided
// again, with what is true then, when the slot is given back.
func TestReconcileTakesSlotsWhenItDecides(t *testing.T) {
	t.Parallel()
	f := newFakeNode(t, "jobs:\n  - name: j\n    cron: \"@every 10s\"\n    shardingTotalCount: 2\n    maxConcurrency: 1\n    script: \"true\"\n", map[string][]int{"a": {0, 1}})
	for i := range 2 {
		f.set(i, keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: noon, Sched: noon, State: keyspace.StateDone, Attempt: 1, End: noon.Add(time.Second)}})
	}
	clock := &fakeClock{now: noon.Add(10 * time.Second)}
	hold, started := make(chan struct{}), make(chan struct{}, 2)
	j, wait := loopWith(f, clock, hold, started)
	j.reconcile(context.Background())
	<-started
	if got := f.claimed(); len(got) != 1 {
		t.Fatalf("claims with one slot: %q", got)
	}
	clock.set(noon.Add(20500 * time.Millisecond)) // the next fire came meanwhile
	close(hold)
	wait()
	if !poked(j) { // the slot given back woke the job
		t.Fatal("the job waiting for a slot was not woken")
	}
	j.reconcile(context.Background())
	wait()
	got := f.claimed()
	if len(got) != 2 || !slices.Contains(got, fmt.Sprintf("%d 12:00:20 1 MISFIRE", 1-f.claims[0].Item)) {
		t.Fatalf("claims: %q (the second item runs its latest fire, decided afresh)", got)
	}
}

// A manual trigger for an item busy for minutes runs when the item is
// free; it is not forgotten, and once served it is deleted.
func TestReconcileKeepsATriggerWhileTheItemIsBusy(t *testing.T) {
	t.Parallel()
	f := newFakeNode(t, "jobs:\n  - name: j\n    cron: \"@every 1h\"\n    script: \"true\"\n", map[string][]int{"a": {0}})
	f.set(0, keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: noon, Sched: noon, State: keyspace.StateDone, Attempt: 1, End: noon.Add(time.Second)}})
	clock := &fakeClock{now: noon.Add(10 * time.Second)}
	j, wait := loopOn(f, clock, nil)
	j.runs.running[0] = true // a run of the item is in progress here
	f.putTrigger(keyspace.Trigger{ID: "t1"})
	j.reconcile(context.Background())
	clock.set(noon.Add(3 * time.Minute)) // still busy, well past the trigger's minute
	j.reconcile(context.Background())
	wait()
	if got := f.claimed(); len(got) != 0 {
		t.Fatalf("claims while the item is busy: %q", got)
	}
	delete(j.runs.running, 0)
	j.reconcile(context.Background())
	wait()
	if got := f.claimed(); !slices.Equal(got, []string{"0 12:03:00 1 MANUAL"}) {
		t.Fatalf("claims once the item is free: %q (the trigger must still be served)", got)
	}
	j.reconcile(context.Background())
	wait()
	if got := f.claimed(); len(got) != 1 || len(f.triggers) != 0 || len(j.pendingTriggers()) != 0 {
		t.Fatalf("the trigger ran again or stayed pending: claims %q, in etcd %d, in the loop %d", got, len(f.triggers), len(j.pendingTriggers()))
	}
}

// A run claimed ahead carries its fire as its start time; one claimed at
// or after its fire starts at once.
func TestClaimAheadStartsAtTheFire(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		now  time.Duration
		want time.Time
	}{{10*time.Second - 20*time.Millisecond, noon.Add(10 * time.Second)}, {10*time.Second + 20*time.Millisecond, time.Time{}}} {
		f := newFakeNode(t, "jobs:\n  - name: j\n    cron: \"@every 10s\"\n    script: \"true\"\n", map[string][]int{"a": {0}})
		f.set(0, keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: noon, Sched: noon, State: keyspace.StateDone, Attempt: 1, End: noon.Add(time.Second)}})
		clock := &fakeClock{now: noon.Add(tc.now)}
		j, wait := loopOn(f, clock, nil)
		var got []time.Time
		var mu sync.Mutex
		work := j.e.work
		j.e.work = func(ctx context.Context, c runner.Context) runner.Result {
			mu.Lock()
			got = append(got, c.StartAt)
			mu.Unlock()
			return work(ctx, c)
		}
		j.reconcile(context.Background())
		wait()
		if len(got) != 1 || !got[0].Equal(tc.want) {
			t.Errorf("at fire%+v: StartAt %v, want %v", tc.now-10*time.Second, got, tc.want)
		}
	}
}
