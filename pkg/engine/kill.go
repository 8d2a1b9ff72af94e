package engine

import (
	"context"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// An operator's kill (coord.Kill) names runs by fence. The job's loop
// hands each to its localRuns: a run of that item with that fence is
// cancelled at once, with an operatorKill as the cause, and work records
// it KILLED, reason operator. A kill that finds no such run is kept for
// the request's lifetime (coord.KillTTL): its run may be between its claim
// and the registration of its cancel, and is then cancelled as it
// registers. A kill never touches another fence: the item's next run is
// not the one the operator saw.

// operatorKill is the cause of a run cancelled by an operator, or by
// overlap replace for a newer fire (reason replaced).
type operatorKill struct{ by, reason string }

func (k operatorKill) Error() string {
	switch {
	case k.reason == keyspace.ReasonReplaced:
		return "replaced by " + k.by + " (overlap: replace)"
	case k.by == "":
		return "killed by an operator"
	}
	return "killed by " + k.by
}

// runHandle is a run in progress that a kill can stop.
type runHandle struct {
	fence  int64
	cancel context.CancelCauseFunc
}

// pendingKill is a kill whose run was not (yet) registered here. The
// items of one claim share a fence: a kill names the item too.
type pendingKill struct {
	item  int
	fence int64
	cause operatorKill
	until time.Time
}

// register makes the run of item with fence killable until the returned
// func is called. A kill of it that came first cancels it at once.
func (l *localRuns) register(item int, fence int64, cancel context.CancelCauseFunc, now time.Time) (unregister func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.handles == nil {
		l.handles = map[int]runHandle{}
	}
	l.handles[item] = runHandle{fence: fence, cancel: cancel}
	for i, k := range l.kills {
		if k.item == item && k.fence == fence && now.Before(k.until) {
			cancel(k.cause)
			l.kills = append(l.kills[:i], l.kills[i+1:]...)
			break
		}
	}
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if h, ok := l.handles[item]; ok && h.fence == fence {
			delete(l.handles, item)
		}
	}
}

// kill stops the run of item with fence, or keeps the kill for a run
// still registering; it reports whether a run was stopped.
func (l *localRuns) kill(item int, fence int64, cause operatorKill, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if h, ok := l.handles[item]; ok && h.fence == fence {
		h.cancel(cause)
		return true
	}
	kept := l.kills[:0]
	for _, k := range l.kills {
		if now.Before(k.until) {
			kept = append(kept, k)
		}
	}
	l.kills = append(kept, pendingKill{item: item, fence: fence, cause: cause, until: now.Add(keyspace.KillTTL)})
	return false
}

// onKill serves an operator's kill of this instance's runs of the job.
func (j *jobLoop) onKill(k keyspace.Kill) {
	now := j.e.opts.Now()
	for _, r := range k.Runs {
		stopped := j.runs.kill(r.Item, r.Fence, operatorKill{by: k.By, reason: k.KillReason()}, now)
		j.log.Info("kill requested", "item", r.Item, "fence", r.Fence, "by", k.By, "reason", k.KillReason(), "stopped", stopped)
	}
}

// killedBy returns the kill that cancelled a run with cause, if an
// operator (or overlap replace) did.
func killedBy(cause error) (operatorKill, bool) {
	k, ok := cause.(operatorKill)
	return k, ok
}

// settleKilled records a run cut by a failure, which an operator killed
// before the kill could reach it, as killed: it is not run again.
func (j *jobLoop) settleKilled(ctx context.Context, item int, st keyspace.ItemState, k keyspace.KillBy) {
	if err := j.e.opts.Node.SettleKilled(ctx, j.name, item, st, k); err != nil {
		j.log.Warn("record a killed run; trying again", "item", item, "err", err)
		j.pokeAfter(200 * time.Millisecond)
		return
	}
	j.log.Info("run killed by an operator and cut by a failure; not run again", "item", item, "fire", st.Record.Fire.UTC(),
		"fence", keyspace.RunFence(st.Record, st.Rev), "by", k.By, "reason", k.Reason)
}

// replace asks for the run a names to be stopped for a's fire (overlap
// replace). The run's instance records it KILLED/replaced and deletes its
// marker, whose deletion wakes this loop for the new fire. A request that
// could not be put is tried again at the next reconcile.
func (j *jobLoop) replace(ctx context.Context, item int, a action) {
	asked, err := j.e.opts.Node.Replace(ctx, j.name, item, a.fence, a.by, a.fire)
	switch {
	case err != nil:
		j.log.Warn("ask to replace a run; trying again", "item", item, "fence", a.fence, "err", err)
		j.pokeAfter(500 * time.Millisecond)
	case !asked:
		j.pokeAfter(100 * time.Millisecond) // the run ended meanwhile: decide again
	default:
		j.log.Info("replacing a run (overlap: replace)", "item", item, "fence", a.fence, "instance", a.by, "for", a.fire.UTC())
	}
}
