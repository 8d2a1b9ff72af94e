package engine

import (
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/schedule"
)

// policy is what decide needs of a job.
type policy struct {
	schedule schedule.Schedule // nil: manual job, nothing is ever due
	failover bool
	misfire  bool
	// overlap is the job's overlap policy (config.Overlap*); "" is
	// misfire's: bufferOne when it is set, else skip.
	overlap string
	// bufferLimit bounds the pending fires of overlap bufferAll.
	bufferLimit int
	// exclusion is the job's calendars: the fires they exclude are
	// recorded skipped, reason calendar.
	exclusion schedule.Exclusion
	// fixedDelay, for a job without a cron, puts each item's next fire at
	// its record's end plus the delay.
	fixedDelay time.Duration
	// window is how old a missed fire may be and still run, counted from
	// its start: the fire plus its jitter offset (see tooOld).
	window time.Duration
	// jitter is the job's; job and item name the fires whose offsets it
	// gives (schedule.JitterOffset).
	jitter time.Duration
	job    string
	item   int
	// baseline is the watermark of an item never claimed, until its
	// record begins: fires at or before it are not due (the job did not
	// exist yet, as far as this instance knows).
	baseline time.Time
}

// policyOf is job's policy; window is the instance's catch-up window, for
// a job that names none.
func policyOf(job *config.Job, window time.Duration, baseline time.Time) policy {
	p := policy{schedule: job.Schedule, failover: job.Failover, misfire: job.Misfire, overlap: job.Overlap,
		bufferLimit: job.BufferLimit, exclusion: job.Exclusion, fixedDelay: time.Duration(job.FixedDelay), window: window, baseline: baseline,
		jitter: time.Duration(job.Jitter), job: job.Name}
	if job.CatchUpWindow > 0 {
		p.window = time.Duration(job.CatchUpWindow)
	}
	return p
}

// forItem is p for one item of the job: its fires' jitter offsets are the
// item's.
func (p policy) forItem(item int) policy {
	p.item = item
	return p
}

// tooOld reports whether fire is older than the catch-up window at now. A
// jittered run is due at its fire plus the item's offset for that fire:
// its lateness counts from there.
func (p policy) tooOld(fire, now time.Time) bool {
	if p.jitter > 0 {
		fire = fire.Add(schedule.JitterOffset(p.job, p.item, fire, p.jitter))
	}
	return now.Sub(fire) > p.window
}

// overlapPolicy is p's overlap policy, misfire's when none is named.
func (p policy) overlapPolicy() string {
	switch {
	case p.overlap != "":
		return p.overlap
	case p.misfire:
		return config.OverlapBufferOne
	}
	return config.OverlapSkip
}

type actionKind int

const (
	none    actionKind = iota
	run                // claim and run fire
	adopt              // run the claim this session already holds
	skip               // record the fires through fire as skipped
	begin              // start the record of an item never claimed, at fire
	settle             // record a cut run that will not be re-run (failover: false)
	killed             // record a cut run an operator killed: not re-run (kill.go)
	replace            // ask the item's running run to stop for fire (overlap replace)
)

func (k actionKind) String() string {
	return [...]string{"none", "run", "adopt", "skip", "begin", "settle", "killed", "replace"}[k]
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
	// skipped counts the fires before fire that will not run (in a skip,
	// fire too); excluded those of them the job's calendars excluded.
	skipped  int
	excluded int
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
	// kill is the kill request a cut run is settled killed by (killed).
	kill keyspace.KillBy
	// fence is the run a replace asks to stop (by names its instance).
	fence int64
	// slot is the cluster slot a run claims, plus one (0: none).
	slot int
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
	rec := st.Record
	if a, ok := replacing(st, local, p, now); ok {
		return a
	}
	if local {
		return action{}
	}
	if st.Disabled {
		// Nothing runs; the fires that come meanwhile are recorded
		// skipped, so that enabling the item does not catch them up.
		if st.RunningBy != "" || rec == nil || p.schedule == nil {
			return action{}
		}
		d := dueOf(p.schedule, nil, rec.Watermark(), now)
		if latest := d.latest(now); !latest.IsZero() {
			n, _ := d.counts(latest)
			return action{kind: skip, fire: latest, skipped: n, why: whyDisabled}
		}
		return action{}
	}
	if st.RunningBy != "" {
		if st.RunningMine && rec != nil && rec.State == keyspace.StateRunning {
			// Our session holds the marker and no run of ours knows it: a
			// claim whose reply was lost applied after all.
			return action{kind: adopt, fire: rec.Fire, attempt: rec.Attempt, source: rec.Source, sched: rec.Watermark(), skipped: rec.Skipped, excluded: rec.Excluded, param: rec.Param, by: rec.By, fireKey: rec.FireKey, upstream: rec.Upstream, noPropagate: rec.NoPropagate}
		}
		return action{} // someone runs it; the marker's deletion wakes us
	}
	if rec != nil && rec.NeverStarted() {
		// A won claim whose work never began: the fire has not run yet.
		return action{kind: run, fire: rec.Fire, attempt: rec.Attempt + 1, source: rec.Source, sched: rec.Watermark(), skipped: rec.Skipped, excluded: rec.Excluded, trigger: rec.Trigger, param: rec.Param, by: rec.By, fireKey: rec.FireKey, upstream: rec.Upstream, noPropagate: rec.NoPropagate}
	}
	if rec != nil && rec.CutByFailure() {
		if p.failover {
			return action{kind: run, fire: rec.Fire, attempt: rec.Attempt + 1, source: keyspace.SourceFailover, sched: rec.Watermark(), skipped: rec.Skipped, excluded: rec.Excluded, param: rec.Param, by: rec.By, fireKey: rec.FireKey, upstream: rec.Upstream, noPropagate: rec.NoPropagate}
		}
		if rec.State == keyspace.StateRunning {
			// Not run again; say so on the record, then the fires after it.
			return action{kind: settle, fire: rec.Fire}
		}
	}
	if p.schedule == nil {
		if p.fixedDelay > 0 {
			return decideFixedDelay(rec, p.fixedDelay, now)
		}
		return action{}
	}
	base, busyUntil := p.baseline, time.Time{}
	if rec != nil {
		base = rec.Watermark()
		if rec.State != keyspace.StateSkipped && !rec.CutByFailure() && !rec.NeverStarted() {
			busyUntil = rec.End // fires up to here came while the item ran
		}
	}
	return decideDue(p, rec, base, busyUntil, now)
}

// replacing is overlap replace's decision for an item whose run is going
// on (here or elsewhere: its record is RUNNING under a running marker):
// when a scheduled fire after the run's has come, still within the
// catch-up window and on a day no calendar excludes, the run is asked to
// stop (kill: reason replaced) for it. The new fire runs only once the
// run's marker is gone, as any claim: the two never overlap (G1). A
// disabled item is not replaced: its fires are recorded skipped. Nor is a
// claim of this session that no run here knows: it is adopted first.
func replacing(st keyspace.ItemState, local bool, p policy, now time.Time) (action, bool) {
	rec := st.Record
	if p.overlapPolicy() != config.OverlapReplace || p.schedule == nil || st.Disabled || st.RunningBy == "" || rec == nil || rec.State != keyspace.StateRunning {
		return action{}, false
	}
	if st.RunningMine && !local {
		return action{}, false
	}
	newer := dueOf(p.schedule, p.exclusion, rec.Watermark(), now).latestIncluded(now)
	if newer.IsZero() || p.tooOld(newer, now) {
		return action{}, false
	}
	return action{kind: replace, fire: newer, fence: keyspace.RunFence(rec, st.Rev), by: st.RunningBy}, true
}

// decideDue decides what to do with the scheduled fires after base (the
// record's watermark) and at or before now, by the job's overlap policy,
// catch-up window and calendars. It counts fires, it does not walk them
// (schedule.Count, schedule.Latest): a year of missed fires every second
// costs what a day does. busyUntil is the end of the record's run: fires
// up to it came while the item ran.
func decideDue(p policy, rec *keyspace.ItemRecord, base, busyUntil, now time.Time) action {
	s, x := p.schedule, p.exclusion
	d := dueOf(s, x, base, now)
	latest := d.latest(now)
	if latest.IsZero() {
		if rec == nil {
			// Nothing was due: the item's record begins now, so that every
			// instance agrees from when its fires are due.
			return action{kind: begin, fire: now}
		}
		return action{}
	}
	counts := d.counts
	if p.overlapPolicy() == config.OverlapBufferAll {
		return decideBufferAll(p, d, busyUntil, now, latest)
	}
	// The latest fire a calendar leaves is the one that may run; the
	// excluded fires after it are recorded once it has (or is skipped).
	target := latest
	if len(x) > 0 {
		if target = d.latestIncluded(now); target.IsZero() {
			_, excluded := counts(latest)
			return action{kind: skip, fire: latest, excluded: excluded, why: whyCalendar}
		}
	}
	count, excluded := counts(target)
	cameWhileBusy := !target.After(busyUntil)
	switch {
	case p.tooOld(target, now):
		return action{kind: skip, fire: target, skipped: count, excluded: excluded, why: whyTooOld}
	case p.overlapPolicy() == config.OverlapSkip && cameWhileBusy:
		return action{kind: skip, fire: target, skipped: count, excluded: excluded, why: whyBusy}
	}
	// MISFIRE: a run that stands for fires that came while the item was
	// busy, or for several; a fire run late by a new owner is still NORMAL.
	source := keyspace.SourceNormal
	if count > 1 || cameWhileBusy && p.overlapPolicy() != config.OverlapReplace {
		// (A replaced run's successor came while it ran, by definition:
		// one fire, on time, is NORMAL.)
		source = keyspace.SourceMisfire
	}
	a := action{kind: run, fire: target, attempt: 1, source: source, skipped: count - 1, excluded: excluded, sched: target}
	if count+excluded > 1 {
		a.oldest = d.first()
	}
	return a
}

// decideFixedDelay is decide for a job with fixedDelay: an item's next
// fire is its record's end plus the delay, rounded up to a whole second,
// computed from the record in etcd: the same on every instance, and kept
// across a failover, a reshard and a restart. The first fire is the second
// after the item's record begins; a skip ends at its fire. A fire late because its owner was down runs
// late: with nothing due meanwhile, nothing is skipped. When the fire is
// ahead, the action says when (none, fire set): the loop wakes then.
func decideFixedDelay(rec *keyspace.ItemRecord, delay time.Duration, now time.Time) action {
	if rec == nil {
		return action{kind: begin, fire: now}
	}
	end := rec.End
	if end.IsZero() || end.Before(rec.Fire) {
		end = rec.Fire
	}
	next := end.Add(delay)
	if rec.Begins() {
		next = rec.Fire // the record's beginning: the first fire is now
	}
	if t := next.Truncate(time.Second); t.Before(next) {
		next = t.Add(time.Second)
	}
	if !next.After(rec.Watermark()) { // a manual run's record keeps an older watermark
		next = rec.Watermark().Add(time.Second).Truncate(time.Second)
	}
	if next.After(now) {
		return action{kind: none, fire: next}
	}
	return action{kind: run, fire: next, attempt: 1, source: keyspace.SourceNormal, sched: next}
}

// decideBufferAll is decideDue for overlap bufferAll: each due fire runs,
// the oldest first. The queue is the record's watermark: the next fire to
// run is the first after it, so the queue lives in etcd and survives a
// reshard, a failover and a restart. Fires older than the catch-up window
// are recorded skipped (too-old), the oldest of more than bufferLimit
// pending ones too (buffer-full), and a calendar's, in their turn
// (calendar).
func decideBufferAll(p policy, d due, busyUntil, now, latest time.Time) action {
	// Fires f with now - f > window + jitter are too old whatever their
	// offsets; of the rest, the first may be too, by its own offset (a
	// second one, if any, is looked at once the first is recorded).
	old := d.latest(now.Add(-p.window - p.jitter).Add(-time.Nanosecond))
	if first := d.first(); old.IsZero() && p.tooOld(first, now) {
		old = first
	}
	if !old.IsZero() {
		count, excluded := d.counts(old)
		return action{kind: skip, fire: old, skipped: count, excluded: excluded, why: whyTooOld}
	}
	limit := p.bufferLimit
	if limit <= 0 {
		limit = config.DefaultBufferLimit
	}
	if pending, _ := d.counts(now); pending > limit {
		cut := d.nthIncluded(pending - limit)
		count, excluded := d.counts(cut)
		return action{kind: skip, fire: cut, skipped: count, excluded: excluded, why: whyBufferFull}
	}
	next := d.first()
	if d.x.Excludes(next) {
		// The excluded fires before the next one that runs, in one record.
		upTo := now
		if included := d.nextIncluded(); !included.IsZero() {
			upTo = included.Add(-time.Nanosecond)
		}
		last := d.latest(upTo)
		_, excluded := d.counts(last)
		return action{kind: skip, fire: last, excluded: excluded, why: whyCalendar}
	}
	// MISFIRE: the fire came while the item ran, or waited behind others.
	source := keyspace.SourceNormal
	if !next.After(busyUntil) || next.Before(latest) {
		source = keyspace.SourceMisfire
	}
	return action{kind: run, fire: next, attempt: 1, source: source, sched: next}
}

// maxListed is how many due fires an item's decision lists one by one;
// past it, it counts them (schedule.Count and friends).
const maxListed = 8

// due is an item's scheduled fires after base and at or before now: listed
// when there are few (nearly always one), counted when there are many (a
// long outage), with the same answers either way. Counting costs more per
// decision than walking a few fires; walking a year of fires costs far
// more than counting them.
type due struct {
	s         schedule.Schedule
	x         schedule.Exclusion
	base, now time.Time
	list      []time.Time // every due fire, when listed
	listed    bool
}

func dueOf(s schedule.Schedule, x schedule.Exclusion, base, now time.Time) due {
	d := due{s: s, x: x, base: base, now: now}
	for f := s.Next(base); !f.IsZero() && !f.After(now); f = s.Next(f) {
		if len(d.list) == maxListed {
			d.list = nil
			return d
		}
		d.list = append(d.list, f)
	}
	d.listed = true
	return d
}

// first is the first due fire (zero: none).
func (d due) first() time.Time {
	if d.listed {
		if len(d.list) == 0 {
			return time.Time{}
		}
		return d.list[0]
	}
	if f := d.s.Next(d.base); !f.After(d.now) {
		return f
	}
	return time.Time{}
}

// latest is the latest due fire at or before upTo.
func (d due) latest(upTo time.Time) time.Time {
	if !d.listed {
		return schedule.Latest(d.s, d.base, minTime(upTo, d.now))
	}
	for i := len(d.list) - 1; i >= 0; i-- {
		if !d.list[i].After(upTo) {
			return d.list[i]
		}
	}
	return time.Time{}
}

// latestIncluded is the latest due fire at or before upTo that no calendar
// excludes.
func (d due) latestIncluded(upTo time.Time) time.Time {
	if !d.listed {
		return d.x.LatestIncluded(d.s, d.base, minTime(upTo, d.now))
	}
	for i := len(d.list) - 1; i >= 0; i-- {
		if !d.list[i].After(upTo) && !d.x.Excludes(d.list[i]) {
			return d.list[i]
		}
	}
	return time.Time{}
}

// counts returns how many due fires at or before upTo no calendar
// excludes, and how many one does.
func (d due) counts(upTo time.Time) (included, excluded int) {
	if !d.listed {
		ex := d.x.CountExcluded(d.s, d.base, upTo)
		return int(schedule.Count(d.s, d.base, upTo) - ex), int(ex)
	}
	for _, f := range d.list {
		switch {
		case f.After(upTo):
		case d.x.Excludes(f):
			excluded++
		default:
			included++
		}
	}
	return included, excluded
}

// nextIncluded is the first due fire no calendar excludes.
func (d due) nextIncluded() time.Time {
	if !d.listed {
		return d.x.NextIncluded(d.s, d.base, d.now)
	}
	for _, f := range d.list {
		if !d.x.Excludes(f) {
			return f
		}
	}
	return time.Time{}
}

// nthIncluded is the k-th due fire (k >= 1) no calendar excludes.
func (d due) nthIncluded(k int) time.Time {
	if !d.listed {
		return d.x.NthIncluded(d.s, d.base, d.now, int64(k))
	}
	for _, f := range d.list {
		if !d.x.Excludes(f) {
			if k--; k == 0 {
				return f
			}
		}
	}
	return time.Time{}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Why fires are recorded skipped.
const (
	whyTooOld     = keyspace.SkipTooOld
	whyBusy       = keyspace.SkipBusy
	whyDisabled   = keyspace.SkipDisabled
	whyCalendar   = keyspace.SkipCalendar
	whyBufferFull = keyspace.SkipBufferFull
)
