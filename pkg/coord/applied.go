package coord

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Applied definitions (docs/applied.md): jobs an operator registered in
// etcd (shardd apply) rather than a host's file. The catalog finds them
// (placement/<job>) and decides, for each, what this instance does:
//
//	absent ──placement put──▶ evaluating ──selector does not match──▶ not selected (nothing)
//	                              │ ├──────not accepted (AcceptPolicy)──▶ refused (instance key says why)
//	                              │ └──────matches and accepted────────▶ member (a task: registers, runs)
//	                              └── placement or config changes, a resync: evaluating again
//
// Events only mark a job for evaluation: every decision is taken from a
// read of its placement and config keys (what etcd says now), never from
// an event's value or a cached view. A task guards its own membership
// with the definition its registration read (eligible), so that a
// catalog one change behind never makes an instance join a job it may not
// run.
type catalog struct {
	n    *Node
	kick chan struct{} // buffered(1)

	mu     sync.Mutex
	relist bool            // list placement/ again (at start, after a resync)
	dirty  map[string]bool // jobs to evaluate
	names  map[string]bool // the applied jobs known
	// loaded is closed after the first complete evaluation.
	loaded     chan struct{}
	loadedOnce sync.Once
}

func newCatalog(n *Node) *catalog {
	c := &catalog{n: n, kick: make(chan struct{}, 1), relist: true, dirty: map[string]bool{}, names: map[string]bool{}, loaded: make(chan struct{})}
	n.hub.onPlacement = func(ev *clientv3.Event) {
		if job := n.keys.PlacementOf(string(ev.Kv.Key)); job != "" {
			c.mark(job)
		}
	}
	n.hub.onConfig = func(job string) {
		c.mu.Lock()
		known := c.names[job]
		c.mu.Unlock()
		if known {
			c.mark(job)
		}
	}
	n.hub.onResync = func() {
		c.mu.Lock()
		c.relist = true
		c.mu.Unlock()
		c.wake()
	}
	return c
}

func (c *catalog) mark(job string) {
	c.mu.Lock()
	c.dirty[job] = true
	c.mu.Unlock()
	c.wake()
}

func (c *catalog) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// run evaluates the marked jobs until ctx is done.
func (c *catalog) run(ctx context.Context) {
	b := backoff{min: 100 * time.Millisecond, max: 2 * time.Second}
	c.wake()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.kick:
		}
		if err := c.evaluate(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			c.n.log.Debug("applied definitions: read failed; retrying", "err", err)
			sleep(ctx, b.next())
			c.wake()
			continue
		}
		b.reset()
		c.loadedOnce.Do(func() { close(c.loaded) })
	}
}

// evaluate takes the marked jobs (all of them after a relist) and decides
// each from a read of its keys. On an error the jobs stay marked.
func (c *catalog) evaluate(ctx context.Context) error {
	c.mu.Lock()
	relist, dirty := c.relist, c.dirty
	c.relist, c.dirty = false, map[string]bool{}
	c.mu.Unlock()
	remark := func() {
		c.mu.Lock()
		c.relist = c.relist || relist
		for j := range dirty {
			c.dirty[j] = true
		}
		c.mu.Unlock()
	}
	n := c.n
	if relist {
		rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
		resp, err := n.opts.Client.Get(rctx, n.keys.Placements(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		cancel()
		if err != nil {
			remark()
			return fmt.Errorf("list %s: %w", n.keys.Placements(), err)
		}
		c.mu.Lock()
		for j := range c.names {
			dirty[j] = true // gone from the list: evaluated (and dropped) too
		}
		c.mu.Unlock()
		for _, kv := range resp.Kvs {
			if job := n.keys.PlacementOf(string(kv.Key)); job != "" {
				dirty[job] = true
			}
		}
	}
	jobs := slices.Sorted(maps.Keys(dirty))
	for len(jobs) > 0 {
		chunk := jobs[:min(len(jobs), 50)] // two reads a job, within etcd's 128 operations
		jobs = jobs[len(chunk):]
		ops := make([]clientv3.Op, 0, 2*len(chunk))
		for _, job := range chunk {
			ops = append(ops, clientv3.OpGet(n.keys.Placement(job)), clientv3.OpGet(n.keys.Config(job)))
		}
		rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
		resp, err := n.opts.Client.Txn(rctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			for _, j := range jobs {
				c.mark(j)
			}
			for _, j := range chunk {
				c.mark(j)
			}
			if relist {
				c.mu.Lock()
				c.relist = true
				c.mu.Unlock()
			}
			return fmt.Errorf("read applied definitions: %w", err)
		}
		var jobsChanged, refusals bool
		for i, job := range chunk {
			placed := len(resp.Responses[2*i].GetResponseRange().Kvs) > 0
			j, r := c.decide(job, placed, resp.Responses[2*i+1].GetResponseRange().Kvs)
			jobsChanged, refusals = jobsChanged || j, refusals || r
		}
		c.applied(jobsChanged, refusals)
	}
	return nil
}

// applied has the node follow the catalog's decisions: its job set (and
// its tasks, the engine, the instance key) when jobs changed, its instance
// key alone when only a refusal did.
func (c *catalog) applied(jobs, refusals bool) {
	n := c.n
	switch {
	case jobs:
		n.mu.Lock()
		dropped := n.recomputeJobsLocked()
		n.mu.Unlock()
		n.droppedJobs(dropped)
	case refusals:
		n.republish()
	}
}

// decide takes what the read said of job: placed (its placement key is
// there) and its config key (kvs). It reports whether the node's job set
// changed (jobs) and whether only the instance key did (refusal): the
// caller recomputes once for many jobs (applied).
func (c *catalog) decide(job string, placed bool, kvs []*mvccpb.KeyValue) (jobs, refusal bool) {
	n := c.n
	var def *config.Job
	var why string
	if placed && len(kvs) > 0 {
		var rc keyspace.RegisteredConfig
		n.mu.Lock()
		prev := n.applied[job]
		n.mu.Unlock()
		d, err := keyspace.DecodeRegistered(n.keys.Config(job), job, kvs[0].Value, &rc, prev)
		switch {
		case !rc.Applied():
			placed = false // deleted, or given back to the files, meanwhile
		case err != nil:
			why = "the applied definition cannot be read here: " + err.Error()
		default:
			def = d
			if err := n.mayRun(def, keyspace.SourceApplied); err != nil {
				// Not selected is no refusal; nor is an instance that
				// accepts no applied definition at all (its key says so
				// once, not once a job: status tells).
				if !errors.Is(err, errNotSelected) && n.opts.Accept.Applied {
					why = err.Error()
				}
				def = nil
			}
		}
	} else {
		placed = false
	}
	c.mu.Lock()
	if placed {
		c.names[job] = true
	} else {
		delete(c.names, job)
	}
	c.mu.Unlock()

	n.mu.Lock()
	defer n.mu.Unlock()
	was, wasPlaced, wasWhy := n.applied[job], n.placed[job], n.refusals[job]
	if was != nil && def != nil && was.Hash() == def.Hash() {
		def = was // the same definition: the tasks keep theirs
	}
	setOrDelete(n.placed, job, placed, placed)
	setOrDelete(n.refusals, job, why, why != "")
	setOrDelete(n.applied, job, def, def != nil)
	if why != "" && why != wasWhy {
		n.log.Warn("refusing an applied job", "job", job, "why", why)
	}
	if def != nil && was == nil {
		n.log.Info("running applied job here", "job", job)
	}
	return wasPlaced != placed || was != def, wasWhy != why
}

func setOrDelete[V any](m map[string]V, k string, v V, set bool) {
	if set {
		m[k] = v
	} else {
		delete(m, k)
	}
}

// errNotSelected: the job's selector does not match this instance's labels.
var errNotSelected = errors.New("its instances.selector does not match this instance's labels")

// mayRun says why this instance may not run def, registered from source;
// nil: it may. A file job runs where its selector (if any) matches; an
// applied one also needs the instance's AcceptPolicy.
func (n *Node) mayRun(def *config.Job, source string) error {
	if def == nil {
		return nil
	}
	if !def.Eligible(n.opts.Info.Labels) {
		return errNotSelected
	}
	if source == keyspace.SourceApplied {
		return n.opts.Accept.Check(def)
	}
	return nil
}

// notEligibleError is a registration's answer when the registered
// definition it read may not run here (mayRun).
type notEligibleError struct{ err error }

func (e *notEligibleError) Error() string { return "not run here: " + e.err.Error() }
func (e *notEligibleError) Unwrap() error { return e.err }

// appliedOverFiles lists the jobs this host's files define that are
// applied: the files are behind (docs/applied.md), and status shows it.
func (n *Node) appliedOverFilesLocked() []string {
	var out []string
	for name := range n.files {
		if n.placed[name] {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
