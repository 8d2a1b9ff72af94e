package coord

import (
	"context"
	"encoding/json"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Trigger is a one-off run of a job requested by an operator.
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
}

// OnTrigger calls fn for every trigger of job requested from now on, and
// lost when the watch may have lost some (a compacted gap: ReadTriggers
// finds those still in etcd), until the returned cancel is called. fn and
// lost run on the node's watch goroutine and must not block.
func (n *Node) OnTrigger(job string, fn func(Trigger), lost func()) (cancel func()) {
	return n.hub.subscribe(job, n.keys.Triggers(job), func(ev *clientv3.Event) {
		if ev.Type != clientv3.EventTypePut {
			return
		}
		var tr Trigger
		if err := json.Unmarshal(ev.Kv.Value, &tr); err != nil {
			n.log.Error("ignoring malformed trigger", "job", job, "key", string(ev.Kv.Key), "err", err)
			return
		}
		tr.Rev = ev.Kv.CreateRevision
		fn(tr)
	}, lost)
}

// OnChange calls fn whenever something may have changed what this instance
// should do with job's items: a newer shard map in its view, a running
// marker deleted (a run ended, or a lease expired under one), an item
// disabled or enabled, and whenever the watch may have lost events. fn runs
// on the node's watch goroutine and must not block.
func (n *Node) OnChange(job string, fn func()) (cancel func()) {
	id := new(int)
	n.mu.Lock()
	if n.mapSubs[job] == nil {
		n.mapSubs[job] = map[*int]func(){}
	}
	n.mapSubs[job][id] = fn
	n.mu.Unlock()
	stopRunning := n.hub.subscribe(job, n.keys.Running(job), func(ev *clientv3.Event) {
		if ev.Type == clientv3.EventTypeDelete {
			fn()
		}
	}, fn)
	stopDisabled := n.hub.subscribe(job, n.keys.Disabled(job), func(*clientv3.Event) { fn() }, fn)
	return func() {
		stopRunning()
		stopDisabled()
		n.mu.Lock()
		delete(n.mapSubs[job], id)
		if len(n.mapSubs[job]) == 0 {
			delete(n.mapSubs, job)
		}
		n.mu.Unlock()
	}
}

// Status reads the cluster's state (see ReadStatus).
func (n *Node) Status(ctx context.Context) (*ClusterStatus, error) {
	return ReadStatus(ctx, n.opts.Client, n.keys)
}
