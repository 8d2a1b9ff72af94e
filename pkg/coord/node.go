package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/steps"
)

// ErrDuplicateID is returned by Run when another live instance holds this
// instance's id for longer than two TTLs.
var ErrDuplicateID = errors.New("coord: instance id is held by another live instance")

// Options configure a Node.
type Options struct {
	Client *clientv3.Client
	// Prefix is the root of the keyspace (DefaultPrefix if empty).
	Prefix string
	// ID identifies the instance; two live instances may not share it.
	ID string
	// Info is published at the instance key; ID, Jobs and Started are
	// filled in. Its Labels are matched by the jobs' selectors.
	Info keyspace.InstanceInfo
	// Accept is what the instance accepts of applied definitions (none by
	// default); it is published in the instance key.
	Accept config.AcceptPolicy
	// TTL of the session lease, >= MinTTL. Default 10s.
	TTL time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
	// OnMap, if set, is called whenever this instance's view of a job's
	// shard map changes to a newer epoch. It must not block.
	OnMap func(job string, m *keyspace.ShardMap)
	// OnMapWritten, if set, is called when this instance, as leader, wrote a map.
	OnMapWritten func(job string)
	// OnSessionLost, if set, is called when a session fenced itself or expired.
	OnSessionLost func(err error)
	// Explain, if set, says why etcd does not answer, when it can tell
	// (see Diagnose): added, at most every 30 s, to the log of a failed
	// connection, which the etcd client reports only as a timeout.
	Explain func(ctx context.Context) string
	// Revisions is the one given to the client's ClientOptions: the node
	// learns from it that etcd's history went back, and recovers (see
	// rewind.go). Without it the node still sees a key's revision go back in
	// what it reads, but no answer is refused before it acts on it.
	Revisions *Revisions
}

// Node is one shardd instance in the cluster.
type Node struct {
	opts Options
	keys keyspace.Keys
	log  *slog.Logger
	hub  *hub // the one watch of the jobs keyspace
	// steps runs the jobs' tasks (task.go): registration, campaign,
	// leadership.
	steps *steps.Scheduler

	mu sync.Mutex
	// jobs are the definitions this instance has tasks for: files are
	// the host's, applied the applied ones it matches and accepts, placed
	// every applied job (recomputeJobsLocked).
	jobs    map[string]*config.Job
	files   map[string]*config.Job
	applied map[string]*config.Job
	placed  map[string]bool
	// refusals are the applied jobs whose selector matches this instance
	// but which it does not accept, and why (the instance key says so).
	refusals map[string]string
	onJobs   atomic.Pointer[func()]
	catalog  *catalog
	// reloadRejected is what the instance key says of a rejected reload.
	reloadRejected string
	views          map[string]*JobView
	up             bool
	session        *session         // current session, nil when down
	members        map[string]int64 // job -> CreateRevision of this session's member key
	// registered maps each job to the hash of the local definition this
	// process last registered (see publishDecision: overwrite acts once).
	registered map[string]string
	leaving    bool      // Leave was called: no membership any more
	explained  time.Time // when why last asked Options.Explain
	started    time.Time
	changed    chan struct{}        // buffered(1): the job set changed
	mapSubs    map[string][]*func() // OnChange callbacks by job, called on a newer map
	// registering paces how many jobs register at once by etcd's answers
	// (pacer.go). Each job's campaign and first map follow its
	// registration, so it paces them too.
	registering *pacer
	// completions groups the outcomes of runs that end together into
	// shared Txns (see completer).
	completions completer
	// txns sends the small Txns of many jobs together (batch.go).
	txns *txnBatcher
	// itemCaches keep jobs' item keys from the hub's watch (itemcache.go);
	// lastItemWrite is the revision of this node's last write of item keys
	// (wroteItems).
	itemCaches    map[string]*itemCache
	lastItemWrite atomic.Int64
	// revs is what the client saw of etcd's history; known the item
	// records seen, for a recovery from a rewind (rewind.go).
	revs     *Revisions
	known    records
	outcomes outcomes
	// rewindFloor is the revision another instance's rewind report must
	// have seen past to concern this one: where its watch began, or where it
	// last recovered (rewind.go).
	rewindFloor atomic.Int64
	// probes (buffered(1)) asks checkEtcd for a linearizable read: a watch
	// stream was opened again (rewind.go).
	probes chan struct{}
	// reports are the rewind records of other instances already taken, by
	// instance: a record rewritten while its instance waits is not a new
	// rewind.
	reports map[string]time.Time
}

// New returns a node for jobs; Run starts it.
func New(opts Options, jobs []*config.Job) (*Node, error) {
	if opts.Client == nil {
		return nil, errors.New("coord: Options.Client is nil")
	}
	if err := config.CheckName(opts.ID); err != nil {
		return nil, fmt.Errorf("coord: instance id %w", err)
	}
	if opts.TTL == 0 {
		opts.TTL = 10 * time.Second
	}
	if opts.TTL < MinTTL || opts.TTL%time.Second != 0 {
		return nil, fmt.Errorf("coord: TTL must be a whole number of seconds >= %s, got %s", MinTTL, opts.TTL)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Revisions == nil {
		opts.Revisions = NewRevisions()
	}
	n := &Node{
		revs:        opts.Revisions,
		known:       records{jobs: map[string]map[int]knownRecord{}},
		opts:        opts,
		keys:        keyspace.NewKeys(opts.Prefix),
		log:         opts.Logger.With("instance", opts.ID),
		views:       map[string]*JobView{},
		itemCaches:  map[string]*itemCache{},
		mapSubs:     map[string][]*func(){},
		registered:  map[string]string{},
		files:       map[string]*config.Job{},
		applied:     map[string]*config.Job{},
		placed:      map[string]bool{},
		refusals:    map[string]string{},
		changed:     make(chan struct{}, 1),
		registering: newPacer(opts.TTL / 10),
		probes:      make(chan struct{}, 1),
		steps:       steps.New(opts.Now),
		started:     opts.Now(),
	}
	n.completions.write = n.writeOutcomes
	n.txns = newTxnBatcher(opts.Client, opts.TTL)
	n.hub = newHub(opts.Client, n.keys, func(msg string, err error, attrs ...any) {
		n.log.Warn(msg, append(n.why(err), attrs...)...)
	})
	n.hub.onRewind = n.onRewindRecord
	n.hub.onAdvance = n.revs.sawCommitted
	n.revs.mu.Lock()
	n.revs.onWatchStream = func() {
		select {
		case n.probes <- struct{}{}:
		default:
		}
	}
	n.revs.onNoSpace = func(ns *NoSpaceError) {
		if ns != nil {
			n.log.Error("etcd refuses writes: its NOSPACE alarm is raised; no run starts or is recorded until it is compacted, defragmented and disarmed (docs/operations.md)")
		} else {
			n.log.Info("etcd takes writes again: its NOSPACE alarm is gone")
		}
	}
	n.revs.mu.Unlock()
	n.catalog = newCatalog(n)
	n.SetJobs(jobs)
	return n, nil
}

// ID returns the instance id.
func (n *Node) ID() string { return n.opts.ID }

// Keys returns the node's keyspace.
func (n *Node) Keys() keyspace.Keys { return n.keys }

// SetJobs replaces the local job definitions (the host's files); a
// running node registers the new set in its next step.
func (n *Node) SetJobs(jobs []*config.Job) {
	n.mu.Lock()
	n.files = make(map[string]*config.Job, len(jobs))
	for _, j := range jobs {
		n.files[j.Name] = j
	}
	dropped := n.recomputeJobsLocked()
	n.mu.Unlock()
	n.droppedJobs(dropped)
}

// recomputeJobsLocked sets n.jobs, the jobs this instance has tasks for,
// from the files and the applied catalog (applied.go): the file jobs that
// are not applied, and the applied jobs this instance matches and
// accepts. A file defining an applied job is behind it (docs/applied.md):
// the applied definition stands for it, or nothing. It returns the jobs
// dropped, for droppedJobs (without n.mu).
func (n *Node) recomputeJobsLocked() (dropped []string) {
	old := n.jobs
	n.jobs = make(map[string]*config.Job, len(n.files)+len(n.applied))
	for name, j := range n.files {
		if !n.placed[name] {
			n.jobs[name] = j
		}
	}
	for name, j := range n.applied {
		n.jobs[name] = j
	}
	for name, j := range n.jobs {
		if o, ok := old[name]; !ok || o.Hash() != j.Hash() || o.Overwrite != j.Overwrite {
			// A changed or added definition is loaded anew: overwrite: true
			// acts once more (publishDecision's first).
			delete(n.registered, name)
		}
		if v, ok := n.views[name]; ok {
			v.Local = j // the registration that follows says whether it conflicts
		} else {
			v := &JobView{Local: j, Job: j}
			if n.applied[name] == j {
				v.Source = keyspace.SourceApplied
			}
			v.Refusal = n.mayRun(j, v.Source)
			n.views[name] = v
		}
	}
	for name := range n.views {
		if _, ok := n.jobs[name]; !ok {
			delete(n.views, name)
			dropped = append(dropped, name)
		}
	}
	return dropped
}

// droppedJobs forgets what the node kept of jobs it no longer has, and
// has the instance key and the engine follow the new set.
func (n *Node) droppedJobs(dropped []string) {
	for _, name := range dropped {
		n.dropItemCache(name)
		n.forgetRecords(name)
	}
	n.republish()
	if f := n.onJobs.Load(); f != nil {
		(*f)()
	}
}

// OnJobs has fn called whenever the node's job set changes (a reload, an
// applied job that this instance now runs or no longer does): the engine
// follows it (Engine.Resync). fn must not block.
func (n *Node) OnJobs(fn func()) { n.onJobs.Store(&fn) }

// Up reports whether the instance holds a live session.
func (n *Node) Up() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.up
}

// Jobs returns the names of the local jobs, sorted.
func (n *Node) Jobs() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	names := make([]string, 0, len(n.jobs))
	for name := range n.jobs {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Definitions returns the definitions of the node's jobs (files and
// applied), as it runs them: each job's registered definition once known.
func (n *Node) Definitions() []*config.Job {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]*config.Job, 0, len(n.jobs))
	for name, j := range n.jobs {
		if v, ok := n.views[name]; ok && v.Job != nil {
			j = v.Job
		}
		out = append(out, j)
	}
	return out
}

// conflicts lists the jobs whose local definition lost to the registered one.
func (n *Node) conflicts() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for name, v := range n.views {
		if v.Conflict {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// SetReloadRejected publishes in the instance's key that its last
// configuration reload was rejected, and why (counts and job names, no
// text of the files); "" after one that was applied.
func (n *Node) SetReloadRejected(why string) {
	n.mu.Lock()
	changed := n.reloadRejected != why
	n.reloadRejected = why
	n.mu.Unlock()
	if changed {
		n.republish()
	}
}

// republish asks the session loop to rewrite the instance key.
func (n *Node) republish() {
	select {
	case n.changed <- struct{}{}:
	default:
	}
}

// Run keeps the instance in the cluster until ctx is cancelled: it opens a
// session, registers, runs every job's worker, and starts over with a new
// session whenever one is lost. On cancellation it leaves gracefully
// (resign, revoke) and returns nil. It returns an error only when the
// instance id stays held by another live instance for two TTLs.
func (n *Node) Run(ctx context.Context) error {
	var prevLease clientv3.LeaseID
	var dupSince time.Time
	b := backoff{min: 200 * time.Millisecond, max: 5 * time.Second}
	defer n.txns.close() // last: the deferred stops below may still send
	hctx, stopHub := context.WithCancel(ctx)
	hubDone := make(chan struct{})
	go func() {
		defer close(hubDone)
		n.hub.run(hctx)
	}()
	defer func() { stopHub(); <-hubDone }()
	stepsDone := make(chan struct{})
	go func() {
		defer close(stepsDone)
		n.steps.Run(hctx)
	}()
	defer func() { stopHub(); <-stepsDone }()
	membersDone := make(chan struct{})
	go func() {
		defer close(membersDone)
		n.logMembership(hctx)
	}()
	defer func() { stopHub(); <-membersDone }()
	checksDone := make(chan struct{})
	go func() {
		defer close(checksDone)
		n.checkEtcd(hctx)
	}()
	defer func() { stopHub(); <-checksDone }()
	if !n.hub.waitReady(ctx) {
		return nil
	}
	catalogDone := make(chan struct{})
	go func() {
		defer close(catalogDone)
		n.catalog.run(hctx)
	}()
	defer func() { stopHub(); <-catalogDone }()
	// The first session starts with the applied jobs known, unless etcd
	// keeps them from being read (tasks guard their membership anyway).
	select {
	case <-n.catalog.loaded:
	case <-time.After(n.opts.TTL):
	case <-ctx.Done():
		return nil
	}
	n.rewindFloor.Store(n.hub.deliveredRev())
	for {
		if rw := n.revs.Rewound(); rw != nil {
			if n.recoverRewind(ctx, rw) != nil {
				return nil
			}
		}
		wasUp, err := n.runSession(ctx, &prevLease)
		if ctx.Err() != nil {
			return nil
		}
		if wasUp {
			b.reset()
		}
		switch {
		case errors.Is(err, ErrDuplicateID):
			if dupSince.IsZero() {
				dupSince = n.opts.Now()
			}
			if n.opts.Now().Sub(dupSince) > 2*n.opts.TTL {
				return fmt.Errorf("%w; if that is another host or process, give this one another --name", err)
			}
			n.log.Warn("instance id is held by another instance; waiting for its lease to expire", "err", err)
		case err != nil:
			dupSince = time.Time{}
			n.log.Warn("session ended; reconnecting", n.why(err)...)
		}
		if !sleep(ctx, b.next()) {
			return nil
		}
	}
}

// runSession is one session from grant to fence or shutdown. wasUp reports
// whether the instance got registered.
func (n *Node) runSession(ctx context.Context, prevLease *clientv3.LeaseID) (wasUp bool, err error) {
	if *prevLease != clientv3.NoLease {
		// The old lease may come back with its keys after an outage: revoke it.
		rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
		_, err := n.opts.Client.Revoke(rctx, *prevLease)
		cancel()
		if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return false, fmt.Errorf("revoke previous lease %x: %w", *prevLease, err)
		}
		*prevLease = clientv3.NoLease
	}
	rewinds := n.revs.changes()
	if n.revs.Rewound() != nil {
		return false, n.revs.Rewound()
	}
	s, err := openSession(ctx, n.opts.Client, n.opts.TTL, n.opts.Now, n.log)
	if err != nil {
		return false, err
	}
	*prevLease = s.lease
	if err := n.register(s); err != nil {
		s.close(true)
		*prevLease = clientv3.NoLease
		return false, err
	}
	n.log.Info("session up", "lease", fmt.Sprintf("%x", s.lease), "ttl", n.opts.TTL)
	n.setSession(s)
	defer n.setSession(nil)

	workers := newWorkerSet(s)
	defer workers.stop()
	leave := func() {
		workers.stop() // resigns leaderships while the session is still up
		if err := s.close(true); err != nil {
			n.log.Warn("leaving: lease not revoked; others reshard after the TTL", "err", err)
		} else {
			n.log.Info("left the cluster: leaderships resigned, lease revoked")
		}
		*prevLease = clientv3.NoLease
	}
	for {
		workers.sync(n, n.currentJobs())
		select {
		case <-ctx.Done():
			leave()
			return true, nil
		case <-s.Fenced():
			if ctx.Err() != nil {
				// The session's context is ctx's child: a shutdown
				// ends it too, and select may pick this case.
				leave()
				return true, nil
			}
			err := s.Err()
			n.setSession(nil)
			n.log.Error("session lost: stopping leaderships and work", "err", err)
			if n.opts.OnSessionLost != nil {
				n.opts.OnSessionLost(err)
			}
			if left := workers.stopWithin(n.opts.TTL); left > 0 {
				// A worker may be in an etcd call (bounded by the TTL)
				// with etcd unreachable. Those workers can do no harm
				// (their session is gone); reconnecting must not wait
				// for them.
				n.log.Warn("job workers still finishing an etcd call; reconnecting without them", "workers", left)
			}
			s.close(false)
			return true, err
		case <-rewinds:
			rewinds = nil
			s.cancel(n.revs.Rewound()) // Run recovers before the next session

		case <-n.changed:
			if err := n.register(s); err != nil {
				n.log.Warn("update instance registration", "err", err)
			}
		}
	}
}

// setSession records the current session (nil: none).
func (n *Node) setSession(s *session) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.session, n.up = s, s != nil
	n.members = map[string]int64{}
	if s == nil {
		for _, v := range n.views {
			v.Leading = false
		}
	}
}

// sessionFor returns the current session and the CreateRevision of its
// member key for job (0 when the job is not registered in it).
//
// A job whose registered definition this instance may not run (its view's
// refusal: a selector that does not match, an applied definition it does
// not accept) has no member key to claim with, even while its task has
// yet to withdraw the key: the definition and its refusal are taken
// together (takeDefinition), so a claim made on a definition this
// instance refuses is never granted. Nor is one of a job the instance no
// longer has (its view is gone before its task has withdrawn the key).
func (n *Node) sessionFor(job string) (*session, int64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if v, ok := n.views[job]; !ok || v.Refusal != nil {
		return n.session, 0 // refused, or no longer a job of this instance
	}
	return n.session, n.members[job]
}

// isLeaving reports whether Leave was called.
func (n *Node) isLeaving() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.leaving
}

// Leave withdraws this instance from every job (deletes its member keys)
// while keeping its session: the leaders reshard at once, and the items this
// instance still runs keep their running markers, so their new owners wait
// for them (no overlap) instead of for the lease. A graceful shutdown calls
// it before waiting for running items; Run's return then resigns and
// revokes.
func (n *Node) Leave(ctx context.Context) error {
	n.mu.Lock()
	n.leaving = true
	s := n.session
	jobs := make([]string, 0, len(n.jobs))
	for name := range n.jobs {
		jobs = append(jobs, name)
	}
	n.mu.Unlock()
	if s == nil {
		return nil
	}
	ops := make([]clientv3.Op, 0, len(jobs))
	for _, job := range jobs {
		ops = append(ops, clientv3.OpDelete(n.keys.Member(job, n.opts.ID)))
	}
	for len(ops) > 0 { // within etcd's limit of operations per transaction
		batch := ops[:min(len(ops), 100)]
		ops = ops[len(batch):]
		if _, err := n.opts.Client.Txn(ctx).Then(batch...).Commit(); err != nil {
			return fmt.Errorf("leave: delete member keys: %w", err)
		}
	}
	n.log.Info("withdrew from every job; running items finish under their markers", "jobs", len(jobs))
	return nil
}

// FenceDeadline returns the time at which the current session fences itself
// unless etcd acknowledges another keepalive, and false with no session.
func (n *Node) FenceDeadline() (time.Time, bool) {
	n.mu.Lock()
	s := n.session
	n.mu.Unlock()
	if s == nil {
		return time.Time{}, false
	}
	return s.Deadline(), true
}

// Session returns a context that is cancelled when the current session ends
// (or fences itself), and false when there is no session.
func (n *Node) Session() (context.Context, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.session == nil {
		return nil, false
	}
	return n.session.ctx, true
}

// currentJobs returns the jobs to have tasks for, each with whether its
// definition is an applied one (applied.go) rather than the host's file's.
func (n *Node) currentJobs() map[string]localJob {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]localJob, len(n.jobs))
	for k, v := range n.jobs {
		out[k] = localJob{def: v, applied: n.applied[k] == v, view: n.views[k]}
	}
	return out
}

// localJob is a task's definition: the host's file's, or an applied one
// (which the task never publishes); and the job's view, whose changes of
// definition wake the task.
type localJob struct {
	def     *config.Job
	applied bool
	view    *JobView
}

// register creates or updates the instance key under s's lease. Creating
// fails if another live instance holds the id.
func (n *Node) register(s *session) error {
	info := n.opts.Info
	info.ID = n.opts.ID
	info.Jobs = n.Jobs()
	info.Conflicts = n.conflicts()
	info.Started = n.started
	n.mu.Lock()
	info.ReloadRejected = n.reloadRejected
	info.Accepts = n.opts.Accept
	if len(n.refusals) > 0 {
		info.Refused = maps.Clone(n.refusals)
	}
	info.AppliedOverFiles = n.appliedOverFilesLocked()
	n.mu.Unlock()
	val, err := json.Marshal(info)
	if err != nil {
		return err
	}
	key := n.keys.Instance(n.opts.ID)
	ctx, cancel := context.WithTimeout(s.ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(val), clientv3.WithLease(s.lease))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return fmt.Errorf("register instance %s: %w", key, err)
	}
	if resp.Succeeded {
		return nil
	}
	kv := resp.Responses[0].GetResponseRange().Kvs[0]
	if clientv3.LeaseID(kv.Lease) == s.lease {
		_, err := n.opts.Client.Put(ctx, key, string(val), clientv3.WithLease(s.lease))
		return err
	}
	var other keyspace.InstanceInfo
	json.Unmarshal(kv.Value, &other)
	return fmt.Errorf("%w: %s is registered by pid %d on host %q since %s", ErrDuplicateID, key, other.PID, other.Host, other.Started.Format(time.RFC3339))
}

// workerSet holds the jobs' tasks under a session (task.go): plain data,
// stepped by the node's scheduler.
type workerSet struct {
	s       *session
	running map[string]*jobTask
}

func newWorkerSet(s *session) *workerSet {
	return &workerSet{s: s, running: map[string]*jobTask{}}
}

// sync starts tasks for new or changed jobs and stops the others. A
// removed job's membership is withdrawn; a changed job keeps it, so that
// its items do not move away and back.
func (ws *workerSet) sync(n *Node, jobs map[string]localJob) {
	var stopping []*jobTask
	for name, t := range ws.running {
		j, ok := jobs[name]
		// A view made anew (the job left and came back between two syncs)
		// knows nothing of the task: a parked one would never be woken.
		if ok && j.def.Hash() == t.local.Hash() && j.def.Overwrite == t.local.Overwrite && j.applied == t.applied && j.view == t.view {
			continue
		}
		t.removed.Store(!ok)
		stopping = append(stopping, t)
		delete(ws.running, name)
	}
	stopAll(stopping)
	for _, t := range stopping {
		<-t.done
	}
	for name, j := range jobs {
		if _, ok := ws.running[name]; ok {
			continue
		}
		t := n.newJobTask(ws.s, j.def, j.applied, j.view)
		ws.running[name] = t
		n.steps.Add(t.slot)
	}
}

// stopAll stops tasks in parallel (thousands of leaderships resign at once,
// not one by one); each closes its done when finished.
func stopAll(tasks []*jobTask) {
	for _, t := range tasks {
		go t.stop()
	}
}

// stop stops every task and waits for them.
func (ws *workerSet) stop() { ws.stopWithin(math.MaxInt64) }

// stopWithin is stop, waiting at most d for the tasks to finish; it
// returns how many had not. They go on finishing in the background.
func (ws *workerSet) stopWithin(d time.Duration) int {
	tasks := make([]*jobTask, 0, len(ws.running))
	for _, t := range ws.running {
		tasks = append(tasks, t)
	}
	ws.running = map[string]*jobTask{}
	stopAll(tasks)
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	left := 0
	for i, t := range tasks {
		select {
		case <-t.done:
			continue
		case <-deadline.C:
		}
		for _, t := range tasks[i:] {
			select {
			case <-t.done:
			default:
				left++
			}
		}
		break
	}
	return left
}

// backoff is exponential with jitter.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	return b.cur/2 + rand.N(b.cur/2+1)
}

func (b *backoff) reset() { b.cur = 0 }

// sleep waits d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// logMembership logs, at info, every instance that joins or leaves the
// cluster, as this instance sees it, until ctx is done. It is a log for
// people, not a source of truth: after a watch gap it starts again from
// the current revision, and changes inside the gap are not logged.
func (n *Node) logMembership(ctx context.Context) {
	b := backoff{min: 200 * time.Millisecond, max: 5 * time.Second}
	for ctx.Err() == nil {
		wch := n.opts.Client.Watch(clientv3.WithRequireLeader(ctx), n.keys.Instances(), clientv3.WithPrefix(), clientv3.WithPrevKV())
		for resp := range wch {
			if resp.Err() != nil {
				break
			}
			b.reset()
			for _, ev := range resp.Events {
				id := keyspace.LastSegment(string(ev.Kv.Key))
				if id == n.opts.ID {
					continue
				}
				switch {
				case ev.Type == clientv3.EventTypePut && ev.IsCreate():
					var info keyspace.InstanceInfo
					json.Unmarshal(ev.Kv.Value, &info)
					n.log.Info("instance joined", "other", id, "host", info.Host, "version", info.Version)
				case ev.Type == clientv3.EventTypeDelete:
					var info keyspace.InstanceInfo
					if ev.PrevKv != nil {
						json.Unmarshal(ev.PrevKv.Value, &info)
					}
					n.log.Info("instance left (stopped, or its lease expired)", "other", id, "host", info.Host)
				}
			}
		}
		sleep(ctx, b.next())
	}
}

// why returns the log attributes of a connection error: err, and what
// Options.Explain says of a timeout, at most every 30 s.
func (n *Node) why(err error) []any {
	attrs := []any{"err", err}
	if n.opts.Explain == nil || !errors.Is(err, context.DeadlineExceeded) {
		return attrs
	}
	n.mu.Lock()
	now := n.opts.Now()
	due := now.Sub(n.explained) >= 30*time.Second
	if due {
		n.explained = now
	}
	n.mu.Unlock()
	if due {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if why := n.opts.Explain(ctx); why != "" {
			attrs = append(attrs, "why", why)
		}
	}
	return attrs
}
