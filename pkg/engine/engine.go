package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/runlog"
	"github.com/shardd/shardd/pkg/runner"
	"github.com/shardd/shardd/pkg/steps"
)

// Options configure an Engine.
type Options struct {
	Node   Node
	Logger *slog.Logger
	// Now is the clock decisions are made with; default time.Now.
	Now func() time.Time
	// TTL of the node's session; the catch-up window of a job that sets none is max(1m, 3 x TTL).
	TTL time.Duration
	// MaxConcurrency caps the items running at once on this instance, all
	// jobs together; 0 means no cap.
	MaxConcurrency int
	// ShutdownGrace is how long Run waits for running items after its
	// context ends before it kills them (recorded KILLED, reason shutdown).
	// Default 10s.
	ShutdownGrace time.Duration
	// Sweep and SweepRate shape the safety net: a reconcile of each job
	// that nothing woke, so that an event this process missed (a bug, not
	// a lost watch event: a gap of the watch wakes every job it could
	// concern) cannot lose a fire. Each job is swept at most once per Sweep
	// (default 10s), and at most SweepRate jobs a second all together
	// (default 50): with more jobs than Sweep x SweepRate, each is swept
	// less often, so that the net costs the same at 100,000 jobs as at 500.
	// Every decision the sweep could make is woken by its own event
	// (doc.go, "What wakes a job"). A negative Sweep turns the net off
	// (tests that prove the events).
	Sweep     time.Duration
	SweepRate int
	// Watchdog kills scripts when shardd dies or its session's fence
	// deadline passes (see runner.WatchdogMain); nil runs them unwatched.
	Watchdog *runner.Watchdog
	// Cgroups, if set, confines each script run to a cgroup of its own.
	Cgroups *runner.Cgroups
	// MaxStarts bounds the scripts starting at once (forked, their gate
	// registered; runner.Starts), taken in fire-time order. 0: the
	// default, defaultMaxStarts; negative: no bound.
	MaxStarts int
	// RunLogs, if set, keeps each run's whole output in a file (see package
	// runlog), with the job's logRetention.
	RunLogs *runlog.Store
	// Skew returns this host's clock skew against etcd (etcd minus here)
	// and whether it is known; nil or unknown skips maxTimeDiffSeconds.
	Skew func() (time.Duration, bool)
	// Observe, if set, is called after every run (metrics, benchmarks);
	// OnStart before every run's work begins; OnSkipped when fires are
	// recorded as skipped or coalesced.
	Observe   func(Run)
	OnStart   func(job string)
	OnSkipped func(job string, fires int)

	// forgetNotes, a test's fault, makes this instance record outcomes
	// and never note them in their fires' barriers: as if it died after
	// each outcome, before its note (deps.go).
	forgetNotes bool
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
	// Killed is set when the run was stopped before it ended (KILLED:
	// fence, shutdown or operator; a timeout is a failure).
	Killed bool
	// Duration covers the run with its retries.
	Duration time.Duration
}

// Engine runs the owned items of every job of its node.
type Engine struct {
	opts   Options
	log    *slog.Logger
	global semaphore // --max-concurrency; nil: no cap
	runs   sync.WaitGroup

	killCtx context.Context // cancelled by Kill: running items stop
	kill    context.CancelCauseFunc
	// recordCtx bounds the writes of outcomes; cancelled a little after Kill.
	recordCtx     context.Context
	stopRecording context.CancelFunc
	// stopping is cancelled when Run's context ends; graceEnd, set just
	// before, is when the shutdown grace runs out (see outcomeCtx).
	stopping     context.Context
	stopShutdown context.CancelFunc
	graceEnd     time.Time
	resync       chan struct{} // buffered(1): the node's job set changed

	mu    sync.Mutex
	jobs  map[string]*jobLoop
	local map[string]*localRuns // by job; kept when a job's loop stops
	// work, if set, runs every item instead of the job's script or hook
	// (tests of the reconcile).
	work runFunc
	// waiting are the loops that found no free concurrency slot; the next
	// slot given back wakes them.
	waiting map[*jobLoop]struct{}
	// ready measures how long runs take to be ready, and due counts the
	// runs due at each coming fire, for the lead of claims ahead of it.
	ready readyLatency
	due   dueCalendar
	// starts bounds the scripts starting at once (Options.MaxStarts).
	starts *runner.Starts
	// sched runs the jobs' reconciles (pkg/steps).
	sched *steps.Scheduler
}

// lead is how long before a fire of due runs here its items are claimed
// and prepared.
func (e *Engine) lead(due int) time.Duration { return e.ready.lead(due) }

// releaseSlots gives back a run's concurrency slots and wakes the loops
// that wanted one.
func (e *Engine) releaseSlots(sems ...semaphore) {
	release(sems...)
	e.mu.Lock()
	waiting := e.waiting
	e.waiting = map[*jobLoop]struct{}{}
	e.mu.Unlock()
	for j := range waiting {
		j.poke()
	}
}

// waitSlot asks for j to be woken when a slot is given back.
func (e *Engine) waitSlot(j *jobLoop) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.waiting[j] = struct{}{}
}

// localRuns returns the runs of job in this process.
func (e *Engine) localRuns(job string) *localRuns {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.local[job]
	if !ok {
		r = &localRuns{running: map[int]bool{}, ended: map[int]uint64{}}
		e.local[job] = r
	}
	return r
}

// New returns an engine; call Run.
func New(opts Options) *Engine {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.ShutdownGrace <= 0 {
		opts.ShutdownGrace = 10 * time.Second
	}
	if opts.Sweep == 0 {
		opts.Sweep = 10 * time.Second
	}
	if opts.SweepRate <= 0 {
		opts.SweepRate = 50
	}
	if opts.MaxStarts == 0 {
		opts.MaxStarts = defaultMaxStarts()
	}
	e := &Engine{opts: opts, log: opts.Logger, global: newSemaphore(opts.MaxConcurrency), starts: runner.NewStarts(opts.MaxStarts),
		resync: make(chan struct{}, 1), jobs: map[string]*jobLoop{}, local: map[string]*localRuns{}, waiting: map[*jobLoop]struct{}{}}
	e.sched = steps.New(opts.Now)
	e.killCtx, e.kill = context.WithCancelCause(context.Background())
	e.recordCtx, e.stopRecording = context.WithCancel(context.Background())
	e.stopping, e.stopShutdown = context.WithCancel(context.Background())
	return e
}

// recordWindow is how long a run that ends at shutdown has for its outcome
// to be written, when the shutdown grace leaves it less.
const recordWindow = 3 * time.Second

// outcomeCtx bounds the writes of one run's outcome (its record, its note
// of a parent fire). Until shutdown they are retried until they land: the
// outcome is known nowhere else. At shutdown, an etcd that does not answer
// (no quorum, unreachable) must not hold the stop: the writes go on until
// the shutdown grace ends, or recordWindow after the call when that is
// later (a run killed when the grace ran out still records KILLED if etcd
// answers). An outcome not written is logged; the item's next owner finds
// the run's claim without an outcome (docs/design.md, "Shutdown").
func (e *Engine) outcomeCtx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(e.recordCtx)
	called := time.Now()
	stop := context.AfterFunc(e.stopping, func() {
		d := max(time.Until(e.graceEnd), time.Until(called.Add(recordWindow)))
		time.AfterFunc(d, cancel)
	})
	return ctx, func() { stop(); cancel() }
}

// errShutdown is the cause of a run killed at shutdown.
var errShutdown = errors.New("engine: killed at shutdown")

// Run fires every job until ctx is done. Then it starts no run, waits up to
// ShutdownGrace for the running items, kills those still running, waits
// for their outcomes to be recorded, and returns.
func (e *Engine) Run(ctx context.Context) error {
	loopCtx, stopLoops := context.WithCancel(ctx)
	schedDone := make(chan struct{})
	go func() {
		defer close(schedDone)
		e.sched.Run(loopCtx)
	}()
	feedCtx, stopFeed := context.WithCancel(context.Background())
	feedDone := make(chan struct{})
	go func() {
		defer close(feedDone)
		e.followSession(feedCtx)
	}()
	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		e.sweep(loopCtx)
	}()

	unfollow := map[string]func(){}
	reload := false // matchJobs after the first: the session may hold claims of a loop that stopped
	matchJobs := func() {
		want := map[string]bool{}
		for _, name := range e.opts.Node.Jobs() {
			want[name] = true
			if _, ok := unfollow[name]; ok {
				continue
			}
			j := newJobLoop(e, name)
			// A job added back by a reload reads its items at once, even
			// if idle here: a claim of its old loop may have applied
			// while no loop was subscribed to its marker's event.
			j.mustRead.Store(reload)
			j.slot = e.sched.NewSlot(loopCtx, j.reconcile)
			e.mu.Lock()
			e.jobs[name] = j
			e.mu.Unlock()
			// Subscribed first, reconciled second: every change after the
			// first reconcile's read wakes it.
			unfollow[name] = j.follow()
			e.sched.Add(j.slot)
		}
		for name, stop := range unfollow {
			if want[name] {
				continue
			}
			stop()
			e.mu.Lock()
			j := e.jobs[name]
			delete(e.jobs, name)
			e.mu.Unlock()
			e.sched.Remove(j.slot) // its running items go on; they finish or die with the session
			e.due.forget(j)
			delete(unfollow, name)
		}
	}
	matchJobs()
	reload = true
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-e.resync:
			matchJobs()
		}
	}
	stopLoops()
	<-schedDone
	<-sweepDone
	for _, stop := range unfollow {
		stop()
	}

	// No new runs. Give the running ones their grace, then kill them.
	e.graceEnd = time.Now().Add(e.opts.ShutdownGrace)
	e.stopShutdown() // outcomes are written within the grace (outcomeCtx)
	finished := make(chan struct{})
	go func() { e.runs.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(e.opts.ShutdownGrace):
		e.log.Warn("shutdown grace ran out: killing running items; outcomes etcd has not taken are given up", "grace", e.opts.ShutdownGrace)
		e.kill(errShutdown) // their outcomes get outcomeCtx's window, however long the kill takes
		<-finished
	case <-e.killCtx.Done():
		<-finished
	}
	stopFeed()
	<-feedDone
	return nil
}

// followSession keeps the watchdog's deadline at the session's fence
// deadline (when the session is gone the last one stays, and passes) and
// wakes every job when a new session comes up: fires may have come while
// there was none.
func (e *Engine) followSession(ctx context.Context) {
	var last context.Context
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		if d, ok := e.opts.Node.FenceDeadline(); ok && e.opts.Watchdog != nil {
			e.opts.Watchdog.SetDeadline(d)
		}
		if s, ok := e.opts.Node.Session(); ok && s != last {
			last = s
			e.wakeAll()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (e *Engine) wakeAll() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, j := range e.jobs {
		j.poke()
	}
}

// Resync makes a running engine start and stop job loops to match the
// node's jobs (after a reload).
func (e *Engine) Resync() {
	select {
	case e.resync <- struct{}{}:
	default:
	}
}

// Kill stops every running item at once (a forced shutdown); their
// outcomes are recorded as KILLED for a few more seconds.
func (e *Engine) Kill() {
	e.kill(errShutdown)
	time.AfterFunc(3*time.Second, e.stopRecording)
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

// window is how old a missed fire may be and still run.
func (e *Engine) window() time.Duration { return max(time.Minute, 3*e.opts.TTL) }
