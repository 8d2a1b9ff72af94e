package engine

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/schedule"
	"github.com/shardd/shardd/pkg/shard"
	"github.com/shardd/shardd/pkg/steps"
)

// jobLoop is one job's reconcile, run by the engine's scheduler, and the
// local state it keeps: which items run in this process, the job's
// triggers as etcd has them, the job's concurrency limit and runner. It is
// plain data: no goroutine of its own while idle.
type jobLoop struct {
	e    *Engine
	name string
	log  *slog.Logger
	slot *steps.Slot // its place in the scheduler (the scheduler's to change)
	// baseline is when this loop started: the watermark of items never
	// claimed (see policy.baseline); seen when each item was first in a
	// map this loop read, for items added later (a larger
	// shardingTotalCount, another instance under BROADCAST).
	baseline time.Time
	seen     map[int]time.Time
	runners  runnerCache

	// runs is the job's runs in this process; it outlives the loop, so
	// that a job removed and added back while an item runs knows the run.
	runs *localRuns

	mu       sync.Mutex
	triggers triggerSet // the job's trigger keys (triggers.go)
	sem      semaphore  // the job's maxConcurrency; replaced when it changes
	semCap   int
	clockErr string // the last clock refusal logged
	disabled bool   // the job was disabled at the last reconcile
	// mustRead makes the next reconcile read the items even if the job is
	// idle here: set by the safety net (sweep.go) and by a marker of this
	// session that no run here holds (ownMarker).
	mustRead atomic.Bool
	// noted is, per item, the Seq of the record last noted in its fire's
	// barrier (deps.go).
	noted map[int]int64
	// waitKeys are the items this loop put a waiting key for
	// (clusterConcurrency) that it has not seen gone: its reconciles read
	// the slots, and look after those keys, even when it has no run to
	// start (dropStaleWaiting). slotsRead: the loop has read them once,
	// which looks after the keys a loop this one replaced (a reload) put.
	// Only the reconcile uses them.
	waitKeys  map[int]bool
	slotsRead bool
}

// localRuns are the runs of one job's items in this process, from the
// decision to run through the recording of the outcome.
type localRuns struct {
	mu      sync.Mutex
	running map[int]bool
	ended   map[int]uint64 // per item, runs that have ended, ever
	// handles are the runs an operator's kill can stop, by item; kills
	// those that came before their run registered (kill.go).
	handles map[int]runHandle
	kills   []pendingKill
}

func (l *localRuns) snapshot(item int) (running bool, ended uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.running[item], l.ended[item]
}

func (l *localRuns) busy() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.running) > 0
}

func newJobLoop(e *Engine, name string) *jobLoop {
	return &jobLoop{e: e, name: name, log: e.log.With("job", name),
		baseline: e.opts.Now(), seen: map[int]time.Time{}, noted: map[int]int64{}, runs: e.localRuns(name)}
}

// poke makes the job reconcile at once (after the one in progress, if
// any); it never blocks.
func (j *jobLoop) poke() { j.e.sched.WakeAt(j.slot, time.Time{}) }

// pokeAfter makes the job's current loop reconcile within d (see
// wakeCurrent).
func (j *jobLoop) pokeAfter(d time.Duration) { j.wakeCurrent(j.e.opts.Now().Add(d), false) }

// readAfter makes the job's current loop read its items within d, even if
// the job is idle here: a claim whose outcome is unknown may have applied,
// its marker's event filtered out while the claim was pending (ownMarker),
// and the item may have moved away meanwhile.
func (j *jobLoop) readAfter(d time.Duration) { j.wakeCurrent(j.e.opts.Now().Add(d), true) }

// wakeCurrent makes the job's current loop reconcile at t (zero: at once),
// reading its items even if idle when mustRead. A run outlives the loop
// that started it (a reload removes the job and adds it back: a new loop),
// and what happens to the run (its end, a claim lost) must wake the loop
// that decides now: the new loop, woken by the run's marker deletion while
// the run still counted as running here, decided nothing and waits for
// this.
func (j *jobLoop) wakeCurrent(t time.Time, mustRead bool) {
	e := j.e
	e.mu.Lock()
	cur := e.jobs[j.name]
	e.mu.Unlock()
	if cur == nil {
		return
	}
	if mustRead {
		cur.mustRead.Store(true)
	}
	e.sched.WakeAt(cur.slot, t)
}

// ownMarker wakes the job for a running marker of item put under this
// instance's session that no run here holds: a claim whose reply was lost
// (or came late), to adopt (doc.go). The marker of a run here wakes
// nothing: its claim's reply says what it needs to.
func (j *jobLoop) ownMarker(item int) {
	if running, _ := j.runs.snapshot(item); item < 0 || !running { // -1: such puts may have been lost
		j.mustRead.Store(true)
		j.poke()
	}
}

// follow subscribes the job to what wakes it (see OnChange), to its
// triggers and to operators' kills; the returned stop ends them.
func (j *jobLoop) follow() (stop func()) {
	node := j.e.opts.Node
	stopChanges := node.OnChange(j.name, j.poke, j.ownMarker)
	stopTriggers := j.followTriggers()
	stopKills := node.OnKill(j.name, j.onKill)
	return func() {
		stopChanges()
		stopTriggers()
		stopKills()
	}
}

// start is one run the reconcile decided on.
type start struct {
	item  int
	st    keyspace.ItemState
	a     action
	slots []semaphore // taken for the run; execute gives them back
	read  time.Time   // when the reconcile that decided on it read the items
	due   int         // the runs due here at the job's next fire, as filed then
	// claimed is the claim's result when launch made it with others'.
	claimed *coord.ClaimResult
}

// reconcile reads the job's items, decides for each, starts the runs and
// records the skips it decided on, and returns when it wants to look again
// if nothing wakes it before.
func (j *jobLoop) reconcile(ctx context.Context) time.Time {
	e := j.e
	now := e.opts.Now()
	next := steps.Never // what else wakes it: doc.go, "What wakes a job"
	v, ok := e.opts.Node.View(j.name)
	if !ok {
		e.due.forget(j)
		return next
	}
	if _, up := e.opts.Node.Session(); !up {
		e.due.forget(j)
		return next // a new session wakes every job
	}
	if !j.runnable(ctx, v) {
		e.due.forget(j)
		return next
	}
	if !j.clockAllows(v.Job) {
		e.due.forget(j)
		return now.Add(clockRetry)
	}
	r := &pass{v: v, now: now}
	r.ahead, r.next, r.due = j.claimAhead(v, now, next)
	r.total = v.Job.ShardingTotalCount
	if v.Map.Total > 0 {
		r.total = v.Map.Total // BROADCAST: one item per instance
	}
	// A run that ends while the items are read leaves a stale RUNNING
	// record and marker of this session in the read: such a state must not
	// be adopted (coord.Adopt checks again; this saves it the read).
	r.before = make([]runSnapshot, r.total)
	for item := range r.total {
		r.before[item].running, r.before[item].ended = j.runs.snapshot(item)
	}
	mustRead := j.mustRead.Swap(false)
	r.mustRead = mustRead
	if !mustRead && j.idle(v) {
		return r.next
	}
	if !j.read(ctx, r) {
		if mustRead {
			j.mustRead.Store(true) // the retry reads too, idle or not
		}
		return now.Add(500 * time.Millisecond)
	}
	r.policy = policyOf(v.Job, e.window(), j.baseline)
	r.notes = j.notesOutcomes(v)
	r.own = j.ownership(ctx, v)
	for item := range r.total {
		j.decideItem(ctx, r, item)
	}
	j.takeClusterSlots(ctx, r)
	j.takeSlots(r)
	j.launch(ctx, v, r.starts)                        // runs first: the records below may take a while
	j.deleteServed(ctx, r.triggers, r.total, r.items) // as read: the claims just made count at the next look
	j.record(ctx, r)
	return r.next
}

// pass is one reconcile: the view it acts on, the job's items and triggers
// as it read them, what it decided, and when the loop looks again.
type pass struct {
	v     coord.JobView
	total int       // the job's items
	now   time.Time // when the items were read (the start, until then)
	// readAt is the real time of the read: the lead of claims ahead is
	// measured against the runner's.
	readAt time.Time
	ahead  time.Time     // the next fire, when it is claimed ahead
	due    int           // the runs due here at the next fire (claimAhead)
	next   time.Time     // when the loop looks again
	before []runSnapshot // per item, its runs here before the read

	items    keyspace.JobItems
	triggers []keyspace.Trigger
	loaded   bool // the triggers are complete as of a revision: they are served

	policy policy
	notes  func(item int, rec *keyspace.ItemRecord) bool // see notesOutcomes
	own    func(item int, fire time.Time, source string) (bool, time.Time)
	kills  map[keyspace.KillKey]keyspace.KillBy // read when a cut run is to run again

	// mustRead: this reconcile was asked to read even if idle (the
	// safety net's sweep, a marker of this session no run holds).
	mustRead bool

	starts []start // the runs decided on
	skips  []start // the records of skips, settles and kills decided on
	fresh  []int   // the items whose records begin
}

// runSnapshot is what this process knew of an item's runs at a moment.
type runSnapshot struct {
	running bool
	ended   uint64
}

// retrySoon makes the loop look again shortly: something failed, or must
// happen first.
func (r *pass) retrySoon() { r.next = earliest(r.next, r.now.Add(500*time.Millisecond)) }

// runnable reports whether the job's fires run in view v: it has a map and
// is not disabled. It logs when the job is disabled or enabled; a disabled
// job's fires do not run, its parents' and operators' included: its leader
// drops its triggers (one instance: no other needs to read them while the
// job is disabled).
func (j *jobLoop) runnable(ctx context.Context, v coord.JobView) bool {
	if v.Refusal != nil {
		// Its definition may not run here (a selector that does not match,
		// an applied definition this instance does not accept): nothing of
		// it runs, not even a listener, until a definition it may run;
		// its task leaves the job meanwhile.
		return false
	}
	job, m := v.Job, v.Map
	disabled := m != nil && m.Disabled || job.Disabled
	if disabled != j.disabled {
		j.disabled = disabled
		switch {
		case disabled && job.Disabled:
			j.log.Info("job is disabled by its definition (disabled: true): its fires are not run")
		case disabled:
			j.log.Info("job is disabled by an operator: its fires are not run until it is enabled")
		default:
			j.log.Info("job is enabled: its fires run again; fires missed while it was disabled count as missed (the latest runs if younger than the catch-up window)")
		}
	}
	if m == nil || disabled {
		if m != nil && v.Leading {
			if j.loadTriggers(ctx) {
				j.dropDisabled(ctx, v)
			} else {
				j.pokeAfter(500 * time.Millisecond) // the read failed: no event would wake it
			}
		}
		return false
	}
	return true
}

// clockAllows reports whether this host's clock lets job fire; a refusal
// is logged once, until the next other one.
func (j *jobLoop) clockAllows(job *config.Job) bool {
	if err := j.e.checkClock(job); err != nil {
		if msg := err.Error(); msg != j.clockErr {
			j.clockErr = msg
			j.log.Error("refusing to fire", "err", err)
		}
		return false
	}
	j.clockErr = ""
	return true
}

// claimAhead returns the job's next fire if it is claimed ahead, next
// moved to when the loop must wake for it, and the runs due here at that
// fire (this job's and others'). The next fire is claimed a lead time
// ahead, and its work prepared, so that it starts on time
// (docs/performance.md): the loop wakes at fire - lead, and at the fire for
// what it could not claim ahead. The lead grows with the runs due here at
// the same fire (readyLatency).
func (j *jobLoop) claimAhead(v coord.JobView, now, next time.Time) (ahead, wake time.Time, due int) {
	wake = next
	if v.Job.Schedule == nil {
		j.e.due.forget(j)
		return ahead, wake, 0
	}
	f := v.Job.Schedule.Next(now)
	if f.IsZero() {
		j.e.due.forget(j)
		return ahead, wake, 0
	}
	due, others := j.e.due.file(j, f, len(v.Map.ItemsOf(j.e.opts.Node.ID())))
	lead := j.e.lead(due)
	for _, l := range others {
		// Their lead was chosen for fewer runs: they wake earlier (a
		// reconcile then, not now).
		j.e.sched.WakeAt(l.slot, f.Add(-lead))
	}
	if f.Sub(now) <= lead {
		ahead, wake = f, earliest(wake, f)
	} else {
		wake = earliest(wake, f.Add(-lead))
	}
	return ahead, wake, due
}

// idle reports whether this instance owns none of the job's items in v
// and runs none: it has nothing to decide at a fire, nor a trigger to
// serve (the items' owners serve them, from etcd), so it does not read
// them. A claim of its own that applied late, after the item moved away,
// is adopted when its marker's event wakes the job (OnChange). With
// thousands of jobs on every instance, reading every job at every fire on
// every instance is most of etcd's load.
func (j *jobLoop) idle(v coord.JobView) bool {
	return !v.Map.PerFire && !v.Job.Shard.Runtime() && len(v.Map.ItemsOf(j.e.opts.Node.ID())) == 0 && !j.runs.busy() &&
		(v.Job.ClusterConcurrency == 0 || j.slotsRead && len(j.waitKeys) == 0)
}

// read reads the job's items into r, and its triggers. Triggers are served
// from a set complete as of a revision: the record of an item keeps only
// the newest it served, so serving one while an older one is unknown here
// would skip that one.
func (j *jobLoop) read(ctx context.Context, r *pass) bool {
	r.readAt = time.Now() // real time: the lead is measured against the runner's
	items, err := j.e.opts.Node.ReadItems(ctx, j.name)
	if err != nil {
		if ctx.Err() == nil {
			j.log.Warn("read item states; trying again", "err", err)
		}
		return false
	}
	r.items, r.now = items, j.e.opts.Now()
	if r.loaded = j.loadTriggers(ctx); r.loaded {
		r.triggers = j.pendingTriggers()
	} else {
		r.retrySoon()
	}
	return true
}

// notesOutcomes returns whether this instance notes an item's record rec
// in its fire's barrier (deps.go) before deciding on the item: a parent
// job's outcomes are noted by the instance that wrote them, else by the
// item's owner: the map's, or for per-fire strategies and runtime routes,
// any member (each may own the next).
func (j *jobLoop) notesOutcomes(v coord.JobView) func(item int, rec *keyspace.ItemRecord) bool {
	if !keepsBarriers(v) {
		return func(int, *keyspace.ItemRecord) bool { return false }
	}
	me := j.e.opts.Node.ID()
	anyOwner := v.Map.PerFire || v.Job.Shard.Runtime()
	mine := v.Map.ItemsOf(me)
	return func(item int, rec *keyspace.ItemRecord) bool {
		return rec != nil && (rec.Instance == me || anyOwner || slices.Contains(mine, item))
	}
}

// baselineOf is the watermark of item if it was never claimed: this loop's
// start, or when the item was first in a map this loop read.
func (j *jobLoop) baselineOf(item int, now time.Time) time.Time {
	if _, ok := j.seen[item]; !ok {
		j.seen[item] = now
	}
	if s := j.seen[item]; s.After(j.baseline) {
		return s
	}
	return j.baseline
}

// decideItem decides what to do of item as r read it, and files the
// decision among r's starts, skips or fresh records.
func (j *jobLoop) decideItem(ctx context.Context, r *pass, item int) {
	st := r.items.Items[item]
	p := r.policy.forItem(item)
	p.baseline = j.baselineOf(item, r.now)
	local, ended := j.runs.snapshot(item)
	stale := r.before[item].running || ended != r.before[item].ended
	if !stale && r.notes(item, st.Record) && !j.noteOutcome(ctx, r.v, item, st) {
		r.retrySoon()
		return // the record is not replaced before it is noted
	}
	a := decide(st, local, p, r.now)
	if a.kind == adopt && stale {
		j.pokeAfter(100 * time.Millisecond) // read again first
		return
	}
	if a.kind == none && !a.fire.IsZero() {
		r.next = earliest(r.next, a.fire) // a fixed delay's next fire
		a = action{}
	}
	if a.kind == none && !local && !st.Disabled && st.RunningBy == "" && r.loaded {
		a = manual(r.triggers, item, st, r.now, j.baseline)
	}
	if a.kind == none && !local && !st.Disabled && st.RunningBy == "" && !r.ahead.IsZero() {
		// Nothing due now: claim the next fire ahead if, as of that
		// fire, it would simply run (on time, nothing coalesced).
		if b := decide(st, local, p, r.ahead); b.kind == run && b.fire.Equal(r.ahead) && b.source == keyspace.SourceNormal && b.skipped == 0 && b.attempt == 1 {
			a, a.startAt = b, r.ahead
		}
	}
	if a.kind == none {
		return
	}
	if a.rerun(st.Record) {
		// A run cut by a failure is not run again when an operator
		// killed it: its kill may not have reached its instance.
		k, found, ok := j.killRequest(ctx, r, item, st)
		if !ok {
			return
		}
		if found {
			a = action{kind: killed, fire: st.Record.Fire, kill: k}
		}
	}
	if (a.kind == run || a.kind == adopt) && a.startAt.IsZero() && !keyspace.OffSchedule(a.source) && a.fire.After(r.now) {
		// A fire claimed ahead before (a claim whose reply was lost, or
		// one that never started) runs again or is adopted: not before
		// its time either.
		a.startAt = a.fire
	}
	if !j.mayAct(r, item, a) {
		return
	}
	if !j.jitter(r, item, &a) {
		return
	}
	if a.kind != begin && a.kind != replace && !j.noteOutcome(ctx, r.v, item, st) {
		r.retrySoon()
		return // the record is not replaced before it is noted
	}
	switch a.kind {
	case skip, settle, killed, replace:
		r.skips = append(r.skips, start{item: item, st: st, a: a})
	case begin:
		r.fresh = append(r.fresh, item)
	default:
		r.starts = append(r.starts, start{item: item, st: st, a: a, read: r.readAt, due: r.due})
	}
}

// jitter applies the job's jitter to a, a run of a scheduled fire: its
// work starts at fire + schedule.JitterOffset, and it is claimed a lead
// before then, not at the fire (a claim held for the whole offset would
// hold the item, and a prepared process, for up to an hour). It reports
// whether a is to be acted on now; if not, the loop wakes for it. A
// failover re-run starts at once: its offset has passed.
func (j *jobLoop) jitter(r *pass, item int, a *action) bool {
	d := time.Duration(r.v.Job.Jitter)
	if d <= 0 || a.kind != run || (a.source != keyspace.SourceNormal && a.source != keyspace.SourceMisfire) {
		return true
	}
	at := a.fire.Add(schedule.JitterOffset(j.name, item, a.fire, d))
	if !at.After(r.now) {
		return true
	}
	if lead := j.e.lead(1); at.Sub(r.now) > lead {
		r.next = earliest(r.next, at.Add(-lead))
		return false
	}
	a.startAt = at
	return true
}

// killRequest returns who killed the run that st records, when an
// operator's kill request of it is still in etcd. ok is false when the
// requests could not be read: the loop decides again soon. They are read
// once per pass, when the first cut run is to run again.
func (j *jobLoop) killRequest(ctx context.Context, r *pass, item int, st keyspace.ItemState) (k keyspace.KillBy, found, ok bool) {
	if r.kills == nil {
		kills, err := j.e.opts.Node.Kills(ctx, j.name)
		if err != nil {
			j.log.Warn("read kill requests; deciding again", "err", err)
			r.retrySoon()
			return keyspace.KillBy{}, false, false
		}
		r.kills = kills
	}
	k, found = r.kills[keyspace.KillKey{Item: item, Fence: keyspace.RunFence(st.Record, st.Rev)}]
	return k, found, true
}

// mayAct reports whether this instance acts on a for item now. A claim
// already held (adopt) is run whoever owns the item now; anything else
// needs the item's owner for a's fire. A runtime route's turn applies to
// runs (records are written by whoever comes first): the loop looks again
// at a turn to come.
func (j *jobLoop) mayAct(r *pass, item int, a action) bool {
	if a.kind == adopt {
		return true
	}
	mine, at := r.own(item, a.fire, a.source)
	if !mine {
		return false
	}
	if at.After(r.now) && a.kind == run && (a.startAt.IsZero() || at.After(a.fire)) {
		r.next = earliest(r.next, at)
		return false
	}
	return true
}

// clusterLimited reports whether the job's definition caps its runs
// cluster-wide (clusterConcurrency).
func (j *jobLoop) clusterLimited() bool {
	v, ok := j.e.opts.Node.View(j.name)
	return ok && v.Job != nil && v.Job.ClusterConcurrency > 0
}

// takeClusterSlots gives the runs r decided on the job's free cluster
// slots (clusterConcurrency), read from etcd now, the items that waited
// longest first, counting those waiting on other instances: the runs left
// without one are dropped from r, and their items recorded waiting. The
// claim's guard is what holds the limit (two instances may pick the same
// free slot: one claim wins); this only chooses.
func (j *jobLoop) takeClusterSlots(ctx context.Context, r *pass) {
	limit := r.v.Job.ClusterConcurrency
	if limit <= 0 || len(r.starts) == 0 && len(j.waitKeys) == 0 && j.slotsRead && !r.mustRead {
		return
	}
	cs, err := j.e.opts.Node.ReadClusterSlots(ctx, j.name)
	if err != nil {
		j.log.Warn("read the cluster slots; deciding again", "err", err)
		r.starts = nil
		r.retrySoon()
		return
	}
	j.slotsRead = true
	j.dropStaleWaiting(ctx, r, cs)
	granted, waiting := assignClusterSlots(r.starts, limit, cs)
	r.starts = granted
	me := j.e.opts.Node.ID()
	for _, s := range waiting {
		since := s.a.waitingSince()
		if at, ok := cs.Waiting[s.item]; ok && at.Equal(since) && cs.WaitingKeys[s.item].Instance == me {
			continue // put already
		}
		if err := j.e.opts.Node.Wait(ctx, j.name, s.item, since); err != nil {
			j.log.Warn("record an item waiting for a cluster slot", "item", s.item, "err", err)
			r.retrySoon()
		}
		if j.waitKeys == nil {
			j.waitKeys = map[int]bool{}
		}
		j.waitKeys[s.item] = true
	}
	if len(waiting) > 0 {
		j.log.Info("waiting for a cluster slot (clusterConcurrency)", "items", len(waiting), "limit", limit, "held", len(cs.Held))
	}
}

// dropStaleWaiting removes from cs, and deletes from etcd, the waiting keys
// that stand for no wait, which would otherwise keep a slot for an item
// that will not take it for as long as their putter's session lives:
//   - an item no longer in the job (fewer items, a BROADCAST index gone);
//   - a key this instance put for an item it does not wait for now (it
//     ran, its fires were skipped, it moved to another instance);
//   - a key of an instance that is not in the job's map (the job left it:
//     a reload, a selector that no longer matches).
//
// A key another instance of the map put is its own to keep or delete:
// this instance cannot tell what it waits for (a trigger, an upstream
// fire). Each delete is guarded by the key's revision as read: a key put
// again since stays.
func (j *jobLoop) dropStaleWaiting(ctx context.Context, r *pass, cs coord.ClusterSlots) {
	me := j.e.opts.Node.ID()
	for item, key := range cs.WaitingKeys {
		switch {
		case item >= r.total:
		case key.Instance == me:
			if slices.ContainsFunc(r.starts, func(s start) bool { return s.item == item }) {
				continue // it waits, or its run takes a slot now
			}
		case slices.Contains(r.v.Map.Instances, key.Instance):
			continue
		}
		delete(cs.Waiting, item)
		if err := j.e.opts.Node.Unwait(ctx, j.name, item, key.Rev); err != nil {
			j.log.Warn("delete a stale waiting key; trying again", "item", item, "err", err)
			r.retrySoon()
			continue
		}
		delete(cs.WaitingKeys, item)
	}
	// The keys this instance put that are gone (a claim or a skip deleted
	// them, or the loop above) are no longer its to look after.
	for item := range j.waitKeys {
		if key, ok := cs.WaitingKeys[item]; !ok || key.Instance != me {
			delete(j.waitKeys, item)
		}
	}
}

// assignClusterSlots gives starts free slots of limit, given cs: in order
// of how long each has waited (waitingSince, then item), where an item
// waiting elsewhere (in cs.Waiting, not in starts) that waited longer goes
// first. An adoption keeps the slot its claim took.
func assignClusterSlots(starts []start, limit int, cs coord.ClusterSlots) (granted, waiting []start) {
	var free []int
	for k := range limit {
		if !cs.Held[k] {
			free = append(free, k)
		}
	}
	mine := map[int]bool{}
	for _, s := range starts {
		mine[s.item] = true
	}
	type queued struct {
		since time.Time
		item  int
	}
	before := func(a, b queued) bool { return a.since.Before(b.since) || a.since.Equal(b.since) && a.item < b.item }
	sorted := slices.Clone(starts)
	slices.SortStableFunc(sorted, func(x, y start) int {
		a, b := queued{x.a.waitingSince(), x.item}, queued{y.a.waitingSince(), y.item}
		switch {
		case before(a, b):
			return -1
		case before(b, a):
			return 1
		}
		return 0
	})
	used := 0
	for _, s := range sorted {
		if s.a.kind == adopt {
			granted = append(granted, s)
			continue
		}
		me := queued{s.a.waitingSince(), s.item}
		older := 0
		for item, since := range cs.Waiting {
			if !mine[item] && before(queued{since, item}, me) {
				older++
			}
		}
		if used+older < len(free) {
			s.a.slot = free[used] + 1
			used++
			granted = append(granted, s)
			continue
		}
		waiting = append(waiting, s)
	}
	return granted, waiting
}

// takeSlots gives the runs r decided on their concurrency slots, the
// oldest fires first, so that no item starves behind lower-numbered ones;
// the runs left without one are dropped from r, and decided again when a
// slot is free.
func (j *jobLoop) takeSlots(r *pass) {
	e := j.e
	starts := r.starts
	slices.SortStableFunc(starts, func(x, y start) int { return x.a.waitingSince().Compare(y.a.waitingSince()) })
	for i := range starts {
		slots := []semaphore{j.semaphore(r.v.Job.MaxConcurrency), e.global}
		if !tryAcquire(slots...) {
			// Ask to be woken by the next slot given back, then look once
			// more: one may have been given back in between.
			e.waitSlot(j)
			if !tryAcquire(slots...) {
				starts = starts[:i] // decided again when a slot is free
				break
			}
		}
		starts[i].slots = slots
	}
	r.starts = starts
}

// record writes the records r decided on: skips, settles and kills, and
// the records that begin.
func (j *jobLoop) record(ctx context.Context, r *pass) {
	for _, s := range r.skips {
		switch s.a.kind {
		case settle:
			j.settle(ctx, s.item, s.st)
		case killed:
			j.settleKilled(ctx, s.item, s.st, s.a.kill)
		case replace:
			j.replace(ctx, s.item, s.a)
		default:
			if j.skip(ctx, s.item, s.st, s.a) && r.policy.schedule != nil {
				// Fires after the skipped ones may be due already (a
				// queue's next, cut by its own offset): decide again soon,
				// not at the next fire, by when they may be too old.
				if n := r.policy.schedule.Next(s.a.fire); !n.IsZero() && !n.After(r.now) {
					r.retrySoon()
				}
			}
		}
	}
	if len(r.fresh) > 0 {
		if err := j.e.opts.Node.Begin(ctx, j.name, r.fresh, r.now, r.v.MapRev); err != nil {
			j.log.Warn("begin item records; trying again", "items", len(r.fresh), "err", err)
			r.retrySoon()
		}
	}
}

// settle records a run cut by a failure that failover: false leaves alone.
func (j *jobLoop) settle(ctx context.Context, item int, st keyspace.ItemState) {
	if err := j.e.opts.Node.Settle(ctx, j.name, item, st); err != nil {
		j.log.Warn("record a cut run; trying again", "item", item, "err", err)
		j.pokeAfter(200 * time.Millisecond)
		return
	}
	rec := st.Record
	j.log.Info(msgSettled, "item", item, "fire", rec.Fire.UTC(), "attempt", rec.Attempt, "ran_on", rec.Instance)
	if j.e.opts.OnSkipped != nil {
		j.e.opts.OnSkipped(j.name, 1) // a fire that will not run
	}
}

// msgSettled is the log message of a cut run not run again: the explicit
// record of the policy (the chaos suite reads it).
const msgSettled = "run cut by a failure; not run again (failover: false)"

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// manual returns the run of the oldest of triggers (oldest first) that
// item has not served, or none: triggers are served in the order they
// were made, one run each (each may carry its own parameter or fire), so
// none is lost. baseline is the watermark of an item never claimed.
func manual(triggers []keyspace.Trigger, item int, st keyspace.ItemState, now, baseline time.Time) action {
	var served int64
	sched := baseline
	if st.Record != nil {
		served, sched = st.Record.Trigger, st.Record.Watermark()
	}
	var tr *keyspace.Trigger
	for i := range triggers {
		if t := &triggers[i]; t.Rev > served && (len(t.Items) == 0 || slices.Contains(t.Items, item)) {
			tr = t
			break
		}
	}
	if tr == nil {
		return action{}
	}
	fire := now
	if !tr.Rerun.IsZero() {
		fire = tr.Rerun
	}
	a := action{kind: run, fire: fire, attempt: 1, source: keyspace.SourceManual, sched: sched, trigger: tr.Rev, triggerID: tr.ID, param: tr.Param, by: tr.By,
		fireKey: keyspace.ManualFireKey(*tr), upstream: tr.Upstream, noPropagate: tr.NoPropagate || len(tr.Items) > 0}
	if tr.Upstream != nil {
		a.source = keyspace.SourceUpstream
	}
	return a
}

// skip records fires as skipped by the misfire policy.
func (j *jobLoop) skip(ctx context.Context, item int, st keyspace.ItemState, a action) bool {
	e := j.e
	if err := e.opts.Node.Skip(ctx, coord.Skip{Job: j.name, Item: item, Fire: a.fire, Skipped: a.skipped, Excluded: a.excluded, Reason: a.why, Prev: st, Waited: j.clusterLimited()}); err != nil {
		j.log.Warn("record skipped fires; trying again", "item", item, "err", err)
		j.pokeAfter(200 * time.Millisecond)
		return false
	}
	j.log.Info(msgSkipped, "item", item, "skipped", a.skipped, "excluded", a.excluded, "through", a.fire.UTC(), "why", a.why)
	if e.opts.OnSkipped != nil {
		e.opts.OnSkipped(j.name, a.skipped)
	}
	return true
}

// msgSkipped is the log message of fires recorded as skipped by a policy
// (the chaos suite reads it).
const msgSkipped = "fires recorded skipped"

// ownership returns whether this instance may claim item for fire in the
// view v, and from when: the map's owner for sharding strategies, the
// fire's owner for per-fire ones, and every eligible instance in its turn
// for runtime routes.
func (j *jobLoop) ownership(ctx context.Context, v coord.JobView) func(item int, fire time.Time, source string) (bool, time.Time) {
	me := j.e.opts.Node.ID()
	m, job := v.Map, v.Job
	switch {
	case job.Shard.Runtime():
		if !slices.Contains(m.Instances, me) {
			return func(int, time.Time, string) (bool, time.Time) { return false, time.Time{} }
		}
		var rank = -1
		return func(_ int, fire time.Time, source string) (bool, time.Time) {
			if job.Strategy == shard.Busyover && j.busy() {
				return false, time.Time{} // busy: the next instance takes the fire
			}
			if keyspace.OffSchedule(source) {
				return true, fire
			}
			if rank < 0 {
				rank = j.rank(ctx, v)
			}
			return true, fire.Add(time.Duration(rank) * routeStep)
		}
	case m.PerFire:
		return func(item int, fire time.Time, source string) (bool, time.Time) {
			if keyspace.OffSchedule(source) {
				// Each instance would draw a manual fire's owner at its
				// own time; any member may claim it, the claim lets one run.
				return slices.Contains(m.Instances, me), fire
			}
			seq := int64(0)
			if job.Schedule != nil {
				seq = schedule.Seq(job.Schedule, fire)
			}
			a, err := job.Shard.Assign(shard.Input{Instances: m.Instances, Job: job.Name, Total: job.ShardingTotalCount, Fire: shard.Fire{Time: fire, Seq: seq}})
			if err != nil {
				return false, time.Time{}
			}
			return slices.Contains(a.ByInstance()[me], item), fire
		}
	default:
		mine := m.ItemsOf(me)
		return func(item int, fire time.Time, _ string) (bool, time.Time) { return slices.Contains(mine, item), fire }
	}
}

// rank is this instance's place in the runtime route's order.
func (j *jobLoop) rank(ctx context.Context, v coord.JobView) int {
	var history []keyspace.ItemRecord
	if r := v.Job.Strategy; r == shard.LFU || r == shard.LRU {
		h, err := j.e.opts.Node.History(ctx, v.Job.Name)
		if err != nil {
			j.log.Warn("read history for the route", "err", err)
		}
		history = h
	}
	return slices.Index(routeOrder(v.Job.Strategy, v.Map.Instances, history), j.e.opts.Node.ID())
}

// busy reports whether any item of the job runs here.
func (j *jobLoop) busy() bool { return j.runs.busy() }

// semaphore returns the job's concurrency semaphore for max (nil: none),
// replacing it when max changed. Runs holding the old one give back the old.
func (j *jobLoop) semaphore(max int) semaphore {
	j.mu.Lock()
	defer j.mu.Unlock()
	if max != j.semCap {
		j.sem, j.semCap = newSemaphore(max), max
	}
	return j.sem
}

// launch starts the runs decided on. Items run in their own goroutines; for
// a job with listeners, the items of one scheduled fire form a group:
// BEFORE runs before the first starts, AFTER when the last has ended.
func (j *jobLoop) launch(ctx context.Context, v coord.JobView, starts []start) {
	if len(starts) == 0 {
		return
	}
	j.runs.mu.Lock()
	for _, s := range starts {
		j.runs.running[s.item] = true
	}
	j.runs.mu.Unlock()
	e := j.e
	// The claims of several items go together: one Txn, one fence.
	var claims []coord.Claim
	var of []int
	for i, s := range starts {
		if s.a.kind != adopt {
			claims, of = append(claims, j.claimOf(v, s)), append(of, i)
		}
	}
	if len(claims) > 1 && ctx.Err() == nil {
		for k, r := range e.opts.Node.ClaimAll(ctx, claims) {
			starts[of[k]].claimed = &r
		}
	}
	one := func(s start) bool {
		ran := false
		defer func() {
			j.runs.mu.Lock()
			delete(j.runs.running, s.item)
			j.runs.ended[s.item]++
			j.runs.mu.Unlock()
			if ran {
				j.wakeCurrent(time.Time{}, false) // decide again: fires may have come meanwhile
			} // else execute asked for a later look: at once would spin on a claim that cannot be won
		}()
		ran = j.execute(ctx, v, s)
		return ran
	}
	ls := v.Job.Listeners
	groups := map[time.Time][]start{}
	for _, s := range starts {
		if ls == nil || s.a.source == keyspace.SourceFailover || keyspace.OffSchedule(s.a.source) || s.a.kind == adopt {
			e.runs.Add(1)
			go func() {
				defer e.runs.Done()
				one(s)
			}()
			continue
		}
		groups[s.a.fire] = append(groups[s.a.fire], s)
	}
	for fire, group := range groups {
		e.runs.Add(1)
		go func() {
			defer e.runs.Done()
			j.runGroup(v.Job, fire, group, one)
		}()
	}
}

// runGroup runs the items of one scheduled fire of a job with listeners,
// each with one: BEFORE runs before the first starts, AFTER when the last
// has ended, with the items that ran.
func (j *jobLoop) runGroup(job *config.Job, fire time.Time, group []start, one func(start) bool) {
	e, ls := j.e, job.Listeners
	items := make([]int, len(group))
	for i, s := range group {
		items[i] = s.item
	}
	e.listener(job, "BEFORE", ls.Before, fire, items)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var ran []int
	for _, s := range group {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if one(s) {
				mu.Lock()
				ran = append(ran, s.item)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(ran) > 0 {
		slices.Sort(ran)
		e.listener(job, "AFTER", ls.After, fire, ran)
	}
}
