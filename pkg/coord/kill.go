package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Killing a running item (`shardd kill`, the API, the console) is a
// request, like a trigger: the operator's side reads which runs are in
// progress (item, fence, instance) and puts jobs/<job>/kills/<id> under a
// one-minute lease; the instance that runs each of them stops it (the
// script's process group, or the hook's request) and records it KILLED,
// reason operator, with who asked. A killed run is not failed over: it was
// stopped on purpose (ItemRecord.CutByFailure is false for it).
//
// A kill names runs by fence, never just items: a request that arrives
// after its run ended cannot stop the item's next run. The operator names
// the fence when it saw one (the console's page, `shardd kill --fence`):
// the kill is of that run or of nothing. The request is put by a Txn that
// compares each run's running marker (its create revision is the run's
// fence) with the fence named, so the check and the put are one: a run
// that ended since the operator saw it, or since the read, is refused
// (ErrRefused, saying how it ended and what runs now) when it was named,
// and read again when the kill meant "the runs in progress".
//
//	operator                          owner of the item
//	read items, markers
//	  refuse: nothing running, or
//	  the fence named is not running
//	Txn: markers still at the fences
//	  put kills/<id>  ───────────────▶ OnKill: the run with that fence?
//	  else read again                  yes: cancel it (cause: who)
//	wait for the records               no:  nothing (it ended, or is
//	  KILLED/operator  ◀──record outcome──   another's; remembered for a
//	  or ended first                         minute in case its start is
//	                                         still being registered)

// OnKill calls fn for every kill request of job made from now on that
// names a run of this instance, until the returned cancel is called. fn
// runs on the node's watch goroutine and must not block.
func (n *Node) OnKill(job string, fn func(keyspace.Kill)) (cancel func()) {
	return n.hub.subscribe(job, n.keys.Kills(job), func(ev *clientv3.Event) {
		if ev.Type != clientv3.EventTypePut {
			return
		}
		var k keyspace.Kill
		if err := json.Unmarshal(ev.Kv.Value, &k); err != nil {
			n.log.Error("ignoring malformed kill request", "job", job, "key", string(ev.Kv.Key), "err", err)
			return
		}
		k.Runs = slices.DeleteFunc(k.Runs, func(r keyspace.KillRun) bool { return r.Instance != n.opts.ID })
		if len(k.Runs) > 0 {
			fn(k)
		}
	}, func() {
		// A request put during a compacted watch gap is lost; the hub logs
		// the gap once, and the operator's wait says the run did not end.
	})
}

// Kills reads the job's kill requests still in etcd (each lives KillTTL):
// who asked to stop each run. A run cut by a failure before its kill
// reached it (its instance was cut off) is not failed over when it is
// here: see SettleKilled.
func (n *Node) Kills(ctx context.Context, job string) (map[keyspace.KillKey]keyspace.KillBy, error) {
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Get(rctx, n.keys.Kills(job), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read the kill requests of job %q: %w", job, err)
	}
	out := map[keyspace.KillKey]keyspace.KillBy{}
	for _, kv := range resp.Kvs {
		var k keyspace.Kill
		if json.Unmarshal(kv.Value, &k) != nil {
			continue
		}
		for _, r := range k.Runs {
			out[keyspace.KillKey{Item: r.Item, Fence: r.Fence}] = keyspace.KillBy{By: k.By, Reason: k.KillReason()}
		}
	}
	return out, nil
}

// SettleKilled records that a run an operator killed (or overlap replace
// did), which a failure cut before the kill reached its instance, is not
// run again: KILLED with the kill's reason, by whom, guarded by the record
// read.
func (n *Node) SettleKilled(ctx context.Context, job string, item int, st keyspace.ItemState, k keyspace.KillBy) error {
	if st.Record == nil {
		return nil
	}
	rec := *st.Record
	rec.Fence = keyspace.RunFence(st.Record, st.Rev)
	rec.State, rec.Reason, rec.KilledBy, rec.End = keyspace.StateKilled, k.Reason, k.By, n.opts.Now().UTC()
	rec.Error = "killed by " + k.By + ": its instance was cut off before the kill reached it; not run again"
	return n.finish(ctx, rec, st.Rev, false)
}

// Replace asks the instance running item's run with fence to stop it for
// a newer fire (overlap replace): a kill request, reason replaced, once per
// run (keyspace.ReplaceKillID), and only while the run holds the item (its
// running marker was created at fence). The request lives under a lease of
// its own, as an operator's does (KillTTL, or three session TTLs if that is
// longer: the time a cut-off run takes to be settled from it), so that
// requests do not pile up. It reports whether the run is asked to stop:
// still running, and the request put by this call or before.
func (n *Node) Replace(ctx context.Context, job string, item int, fence int64, instance string, fire time.Time) (bool, error) {
	key, marker := n.keys.Kill(job, keyspace.ReplaceKillID(item, fence)), n.keys.RunningItem(job, item)
	read, err := n.opts.Client.Txn(ctx).Then(clientv3.OpGet(key, clientv3.WithCountOnly()), clientv3.OpGet(marker)).Commit()
	if err != nil {
		return false, fmt.Errorf("ask to replace the run of job %q item %d: %w", job, item, err)
	}
	kvs := read.Responses[1].GetResponseRange().Kvs
	if len(kvs) != 1 || kvs[0].CreateRevision != fence {
		return false, nil // the run ended
	}
	if read.Responses[0].GetResponseRange().Count > 0 {
		return true, nil // asked before
	}
	ttl := max(keyspace.KillTTL, 3*n.opts.TTL)
	lease, err := n.opts.Client.Grant(ctx, int64(ttl/time.Second))
	if err != nil {
		return false, fmt.Errorf("ask to replace the run of job %q item %d: %w", job, item, err)
	}
	k := keyspace.Kill{ID: keyspace.ReplaceKillID(item, fence), Runs: []keyspace.KillRun{{Item: item, Fence: fence, Instance: instance}},
		By: "the fire of " + fire.UTC().Format(time.RFC3339), At: n.opts.Now().UTC(), Reason: keyspace.ReasonReplaced}
	val, err := json.Marshal(k)
	if err != nil {
		return false, err
	}
	resp, err := n.opts.Client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), clientv3.Compare(clientv3.CreateRevision(marker), "=", fence)).
		Then(clientv3.OpPut(key, string(val), clientv3.WithLease(lease.ID))).
		Else(clientv3.OpGet(marker)).Commit()
	if err != nil {
		return false, fmt.Errorf("ask to replace the run of job %q item %d: %w", job, item, err)
	}
	if resp.Succeeded {
		return true, nil
	}
	n.opts.Client.Revoke(ctx, lease.ID) // not needed: the request is there, or the run ended
	kvs = resp.Responses[0].GetResponseRange().Kvs
	return len(kvs) == 1 && kvs[0].CreateRevision == fence, nil
}
