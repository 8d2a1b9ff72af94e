package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Triggers are durable until served (docs/design.md, Triggers): a trigger
// is a key under jobs/<job>/triggers/, an operator's with a lease of
// TriggerTTL, a parent fire's (upstream) with none. The engine keeps each
// job's trigger keys from OnTrigger's events and a ReadTriggers that
// follows the subscription, serves them with claims (the item record's
// Trigger, written by the claim's Txn, says which an item served), and
// deletes a trigger with DeleteTrigger once no item is left to serve it:
// a Txn that compares, as etcd has them then, whatever made an item (or
// the whole job) count as having nothing left to serve.

// OnTrigger calls fn for every change of job's trigger keys from now on
// (puts and deletions), and lost when the watch may have lost some (a
// compacted gap: what ReadTriggers reads after it is the truth), until the
// returned cancel is called. Subscribed first, read second: every change
// after the read's revision is delivered. fn and lost run on the node's
// watch goroutine and must not block.
func (n *Node) OnTrigger(job string, fn func(keyspace.TriggerEvent), lost func()) (cancel func()) {
	return n.hub.subscribe(job, n.keys.Triggers(job), func(ev *clientv3.Event) {
		id := keyspace.LastSegment(string(ev.Kv.Key))
		if ev.Type == clientv3.EventTypeDelete {
			fn(keyspace.TriggerEvent{ID: id, Rev: ev.Kv.ModRevision})
			return
		}
		tr, ok := n.decodeTrigger(job, ev.Kv)
		if !ok {
			return
		}
		fn(keyspace.TriggerEvent{ID: id, Trigger: &tr, Rev: ev.Kv.ModRevision})
	}, lost)
}

// decodeTrigger reads a trigger key; a malformed one is logged and left
// out (no instance can serve it).
func (n *Node) decodeTrigger(job string, kv *mvccpb.KeyValue) (keyspace.Trigger, bool) {
	var tr keyspace.Trigger
	if err := json.Unmarshal(kv.Value, &tr); err != nil {
		n.log.Error("ignoring malformed trigger", "job", job, "key", string(kv.Key), "err", err)
		return keyspace.Trigger{}, false
	}
	tr.ID = keyspace.LastSegment(string(kv.Key)) // the key names it, whatever the value says
	tr.Rev, tr.ModRev = kv.CreateRevision, kv.ModRevision
	return tr, true
}

// ReadTriggers reads the job's pending triggers (operators' and
// upstream), oldest first.
func (n *Node) ReadTriggers(ctx context.Context, job string) ([]keyspace.Trigger, error) {
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.txns.Get(rctx, n.keys.Triggers(job), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read triggers of %s: %w", job, err)
	}
	var out []keyspace.Trigger
	for _, kv := range resp.Kvs {
		if tr, ok := n.decodeTrigger(job, kv); ok {
			out = append(out, tr)
		}
	}
	slices.SortFunc(out, func(a, b keyspace.Trigger) int { return int(a.Rev - b.Rev) })
	return out, nil
}

// TriggerGuard is why an instance found no item left to serve a trigger,
// beyond items whose records say they served it (a record's Trigger only
// grows: that needs no guard). DeleteTrigger checks each in its Txn, as
// etcd has it then.
type TriggerGuard struct {
	// JobOff: the job is disabled by an operator (its disable mark).
	JobOff bool
	// Definition, when not 0, is the generation (the config key's
	// ModRevision) of a definition that says disabled: true.
	Definition int64
	// ItemsOff are the items counted because they are disabled.
	ItemsOff []int
}

// MaxTriggerGuardItems bounds TriggerGuard.ItemsOff: one compare each,
// within etcd's default 128 operations per Txn.
const MaxTriggerGuardItems = 120

// DeleteTrigger deletes tr if its key is still the trigger read and
// everything g names holds in etcd now; it reports whether it did. A
// false with no error changes nothing: the caller decides again on a
// fresher read.
func (n *Node) DeleteTrigger(ctx context.Context, job string, tr keyspace.Trigger, g TriggerGuard) (bool, error) {
	if len(g.ItemsOff) > MaxTriggerGuardItems {
		return false, fmt.Errorf("delete trigger %s of job %q: %d disabled items to compare, at most %d fit a Txn", tr.ID, job, len(g.ItemsOff), MaxTriggerGuardItems)
	}
	key := n.keys.Trigger(job, tr.ID)
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", tr.Rev)}
	if g.JobOff {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(n.keys.DisabledJob(job)), ">", 0))
	}
	if g.Definition != 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(n.keys.Config(job)), "=", g.Definition))
	}
	for _, item := range g.ItemsOff {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(n.keys.DisabledItem(job, item)), ">", 0))
	}
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Txn(rctx).If(cmps...).Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return false, fmt.Errorf("delete trigger %s of job %q: %w", tr.ID, job, err)
	}
	return resp.Succeeded, nil
}
