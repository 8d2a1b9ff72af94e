package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

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
// after its run ended cannot stop the item's next run.
//
//	operator                          owner of the item
//	read items, markers  ──put kills/<id>──▶ OnKill: the run with that fence?
//	wait for the records                     yes: cancel it (cause: who)
//	  KILLED/operator  ◀──record outcome──   no:  nothing (it ended, or is
//	  or ended first                              another's; remembered for a
//	                                              minute in case its start is
//	                                              still being registered)

// Kill is an operator's request to stop runs in progress.
type Kill struct {
	ID   string    `json:"id"`
	Runs []KillRun `json:"runs"`
	// By names who asked (see Trigger.By).
	By string    `json:"by,omitempty"`
	At time.Time `json:"at"`
}

// KillRun is one run a kill stops: the item's run with that fence, on
// that instance.
type KillRun struct {
	Item     int    `json:"item"`
	Fence    int64  `json:"fence"`
	Instance string `json:"instance"`
}

// KillRequest is what an operator asks to stop: the runs in progress of
// the job's items (all of them when Items is empty).
type KillRequest struct {
	Job   string
	Items []int
	By    string
}

// KillTTL is how long a kill request stays in etcd.
const KillTTL = time.Minute

// Killing says what a kill request asked to stop.
type Killing struct {
	Kill
	// Rev is the revision of the request.
	Rev int64 `json:"rev"`
}

// RequestKill asks the instances running the job's items to stop those
// runs. It refuses an unknown job, an item out of range, and a target with
// nothing running.
func RequestKill(ctx context.Context, cli *clientv3.Client, keys Keys, r KillRequest) (Killing, error) {
	f, err := requireJob(ctx, cli, keys, r.Job)
	if err != nil {
		return Killing{}, err
	}
	for _, item := range r.Items {
		if item < 0 {
			return Killing{}, opErr(ErrBadTarget, "item %d: items are numbered from 0", item)
		}
		if err := f.checkItem(item); err != nil {
			return Killing{}, err
		}
	}
	items := r.Items
	if len(items) == 0 {
		items = f.running
	}
	if len(items) == 0 {
		return Killing{}, opErr(ErrRefused, "no item of job %q is running: nothing to kill", r.Job)
	}
	ops := make([]clientv3.Op, 0, 2*len(items))
	for _, item := range items {
		ops = append(ops, clientv3.OpGet(keys.Item(r.Job, item)), clientv3.OpGet(keys.RunningItem(r.Job, item)))
	}
	resp, err := cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return Killing{}, fmt.Errorf("kill job %q: read its items: %w", r.Job, err)
	}
	k := Kill{By: r.By, At: time.Now().UTC().Truncate(time.Millisecond)}
	var idle []string
	for i, item := range items {
		recs := resp.Responses[2*i].GetResponseRange().Kvs
		markers := resp.Responses[2*i+1].GetResponseRange().Kvs
		var rec ItemRecord
		if len(recs) > 0 {
			json.Unmarshal(recs[0].Value, &rec)
		}
		if len(markers) == 0 || len(recs) == 0 || rec.State != StateRunning {
			idle = append(idle, idleWhy(item, rec, len(recs) > 0))
			continue
		}
		// The marker is created by the claim: its revision is the fence.
		k.Runs = append(k.Runs, KillRun{Item: item, Fence: markers[0].CreateRevision, Instance: string(markers[0].Value)})
	}
	if len(k.Runs) == 0 {
		if len(idle) == 1 {
			return Killing{}, opErr(ErrRefused, "job %q: %s: nothing to kill", r.Job, idle[0])
		}
		return Killing{}, opErr(ErrRefused, "no item of job %q is running (%d asked): nothing to kill", r.Job, len(idle))
	}
	lease, err := cli.Grant(ctx, int64(KillTTL/time.Second))
	if err != nil {
		return Killing{}, fmt.Errorf("kill job %q: %w", r.Job, err)
	}
	k.ID = newRequestID(k.At)
	val, _ := json.Marshal(k)
	put, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(keys.Kill(r.Job, k.ID)), "=", 0)).
		Then(clientv3.OpPut(keys.Kill(r.Job, k.ID), string(val), clientv3.WithLease(lease.ID))).Commit()
	if err != nil {
		return Killing{}, fmt.Errorf("kill job %q: %w", r.Job, err)
	}
	if !put.Succeeded {
		return Killing{}, fmt.Errorf("kill job %q: request key %s exists", r.Job, k.ID)
	}
	return Killing{Kill: k, Rev: put.Header.Revision}, nil
}

// idleWhy says why an item has no run to kill.
func idleWhy(item int, rec ItemRecord, ok bool) string {
	if !ok || rec.Fence == 0 {
		return fmt.Sprintf("item %d is not running (it never ran)", item)
	}
	what := rec.State
	if rec.Reason != "" {
		what += "/" + rec.Reason
	}
	when := rec.End
	if when.IsZero() {
		when = rec.Fire
	}
	return fmt.Sprintf("item %d is not running (its last run, fence %d, ended %s at %s)", item, rec.Fence, what, when.UTC().Format(time.RFC3339))
}

// KillResult is how a killed run ended.
type KillResult struct {
	KillRun
	// State is the run's record: KILLED (Reason operator) when the kill
	// stopped it; DONE, FAILED or another KILLED when it ended first; "" if
	// it had not ended when WaitKill gave up.
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

// WaitKill waits until every run of k has ended (its item's record with
// that fence is no longer RUNNING, or a newer run has replaced it) or ctx
// ends, and says how each ended.
func WaitKill(ctx context.Context, cli *clientv3.Client, keys Keys, job string, k Kill) ([]KillResult, error) {
	out := make([]KillResult, len(k.Runs))
	for i, r := range k.Runs {
		out[i].KillRun = r
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ops := make([]clientv3.Op, len(k.Runs))
		for i, r := range k.Runs {
			ops[i] = clientv3.OpGet(keys.Item(job, r.Item))
		}
		resp, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return out, fmt.Errorf("read the killed items of job %q: %w", job, err)
		}
		pending := 0
		for i, r := range k.Runs {
			var rec ItemRecord
			var rev int64
			if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
				json.Unmarshal(kvs[0].Value, &rec)
				rev = kvs[0].ModRevision
			}
			switch {
			case rec.State == StateRunning && rev == r.Fence: // a RUNNING record's fence is its claim's revision
				pending++
			case rec.Fence == r.Fence:
				out[i].State, out[i].Reason, out[i].Error = rec.State, rec.Reason, rec.Error
			case rev > r.Fence:
				// The record has moved on (the item's next run, or fires
				// recorded skipped): the run's own record is in the history.
				ended, err := endOf(ctx, cli, keys, job, r)
				if err != nil {
					return out, err
				}
				out[i] = ended
			default:
				pending++
			}
		}
		if pending == 0 {
			return out, nil
		}
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-tick.C:
		}
	}
}

// endOf finds how run r ended in its item's history; State is "ENDED"
// when the history no longer has it.
func endOf(ctx context.Context, cli *clientv3.Client, keys Keys, job string, r KillRun) (KillResult, error) {
	res := KillResult{KillRun: r}
	recs, err := ReadHistory(ctx, cli, keys, job)
	if err != nil {
		return res, fmt.Errorf("read the history of job %q: %w", job, err)
	}
	for _, h := range recs {
		if h.Item == r.Item && h.Fence == r.Fence {
			res.State, res.Reason, res.Error = h.State, h.Reason, h.Error
			return res, nil
		}
	}
	res.State, res.Error = "ENDED", "it ended; the item's history no longer has its record (fence "+strconv.FormatInt(r.Fence, 10)+")"
	return res, nil
}

// OnKill calls fn for every kill request of job made from now on that
// names a run of this instance, until the returned cancel is called. fn
// runs on the node's watch goroutine and must not block.
func (n *Node) OnKill(job string, fn func(Kill)) (cancel func()) {
	return n.hub.subscribe(job, n.keys.Kills(job), func(ev *clientv3.Event) {
		if ev.Type != clientv3.EventTypePut {
			return
		}
		var k Kill
		if err := json.Unmarshal(ev.Kv.Value, &k); err != nil {
			n.log.Error("ignoring malformed kill request", "job", job, "key", string(ev.Kv.Key), "err", err)
			return
		}
		k.Runs = slices.DeleteFunc(k.Runs, func(r KillRun) bool { return r.Instance != n.opts.ID })
		if len(k.Runs) > 0 {
			fn(k)
		}
	}, func() {
		// A request put during a compacted watch gap is lost; the hub logs
		// the gap once, and the operator's wait says the run did not end.
	})
}

// KillKey names a run a kill asked to stop: its item and fence.
type KillKey struct {
	Item  int
	Fence int64
}

// Kills reads the job's kill requests still in etcd (each lives KillTTL):
// who asked to stop each run. A run cut by a failure before its kill
// reached it (its instance was cut off) is not failed over when it is
// here: see SettleKilled.
func (n *Node) Kills(ctx context.Context, job string) (map[KillKey]string, error) {
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Get(rctx, n.keys.Kills(job), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read the kill requests of job %q: %w", job, err)
	}
	out := map[KillKey]string{}
	for _, kv := range resp.Kvs {
		var k Kill
		if json.Unmarshal(kv.Value, &k) != nil {
			continue
		}
		for _, r := range k.Runs {
			out[KillKey{Item: r.Item, Fence: r.Fence}] = k.By
		}
	}
	return out, nil
}

// RunFence is the fence of the run a record describes: its Fence, or, for
// a RUNNING record (written before its fence was known), the record's
// revision rev, which is its claim's.
func RunFence(rec *ItemRecord, rev int64) int64 {
	if rec.State == StateRunning {
		return rev
	}
	return rec.Fence
}

// SettleKilled records that a run an operator killed, which a failure cut
// before the kill reached its instance, is not run again: KILLED, reason
// operator, by whom, guarded by the record read.
func (n *Node) SettleKilled(ctx context.Context, job string, item int, st ItemState, by string) error {
	if st.Record == nil {
		return nil
	}
	rec := *st.Record
	rec.Fence = RunFence(st.Record, st.Rev)
	rec.State, rec.Reason, rec.KilledBy, rec.End = StateKilled, ReasonOperator, by, n.opts.Now().UTC()
	rec.Error = "killed by " + by + ": its instance was cut off before the kill reached it; not run again"
	return n.finish(ctx, rec, st.Rev, false)
}

// Kill asks for the job's runs in progress to be stopped (see RequestKill).
func (n *Node) Kill(ctx context.Context, r KillRequest) (Killing, error) {
	if r.By == "" {
		r.By = n.opts.ID
	}
	return RequestKill(ctx, n.opts.Client, n.keys, r)
}

// WaitKill waits for the runs of k to end (see WaitKill).
func (n *Node) WaitKill(ctx context.Context, job string, k Kill) ([]KillResult, error) {
	return WaitKill(ctx, n.opts.Client, n.keys, job, k)
}
