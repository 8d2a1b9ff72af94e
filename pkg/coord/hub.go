package coord

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// hub multiplexes ONE etcd watch of the jobs keyspace to the node's
// per-job subscribers: shard-map views, leaders' reconcile wake-ups and
// manual triggers.
//
// One watch per job and purpose does not scale: with 10,000 jobs an
// instance held ~40,000 watchers, every one started at a past revision, and
// etcd syncs such "unsynced" watchers a few hundred at a time; the cluster
// never converged. With the hub an instance holds one watcher whatever the
// number of jobs, at the cost of receiving (and dropping) the events of
// keys nobody here subscribes to, such as other jobs' claims.
//
// Contract, which makes "subscribe, then read" complete:
//
//   - ready is closed once the hub knows its start revision R0 (one read);
//     from then on it delivers every event after R0 in revision order, one
//     goroutine, to the subscribers whose prefix matches the key.
//   - A subscriber subscribes first and reads its keys second. Its read is
//     at a revision R >= R0; every event after R is still to be delivered,
//     every event up to R is in what it read.
//   - When the watch breaks it resumes after the last revision delivered.
//     If that revision was compacted, events are lost: the hub reads a new
//     start revision and calls every subscriber's resync, which re-reads.
//   - Callbacks run on the hub's goroutine and must not block.
type hub struct {
	cli *clientv3.Client
	// The watch covers [prefix, end): keys.Jobs() and keys.Rewinds(), which
	// sort next to each other, so that one watcher carries both.
	prefix, end string
	keys        keyspace.Keys
	onErr       func(msg string, err error, attrs ...any)
	// ended rate-limits the warning that the watch ended: during a quorum
	// loss it ends about once a second (WithRequireLeader).
	ended *repeats
	// onRewind is called with every put of a rewind record (rewind.go);
	// onAdvance with every revision through which events were delivered.
	onRewind  func(*clientv3.Event)
	onAdvance func(rev int64)
	// onPlacement is called with every event of a placement key, onConfig
	// with the job of every event of a config key, onResync when events
	// may have been lost (the applied catalog, applied.go).
	onPlacement func(*clientv3.Event)
	onConfig    func(job string)
	onResync    func()

	ready chan struct{}

	mu   sync.Mutex
	subs map[string][]*subscription // by job: a few each, a list is the smallest
	// delivered is the revision through which every event was delivered;
	// advanced wakes those waiting for it to grow.
	delivered int64
	advanced  broadcast

	// delivering is held (written) while the events of one watch response,
	// or a resync, are handed to the subscribers, and read by whoever must
	// see all of them or none (settled): subscribers are called in no set
	// order, and one woken by an event must not read another's state
	// before that one has the event too.
	delivering sync.RWMutex

	// fresh, set by restart, makes the watch start over from the current
	// revision (with a resync); stopWatch ends the watch in progress.
	fresh     atomic.Bool
	stopWatch func()
	// resyncs counts the resyncs of every subscriber (resyncAll), counted
	// before their callbacks run.
	resyncs atomic.Int64
}

// subscription is one subscriber's interest in the keys of one job under
// prefix.
type subscription struct {
	job    string
	prefix string
	event  func(*clientv3.Event)
	resync func()
}

func newHub(cli *clientv3.Client, keys keyspace.Keys, onErr func(string, error, ...any)) *hub {
	return &hub{cli: cli, prefix: keys.Jobs(), end: keys.RewindsEnd(), keys: keys, onErr: onErr, ended: newRepeats(30*time.Second, time.Now), ready: make(chan struct{}), subs: map[string][]*subscription{}}
}

// subscribe calls event for every event on a key of job starting with
// prefix, and resync when events may have been lost, until the returned
// cancel is called.
func (h *hub) subscribe(job, prefix string, event func(*clientv3.Event), resync func()) (cancel func()) {
	s := &subscription{job: job, prefix: prefix, event: event, resync: resync}
	h.mu.Lock()
	h.subs[job] = append(h.subs[job], s)
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		subs := slices.DeleteFunc(h.subs[job], func(o *subscription) bool { return o == s })
		if len(subs) == 0 {
			delete(h.subs, job)
		} else {
			h.subs[job] = subs
		}
	}
}

// run watches the jobs keyspace until ctx is done.
func (h *hub) run(ctx context.Context) { h.runFrom(ctx, 0) }

// runFrom is run delivering the events after revision rev; 0 reads the
// start revision.
func (h *hub) runFrom(ctx context.Context, rev int64) {
	b := backoff{min: 100 * time.Millisecond, max: 2 * time.Second}
	if rev != 0 {
		close(h.ready)
	}
	for ctx.Err() == nil {
		if h.fresh.Swap(false) {
			rev = 0
		}
		if rev == 0 {
			r, err := h.startRevision(ctx)
			if err != nil {
				if ctx.Err() == nil && !errors.Is(err, ErrRewound) { // the recovery says so
					h.onErr("cannot reach etcd; retrying", err)
				}
				sleep(ctx, b.next())
				continue
			}
			rev = r
			select {
			case <-h.ready:
				h.resyncAll() // a restart after compaction: events were lost
			default:
				close(h.ready)
			}
			h.advance(rev)
		}
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		h.mu.Lock()
		h.stopWatch = cancel
		h.mu.Unlock()
		if h.fresh.Load() {
			cancel() // restart was called before stopWatch was set
		}
		wch := h.cli.Watch(wctx, h.prefix, clientv3.WithRange(h.end), clientv3.WithRev(rev+1), clientv3.WithProgressNotify())
		for wr := range wch {
			if err := wr.Err(); err != nil {
				if errors.Is(err, rpctypes.ErrCompacted) {
					h.onErr("jobs watch: revision compacted; re-reading", err)
					rev = 0
				} else if ctx.Err() == nil && !errors.Is(err, ErrRewound) {
					const msg = "jobs watch ended; resuming"
					if ok, held := h.ended.say(msg); ok && held > 0 {
						h.onErr(msg, err, "repeated", held, "within", "30s")
					} else if ok {
						h.onErr(msg, err)
					}
				}
				break
			}
			b.reset()
			h.delivering.Lock()
			for _, ev := range wr.Events {
				h.deliver(ev)
				rev = ev.Kv.ModRevision
			}
			if wr.IsProgressNotify() && wr.Header.Revision > rev {
				rev = wr.Header.Revision
			}
			h.advance(rev)
			h.delivering.Unlock()
		}
		cancel()
		sleep(ctx, b.next())
	}
}

// restart makes the hub start over from the current revision and resync
// every subscriber, as after a compaction: after etcd's history went back,
// the revision it would resume after belongs to the history that went.
func (h *hub) restart() {
	h.fresh.Store(true)
	h.mu.Lock()
	stop := h.stopWatch
	h.mu.Unlock()
	if stop != nil {
		stop()
	}
}

// startRevision is the current revision of the store.
func (h *hub) startRevision(ctx context.Context) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := h.cli.Get(rctx, h.prefix, clientv3.WithRange(h.end), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

func (h *hub) deliver(ev *clientv3.Event) {
	key := string(ev.Kv.Key)
	job := h.keys.JobOf(key)
	if job == "" {
		switch {
		case h.onRewind != nil && ev.Type == clientv3.EventTypePut && strings.HasPrefix(key, h.keys.Rewinds()):
			h.onRewind(ev)
		case h.onPlacement != nil && strings.HasPrefix(key, h.keys.Placements()):
			h.onPlacement(ev)
		}
		return
	}
	if h.onConfig != nil && strings.HasSuffix(key, "/config") && key == h.keys.Config(job) {
		h.onConfig(job)
	}
	h.mu.Lock()
	var match []*subscription
	for _, s := range h.subs[job] {
		if strings.HasPrefix(key, s.prefix) {
			match = append(match, s)
		}
	}
	h.mu.Unlock()
	for _, s := range match {
		s.event(ev)
	}
}

func (h *hub) resyncAll() {
	h.delivering.Lock()
	defer h.delivering.Unlock()
	h.resyncs.Add(1)
	h.mu.Lock()
	var all []*subscription
	for _, subs := range h.subs {
		all = append(all, subs...)
	}
	h.mu.Unlock()
	for _, s := range all {
		s.resync()
	}
	if h.onResync != nil {
		h.onResync()
	}
}

// advance records that every event through rev was delivered.
func (h *hub) advance(rev int64) {
	if h.onAdvance != nil {
		h.onAdvance(rev)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if rev > h.delivered {
		h.delivered = rev
		h.advanced.notify()
	}
}

// deliveredRev is the revision through which every event was delivered.
func (h *hub) deliveredRev() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.delivered
}

// waitDelivered waits until every event through rev was delivered, at most
// for max (or until ctx is done). It returns the delivered revision and
// whether it reached rev.
func (h *hub) waitDelivered(ctx context.Context, rev int64, max time.Duration) (int64, bool) {
	var timeout <-chan time.Time
	for {
		h.mu.Lock()
		delivered, advanced := h.delivered, h.advanced.C()
		h.mu.Unlock()
		if delivered >= rev && delivered > 0 {
			return delivered, true
		}
		if timeout == nil {
			t := time.NewTimer(max)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-advanced:
		case <-timeout:
			return delivered, false
		case <-ctx.Done():
			return delivered, false
		}
	}
}

// settled calls fn between deliveries: every subscriber has had every
// event delivered so far, or none has had it yet. fn must not wait for the
// hub.
func (h *hub) settled(fn func()) {
	h.delivering.RLock()
	defer h.delivering.RUnlock()
	fn()
}

// waitReady waits until the hub delivers events, or ctx is done.
func (h *hub) waitReady(ctx context.Context) bool {
	select {
	case <-h.ready:
		return true
	case <-ctx.Done():
		return false
	}
}
