package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

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

// Trigger is a one-off run of a job requested by an operator, or by a
// parent's completed fire (Upstream).
type Trigger struct {
	ID string `json:"id"`
	// Items to run; empty runs every item.
	Items []int `json:"items,omitempty"`
	// Fire is the run's fire time: when it was requested.
	Fire time.Time `json:"fire"`
	// By names who asked: a token's name (API, console) or user@host (CLI).
	By string `json:"by,omitempty"`
	// Param is the operator's one-off parameter, given to the run as
	// SHARDD_TRIGGER_PARAMETER (and in SHARDD_CONTEXT).
	Param string `json:"param,omitempty"`
	// Rerun, when set, is a past scheduled fire to run again: the run's
	// fire is Rerun instead of the time it is served. It is still a MANUAL
	// run with a claim (and fence) of its own; it does not move the item's
	// watermark, so it is never taken for the original fire.
	Rerun time.Time `json:"rerun,omitzero"`
	// Upstream is set on a trigger a parent's completed fire put (no
	// lease: it stays until every item served it).
	Upstream *Upstream `json:"upstream,omitempty"`
	// NoPropagate: the runs of this trigger do not trigger the job's
	// children.
	NoPropagate bool `json:"noPropagate,omitempty"`
	// Rev is the etcd revision that created the request: the identity of
	// the manual fire, ordered cluster-wide without trusting any host's
	// clock (Fire is only the requester's note of when it asked).
	Rev int64 `json:"-"`
	// ModRev is the revision of the key's last change (triggers are not
	// rewritten: its creation), by which a read and events fold together.
	ModRev int64 `json:"-"`
}

// TriggerEvent is a change of one of a job's trigger keys.
type TriggerEvent struct {
	// ID is the trigger's key's last segment.
	ID string
	// Trigger is the trigger put; nil when the key was deleted (served,
	// dropped, or its lease ended).
	Trigger *Trigger
	// Rev is the revision of the change.
	Rev int64
}

// OnTrigger calls fn for every change of job's trigger keys from now on
// (puts and deletions), and lost when the watch may have lost some (a
// compacted gap: what ReadTriggers reads after it is the truth), until the
// returned cancel is called. Subscribed first, read second: every change
// after the read's revision is delivered. fn and lost run on the node's
// watch goroutine and must not block.
func (n *Node) OnTrigger(job string, fn func(TriggerEvent), lost func()) (cancel func()) {
	return n.hub.subscribe(job, n.keys.Triggers(job), func(ev *clientv3.Event) {
		id := lastSegment(string(ev.Kv.Key))
		if ev.Type == clientv3.EventTypeDelete {
			fn(TriggerEvent{ID: id, Rev: ev.Kv.ModRevision})
			return
		}
		tr, ok := n.decodeTrigger(job, ev.Kv)
		if !ok {
			return
		}
		fn(TriggerEvent{ID: id, Trigger: &tr, Rev: ev.Kv.ModRevision})
	}, lost)
}

// decodeTrigger reads a trigger key; a malformed one is logged and left
// out (no instance can serve it).
func (n *Node) decodeTrigger(job string, kv *mvccpb.KeyValue) (Trigger, bool) {
	var tr Trigger
	if err := json.Unmarshal(kv.Value, &tr); err != nil {
		n.log.Error("ignoring malformed trigger", "job", job, "key", string(kv.Key), "err", err)
		return Trigger{}, false
	}
	tr.ID = lastSegment(string(kv.Key)) // the key names it, whatever the value says
	tr.Rev, tr.ModRev = kv.CreateRevision, kv.ModRevision
	return tr, true
}

// ReadTriggers reads the job's pending triggers (operators' and
// upstream), oldest first.
func (n *Node) ReadTriggers(ctx context.Context, job string) ([]Trigger, error) {
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Get(rctx, n.keys.Triggers(job), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read triggers of %s: %w", job, err)
	}
	var out []Trigger
	for _, kv := range resp.Kvs {
		if tr, ok := n.decodeTrigger(job, kv); ok {
			out = append(out, tr)
		}
	}
	slices.SortFunc(out, func(a, b Trigger) int { return int(a.Rev - b.Rev) })
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
func (n *Node) DeleteTrigger(ctx context.Context, job string, tr Trigger, g TriggerGuard) (bool, error) {
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
