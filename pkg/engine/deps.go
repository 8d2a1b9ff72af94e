package engine

import (
	"context"
	"maps"
	"slices"

	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/shard"
)

// Dependencies, the engine's part (docs/dependencies.md): a parent job's
// items note their final outcomes in their fire's barrier, and a child
// job serves the upstream triggers the completing notes put.
//
// Noting is level-triggered: the reconcile notes an item's record once it
// is final, before anything replaces it. The record is replaced only by a
// write decided by a reconcile that read it (the next claim, a skip, a
// settle), and that reconcile notes it first: an instance that dies
// between recording an outcome and noting it leaves the note to the
// item's next writer, or to its new owner, whose reconcile notes the
// records of the items it owns.

// keepsBarriers reports whether the job's fires are noted in barriers: it
// has children (dependsOn), or it pauses after failed fires.
func keepsBarriers(v coord.JobView) bool {
	return len(v.Children) > 0 || v.Job != nil && v.Job.PauseAfterFailures > 0
}

// notable reports whether rec is the final outcome of a fire of its item,
// to be noted in the fire's barrier: not a run in progress, not one to be
// run again, not the start of a record (begin), not a manual run that does
// not propagate.
func notable(rec *keyspace.ItemRecord, failover bool) bool {
	switch {
	case rec == nil, rec.State == keyspace.StateRunning, rec.NeverStarted(), rec.NoPropagate:
		return false
	case rec.CutByFailure() && failover:
		return false // its re-run ends the item
	case rec.State == keyspace.StateSkipped && rec.Reason == "":
		return false // Begin's record: no fire
	}
	return true
}

// noteOutcome notes item's final record (st's) in its fire's barrier, once
// per record (by Seq), when the job has children. It reports false when
// the note failed: nothing may replace the record before it is noted.
func (j *jobLoop) noteOutcome(ctx context.Context, v coord.JobView, item int, st keyspace.ItemState) bool {
	if st.Record == nil {
		return true
	}
	r := *st.Record
	if r.Fence == 0 {
		r.Fence = keyspace.RunFence(st.Record, st.Rev)
	}
	return j.note(ctx, v, item, r)
}

// noteFinal notes the record a run of item just completed with, at once
// (the reconcile would, at its next look): the fast path, and the only one
// for an item a smaller shardingTotalCount left out while it ran.
func (j *jobLoop) noteFinal(item int, rec keyspace.ItemRecord) {
	if v, ok := j.e.opts.Node.View(j.name); ok && v.Job != nil {
		ctx, done := j.e.outcomeCtx()
		defer done()
		j.note(ctx, v, item, rec)
	}
}

func (j *jobLoop) note(ctx context.Context, v coord.JobView, item int, rec keyspace.ItemRecord) bool {
	if !keepsBarriers(v) || !notable(&rec, v.Job.Failover) || j.e.opts.forgetNotes {
		return true
	}
	j.mu.Lock()
	seq, ok := j.noted[item]
	j.mu.Unlock()
	if ok && seq == rec.Seq {
		return true
	}
	total := rec.Total // the fire's, from its claim
	if now := j.totalOf(v); total == 0 || v.Job.Strategy == shard.Broadcast && now > total {
		// Under BROADCAST a member that joined since the claim runs the
		// fire too: wait for its item.
		total = now
	}
	b, completed, err := j.e.opts.Node.NoteOutcome(ctx, j.name, total, rec, v.Children)
	if err != nil {
		if ctx.Err() == nil {
			j.log.Warn("note an item's outcome in its fire's barrier; trying again", "item", item, "fire", rec.Fire.UTC(), "err", err)
		}
		return false
	}
	j.mu.Lock()
	j.noted[item] = rec.Seq
	j.mu.Unlock()
	if completed && b.Paused {
		j.e.runs.Add(1)
		go func() {
			defer j.e.runs.Done()
			j.e.notifyPause(v.Job, rec.Fire, b)
		}()
	}
	if completed && len(v.Children) > 0 {
		j.log.Info("fire complete: its children are triggered", "fire", keyspace.FireKey(&rec), "succeeded", b.Succeeded(),
			"done", len(b.Done), "failed", b.Failed, "skipped", b.Skipped, "stopped", b.Stopped, "children", slices.Sorted(maps.Keys(v.Children)))
	}
	return true
}
