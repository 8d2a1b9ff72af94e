package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/runner"
	"github.com/shardd/shardd/pkg/schedule"
	"github.com/shardd/shardd/pkg/shard"
)

// Coordinator is what the engine needs of coord.Node.
type Coordinator interface {
	ID() string
	Jobs() []string
	View(job string) (coord.JobView, bool)
	Session() (context.Context, bool)
	FenceDeadline() (time.Time, bool)
	ReadItems(ctx context.Context, job string) (coord.JobItems, error)
	ReadItem(ctx context.Context, job string, item int) (coord.ItemState, error)
	Claim(ctx context.Context, c coord.Claim) (*coord.Grant, error)
	Complete(ctx context.Context, g *coord.Grant, state string, exitCode int, errText, output string, start, end time.Time) error
	Skip(ctx context.Context, job string, item int, fire time.Time, skipped int, prev coord.ItemState) error
	OnTrigger(job string, fn func(coord.Trigger)) (cancel func())
	History(ctx context.Context, job string) ([]coord.ItemRecord, error)
}

// Options configure an Engine.
type Options struct {
	Node   Coordinator
	Logger *slog.Logger
	Now    func() time.Time
	// TTL of the node's session; the misfire window is max(1m, 3 x TTL).
	TTL time.Duration
	// MaxConcurrency caps the items running at once on this instance, all
	// jobs together; 0 means no cap.
	MaxConcurrency int
	// Watchdog kills scripts when shardd dies or its session's fence
	// deadline passes (see runner.WatchdogMain); nil runs them unwatched.
	Watchdog *runner.Watchdog
	// Skew returns this host's clock skew against etcd (etcd minus here)
	// and whether it is known; nil or unknown skips maxTimeDiffSeconds.
	Skew func() (time.Duration, bool)
	// Observe, if set, is called after every run (metrics, benchmarks);
	// OnStart before every run's work begins; OnSkipped when fires are
	// recorded as skipped or coalesced.
	Observe   func(Run)
	OnStart   func(job string)
	OnSkipped func(job string, fires int)
}

// Run describes one finished execution, for Options.Observe.
type Run struct {
	Job    string
	Item   int
	Fire   time.Time
	Source string
	// Started is when the work began (see runner.Result.Started).
	Started time.Time
	Result  runner.Result
	// Killed is set when the run was stopped because its session ended (or
	// at a forced shutdown); it was not recorded.
	Killed bool
	// Duration covers the run with its retries.
	Duration time.Duration
}

// Engine runs the owned items of every job of its node.
type Engine struct {
	opts   Options
	log    *slog.Logger
	global chan struct{} // nil: no global cap

	mu    sync.Mutex
	wakes map[string]chan struct{} // per job, buffered(1)
	wg    sync.WaitGroup           // item workers

	killCtx context.Context // cancelled by Kill
	kill    context.CancelFunc
	resync  chan struct{} // buffered(1): the node's job set changed
}

// New returns an engine; call Run.
func New(opts Options) *Engine {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	e := &Engine{opts: opts, log: opts.Logger, wakes: map[string]chan struct{}{}}
	e.killCtx, e.kill = context.WithCancel(context.Background())
	e.resync = make(chan struct{}, 1)
	if opts.MaxConcurrency > 0 {
		e.global = make(chan struct{}, opts.MaxConcurrency)
	}
	return e
}

// OnMap is coord.Options.OnMap: it wakes the job's loop to look at the new map.
func (e *Engine) OnMap(job string, _ *coord.ShardMap) { e.wake(job) }

func (e *Engine) wake(job string) {
	select {
	case e.wakeChan(job) <- struct{}{}:
	default:
	}
}

func (e *Engine) wakeChan(job string) chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, ok := e.wakes[job]
	if !ok {
		c = make(chan struct{}, 1)
		e.wakes[job] = c
	}
	return c
}

// Run fires every job until ctx is done, then waits for running items: they
// finish, or are killed when the node's session ends.
func (e *Engine) Run(ctx context.Context) error {
	var feeder sync.WaitGroup
	stopFeed := func() {}
	if e.opts.Watchdog != nil {
		// Keep the watchdog's deadline at the session's fence deadline; when
		// the session is gone the last one stays, and passes.
		fctx, cancel := context.WithCancel(context.Background())
		stopFeed = cancel
		feeder.Add(1)
		go func() {
			defer feeder.Done()
			for {
				if d, ok := e.opts.Node.FenceDeadline(); ok {
					e.opts.Watchdog.SetDeadline(d)
				}
				if !sleepCtx(fctx, 50*time.Millisecond) {
					return
				}
			}
		}()
	}
	type loop struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	loops := map[string]*loop{}
	stop := func(name string) {
		l := loops[name]
		l.cancel()
		<-l.done
		delete(loops, name)
	}
	resync := func() {
		want := map[string]bool{}
		for _, name := range e.opts.Node.Jobs() {
			want[name] = true
			if _, ok := loops[name]; ok {
				continue
			}
			lctx, cancel := context.WithCancel(ctx)
			l := &loop{cancel: cancel, done: make(chan struct{})}
			loops[name] = l
			go func() {
				defer close(l.done)
				e.jobLoop(lctx, name)
			}()
		}
		for name := range loops {
			if !want[name] {
				stop(name) // its running items go on; they finish or die with the session
			}
		}
	}
	resync()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-e.resync:
			resync()
		}
	}
	for name := range loops {
		stop(name)
	}
	e.wg.Wait() // running items finish, or die with their session
	stopFeed()
	feeder.Wait()
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// jobState is the engine's local state of one job's items.
type jobState struct {
	mu      sync.Mutex
	busy    map[int]*itemSlot
	sem     chan struct{} // maxConcurrency of the job, nil: none
	workers map[string]*workerCache
}

// itemSlot is a busy item: its worker runs, and pending is the latest fire
// that came meanwhile (zero: none).
type itemSlot struct {
	pending time.Time
	skipped int // fires that came while busy and were coalesced or dropped
}

func (e *Engine) jobLoop(ctx context.Context, name string) {
	log := e.log.With("job", name)
	js := &jobState{busy: map[int]*itemSlot{}, workers: map[string]*workerCache{}}
	wake := e.wakeChan(name)
	triggers := make(chan coord.Trigger, 16)
	stopTriggers := e.opts.Node.OnTrigger(name, func(tr coord.Trigger) {
		select {
		case triggers <- tr:
		default:
			log.Warn("too many triggers at once; dropping one", "trigger", tr.ID)
		}
	})
	defer stopTriggers()
	var owned []int
	last := e.opts.Now()
	for {
		v, ok := e.opts.Node.View(name)
		if !ok {
			return
		}
		job := v.Job
		if job.MaxConcurrency > 0 && (js.sem == nil || cap(js.sem) != job.MaxConcurrency) {
			js.sem = make(chan struct{}, job.MaxConcurrency)
		}
		var next time.Time
		if job.Schedule != nil {
			next = job.Schedule.Next(last)
		}
		var timer <-chan time.Time
		var t *time.Timer
		if !next.IsZero() {
			t = time.NewTimer(next.Sub(e.opts.Now()))
			timer = t.C
		}
		stopTimer := func() {
			if t != nil {
				t.Stop()
			}
		}
		select {
		case <-ctx.Done():
			stopTimer()
			return
		case tr := <-triggers:
			stopTimer()
			mine := e.ownedAt(v, tr.Fire, job.Schedule)
			var items []int
			for _, item := range mine {
				if len(tr.Items) == 0 || slices.Contains(tr.Items, item) {
					items = append(items, item)
				}
			}
			log.Info("manual trigger", "trigger", tr.ID, "items", items, "by", tr.By)
			for _, item := range items {
				e.manual(ctx, js, v, item, tr.Fire)
			}
		case <-wake:
			stopTimer()
			// A new map (or a new session): take over items that are new to us.
			now := e.opts.Now()
			mine := e.ownedAt(v, now, job.Schedule)
			var acquired []int
			for _, item := range mine {
				if !slices.Contains(owned, item) {
					acquired = append(acquired, item)
				}
			}
			owned = mine
			if len(acquired) > 0 && !v.Map.PerFire {
				log.Debug("acquired items", "items", acquired, "epoch", v.Map.Epoch)
				e.dispatch(ctx, js, v, acquired, time.Time{})
			}
		case <-timer:
			now := e.opts.Now()
			fire, missed := next, 0
			for f := job.Schedule.Next(fire); !f.IsZero() && !f.After(now); f = job.Schedule.Next(f) {
				fire, missed = f, missed+1 // this host was late (paused, overloaded): coalesce
			}
			if missed > 0 {
				log.Warn("fires were late on this host; running the latest", "fire", fire, "missed", missed)
			}
			last = fire
			if _, up := e.opts.Node.Session(); !up {
				log.Debug("no session: not firing", "fire", fire)
				continue
			}
			if err := e.checkClock(job); err != nil {
				log.Error("refusing to fire", "fire", fire, "err", err)
				continue
			}
			if job.Shard.Runtime() {
				e.wg.Add(1)
				go func() {
					defer e.wg.Done()
					e.route(ctx, js, v, fire)
				}()
				continue
			}
			owned = e.ownedAt(v, fire, job.Schedule)
			e.dispatch(ctx, js, v, owned, fire)
		}
	}
}

// checkClock enforces the job's maxTimeDiffSeconds.
func (e *Engine) checkClock(job *config.Job) error {
	if job.MaxTimeDiffSeconds < 0 || e.opts.Skew == nil {
		return nil
	}
	skew, ok := e.opts.Skew()
	if !ok {
		return nil
	}
	if limit := time.Duration(job.MaxTimeDiffSeconds) * time.Second; skew > limit || -skew > limit {
		return fmt.Errorf("this host's clock is off by %s against etcd, more than maxTimeDiffSeconds %d allows; fix its time sync (NTP)", skew.Round(time.Millisecond), job.MaxTimeDiffSeconds)
	}
	return nil
}

// ownedAt returns the items this instance owns in v for a fire at t.
func (e *Engine) ownedAt(v coord.JobView, t time.Time, sched schedule.Schedule) []int {
	m := v.Map
	if m == nil || m.Disabled || v.Job.Disabled {
		return nil
	}
	if !m.PerFire {
		return m.ItemsOf(e.opts.Node.ID())
	}
	seq := int64(0)
	if sched != nil {
		seq = schedule.Seq(sched, t)
	}
	a, err := v.Job.Shard.Assign(shard.Input{Instances: m.Instances, Job: v.Job.Name, Total: v.Job.ShardingTotalCount, Fire: shard.Fire{Time: t, Seq: seq}})
	if err != nil {
		return nil
	}
	return a.ByInstance()[e.opts.Node.ID()]
}

// dispatch hands items to their workers for fire (zero: acquisition). For
// a fire, the job's listeners run before the first and after the last of
// the items started for it.
func (e *Engine) dispatch(ctx context.Context, js *jobState, v coord.JobView, items []int, fire time.Time) {
	ls := v.Job.Listeners
	var group *sync.WaitGroup
	var started []int
	if ls != nil && !fire.IsZero() && len(items) > 0 {
		e.listener(v.Job, "BEFORE", ls.Before, fire, items)
		group = &sync.WaitGroup{}
		defer func() {
			if len(started) == 0 {
				return
			}
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				group.Wait()
				e.listener(v.Job, "AFTER", ls.After, fire, started)
			}()
		}()
	}
	// One read for all the items; workers re-read their own item later.
	snap, err := e.opts.Node.ReadItems(ctx, v.Job.Name)
	if err != nil {
		e.log.Warn("read item states; skipping this fire", "job", v.Job.Name, "fire", fire, "err", err)
		return
	}
	for _, item := range items {
		js.mu.Lock()
		if slot, busy := js.busy[item]; busy {
			if !fire.IsZero() {
				if !slot.pending.IsZero() {
					slot.skipped++ // an older pending fire is coalesced into this one
				}
				slot.pending = fire
			}
			js.mu.Unlock()
			continue
		}
		slot := &itemSlot{}
		js.busy[item] = slot
		js.mu.Unlock()
		firstPass := func() {}
		if group != nil {
			group.Add(1)
			started = append(started, item)
			firstPass = sync.OnceFunc(group.Done)
		}
		st := snap.Items[item]
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			defer firstPass()
			e.itemWorker(ctx, js, v.Job.Name, item, fire, &st, firstPass)
		}()
	}
}

// manual runs item once for a trigger at fire, unless it is busy or a
// later fire was claimed already.
func (e *Engine) manual(ctx context.Context, js *jobState, v coord.JobView, item int, fire time.Time) {
	log := e.log.With("job", v.Job.Name, "item", item)
	js.mu.Lock()
	if _, busy := js.busy[item]; busy {
		js.mu.Unlock()
		log.Info("item is running; manual trigger ignored for it")
		return
	}
	js.busy[item] = &itemSlot{}
	js.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer func() {
			js.mu.Lock()
			delete(js.busy, item)
			js.mu.Unlock()
		}()
		st, err := e.opts.Node.ReadItem(ctx, v.Job.Name, item)
		if err != nil {
			log.Warn("read item state", "err", err)
			return
		}
		switch {
		case st.RunningBy != "":
			log.Info("item is running elsewhere; manual trigger ignored for it", "running_on", st.RunningBy)
		case st.Record != nil && !fire.After(st.Record.Fire):
			log.Info("a later fire was claimed already; manual trigger ignored for it", "claimed", st.Record.Fire)
		default:
			e.execute(ctx, js, v, item, st, fire, 1, coord.SourceManual, 0)
		}
	}()
}

// itemWorker plans and runs one item until nothing is pending.
// st, if not nil, is the item's state read for this dispatch; firstPass is
// called once the due fire has been handled.
func (e *Engine) itemWorker(ctx context.Context, js *jobState, name string, item int, due time.Time, st *coord.ItemState, firstPass func()) {
	log := e.log.With("job", name, "item", item)
	defer func() {
		js.mu.Lock()
		delete(js.busy, item)
		js.mu.Unlock()
	}()
	extraSkipped := 0
	for attempt := 0; attempt < 50; attempt++ { // bounded: every pass claims, waits or returns
		v, ok := e.opts.Node.View(name)
		if !ok || ctx.Err() != nil { // shutting down: no new runs
			return
		}
		job := v.Job
		p := policy{schedule: job.Schedule, failover: job.Failover, misfire: job.Misfire, window: max(time.Minute, 3*e.opts.TTL)}
		if st == nil {
			s, err := e.opts.Node.ReadItem(ctx, name, item)
			if err != nil {
				log.Warn("read item state", "err", err)
				return // the next fire or map change tries again
			}
			st = &s
		}
		cur := *st
		st = nil // every later pass reads again
		if cur.Disabled {
			return
		}
		d := plan(cur, p, due, e.opts.Now())
		switch {
		case d.wait:
			if !job.Misfire && !due.IsZero() {
				log.Info("item still running elsewhere; fire skipped (misfire: false)", "fire", due, "running_on", cur.RunningBy)
				due = time.Time{}
			}
			if !e.waitReleased(ctx, name, item) {
				return
			}
			continue
		case d.failover:
			if !e.execute(ctx, js, v, item, cur, cur.Record.Fire, cur.Record.Attempt+1, coord.SourceFailover, 0) {
				return
			}
			continue // then plan again: missed fires, the due fire
		case !d.run.IsZero():
			e.execute(ctx, js, v, item, cur, d.run, 1, d.source, d.skipped+extraSkipped)
		case d.skipped > 0:
			if err := e.opts.Node.Skip(ctx, name, item, d.skipTo, d.skipped, cur); err != nil && !errors.Is(err, coord.ErrClaimLost) {
				log.Warn("record skipped fires", "err", err)
			} else if err == nil {
				log.Info("fires skipped by misfire policy", "skipped", d.skipped, "through", d.skipTo)
				if e.opts.OnSkipped != nil {
					e.opts.OnSkipped(name, d.skipped)
				}
			}
		}
		firstPass()
		// Anything pending? A fire came while this one ran.
		js.mu.Lock()
		slot := js.busy[item]
		due, extraSkipped = slot.pending, slot.skipped
		slot.pending, slot.skipped = time.Time{}, 0
		js.mu.Unlock()
		if due.IsZero() {
			return
		}
		if !job.Misfire {
			log.Info("fire came while the item ran; skipped (misfire: false)", "fire", due)
			return
		}
	}
}

// waitReleased waits until the item's running marker is gone, polling
// briefly; it reports false when ctx ended or the item stays held too long
// (the next fire or map change tries again).
func (e *Engine) waitReleased(ctx context.Context, job string, item int) bool {
	deadline := e.opts.Now().Add(max(time.Minute, 3*e.opts.TTL))
	for e.opts.Now().Before(deadline) {
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		}
		st, err := e.opts.Node.ReadItem(ctx, job, item)
		if err == nil && st.RunningBy == "" {
			return true
		}
	}
	return false
}

// execute claims (item, fire) and, if the claim is won, runs it with its
// retries and records the outcome. It reports whether the run completed.
func (e *Engine) execute(ctx context.Context, js *jobState, v coord.JobView, item int, prev coord.ItemState, fire time.Time, attempt int, source string, skipped int) bool {
	job := v.Job
	log := e.log.With("job", job.Name, "item", item, "fire", fire.UTC(), "attempt", attempt, "source", source)
	if !e.acquire(ctx, js) {
		return false
	}
	defer e.release(js)
	g, err := e.opts.Node.Claim(ctx, coord.Claim{Job: job.Name, Item: item, Fire: fire, Attempt: attempt, Source: source, Skipped: skipped, Prev: prev, MapRev: mapRevFor(v, source)})
	if err != nil {
		if !errors.Is(err, coord.ErrClaimLost) && !errors.Is(err, coord.ErrNotUp) {
			log.Warn("claim", "err", err)
		} else {
			log.Debug("claim not won", "err", err)
		}
		return false
	}
	w, err := js.worker(job, e.opts.Watchdog, e.log)
	if err != nil {
		log.Error("job work is not runnable", "err", err)
		e.opts.Node.Complete(context.WithoutCancel(ctx), g, coord.StateFailed, -1, err.Error(), "", time.Now(), time.Now())
		return true
	}
	rc := runner.Context{
		Job: job.Name, Item: item, ItemParameter: job.ShardingItemParameters[item], Total: v.Map.Total,
		JobParameter: job.JobParameter, Fire: fire, Fence: g.Fence, Attempt: attempt, Instance: e.opts.Node.ID(), Source: source,
	}
	log.Info("run", "fence", g.Fence, "skipped", skipped)
	// The work stops at once when the session ends (it may no longer own the
	// item) or when the engine is killed.
	runCtx, cancel := context.WithCancelCause(g.Ctx)
	defer cancel(nil)
	stop := context.AfterFunc(e.killCtx, func() { cancel(errKilled) })
	defer stop()
	start := time.Now()
	if e.opts.OnStart != nil {
		e.opts.OnStart(job.Name)
	}
	observe := func(res runner.Result) {
		if e.opts.Observe != nil {
			e.opts.Observe(Run{Job: job.Name, Item: item, Fire: fire, Source: source, Started: res.Started, Result: res,
				Killed: runCtx.Err() != nil, Duration: time.Since(start)})
		}
	}
	if skipped > 0 && e.opts.OnSkipped != nil {
		e.opts.OnSkipped(job.Name, skipped)
	}
	res := w.run(runCtx, rc)
	for retry := 0; !res.OK && res.Retryable && retry < job.Retries && runCtx.Err() == nil; retry++ {
		wait := min(100*time.Millisecond<<retry, 10*time.Second)
		log.Warn("run failed; retrying", "err", res.Err, "retry", retry+1, "in", wait)
		select {
		case <-time.After(wait):
		case <-runCtx.Done():
		}
		res = w.run(runCtx, rc)
	}
	state, errText := coord.StateDone, ""
	if !res.OK {
		state, errText = coord.StateFailed, fmt.Sprint(res.Err)
	}
	if runCtx.Err() != nil {
		observe(res)
		log.Error("run killed", "err", context.Cause(runCtx))
		return false // the record stays RUNNING; failover decides
	}
	if err := e.opts.Node.Complete(context.WithoutCancel(ctx), g, state, res.ExitCode, errText, res.Output, start, res.End); err != nil {
		log.Warn("record the outcome", "err", err)
	}
	observe(res)
	if res.OK {
		log.Info("done", "fence", g.Fence, "duration", res.End.Sub(start).Round(time.Millisecond))
	} else {
		log.Warn("failed", "fence", g.Fence, "exit_code", res.ExitCode, "err", res.Err)
		e.notifyFailure(job, rc, res)
	}
	return true
}

var errKilled = errors.New("engine: killed at shutdown")

// Resync makes a running engine start and stop job loops to match the
// node's jobs (after a reload).
func (e *Engine) Resync() {
	select {
	case e.resync <- struct{}{}:
	default:
	}
}

// Kill stops every running item at once (a forced shutdown).
func (e *Engine) Kill() { e.kill() }

// mapRevFor is the map revision a claim is guarded by: the one the decision
// was made on, except for failovers and manual runs, which do not depend on
// the map's details beyond ownership.
func mapRevFor(v coord.JobView, source string) int64 {
	if source == coord.SourceManual {
		return 0
	}
	return v.MapRev
}

func (e *Engine) acquire(ctx context.Context, js *jobState) bool {
	if js.sem != nil {
		select {
		case js.sem <- struct{}{}:
		case <-ctx.Done():
			return false
		}
	}
	if e.global != nil {
		select {
		case e.global <- struct{}{}:
		case <-ctx.Done():
			if js.sem != nil {
				<-js.sem
			}
			return false
		}
	}
	return true
}

func (e *Engine) release(js *jobState) {
	if e.global != nil {
		<-e.global
	}
	if js.sem != nil {
		<-js.sem
	}
}

// workerCache holds a job's runner, built once per job definition.
type workerCache struct {
	run func(ctx context.Context, c runner.Context) runner.Result
}

func (js *jobState) worker(job *config.Job, wd *runner.Watchdog, log *slog.Logger) (*workerCache, error) {
	js.mu.Lock()
	defer js.mu.Unlock()
	if w, ok := js.workers[job.Hash()]; ok {
		return w, nil
	}
	w, err := newWorker(job, wd, log)
	if err != nil {
		return nil, err
	}
	js.workers[job.Hash()] = w
	return w, nil
}

func newWorker(job *config.Job, wd *runner.Watchdog, log *slog.Logger) (*workerCache, error) {
	switch {
	case job.Script != nil:
		s := runner.Script{
			Argv: job.Script.Command.Argv, Shell: job.Script.Command.Shell, Env: job.Script.Env,
			Workdir: job.Script.Workdir, Timeout: time.Duration(job.Timeout), Log: log, Watchdog: wd,
			ContextArg: job.Script.ContextArg,
		}
		return &workerCache{run: s.Run}, nil
	case job.HTTP != nil:
		timeout := time.Duration(job.HTTP.Timeout)
		if job.Timeout > 0 {
			timeout = min(timeout, time.Duration(job.Timeout))
		}
		var files runner.TLSFiles
		if t := job.HTTP.TLS; t != nil {
			files = runner.TLSFiles{CA: t.CA, Cert: t.Cert, Key: t.Key}
		}
		h, err := runner.NewHTTP(runner.HTTP{
			URL: job.HTTP.URL, Method: job.HTTP.Method, Headers: job.HTTP.Headers, Body: job.HTTP.Body,
			SuccessCodes: job.HTTP.SuccessCodes, Timeout: timeout,
		}, files)
		if err != nil {
			return nil, err
		}
		return &workerCache{run: h.Run}, nil
	}
	return nil, errors.New("job has neither script nor http")
}
