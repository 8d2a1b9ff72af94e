package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runlog"
	"github.com/shardd/shardd/pkg/runner"
)

// execute claims the item for s.a (or adopts the claim this session holds),
// runs it with its retries, records the outcome and gives back the
// concurrency slots the reconcile took for it. It reports whether the
// claim was won. ctx is the job loop's: once it ends no claim is made, but
// a won run goes on until it ends, its session fences, or Kill.
func (j *jobLoop) execute(ctx context.Context, v coord.JobView, s start) bool {
	e, job, a := j.e, v.Job, s.a
	log := j.log.With("item", s.item, "fire", a.fire.UTC(), "attempt", a.attempt, "source", a.source)
	defer e.releaseSlots(s.slots...)
	if ctx.Err() != nil && s.claimed == nil { // a claim won already is run (and recorded)
		return false
	}
	g, won := j.claim(ctx, v, s, log)
	if !won {
		return false
	}
	if up := a.upstream; up != nil && up.Failed != "" {
		j.skipFailedUpstream(s.item, g, up, log)
		return true
	}
	rc := j.runContext(v, s, g)
	if a.startAt.IsZero() {
		log.Info("run", "fence", g.Fence, "skipped", a.skipped)
	} else {
		// Claimed ahead: the work starts at the fire, not now.
		log.Info("run", "fence", g.Fence, "skipped", a.skipped, "starts_in", a.startAt.Sub(time.Now()).Round(time.Microsecond))
	}
	if a.skipped > 0 && e.opts.OnSkipped != nil {
		e.opts.OnSkipped(job.Name, a.skipped)
	}
	start := time.Now()
	if e.opts.OnStart != nil {
		e.opts.OnStart(job.Name)
	}
	res, out := j.work(g, job, rc, v.MapRev)
	if !res.Prepared.IsZero() && !s.read.IsZero() && !keyspace.OffSchedule(a.source) {
		due := 1
		if !a.startAt.IsZero() {
			due = s.due // claimed ahead with the others due then
		}
		e.ready.observe(res.Prepared.Sub(s.read), due)
	}
	j.complete(s.item, g, out, log)
	if e.opts.Observe != nil {
		e.opts.Observe(Run{Job: job.Name, Item: s.item, Fire: a.fire, Source: a.source, Started: res.Started, Result: res,
			Killed: out.State == keyspace.StateKilled && out.Reason != keyspace.ReasonTimeout, Duration: runDuration(start, res)})
	}
	logEnd(log, g.Fence, a, res, out)
	if out.State == keyspace.StateFailed || out.Reason == keyspace.ReasonTimeout {
		// Told after the item and its slots are given back: a slow
		// notification target must not hold the item's next fire.
		e.runs.Add(1)
		go func() {
			defer e.runs.Done()
			e.notifyFailure(job, rc, out)
		}()
	}
	return true
}

// claim makes the claim of s, adopts the claim this session holds, or
// takes the result of the claim launch made with others'. When the claim
// is not won it returns false, and the loop decides again after a backoff
// that fits why.
func (j *jobLoop) claim(ctx context.Context, v coord.JobView, s start, log *slog.Logger) (*coord.Grant, bool) {
	e := j.e
	var g *coord.Grant
	var err error
	switch {
	case s.claimed != nil:
		g, err = s.claimed.Grant, s.claimed.Err
	case s.a.kind == adopt:
		g, err = e.opts.Node.Adopt(ctx, j.name, s.item, s.st)
		if err == nil {
			log.Warn("a claim of this session applied after its reply was lost; running it", "fence", g.Fence)
		}
	default:
		g, err = e.opts.Node.Claim(ctx, j.claimOf(v, s))
	}
	switch {
	case err == nil:
		return g, true
	case errors.Is(err, coord.ErrClaimLost):
		// The job's item cache was emptied: the next decision reads etcd.
		log.Debug("claim not won; deciding again", "err", err)
		j.readAfter(100 * time.Millisecond)
	case errors.Is(err, coord.ErrNotUp):
		// No session, or the job not registered under it yet: a new
		// session and the job's map wake the job; this is a backstop.
		log.Debug("claim not made: not up for this job; deciding again", "err", err)
		j.pokeAfter(time.Second)
	default:
		log.Warn("claim; deciding again", "err", err)
		j.readAfter(500 * time.Millisecond) // it may have applied: read, to adopt it
	}
	return nil, false
}

// runContext is what the work of the run s, granted g, is told.
func (j *jobLoop) runContext(v coord.JobView, s start, g *coord.Grant) runner.Context {
	job, a := v.Job, s.a
	rc := runner.Context{
		Job: job.Name, Item: s.item, ItemParameter: job.ShardingItemParameters[s.item], Total: job.ShardingTotalCount,
		JobParameter: job.JobParameter, Fire: a.fire, Fence: g.Fence, Attempt: a.attempt, Instance: j.e.opts.Node.ID(), Source: a.source,
		Skipped: a.skipped, StartAt: a.startAt, TriggerParameter: a.param, TriggeredBy: a.by,
		Release: func() error {
			if j.pastFenceDeadline(g) {
				return errFenced
			}
			return nil
		},
	}
	if v.Map != nil {
		rc.Total = v.Map.Total
	}
	if up := a.upstream; up != nil {
		rc.ParentJob, rc.ParentFire = up.Job, up.FireTime.UTC().Format(time.RFC3339)
	}
	return rc
}

// skipFailedUpstream records the run granted g of a parent fire that
// failed as SKIPPED: the item's record says so, nothing runs.
func (j *jobLoop) skipFailedUpstream(item int, g *coord.Grant, up *keyspace.Upstream, log *slog.Logger) {
	now := time.Now()
	out := coord.Outcome{State: keyspace.StateSkipped, Reason: keyspace.SkipUpstreamFailed, ExitCode: -1, Err: up.Failed, Start: now, End: now}
	rctx, done := j.e.outcomeCtx()
	defer done()
	if err := j.e.opts.Node.Complete(rctx, g, out); err != nil {
		log.Warn("record of a failed upstream fire not written", "fence", g.Fence, "err", err)
	} else {
		j.noteFinal(item, g.Final(out))
	}
	log.Info("not run: its parent's fire did not succeed", "fence", g.Fence, "why", up.Failed)
}

// complete records the outcome of the run granted g, and notes it in its
// fire's barrier; an outcome not recorded is logged.
func (j *jobLoop) complete(item int, g *coord.Grant, out coord.Outcome, log *slog.Logger) {
	rctx, done := j.e.outcomeCtx()
	defer done()
	if err := j.e.opts.Node.Complete(rctx, g, out); err != nil {
		if errors.Is(err, coord.ErrClaimLost) {
			log.Warn("outcome not recorded: another instance took the item over", "state", out.State, "fence", g.Fence)
		} else {
			log.Error("outcome not recorded", "state", out.State, "fence", g.Fence, "err", err)
		}
	} else {
		j.noteFinal(item, g.Final(out))
	}
}

// logEnd logs how the run of a, under fence, ended.
func logEnd(log *slog.Logger, fence int64, a action, res runner.Result, out coord.Outcome) {
	switch out.State {
	case keyspace.StateDone:
		log.Info("done", "fence", fence, "duration", res.Duration().Round(time.Millisecond))
	case keyspace.StateKilled:
		log.Warn("killed", "fence", fence, "reason", out.Reason, "skipped", a.skipped, "err", res.Err)
	default:
		log.Warn("failed", "fence", fence, "exit_code", res.ExitCode, "http_status", res.HTTPStatus, "err", res.Err)
	}
}

// runDuration is how long a run took from its start (for a run prepared
// ahead, from when it was let go), else since begun.
func runDuration(begun time.Time, res runner.Result) time.Duration {
	if !res.Start.IsZero() && res.Start.After(begun) {
		return time.Since(res.Start)
	}
	return time.Since(begun)
}

// errFenced is why a run prepared ahead was not started: its session
// passed its fence deadline (shardd was paused or cut off) meanwhile.
var errFenced = errors.New("the session's fence deadline passed before the run started")

// claimOf is the claim of the run s decided on.
func (j *jobLoop) claimOf(v coord.JobView, s start) coord.Claim {
	a := s.a
	return coord.Claim{
		Job: j.name, Item: s.item, Fire: a.fire, Attempt: a.attempt, Source: a.source, Skipped: a.skipped, Excluded: a.excluded,
		Prev: s.st, MapRev: v.MapRev, Sched: a.sched, Trigger: a.trigger, TriggerID: a.triggerID, Param: a.param, By: a.by, FireKey: a.fireKey,
		Upstream: a.upstream, NoPropagate: a.noPropagate, Total: j.totalOf(v), Slot: a.slot, StartAt: a.startAt,
	}
}

// totalOf is the job's item count in view v: its map's, else its
// definition's.
func (j *jobLoop) totalOf(v coord.JobView) int {
	if v.Map != nil {
		return v.Map.Total
	}
	return v.Job.ShardingTotalCount
}

// pastFenceDeadline reports whether the session of g has passed (or
// reached) its fence deadline: it has fenced or is about to.
func (j *jobLoop) pastFenceDeadline(g *coord.Grant) bool {
	if g.Ctx.Err() != nil {
		return true
	}
	d, ok := j.e.opts.Node.FenceDeadline()
	return !ok || !time.Now().Before(d)
}

// work runs a granted item with its retries and says how it ended. The
// work stops at once when the session ends (the instance may no longer own
// the item) or the engine is killed.
func (j *jobLoop) work(g *coord.Grant, job *config.Job, rc runner.Context, mapRev int64) (runner.Result, coord.Outcome) {
	e := j.e
	run, err := e.work, error(nil)
	if run == nil {
		run, err = j.runners.get(job, scriptEnv{watchdog: e.opts.Watchdog, cgroups: e.opts.Cgroups, starts: e.starts, log: e.log})
	}
	if err != nil {
		j.log.Error("job work is not runnable", "err", err)
		now := time.Now()
		return runner.Result{Err: err, ExitCode: -1, End: now},
			coord.Outcome{State: keyspace.StateFailed, ExitCode: -1, Err: err.Error(), Start: now, End: now}
	}
	if d, ok := e.opts.Node.FenceDeadline(); ok && e.opts.Watchdog != nil {
		e.opts.Watchdog.SetDeadline(d) // the newest, not the last one polled
	}
	runCtx, cancel := context.WithCancelCause(g.Ctx)
	defer cancel(nil)
	defer j.runs.register(rc.Item, g.Fence, cancel, e.opts.Now())()
	stop := context.AfterFunc(e.killCtx, func() { cancel(context.Cause(e.killCtx)) })
	defer stop()
	t := &tries{j: j, run: run, job: job, lg: j.openRunLog(job, rc)}
	if t.lg != nil {
		rc.Output = t.lg
	}
	stream := job.Dataflow != nil && job.Dataflow.Streaming
	if stream {
		rc.Iteration = 1
	}
	first := time.Now()
	res := t.try(runCtx, rc)
	if stream {
		res, rc.Iteration = t.streamOn(runCtx, rc, res, mapRev, first)
	}
	if !t.started.IsZero() {
		res.Started = t.started // the first try's start: the trigger delay ends there
	}
	out := j.outcome(runCtx, g, res, t.started)
	out.Iterations = rc.Iteration
	if stream {
		out.Start = first
	}
	if len(t.spans) > 1 && !stream { // retried: the record spans every try, from the first's start
		out.Start = t.spans[0].Start
	}
	if t.lg != nil {
		out.LastLine = t.lg.LastLine()
		j.closeRunLog(t.lg, rc.Item, out, t.spans)
	}
	return res, out
}

// tries runs one item's work with the job's retries, writing what it does
// to the run log lg (nil: none); started is when the first try that
// started did (zero: none did).
type tries struct {
	j       *jobLoop
	run     runFunc
	job     *config.Job
	lg      *runlog.Log
	started time.Time
	spans   []runlog.Try // each try that started
}

// try runs the work for rc, again while it fails in a way worth retrying,
// up to the job's retries, each after its backoff.
func (t *tries) try(ctx context.Context, rc runner.Context) runner.Result {
	res := t.once(ctx, rc)
	for retry := 0; !res.OK && res.Retryable && retry < t.job.Retries && ctx.Err() == nil; retry++ {
		wait := min(time.Duration(t.job.RetryBackoff)<<retry, time.Duration(config.MaxRetryBackoff))
		t.j.log.Warn("run failed; retrying", "item", rc.Item, "err", res.Err, "retry", retry+1, "in", wait)
		rc.Retry = retry + 1
		if t.lg != nil {
			t.lg.Note(fmt.Sprintf("retry %d in %s, after: %v", rc.Retry, wait, res.Err))
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		res = t.once(ctx, rc)
	}
	return res
}

func (t *tries) once(ctx context.Context, rc runner.Context) runner.Result {
	res := t.run(ctx, rc)
	if t.started.IsZero() {
		t.started = res.Started
	}
	if !res.Started.IsZero() {
		t.spans = append(t.spans, runlog.Try{Start: res.Start, Finish: res.End})
	}
	return res
}

// streamOn runs a streaming run's next iterations while the work says more
// may remain, res being the first's, and returns the last one's result and
// number. Between iterations it stops when the run may no longer own the
// item, a new map gave it to another instance, or a limit is reached
// (docs/dependencies.md, Dataflow); the work resumes from its own cursor
// next time.
func (t *tries) streamOn(ctx context.Context, rc runner.Context, res runner.Result, mapRev int64, first time.Time) (runner.Result, int) {
	for res.OK && res.More {
		why := t.j.streamStop(ctx, t.job, mapRev, rc.Item, rc.Iteration, first)
		if why != "" {
			if t.lg != nil {
				t.lg.Note(fmt.Sprintf("streaming stopped after %d iterations: %s", rc.Iteration, why))
			}
			t.j.log.Info("streaming run stopped", "item", rc.Item, "iterations", rc.Iteration, "why", why)
			break
		}
		rc.Iteration++
		rc.Retry = 0
		if t.lg != nil {
			t.lg.Note(fmt.Sprintf("iteration %d", rc.Iteration))
		}
		res = t.try(ctx, rc)
	}
	return res, rc.Iteration
}

// outcome is how the run granted g ended, from the work's result res and
// why runCtx, the run's context, ended if it did; started is when its
// first try started (zero: none did).
func (j *jobLoop) outcome(runCtx context.Context, g *coord.Grant, res runner.Result, started time.Time) coord.Outcome {
	out := coord.Outcome{State: keyspace.StateDone, ExitCode: res.ExitCode, HTTPStatus: res.HTTPStatus, Output: res.Output, Start: res.Start, End: res.End}
	if res.End.IsZero() {
		out.End = time.Now()
	}
	if !res.OK && runCtx.Err() == nil && j.pastFenceDeadline(g) {
		// The watchdog kills the work at the fence deadline, and the
		// session's own timer cancels runCtx at the same moment: when the
		// work died first, it was the fence, not a failure of the work.
		select {
		case <-runCtx.Done():
		case <-time.After(time.Second):
		}
	}
	kill, byOperator := killedBy(context.Cause(runCtx))
	switch {
	case res.OK: // the work ended by itself: whatever happened since, it is done
	case byOperator:
		// Stopped on purpose, started or not: never run again for it.
		out.State, out.Reason, out.KilledBy = keyspace.StateKilled, keyspace.ReasonOperator, kill.by
		if kill.reason != "" {
			out.Reason = kill.reason
		}
		out.Err = kill.Error()
	case runCtx.Err() != nil || errors.Is(res.Err, runner.ErrKilled):
		out.State, out.Reason = keyspace.StateKilled, keyspace.ReasonFence
		if errors.Is(context.Cause(runCtx), errShutdown) {
			out.Reason = keyspace.ReasonShutdown
		}
		out.Err = fmt.Sprint(res.Err)
		if runCtx.Err() != nil {
			out.Err = fmt.Sprint(context.Cause(runCtx))
		}
		if started.IsZero() {
			out.Reason = keyspace.ReasonNotStarted
		}
	case errors.Is(res.Err, runner.ErrTimeout):
		out.State, out.Reason, out.Err = keyspace.StateKilled, keyspace.ReasonTimeout, res.Err.Error()
	case !res.OK:
		out.State, out.Err = keyspace.StateFailed, fmt.Sprint(res.Err)
	}
	return out
}

// openRunLog opens the run log of rc; nil when there is none (no store, or
// it failed: the run goes on, its tail is still in the history).
func (j *jobLoop) openRunLog(job *config.Job, rc runner.Context) *runlog.Log {
	if j.e.opts.RunLogs == nil {
		return nil
	}
	r := job.LogRetention
	lg, err := j.e.opts.RunLogs.Create(runlog.Header{
		Job: rc.Job, Item: rc.Item, Fence: rc.Fence, Fire: rc.Fire, Attempt: rc.Attempt, Source: rc.Source, Instance: rc.Instance, StartAt: rc.StartAt,
		By: rc.TriggeredBy, Param: rc.TriggerParameter,
	}, runlog.Retention{MaxAge: time.Duration(r.MaxAge), MaxBytesPerRun: int64(r.MaxBytesPerRun), MaxTotalBytes: int64(r.MaxTotalBytes)})
	if err != nil {
		j.log.Warn("run without a run log; its output's tail is in its history", "item", rc.Item, "err", err)
		return nil
	}
	return lg
}

// closeRunLog writes how the run ended (its end record, from which the
// run's history is read once etcd's record of it has rotated out) and
// closes its log; tries are the spans of the tries that started.
func (j *jobLoop) closeRunLog(lg *runlog.Log, item int, out coord.Outcome, tries []runlog.Try) {
	end := runlog.End{State: out.State, Reason: string(out.Reason), ExitCode: out.ExitCode, HTTPStatus: out.HTTPStatus, Err: out.Err,
		Start: out.Start, Finish: out.End, Last: out.LastLine}
	if len(tries) > 1 {
		end.Tries = tries
	}
	werr := lg.Err() // why it stopped (a full disk), or its write error
	err := lg.Close(end.String())
	if err == nil || (werr != nil && err.Error() == werr.Error()) {
		err = werr
	}
	if err != nil {
		j.log.Warn("run log incomplete", "item", item, "err", err)
	}
}

// streamStop says why a streaming run stops before its next iteration, ""
// when it goes on: its context ended (fence, shutdown, kill), a map newer
// than the claim's gives the item to another instance, or a limit of the
// job's dataflow was reached.
func (j *jobLoop) streamStop(ctx context.Context, job *config.Job, mapRev int64, item, done int, first time.Time) string {
	d := job.Dataflow
	switch {
	case ctx.Err() != nil:
		return "the run was stopped"
	case j.e.stopping.Err() != nil:
		return "shardd is stopping: the item's next run continues from the work's cursor"
	case done >= d.MaxIterations:
		return fmt.Sprintf("dataflow.maxIterations (%d) reached", d.MaxIterations)
	case time.Since(first) >= time.Duration(d.MaxDuration):
		return fmt.Sprintf("dataflow.maxDuration (%s) reached", d.MaxDuration)
	}
	if v, ok := j.e.opts.Node.View(j.name); !ok || v.MapRev != mapRev && !stillMine(v, j.e.opts.Node.ID(), item) {
		return "a new shard map gives the item to another instance: its next run there continues from the work's cursor"
	}
	return ""
}

// stillMine reports whether the map of v leaves item with instance me: a
// sharding strategy's map that assigns it to me. A per-fire strategy's or a
// runtime route's map names no owner of the next run: any change may move it.
func stillMine(v coord.JobView, me string, item int) bool {
	m := v.Map
	if m == nil || m.PerFire || v.Job == nil || v.Job.Shard.Runtime() {
		return false
	}
	return slices.Contains(m.ItemsOf(me), item)
}
