package coord

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// JobView is what an instance knows about one of its jobs.
type JobView struct {
	// Local is this host's definition; Job the effective one: the
	// registered definition, which every instance runs (before the first
	// registration, Local).
	Local, Job *config.Job
	// Generation is the ModRevision of the config key Job was read from;
	// 0 before the first registration.
	Generation int64
	// Conflict is set when Local differs from the registered definition.
	Conflict bool
	// Source is the registered definition's (keyspace.SourceFile or
	// SourceApplied; "" before the first registration or from an older
	// version, which is a file's).
	Source string
	// Map is the last good shard map seen, nil before the first.
	Map *keyspace.ShardMap
	// MapRev is the ModRevision of Map's key, the guard of claims made on it.
	MapRev int64
	// Leading is set while this instance is the job's leader.
	Leading bool
	// Children are the jobs that depend on this one, each with all its
	// parents (jobs/<job>/children); childrenRev its ModRevision.
	Children    keyspace.ParentsOf
	childrenRev int64
	// Refusal says why this instance may not run Job (a selector that
	// does not match its labels, an applied definition it does not
	// accept), nil when it may. It is set with Job: the engine runs nothing
	// of a view that has one, and no claim is granted on it (sessionFor).
	Refusal error
	// task is the job's task (nil when it has none), woken when the
	// definition changes: whether this instance may run the job depends
	// on it.
	task *jobTask
}

// View returns a copy of what the node knows of job, and whether it has the job.
func (n *Node) View(job string) (JobView, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	v, ok := n.views[job]
	if !ok {
		return JobView{}, false
	}
	return *v, true
}

func (n *Node) updateView(job string, f func(v *JobView)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if v, ok := n.views[job]; ok {
		f(v)
	}
}

// OnChange calls fn whenever something may have changed what this instance
// should do with job's items: a newer shard map in its view, a running
// marker deleted (a run ended, or a lease expired under one), an item
// disabled or enabled, and whenever the watch may have lost events; and
// own with the item of a running marker put under this instance's session
// (one of its claims, perhaps one whose reply was lost and which it must
// adopt), and with -1 when the watch may have lost such puts. Both run on
// the node's watch goroutine and must not block.
func (n *Node) OnChange(job string, fn func(), own func(item int)) (cancel func()) {
	sub := &fn // its identity, for cancel
	n.mu.Lock()
	n.mapSubs[job] = append(n.mapSubs[job], sub)
	n.mu.Unlock()
	stopRunning := n.hub.subscribe(job, n.keys.Running(job), func(ev *clientv3.Event) {
		switch {
		case ev.Type == clientv3.EventTypeDelete:
			fn()
		case ev.Kv.Lease != 0 && clientv3.LeaseID(ev.Kv.Lease) == n.currentLease():
			if item, err := strconv.Atoi(keyspace.LastSegment(string(ev.Kv.Key))); err == nil {
				own(item)
			}
		}
	}, func() { own(-1); fn() })
	stopDisabled := n.hub.subscribe(job, n.keys.Disabled(job), func(*clientv3.Event) { fn() }, fn)
	return func() {
		stopRunning()
		stopDisabled()
		n.mu.Lock()
		if subs := slices.DeleteFunc(n.mapSubs[job], func(s *func()) bool { return s == sub }); len(subs) == 0 {
			delete(n.mapSubs, job)
		} else {
			n.mapSubs[job] = subs
		}
		n.mu.Unlock()
	}
}

// followMap keeps the node's view of job's shard map current until ctx is
// done or stop is called: it reads the map, takes every newer map the hub
// delivers, and reads again when the hub may have lost events.
func (n *Node) followMap(ctx context.Context, job string) (stop func()) {
	return n.followKey(ctx, job, n.keys.Shards(job), true, func(kv *mvccpb.KeyValue) { n.observeMap(job, kv) },
		func(v *JobView) int64 { return v.MapRev })
}

// followKey calls take with every put of key (a key of job) the hub
// delivers, and with key as read from etcd when the hub may have lost
// events, and at once if readNow, until ctx is done or stop is called. It
// holds no goroutine between reads: with thousands of jobs, a goroutine
// per job and purpose is most of an instance's memory.
//
// viewRev is the revision of the key the job's view holds: it outlives a
// session's followKey, until a rewind's recovery forgets it.
func (n *Node) followKey(ctx context.Context, job, key string, readNow bool, take func(*mvccpb.KeyValue), viewRev func(*JobView) int64) (stop func()) {
	var (
		mu      sync.Mutex
		stopped bool
		reads   sync.WaitGroup
		seen    int64 // the key's highest ModRevision delivered or read
	)
	// A read at readRev that shows the key older than a revision seen at
	// or below readRev, or gone, proves etcd went back (the map and the
	// config key of a local job are never deleted): the view keeps newer
	// values by epoch and generation, and would never take etcd's again.
	fromRead := func(kv *mvccpb.KeyValue, readRev int64) {
		var held int64
		n.updateView(job, func(v *JobView) { held = viewRev(v) })
		mu.Lock()
		was := max(seen, held)
		if kv != nil {
			seen = max(seen, kv.ModRevision)
		}
		mu.Unlock()
		switch {
		case was > 0 && was <= readRev && (kv == nil || kv.ModRevision < was):
			got := int64(0)
			if kv != nil {
				got = kv.ModRevision
			}
			n.revs.noteKeyRevision(key, was, got)
		case kv != nil:
			take(kv)
		}
	}
	read := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		reads.Add(1)
		go func() {
			defer reads.Done()
			n.readKey(ctx, key, fromRead)
		}()
	}
	unsubscribe := n.hub.subscribe(job, key, func(ev *clientv3.Event) {
		if ev.Type == clientv3.EventTypePut && string(ev.Kv.Key) == key {
			mu.Lock()
			seen = max(seen, ev.Kv.ModRevision)
			mu.Unlock()
			take(ev.Kv)
		}
	}, read)
	if readNow {
		read()
	}
	return func() {
		unsubscribe()
		mu.Lock()
		stopped = true
		mu.Unlock()
		reads.Wait()
	}
}

// readKey reads key and calls take with it (nil when it is absent) and the
// read's revision, retrying until the read succeeds or ctx is done.
func (n *Node) readKey(ctx context.Context, key string, take func(kv *mvccpb.KeyValue, readRev int64)) {
	b := backoff{min: 100 * time.Millisecond, max: 2 * time.Second}
	for {
		gctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
		resp, err := n.txns.Get(gctx, key)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			var kv *mvccpb.KeyValue
			if len(resp.Kvs) > 0 {
				kv = resp.Kvs[0]
			}
			take(kv, resp.Header.Revision)
			return
		}
		n.log.Debug("read key; retrying", "key", key, "err", err)
		sleep(ctx, b.next())
	}
}

// observeMap takes a newer, well-formed map into the job's view.
func (n *Node) observeMap(job string, kv *mvccpb.KeyValue) {
	m, err := keyspace.DecodeShardMap(kv.Value)
	if err != nil {
		n.log.Error("ignoring shard map; keeping the last good one", "job", job, "key", string(kv.Key), "err", err)
		return
	}
	var changed bool
	n.updateView(job, func(v *JobView) {
		if v.Map == nil || m.Epoch > v.Map.Epoch {
			v.Map, v.MapRev, changed = m, kv.ModRevision, true
		}
	})
	if !changed {
		return
	}
	// At DEBUG: the leader that wrote the map said so at INFO ("wrote
	// shard map"), once for the cluster, not once per instance.
	n.log.Debug("shard map", "job", job, "epoch", m.Epoch, "items", m.ItemsOf(n.opts.ID), "instances", m.Instances, "leader", m.Leader)
	if n.opts.OnMap != nil {
		n.opts.OnMap(job, m)
	}
	n.notifyChange(job)
}

// notifyChange calls the job's OnChange subscribers.
func (n *Node) notifyChange(job string) {
	n.mu.Lock()
	subs := make([]func(), 0, len(n.mapSubs[job]))
	for _, fn := range n.mapSubs[job] {
		subs = append(subs, *fn)
	}
	n.mu.Unlock()
	for _, fn := range subs {
		fn()
	}
}
