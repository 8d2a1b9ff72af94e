package engine

import (
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/schedule"
)

// policy is what decide needs of a job.
type policy struct {
	schedule schedule.Schedule // nil: manual job, nothing is ever due
	failover bool
	misfire  bool
	// window is how old a missed fire may be and still run.
	window time.Duration
	// baseline is the watermark of an item never claimed, until its
	// record begins: fires at or before it are not due (the job did not
	// exist yet, as far as this instance knows).
	baseline time.Time
}

// maxCount bounds how many missed fires decide counts one by one.
const maxCount = 100000

type actionKind int

const (
	none   actionKind = iota
	run               // claim and run fire
	adopt             // run the claim this session already holds
	skip              // record the fires through fire as skipped
	begin             // start the record of an item never claimed, at fire
	settle            // record a cut run that will not be re-run (failover: false)
	killed            // record a cut run an operator killed: not re-run (kill.go)
)

func (k actionKind) String() string {
	return [...]string{"none", "run", "adopt", "skip", "begin", "settle", "killed"}[k]
}

// rerun reports whether a is the record's own run again (a failover, or a
// won claim whose work never started) or the record of it cut: what an
// operator's kill of that run must stop.
func (a action) rerun(rec *keyspace.ItemRecord) bool {
	if rec == nil {
		return false
	}
	return a.kind == settle || (a.kind == run && a.fire.Equal(rec.Fire) && (rec.CutByFailure() || rec.NeverStarted()))
}

// action is what to do for one item now.
type action struct {
	kind    actionKind
	fire    time.Time // the fire to run, or the latest one skipped
	attempt int
	source  string
	// skipped counts the fires before fire that will not run.
	skipped int
	// sched is the record's watermark after the claim.
	sched time.Time
	// trigger is the manual trigger a MANUAL run serves; param its
	// one-off parameter (kept by the run's re-runs).
	trigger int64
	// triggerID names the trigger a run serves now (not set on its
	// failover re-runs: the trigger may be gone by then, served).
	triggerID string
	param     string
	by        string
	fireKey   string // a manual fire's (coord.FireKey)
	// upstream is the parent fire an UPSTREAM run serves; noPropagate
	// keeps a manual run's outcome from triggering the job's children.
	upstream    *keyspace.Upstream
	noPropagate bool
	// why says why fires are skipped.
	why string
	// oldest is the earliest fire the action accounts for (zero: fire):
	// runs waiting longest get concurrency slots first.
	oldest time.Time
	// startAt is set on a run claimed ahead of its fire: its work starts
	// then (see docs/performance.md).
	startAt time.Time
}

// waitingSince is when the fires an action serves began to be due.
func (a action) waitingSince() time.Time {
	if !a.oldest.IsZero() {
		return a.oldest
	}
	return a.fire
}

// decide reconciles one item: from its state in etcd, whether a run of it
// is in progress in this process, the job's policy and the time, it says
// what should happen now. It does not look at ownership or manual
// triggers: the caller checks that this instance owns the item for
// action.fire, and serves triggers when decide says none.
func decide(st keyspace.ItemState, local bool, p policy, now time.Time) action {
	if local {
		return action{}
	}
	rec := st.Record
	if st.Disabled {
		// Nothing runs; the fires that come meanwhile are recorded
		// skipped, so that enabling the item does not catch them up.
		if st.RunningBy != "" || rec == nil || p.schedule == nil {
			return action{}
		}
		if count, _, latest := dueFires(p.schedule, rec.Watermark(), now); count > 0 {
			return action{kind: skip, fire: latest, skipped: count, why: whyDisabled}
		}
		return action{}
	}
	if st.RunningBy != "" {
		if st.RunningMine && rec != nil && rec.State == keyspace.StateRunning {
			// Our session holds the marker and no run of ours knows it: a
			// claim whose reply was lost applied after all.
			return action{kind: adopt, fire: rec.Fire, attempt: rec.Attempt, source: rec.Source, sched: rec.Watermark(), skipped: rec.Skipped, param: rec.Param, by: rec.By, fireKey: rec.FireKey, upstream: rec.Upstream, noPropagate: rec.NoPropagate}
		}
		return action{} // someone runs it; the marker's deletion wakes us
	}
	if rec != nil && rec.NeverStarted() {
		// A won claim whose work never began: the fire has not run yet.
		return action{kind: run, fire: rec.Fire, attempt: rec.Attempt + 1, source: rec.Source, sched: rec.Watermark(), skipped: rec.Skipped, trigger: rec.Trigger, param: rec.Param, by: rec.By, fireKey: rec.FireKey, upstream: rec.Upstream, noPropagate: rec.NoPropagate}
	}
	if rec != nil && rec.CutByFailure() {
		if p.failover {
			return action{kind: run, fire: rec.Fire, attempt: rec.Attempt + 1, source: keyspace.SourceFailover, sched: rec.Watermark(), skipped: rec.Skipped, param: rec.Param, by: rec.By, fireKey: rec.FireKey, upstream: rec.Upstream, noPropagate: rec.NoPropagate}
		}
		if rec.State == keyspace.StateRunning {
			// Not run again; say so on the record, then the fires after it.
			return action{kind: settle, fire: rec.Fire}
		}
	}
	if p.schedule == nil {
		return action{}
	}
	base, busyUntil := p.baseline, time.Time{}
	if rec != nil {
		base = rec.Watermark()
		if rec.State != keyspace.StateSkipped && !rec.CutByFailure() && !rec.NeverStarted() {
			busyUntil = rec.End // fires up to here came while the item ran
		}
	}
	count, first, latest := dueFires(p.schedule, base, now)
	if count == 0 {
		if rec == nil {
			// Nothing was due: the item's record begins now, so that every
			// instance agrees from when its fires are due.
			return action{kind: begin, fire: now}
		}
		return action{}
	}
	cameWhileBusy := !latest.After(busyUntil)
	switch {
	case now.Sub(latest) > p.window:
		return action{kind: skip, fire: latest, skipped: count, why: whyTooOld}
	case !p.misfire && cameWhileBusy:
		return action{kind: skip, fire: latest, skipped: count, why: whyBusy}
	}
	// MISFIRE: a run that stands for fires that came while the item was
	// busy, or for several; a fire run late by a new owner is still NORMAL.
	source := keyspace.SourceNormal
	if count > 1 || cameWhileBusy {
		source = keyspace.SourceMisfire
	}
	a := action{kind: run, fire: latest, attempt: 1, source: source, skipped: count - 1, sched: latest}
	if count > 1 {
		a.oldest = first
	}
	return a
}

// dueFires counts the scheduled fires after base and at or before now, and
// returns the first and the latest of them.
func dueFires(s schedule.Schedule, base, now time.Time) (count int, first, latest time.Time) {
	for f := s.Next(base); !f.IsZero() && !f.After(now) && count < maxCount; f = s.Next(f) {
		if count == 0 {
			first = f
		}
		count, latest = count+1, f
	}
	return count, first, latest
}

// Why fires are recorded skipped.
const (
	whyTooOld   = keyspace.SkipTooOld
	whyBusy     = keyspace.SkipBusy
	whyDisabled = keyspace.SkipDisabled
)
