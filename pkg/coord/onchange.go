package coord

import (
	clientv3 "go.etcd.io/etcd/client/v3"
)

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
