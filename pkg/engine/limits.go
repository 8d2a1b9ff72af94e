package engine

import (
	"runtime"
	"slices"
	"sync"
	"time"
)

// semaphore bounds concurrent runs; a nil semaphore bounds nothing. A run
// takes and gives back the same value, even when the job's maxConcurrency
// changes (and its semaphore is replaced) while it runs.
//
// Slots are taken when the reconcile decides on a run, never waited for: a
// decision that waited for a slot would be stale when it got one (a fire
// older than the catch-up window, a fire a later decision coalesces). An
// item without a slot is decided again when a slot is given back.
type semaphore chan struct{}

func newSemaphore(n int) semaphore {
	if n <= 0 {
		return nil
	}
	return make(semaphore, n)
}

// tryAcquire takes a slot of every semaphore, in order, without waiting,
// or none of them.
func tryAcquire(sems ...semaphore) bool {
	for i, s := range sems {
		if s == nil {
			continue
		}
		select {
		case s <- struct{}{}:
		default:
			release(sems[:i]...)
			return false
		}
	}
	return true
}

// release gives back a slot of every semaphore.
func release(sems ...semaphore) {
	for _, s := range sems {
		if s != nil {
			<-s
		}
	}
}

// defaultMaxStarts is the scripts that start at once: two per core.
// Measured on 2 cores (BenchmarkStorm/1000jobs-script-1instance, with
// SHARDD_BENCH_MAX_STARTS): p99 fire -> start 412-512 ms whether 1, 2, 4,
// 8, 16 or any number start at once, since a storm's scripts start within
// its lead, ahead of the fire; the bound costs nothing there and keeps a
// storm that outgrows its lead (or runs never claimed ahead: failovers,
// triggers) from holding a thousand half-started forks and their pipes at
// once, and lets the earliest fires start first.
func defaultMaxStarts() int { return maxStartsPerCPU * runtime.NumCPU() }

// maxStartsPerCPU: see defaultMaxStarts.
var maxStartsPerCPU = 2

// readyLatency keeps, for this instance's last runs, how long it took from
// the reconcile that decided on the run (its read of the items) to the
// work being ready to start (claimed, and its process waiting behind its
// gate): the lead of claims ahead of the fire is derived from it.
//
// Runs due together are made ready by the same claims, forks and
// registrations, in turn: the last of n is ready about n runs' time after
// the first. So the samples of runs due alone at their fire are kept
// apart from those of runs due with others, which are kept per run due
// (the latency divided by the runs due at its fire), and the lead of a
// fire of n runs is that of one run plus n - 1 times the slowest recent
// per-run sample: a midnight of a thousand jobs is prepared a thousand
// runs' time ahead, and its runs start at the fire rather than in the
// order their forks came, while a lone run after a storm keeps a lone
// run's lead.
type readyLatency struct {
	mu     sync.Mutex
	alone  latencyRing // runs due alone at their fire
	perRun latencyRing // runs due with others: latency / runs due
}

// latencyRing is the last samples of a kind.
type latencyRing struct {
	recent [32]time.Duration
	n      int
}

func (r *latencyRing) add(d time.Duration) {
	r.recent[r.n%len(r.recent)] = d
	r.n++
}

// slowest returns the slowest recent sample; false if none.
func (r *latencyRing) slowest() (time.Duration, bool) {
	if r.n == 0 {
		return 0, false
	}
	return slices.Max(r.recent[:min(r.n, len(r.recent))]), true
}

func (c *readyLatency) observe(d time.Duration, due int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if due <= 1 {
		c.alone.add(d)
	} else {
		c.perRun.add(d / time.Duration(due))
	}
}

// Bounds of the lead: before any claim is measured it is defaultLead for
// one run (and half that for each other run due with it); it is at most
// maxLead for a fire of one run, and at most maxStormLead however many
// are due.
const (
	minLead      = 10 * time.Millisecond
	maxLead      = 250 * time.Millisecond
	maxStormLead = 3 * time.Second
	defaultLead  = 50 * time.Millisecond
	// margin is added to the lead for what the samples may not show.
	margin = 2 * time.Millisecond
)

// lead is how long before a fire of due runs here its items are read and
// claimed and their work prepared: for one run, twice the slowest recent
// time this took plus a margin; for more, twice the slowest recent time
// per run for each other run on top.
func (c *readyLatency) lead(due int) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	base := defaultLead
	alone, ok := c.alone.slowest()
	if ok {
		base = 2*alone + margin
	}
	if due <= 1 {
		return min(max(base, minLead), maxLead)
	}
	per, ok := c.perRun.slowest()
	if !ok {
		per = defaultLead / 2
		if alone > 0 {
			per = alone
		}
	}
	return min(max(base+2*per*time.Duration(due-1), minLead), maxLead*time.Duration(due), maxStormLead)
}

// dueCalendar counts, by fire instant, the runs this instance expects:
// each job loop files its next scheduled fire with the number of its
// items this instance owns. The lead of a fire grows with its count.
//
// A loop files when it reconciles, so the first of a storm's loops saw a
// count of one and chose a short lead: each time a fire's count doubles,
// the loops filed at it are woken to choose again (about two wakes per
// loop and storm, none for a fire of one run).
type dueCalendar struct {
	mu    sync.Mutex
	at    map[int64]*dueFire // by fire, Unix ns
	filed map[*jobLoop]int64 // each loop's fire
}

type dueFire struct {
	runs  int
	told  int // runs when its loops were last woken to choose again
	loops map[*jobLoop]int
}

// file records that j's next fire is fire, with runs runs here (0: none),
// replacing what j filed before. It returns the runs due at fire in all,
// and the loops to wake because that count doubled.
func (c *dueCalendar) file(j *jobLoop, fire time.Time, runs int) (due int, wake []*jobLoop) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at == nil {
		c.at, c.filed = map[int64]*dueFire{}, map[*jobLoop]int64{}
	}
	c.forgetLocked(j)
	at := fire.UnixNano()
	f := c.at[at]
	if runs <= 0 {
		if f == nil {
			return 0, nil
		}
		return f.runs, nil
	}
	if f == nil {
		f = &dueFire{told: 1, loops: map[*jobLoop]int{}}
		c.at[at] = f
	}
	c.filed[j] = at
	f.loops[j] = runs
	f.runs += runs
	if f.runs >= 2*f.told {
		f.told = f.runs
		for l := range f.loops {
			if l != j {
				wake = append(wake, l)
			}
		}
	}
	return f.runs, wake
}

// forget removes what j filed (its loop stopped).
func (c *dueCalendar) forget(j *jobLoop) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forgetLocked(j)
}

func (c *dueCalendar) forgetLocked(j *jobLoop) {
	at, ok := c.filed[j]
	if !ok {
		return
	}
	delete(c.filed, j)
	f := c.at[at]
	f.runs -= f.loops[j]
	delete(f.loops, j)
	if len(f.loops) == 0 {
		delete(c.at, at)
	}
}

// count returns the runs due at fire.
func (c *dueCalendar) count(fire time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.at[fire.UnixNano()]; f != nil {
		return f.runs
	}
	return 0
}
