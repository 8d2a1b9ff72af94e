package engine

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Triggers, the engine's part (docs/design.md, Triggers: durable until
// served). A job loop serves the triggers etcd holds, not those it
// happened to see: it keeps the job's trigger keys from the watch and a
// read that follows its subscription (triggerSet), and serves none until
// that read is in, nor after a gap of the watch until it has read again.
// Each item's record says the newest trigger it served, written by the
// claim that served it; a trigger no item is left to serve is deleted by
// a Txn that checks in etcd what made the loop think so.

// triggerSet is one job's trigger keys as etcd has them: the events of the
// watch and a read fold in by each key's revision, deletions included,
// like the item cache (coord/itemcache.go), so that a read and the events
// that overlap it agree in any order. Guarded by the loop's mu.
//
//	(new) --subscribe--> incomplete --read at R folded in--> complete
//	complete --events, as delivered--> complete
//	any --watch gap (lost)--> incomplete, emptied; a read begun before does not fold in
//
// A deletion is kept (a tombstone) only while a read is in flight, which
// may bring an older state of the key: a read begun after the deletion was
// delivered cannot.
type triggerSet struct {
	keys map[string]triggerKey
	// complete is set once a read begun in this generation folded in.
	complete bool
	// reading is set while a read is in flight (one at a time: the job's
	// reconcile makes it).
	reading bool
	// gen counts the watch's lost stretches.
	gen int
}

// triggerKey is one trigger key: tr nil once deleted (kept while a read
// is in flight), rev its last change.
type triggerKey struct {
	tr  *keyspace.Trigger
	rev int64
}

// apply folds a change of one key in; it reports whether it is a trigger
// this set did not have.
func (s *triggerSet) apply(id string, tr *keyspace.Trigger, rev int64) bool {
	if s.keys == nil {
		s.keys = map[string]triggerKey{}
	}
	had, ok := s.keys[id]
	if ok && had.rev >= rev {
		return false
	}
	if tr == nil && !s.reading {
		delete(s.keys, id) // no read in flight can bring it back
		return false
	}
	s.keys[id] = triggerKey{tr: tr, rev: rev}
	return tr != nil && (!ok || had.tr == nil)
}

// lost empties the set: events may be missing, only a new read tells.
func (s *triggerSet) lost() {
	s.keys, s.complete = nil, false
	s.gen++
}

// begin starts a read: it returns the generation to fill it in.
func (s *triggerSet) begin() int {
	s.reading = true
	return s.gen
}

// fill folds in a read begun in generation gen (nil read: it failed); it
// reports whether the set is complete.
func (s *triggerSet) fill(gen int, read []keyspace.Trigger) bool {
	ok := s.gen == gen // else a gap came after the read began: it may predate it
	if ok {
		for _, tr := range read {
			s.apply(tr.ID, &tr, tr.ModRev)
		}
	}
	s.reading = false
	for id, k := range s.keys {
		if k.tr == nil {
			delete(s.keys, id)
		}
	}
	s.complete = ok && read != nil
	return s.complete
}

// pending returns the triggers in the set, oldest first.
func (s *triggerSet) pending() []keyspace.Trigger {
	var out []keyspace.Trigger
	for _, id := range slices.Sorted(maps.Keys(s.keys)) {
		if k := s.keys[id]; k.tr != nil {
			out = append(out, *k.tr)
		}
	}
	slices.SortStableFunc(out, func(a, b keyspace.Trigger) int { return int(a.Rev - b.Rev) })
	return out
}

// followTriggers subscribes the loop to the job's trigger keys; the
// returned stop ends it. Subscribed before any read (loadTriggers): every
// change after a read's revision comes as an event.
func (j *jobLoop) followTriggers() (stop func()) {
	return j.e.opts.Node.OnTrigger(j.name, func(ev keyspace.TriggerEvent) {
		j.mu.Lock()
		added := j.triggers.apply(ev.ID, ev.Trigger, ev.Rev)
		j.mu.Unlock()
		if !added {
			return
		}
		if tr := ev.Trigger; tr.Upstream != nil {
			j.log.Info("upstream trigger", "trigger", tr.ID, "parent", tr.Upstream.Job, "parent_fire", tr.Upstream.FireTime, "failed", tr.Upstream.Failed)
		} else {
			j.log.Info("manual trigger", "trigger", tr.ID, "items", tr.Items, "by", tr.By)
		}
		j.poke()
	}, func() {
		// Triggers put or deleted in a lost stretch of the watch: only
		// etcd knows; read again before serving any.
		j.mu.Lock()
		j.triggers.lost()
		j.mu.Unlock()
		j.poke()
	})
}

// loadTriggers makes the loop's trigger set complete, reading the job's
// triggers unless it is; it reports whether it is (false: serve none now,
// try again soon).
func (j *jobLoop) loadTriggers(ctx context.Context) bool {
	j.mu.Lock()
	if j.triggers.complete {
		j.mu.Unlock()
		return true
	}
	gen := j.triggers.begin()
	j.mu.Unlock()
	trs, err := j.e.opts.Node.ReadTriggers(ctx, j.name)
	if err != nil && ctx.Err() == nil {
		j.log.Warn("read the job's waiting triggers; trying again", "err", err)
	}
	if err == nil && trs == nil {
		trs = []keyspace.Trigger{} // none: a read all the same
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.triggers.fill(gen, trs)
}

// pendingTriggers returns the loop's triggers, oldest first; call it
// after loadTriggers reported the set complete.
func (j *jobLoop) pendingTriggers() []keyspace.Trigger {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.triggers.pending()
}

// unserved says, for trigger tr and the job's items as read (total of
// them), whether an item is still to serve it, and the items that count as
// having nothing to serve only because they are disabled. An item serves
// a trigger on whichever instance owns it when it is free: the item may
// move here, or away, meanwhile.
func unserved(tr keyspace.Trigger, total int, items keyspace.JobItems) (left bool, off []int) {
	for item := range total {
		if len(tr.Items) > 0 && !slices.Contains(tr.Items, item) {
			continue
		}
		st := items.Items[item]
		switch {
		case st.Record != nil && st.Record.Trigger >= tr.Rev:
			// Served: the record's trigger only grows, a stale read says
			// less, never more.
		case st.Disabled:
			off = append(off, item)
		default:
			return true, nil
		}
	}
	return false, off
}

// deleteServed deletes the triggers of trs that no item of the job is left
// to serve (served, or disabled: like its scheduled fires, the triggers
// that come while an item is disabled do not run on it), each in a Txn
// that checks the disable marks it counted on as etcd has them then.
func (j *jobLoop) deleteServed(ctx context.Context, trs []keyspace.Trigger, total int, items keyspace.JobItems) {
	for _, tr := range trs {
		left, off := unserved(tr, total, items)
		if left {
			continue
		}
		if len(off) > coord.MaxTriggerGuardItems {
			continue // left to the disabled items: they run it if enabled while it lasts
		}
		j.dropTrigger(ctx, tr, coord.TriggerGuard{ItemsOff: off}, "")
	}
}

// dropDisabled drops the triggers of a job disabled in view v (its map or
// its definition): they do not run, as its scheduled fires are recorded
// skipped, and enabling the job does not run them. Each drop checks in
// etcd that the job is disabled still: a view that lags an enable (a map
// its leader has not rewritten yet) drops nothing.
func (j *jobLoop) dropDisabled(ctx context.Context, v coord.JobView) {
	g := coord.TriggerGuard{JobOff: true}
	why := "the job is disabled by an operator"
	if v.Job.Disabled {
		if v.Generation == 0 {
			return // not registered yet: nothing to compare
		}
		g, why = coord.TriggerGuard{Definition: v.Generation}, "the job is disabled by its definition"
	}
	for _, tr := range j.pendingTriggers() {
		j.dropTrigger(ctx, tr, g, why)
	}
}

// dropTrigger deletes tr under g, and forgets it once deleted; a delete
// that does not apply is decided again at the next reconcile. why, when
// set, says why it is dropped unserved.
func (j *jobLoop) dropTrigger(ctx context.Context, tr keyspace.Trigger, g coord.TriggerGuard, why string) {
	ok, err := j.e.opts.Node.DeleteTrigger(ctx, j.name, tr, g)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			j.log.Warn("delete a trigger; deciding again shortly", "trigger", tr.ID, "err", err)
			j.pokeAfter(500 * time.Millisecond) // no event would: nothing changed
		}
		return
	case !ok:
		j.log.Debug("trigger not deleted: etcd no longer says what the reconcile read; deciding again", "trigger", tr.ID)
		return
	}
	j.mu.Lock()
	j.triggers.apply(tr.ID, nil, tr.ModRev+1) // its deletion's event follows
	j.mu.Unlock()
	switch {
	case why == "":
		j.log.Debug("trigger served by every item; deleted", "trigger", tr.ID, "items_off", g.ItemsOff)
	case tr.Upstream != nil:
		j.log.Info("upstream trigger dropped: "+why, "trigger", tr.ID, "parent", tr.Upstream.Job, "parent_fire", tr.Upstream.FireTime)
	default:
		j.log.Info("manual trigger dropped: "+why, "trigger", tr.ID, "items", tr.Items, "by", tr.By)
	}
}
