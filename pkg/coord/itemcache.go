package coord

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The item cache keeps each job's item keys (records, running markers,
// disable marks) as the hub's watch delivers them, so that a job's reconcile
// need not read them from etcd before every decision (one read per fire per
// instance was most of etcd's load).
//
// What it may serve. Decisions made on the cache are as safe as decisions
// made on a read: every write they lead to is guarded in etcd (a claim by
// the record's ModRevision and the marker's absence, a skip or a settle by
// the record's ModRevision), so a stale state can only lose a claim, never
// win a wrong one. What the cache must not do is make this instance blind:
//
//   - to its own writes, which would make it decide again on what it just
//     did: the node remembers the revision of its last write of item keys
//     that applied, and the cache serves a job only once the hub has
//     delivered every event up to that revision (it waits up to cacheWait;
//     else the caller reads etcd);
//   - to what a refused write told it (it would lose the same claim again
//     and again): a refused write empties the job's cache (refused), so
//     that the next decision is made on a read of etcd. Not a wait for the
//     refusal's revision: it may be a write outside jobs/, which the jobs
//     watch never delivers;
//   - to the event that woke the reader: the hub calls its subscribers in
//     no set order, so a reconcile woken by a marker's deletion could read
//     the cache before the cache had the deletion, and wait for a deletion
//     that already came (a lost wake-up: a G3 miss found by the chaos
//     suite). The cache is read between the hub's deliveries (hub.settled).
//
// Events the hub delivers after the read that filled the cache, for
// revisions the read already covers, fold in by each key's revision; until
// they all have, a key deleted before the read may show again for a moment:
// a stale state, which the guards above make safe, and whose deletion,
// delivered next, wakes the loop again.
//
// States of one job's cache:
//
//	(none) --first ReadItems: subscribe--> empty --ReadItems' read at R--> filled at R
//	filled --events after R, in order, as the hub delivers them--> filled
//	filled --hub resync (events lost to compaction)--> empty (a read begun before it does not fill)
//
// Each key keeps the revision of its last change, deletions included, so
// that a read and the events that overlap it fold in any order.

// cacheWait bounds how long ReadItems waits for the hub to deliver this
// node's own last write before it reads etcd instead.
const cacheWait = 200 * time.Millisecond

// itemCache is one job's item keys.
type itemCache struct {
	mu     sync.Mutex
	filled bool
	// gen counts the hub's resyncs: a read begun before one does not fill.
	gen    uint64
	states map[int]*cachedItem
	cancel func() // the hub subscriptions
}

// cachedItem is an item's keys, each with the revision of its last change.
type cachedItem struct {
	keys [3]cachedKey // record, running marker, disable mark
}

type cachedKey struct {
	kv  *mvccpb.KeyValue // nil: absent
	rev int64            // last change, a deletion included
	// state is the key decoded (decodeItemKey, with no lease: RunningMine
	// is set per read), kept until the key changes: a job's reconcile reads
	// its items at every fire and sweep, and decoding each record's JSON
	// every time was most of an idle instance's CPU with 10,000 jobs.
	state *keyspace.ItemState
}

// itemCacheOf returns job's cache, subscribing it on first use (the
// caller's read that follows fills it: itemCache.fill).
func (n *Node) itemCacheOf(job string) *itemCache {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, ok := n.jobs[job]; !ok {
		return nil // not (or no longer) a local job: no cache to leave behind
	}
	c := n.itemCaches[job]
	if c == nil {
		c = n.subscribeItemCache(job)
		n.itemCaches[job] = c
	}
	return c
}

// cachedItems returns job's items from c, and whether it could, with the
// generation of c a read to fill it must be made in.
func (n *Node) cachedItems(ctx context.Context, job string, c *itemCache) (keyspace.JobItems, uint64, bool) {
	if c == nil {
		return keyspace.JobItems{}, 0, false
	}
	c.mu.Lock()
	filled, gen := c.filled, c.gen
	c.mu.Unlock()
	if !filled {
		return keyspace.JobItems{}, gen, false
	}
	rev, ok := n.hub.waitDelivered(ctx, n.lastItemWrite.Load(), cacheWait)
	if !ok {
		return keyspace.JobItems{}, gen, false
	}
	lease := n.currentLease()
	out := keyspace.JobItems{Items: map[int]keyspace.ItemState{}}
	// Between deliveries: a reconcile woken by an event sees that event.
	n.hub.settled(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if ok, gen = c.filled, c.gen; !ok {
			return
		}
		out.Rev = max(rev, n.hub.deliveredRev())
		for item, ci := range c.states {
			var st keyspace.ItemState
			for kind := range ci.keys {
				ck := &ci.keys[kind]
				if ck.kv == nil {
					continue
				}
				if ck.state == nil {
					ck.state = new(keyspace.ItemState)
					n.decodeItemKey(job, item, kind, ck.kv, clientv3.NoLease, ck.state)
				}
				switch kind {
				case 0: // shared: ItemRecords are never changed in place
					st.Record, st.Rev = ck.state.Record, ck.state.Rev
				case 1:
					st.RunningBy = ck.state.RunningBy
					st.RunningMine = lease != clientv3.NoLease && clientv3.LeaseID(ck.kv.Lease) == lease
				case 2:
					st.Disabled = true
				}
			}
			if st.Record != nil || st.RunningBy != "" || st.Disabled {
				out.Items[item] = st
			}
		}
	})
	return out, gen, ok
}

// subscribeItemCache subscribes a new cache to job's item keys. n.mu is held.
func (n *Node) subscribeItemCache(job string) *itemCache {
	c := &itemCache{states: map[int]*cachedItem{}}
	k := n.keys
	apply := func(kind int) func(*clientv3.Event) {
		return func(ev *clientv3.Event) {
			item, err := strconv.Atoi(keyspace.LastSegment(string(ev.Kv.Key)))
			if err != nil {
				return
			}
			deleted := ev.Type == clientv3.EventTypeDelete
			if kind == 0 {
				n.learnRecord(job, item, ev.Kv, deleted, 0)
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			c.apply(item, kind, deleted, ev.Kv)
		}
	}
	resync := c.invalidate // events were lost: the next ReadItems reads and fills again
	cancels := []func(){
		n.hub.subscribe(job, k.Items(job), apply(0), resync),
		n.hub.subscribe(job, k.Running(job), apply(1), resync),
		n.hub.subscribe(job, k.DisabledItems(job), apply(2), resync),
	}
	c.cancel = func() {
		for _, cancel := range cancels {
			cancel()
		}
	}
	return c
}

// fill folds a read of the job's item keys (ReadItems' three ranges),
// begun in generation gen, into c if c waits to be filled.
func (c *itemCache) fill(gen uint64, resp *clientv3.TxnResponse) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.filled || c.gen != gen {
		return
	}
	for kind, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			if item, err := strconv.Atoi(keyspace.LastSegment(string(kv.Key))); err == nil {
				c.apply(item, kind, false, kv)
			}
		}
	}
	c.filled = true
}

// refused invalidates job's cache after etcd refused a write of this node
// to its items (a guard failed): the state it was decided on is stale, and
// the next read goes to etcd (and fills the cache again) rather than
// decide again on the same state. Not a wait for the reply's revision: a
// refused Txn's revision may be a write outside jobs/, which the jobs
// watch never delivers.
func (n *Node) refused(job string) {
	n.mu.Lock()
	c := n.itemCaches[job]
	n.mu.Unlock()
	if c != nil {
		c.invalidate()
	}
}

// invalidate empties c: the next ReadItems reads etcd and fills it; a read
// begun before does not fill it.
func (c *itemCache) invalidate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.filled, c.states = false, map[int]*cachedItem{}
	c.gen++
}

// dropItemCache forgets job's cache (the job is no longer local).
func (n *Node) dropItemCache(job string) {
	n.mu.Lock()
	c := n.itemCaches[job]
	delete(n.itemCaches, job)
	n.mu.Unlock()
	if c != nil {
		c.cancel()
	}
}

// apply folds one key's change into c, unless c has a newer one (a read
// and the events overlap). c.mu is held.
func (c *itemCache) apply(item, kind int, deleted bool, kv *mvccpb.KeyValue) {
	ci := c.states[item]
	if ci == nil {
		ci = &cachedItem{}
		c.states[item] = ci
	}
	ck := &ci.keys[kind]
	if ck.rev >= kv.ModRevision {
		return
	}
	ck.kv, ck.rev, ck.state = kv, kv.ModRevision, nil
	if deleted {
		ck.kv = nil
	}
}

// wroteItems records the revision of a write of this node to item keys
// that applied: the cache serves no decision until the hub has delivered
// it (this node is never blind to what it wrote). The write is under
// jobs/, so the jobs watch delivers it.
func (n *Node) wroteItems(rev int64) {
	for {
		cur := n.lastItemWrite.Load()
		if rev <= cur || n.lastItemWrite.CompareAndSwap(cur, rev) {
			return
		}
	}
}
