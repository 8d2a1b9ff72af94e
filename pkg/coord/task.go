package coord

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/steps"
)

// jobTask is one job's coordination under one session, as plain data: its
// steps are run by the node's scheduler (pkg/steps), so that a job
// that waits (for a registration slot, for an older candidate to go, for
// its next reconcile as leader) holds no goroutine; with 10,000 jobs a
// goroutine per job was most of an idle instance's memory. Events of the
// instance's one watch (the hub) and the pacer wake it.
//
//	registering --pacer slot, registerJob ok--> candidate
//	registering --registerJob failed--> registering, after a backoff
//	candidate --put (or find) the election key, look: no older key, its own there--> leading
//	candidate --older keys--> candidate, woken when the last of them is deleted (then the look
//	    is the leader's first read too) or by a resync
//	candidate --its own key gone or changed (etcd #11051)--> candidate with a new key, after a backoff
//	leading --read, reconcile; next at the reconcile interval or when woken--> leading
//	leading --errNotLeader, errYield--> resign, candidate
//	candidate --Leave called (its member key's deletion wakes it)--> idle, its key withdrawn
//	registering --the registered definition may not run here (selector, AcceptPolicy)--> parked
//	candidate, leading --the definition changed and may no longer run here--> parked: resign or
//	    withdraw the key, delete the member key
//	parked --the definition changed (its view wakes the task)--> registering
//	any --removed (job left the config or changed, session ended)--> stopped: resign or
//	    withdraw the key, unsubscribe; a job that left the config deletes its member key
//
// Steps never overlap (the scheduler's rule), so the fields below the
// slot are the steps' own, and stop reads them after the last step.
type jobTask struct {
	n       *Node
	s       *session
	local   *config.Job
	applied bool     // local is an applied definition: never published, never recorded as loaded
	view    *JobView // the job's view when the task was made: it wakes the task
	slot    *steps.Slot
	removed atomic.Bool   // set before stop when the job left the config
	done    chan struct{} // closed when stop has finished

	phase      taskPhase
	parked     error  // why the job may not run here, while registering; nil otherwise
	ticket     ticket // the registration's place in the pacer's line
	b          backoff
	stopConfig func() // following the registered definition
	stopMap    func() // following the shard map (once registered)
	stopKids   func() // following the children index (with the config)
	unsub      []func()
	key        string // the election key, "" until put
	rev        int64  // its CreateRevision
	older      olderKeys
	e          *concurrency.Election
	l          *leader
	// pending is the state a full look read, for the first reconcile;
	// reread asks for a read after it (events may have been missed).
	pending *state
	reread  bool
	// pendingResyncs is the hub's resync count before pending was read;
	// changed says a leader subscription saw an event or a resync since it
	// was made.
	pendingResyncs int64
	changed        atomic.Bool
}

type taskPhase int

const (
	registering taskPhase = iota
	candidate
	leading
	idle // Leave was called: no new leadership
)

func (n *Node) newJobTask(s *session, local *config.Job, applied bool, view *JobView) *jobTask {
	t := &jobTask{n: n, s: s, local: local, applied: applied, view: view, done: make(chan struct{}), b: backoff{min: 100 * time.Millisecond, max: 2 * time.Second}}
	t.slot = n.steps.NewSlot(s.ctx, t.step)
	t.ticket.wake = t.wake
	return t
}

// wake makes the task step at once (after a step in progress).
func (t *jobTask) wake() { t.n.steps.WakeAt(t.slot, time.Time{}) }

// leaderSettle is how long a leader lets a change settle before it
// reconciles: the changes of a burst (members joining at a cold start, a
// member's key and its candidate key) make one read and at most one map
// write, not one each. A member's departure is not made to wait: its
// items have no owner until the new map.
const leaderSettle = 100 * time.Millisecond

// settle makes the task step leaderSettle from now, or earlier if it was
// to already: later changes of the burst do not push it back.
func (t *jobTask) settle() { t.n.steps.WakeAt(t.slot, time.Now().Add(leaderSettle)) }

// step does the task's next piece of work and says when to do the one
// after (steps.Never: when woken).
func (t *jobTask) step(ctx context.Context) time.Time {
	if ctx.Err() != nil {
		return steps.Never
	}
	if t.stopConfig == nil {
		// Follow the registered definition first, then register: every
		// change after the registration's read reaches the view, and wakes
		// the task.
		t.n.mu.Lock()
		if t.view != nil && t.n.views[t.local.Name] == t.view {
			t.view.task = t
		}
		t.n.mu.Unlock()
		t.stopConfig = t.n.followConfig(ctx, t.local.Name)
		t.stopKids = t.n.followChildren(ctx, t.local.Name) // the registration reads it too
	}
	if t.phase == candidate || t.phase == leading {
		if v, ok := t.n.View(t.local.Name); ok && v.Refusal != nil {
			t.park(v.Refusal)
			return steps.Never
		}
	}
	switch t.phase {
	case registering:
		return t.register(ctx)
	case candidate:
		return t.campaign(ctx)
	case leading:
		return t.lead(ctx)
	}
	return steps.Never
}

// register registers the job's definition and membership, in a slot of the
// pacer.
func (t *jobTask) register(ctx context.Context) time.Time {
	n := t.n
	if !n.registering.take(&t.ticket) {
		return steps.Never // the pacer wakes the task with a slot
	}
	begun := time.Now()
	err := n.registerJob(ctx, t.s, t.local, t.applied)
	if ctx.Err() != nil {
		return steps.Never // stopped, not slowed: stop gives the slot back
	}
	var ne *notEligibleError
	if errors.As(err, &ne) {
		n.registering.release(&t.ticket, begun, nil)
		if t.parked == nil || t.parked.Error() != ne.err.Error() {
			n.log.Info("not running the job here", "job", t.local.Name, "why", ne.err)
		}
		t.parked = ne.err
		t.leaveJob()       // a member key this session put before (a changed job keeps it)
		return steps.Never // woken by a change of the definition
	}
	n.registering.release(&t.ticket, begun, err)
	if err != nil {
		n.log.Warn("register job", "job", t.local.Name, "err", err)
		return time.Now().Add(t.b.next())
	}
	if t.parked != nil {
		n.log.Info("running the job here again: its definition changed", "job", t.local.Name)
		t.parked = nil
	}
	t.b.reset()
	t.stopMap = n.followMap(ctx, t.local.Name)
	t.phase = candidate
	return time.Now()
}

// campaign puts (or finds) this session's candidate key and leads once no
// candidate key is older: concurrency.Election's keys and rule, waiting on
// the hub instead of a watcher of its own, for the older keys only (see
// elect.go).
func (t *jobTask) campaign(ctx context.Context) time.Time {
	n, job := t.n, t.local.Name
	if n.isLeaving() {
		// A candidate that stays would block the election once its key
		// is the oldest: no one would lead the job (and move the items of
		// a leader that died) until this instance is gone.
		n.withdraw(t.s, job)
		t.key, t.rev = "", 0
		t.phase = idle
		return steps.Never
	}
	prefix, member := n.keys.Leader(job), n.keys.Member(job, n.opts.ID)
	if t.key == "" {
		if t.unsub == nil {
			// Subscribe first: a deletion after the put wakes the task,
			// when it is of a key the task waits for. So does the
			// deletion of this instance's member key (Leave).
			t.unsub = append(t.unsub, n.hub.subscribe(job, prefix, func(ev *clientv3.Event) {
				if ev.Type == clientv3.EventTypeDelete && t.older.deleted(string(ev.Kv.Key)) {
					t.wake()
				}
			}, t.wake), n.hub.subscribe(job, member, func(ev *clientv3.Event) {
				if ev.Type == clientv3.EventTypeDelete && string(ev.Kv.Key) == member {
					t.wake()
				}
			}, t.wake))
		}
		t.older.forget()
		key, rev, err := n.candidate(ctx, t.s, job)
		if err != nil {
			if ctx.Err() == nil {
				n.log.Debug("campaign", "job", job, "err", err)
			}
			return time.Now().Add(t.b.next())
		}
		t.key, t.rev = key, rev
	}
	// Every older key the last look found has gone: this candidate most
	// likely leads now, so the look is the leader's first read as well.
	full := t.older.cleared()
	t.older.forget()
	l := &leader{n: n, job: job, local: t.local, applied: t.applied, key: t.key, rev: t.rev}
	var st *state
	var found []candidateKey
	var err error
	resyncs := n.hub.resyncs.Load() // before the read (see the subscriptions below)
	if full {
		if st, err = l.read(ctx); err == nil {
			found = st.candidates
		}
	} else {
		found, err = n.lookElection(ctx, prefix, t.rev)
	}
	switch {
	case ctx.Err() != nil:
		return steps.Never
	case err != nil:
		n.log.Debug("election: look at the candidates; retrying", "job", job, "err", err)
		return time.Now().Add(200 * time.Millisecond)
	}
	older, err := judgeElection(found, t.key, t.rev, t.s.lease)
	if err == nil && t.s.ctx.Err() != nil {
		err = t.s.Err()
	}
	switch {
	case err != nil:
		n.log.Warn("campaign won on a stale session; campaigning again", "job", job, "err", err)
		t.key = "" // put (or find) it again
		return time.Now().Add(t.b.next())
	case len(older) > 0:
		t.older.set(older)
		n.log.Debug("election: waiting for older candidates", "job", job, "older", len(older))
		return steps.Never // woken when the last of them is deleted, or by a resync
	}
	t.b.reset()
	e := concurrency.ResumeElection(t.s.conc, n.keys.Election(job), t.key, t.rev)
	n.log.Info("leading job", "job", job, "leader_rev", e.Rev(), "read_with_election", st != nil)
	t.setLeading(true)
	t.unsubscribe()
	t.e, t.l = e, l
	// Subscribe first, then read (the next step): every change after the
	// read wakes the reconcile. A new candidate may be the preferred
	// leader, so the election prefix counts too.
	//
	// The full look read the state before these subscriptions. The first
	// reconcile goes on it (the map is written one round trip after the
	// election) unless something may be missing from it: the watch had
	// delivered events past its revision when the subscriptions were made
	// (they are made between two deliveries, so every later event reaches
	// them): it goes on it, then reads again after a settle; an event
	// reached a subscription since (changed), or the hub resynced since the
	// read (resyncs; events were lost): it reads.
	shards, members := n.keys.Shards(job), n.keys.Members(job)
	t.changed.Store(false)
	resync := func() { t.changed.Store(true); t.wake() }
	n.hub.settled(func() {
		for _, p := range []string{members, n.keys.Disabled(job), n.keys.Config(job), shards, prefix} {
			t.unsub = append(t.unsub, n.hub.subscribe(job, p, func(ev *clientv3.Event) {
				switch {
				case p == shards && ev.Kv.ModRevision == l.wrote.Load():
					// Its own map write, coming back: nothing changed.
				case p == members && ev.Type == clientv3.EventTypeDelete:
					t.changed.Store(true)
					t.wake() // a member gone: its items wait for the new map, at once
				default:
					t.changed.Store(true)
					t.settle()
				}
			}, resync))
		}
		if st != nil {
			t.pending, t.pendingResyncs, t.reread = st, resyncs, n.hub.deliveredRev() > st.rev
		}
	})
	t.phase = leading
	return time.Now()
}

// lead is one reconcile of the leader: read the job's state (unless the
// election's full look just did), write the map it should have.
func (t *jobTask) lead(ctx context.Context) time.Time {
	st, reread, err := t.pending, t.reread, error(nil)
	t.pending, t.reread = nil, false
	if st != nil && (t.changed.Load() || t.n.hub.resyncs.Load() != t.pendingResyncs) {
		st, reread = nil, false // the full look's read may lack a change (see campaign)
	}
	if st == nil {
		st, err = t.l.read(ctx)
	}
	if err == nil {
		err = t.l.reconcile(ctx, st)
	}
	switch {
	case ctx.Err() != nil:
		return steps.Never
	case errors.Is(err, errNotLeader), errors.Is(err, errYield):
		t.endLeadership(err)
		return time.Now()
	case err != nil:
		t.n.log.Warn("reconcile shard map", "job", t.local.Name, "err", err)
		return time.Now().Add(t.b.next())
	}
	t.b.reset()
	if reread {
		return time.Now().Add(leaderSettle)
	}
	interval := t.l.interval
	if interval <= 0 { // no definition this version reads yet
		interval = config.DefaultReconcileIntervalMinutes
	}
	return time.Now().Add(time.Duration(interval) * time.Minute)
}

// endLeadership resigns (so that another instance leads at once; when the
// session is gone, the lease's end removes the key) and goes back to being
// a candidate, with a new key.
func (t *jobTask) endLeadership(why error) {
	n, job := t.n, t.local.Name
	t.setLeading(false)
	if t.s.ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(t.s.ctx, time.Second)
		t.e.Resign(rctx)
		cancel()
	}
	switch {
	case errors.Is(why, errYield):
		n.log.Info("handed leadership over", "job", job, "reason", why)
	case errors.Is(why, errNotLeader):
		n.log.Warn("lost leadership", "job", job, "err", why)
	default:
		n.log.Info("stopped leading job", "job", job)
	}
	t.unsubscribe()
	t.e, t.l, t.key, t.rev, t.pending = nil, nil, "", 0, nil
	t.older.forget()
	t.phase = candidate
}

// park ends the instance's part in the job, whose definition changed into
// one it may not run (why): leadership resigned or candidacy withdrawn,
// member key deleted (the leader reshards its items away at once; its runs
// in progress finish under their markers). The task waits for the next
// change of the definition.
func (t *jobTask) park(why error) {
	n, job := t.n, t.local.Name
	if t.phase == leading {
		t.endLeadership(nil)
	}
	t.leaveJob()
	t.unsubscribe()
	if t.stopMap != nil {
		t.stopMap()
		t.stopMap = nil
	}
	t.key, t.rev = "", 0
	t.older.forget()
	t.phase, t.parked = registering, why
	n.log.Info("left the job: its definition may no longer run here", "job", job, "why", why)
}

// leaveJob withdraws the session's candidate key and member key of the
// job, and its claims' guard.
func (t *jobTask) leaveJob() {
	n, job := t.n, t.local.Name
	n.mu.Lock()
	if n.session == t.s {
		delete(n.members, job) // no claim of this session on the job from now
	}
	n.mu.Unlock()
	if t.s.ctx.Err() == nil {
		n.withdraw(t.s, job)
		dctx, cancel := context.WithTimeout(t.s.ctx, time.Second)
		n.opts.Client.Delete(dctx, n.keys.Member(job, n.opts.ID))
		cancel()
	}
}

// setLeading sets the job view's Leading while the task's session is the
// node's: a task of an ended session that finishes late must not clear
// the flag a newer session's leadership set.
func (t *jobTask) setLeading(on bool) {
	t.n.updateView(t.local.Name, func(v *JobView) {
		if t.n.session == t.s { // updateView holds n.mu
			v.Leading = on
		}
	})
}

func (t *jobTask) unsubscribe() {
	for _, u := range t.unsub {
		u()
	}
	t.unsub = nil
}

// stop ends the task: no more steps, then its leadership resigned or its
// candidate key withdrawn, its subscriptions cancelled and, when the job
// left the config, its member key deleted.
func (t *jobTask) stop() {
	defer close(t.done)
	n, job := t.n, t.local.Name
	n.steps.Remove(t.slot)
	n.registering.drop(&t.ticket)
	switch {
	case t.phase == leading:
		t.endLeadership(nil)
	case t.phase != registering && t.s.ctx.Err() == nil:
		// Also when t.key is "": a put whose reply was lost may have
		// applied.
		n.withdraw(t.s, job)
	}
	t.unsubscribe()
	if t.stopMap != nil {
		t.stopMap()
	}
	n.mu.Lock()
	if t.view != nil && t.view.task == t {
		t.view.task = nil
	}
	n.mu.Unlock()
	if t.removed.Load() && t.s.ctx.Err() == nil { // the job left the config: leave it now
		dctx, cancel := context.WithTimeout(t.s.ctx, time.Second)
		n.opts.Client.Delete(dctx, n.keys.Member(job, n.opts.ID))
		cancel()
		n.log.Info("left job", "job", job)
	}
	if t.stopConfig != nil {
		t.stopConfig()
		t.stopKids()
	}
}

// candidate puts this session's candidate key for job's leadership, or
// finds it there from an earlier campaign of the session, and returns it
// with its CreateRevision.
func (n *Node) candidate(ctx context.Context, s *session, job string) (key string, rev int64, err error) {
	key = n.candidateKey(s, job)
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.txns.Txn(rctx,
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
		[]clientv3.Op{clientv3.OpPut(key, n.opts.ID, clientv3.WithLease(s.lease))},
		[]clientv3.Op{clientv3.OpGet(key)})
	if err != nil {
		return "", 0, err
	}
	if resp.Succeeded {
		return key, resp.Header.Revision, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return "", 0, fmt.Errorf("election key %s vanished", key)
	}
	return key, kvs[0].CreateRevision, nil
}
