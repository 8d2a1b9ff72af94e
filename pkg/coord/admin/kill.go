package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// KillRequest is what an operator asks to stop: the runs in progress of
// the job's items (all of them when Items is empty) when the request is
// recorded. Fence, when set, names the run the operator saw of the one
// item in Items (and Instance, when set, where it runs): the request
// stops that run or nothing, and is refused when it is no longer the
// item's run in progress.
type KillRequest struct {
	Job      string
	Items    []int
	Fence    int64
	Instance string
	By       string
}

// killAttempts bounds the reads of a kill without a fence whose runs end
// between its read and its put.
const killAttempts = 3

// Killing says what a kill request asked to stop.
type Killing struct {
	keyspace.Kill
	// Rev is the revision of the request.
	Rev int64 `json:"rev"`
}

// Kill asks the instances running the job's items to stop those
// runs. It refuses an unknown job, an item out of range, a target with
// nothing running, and a fence named that is not its item's run in
// progress.
func (c *Client) Kill(ctx context.Context, r KillRequest) (Killing, error) {
	switch {
	case r.Fence < 0:
		return Killing{}, opErr(ErrBadTarget, "fence %d: fences are positive", r.Fence)
	case r.Fence == 0 && r.Instance != "":
		return Killing{}, opErr(ErrBadTarget, "instance %s names a run with its fence: give the fence too", r.Instance)
	case r.Fence != 0 && len(r.Items) != 1:
		return Killing{}, opErr(ErrBadTarget, "a fence names the run of one item: name exactly one item (got %d)", len(r.Items))
	}
	f, err := c.requireJob(ctx, r.Job)
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
	// One lease for the attempts; one left unused by a refusal after a
	// retry expires with its TTL.
	var lease clientv3.LeaseID
	for attempt := 1; ; attempt++ {
		runs, err := c.killTargets(ctx, r, items)
		if err != nil {
			return Killing{}, err
		}
		if lease == 0 {
			l, err := c.cli.Grant(ctx, int64(keyspace.KillTTL/time.Second))
			if err != nil {
				return Killing{}, fmt.Errorf("kill job %q: %w", r.Job, err)
			}
			lease = l.ID
		}
		at := time.Now().UTC().Truncate(time.Millisecond)
		k, ok, err := c.putKill(ctx, r.Job, keyspace.Kill{ID: keyspace.NewRequestID(at), Runs: runs, By: r.By, At: at}, lease)
		if err != nil || ok {
			return k, err
		}
		// A run ended meanwhile: a fence named is refused by the next
		// read; without one, the next read names the runs in progress.
		if attempt == killAttempts {
			return Killing{}, opErr(ErrRefused, "job %q: its runs ended or started %d times while the kill was recorded; nothing killed, try again", r.Job, attempt)
		}
	}
}

// killTargets reads the runs in progress of items, in one Txn, and
// returns those r asks to stop; it refuses (ErrRefused) when there are
// none, or when the fence r names is not its item's run in progress.
func (c *Client) killTargets(ctx context.Context, r KillRequest, items []int) ([]keyspace.KillRun, error) {
	ops := make([]clientv3.Op, 0, 2*len(items))
	for _, item := range items {
		ops = append(ops, clientv3.OpGet(c.keys.Item(r.Job, item)), clientv3.OpGet(c.keys.RunningItem(r.Job, item)))
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("kill job %q: read its items: %w", r.Job, err)
	}
	var runs []keyspace.KillRun
	var idle []string
	for i, item := range items {
		recs := resp.Responses[2*i].GetResponseRange().Kvs
		markers := resp.Responses[2*i+1].GetResponseRange().Kvs
		var rec keyspace.ItemRecord
		if len(recs) > 0 {
			json.Unmarshal(recs[0].Value, &rec)
		}
		var run *keyspace.KillRun
		if len(markers) > 0 && len(recs) > 0 && rec.State == keyspace.StateRunning {
			// The marker is created by the claim: its revision is the fence.
			run = &keyspace.KillRun{Item: item, Fence: markers[0].CreateRevision, Instance: string(markers[0].Value)}
		}
		if r.Fence != 0 {
			switch {
			case run == nil || run.Fence != r.Fence:
				return nil, c.ended(ctx, r.Job, item, r.Fence, run, rec, recs)
			case r.Instance != "" && run.Instance != r.Instance:
				return nil, opErr(ErrRefused, "job %q: the run of item %d with fence %d is on %s, not %s: nothing killed", r.Job, item, r.Fence, run.Instance, r.Instance)
			}
		}
		if run == nil {
			idle = append(idle, idleWhy(item, rec, len(recs) > 0))
			continue
		}
		runs = append(runs, *run)
	}
	if len(runs) == 0 {
		if len(idle) == 1 {
			return nil, opErr(ErrRefused, "job %q: %s: nothing to kill", r.Job, idle[0])
		}
		return nil, opErr(ErrRefused, "no item of job %q is running (%d asked): nothing to kill", r.Job, len(idle))
	}
	return runs, nil
}

// ended is the refusal of a kill naming the run of item with fence, which
// is not the item's run in progress (now, nil if none): how that run
// ended, as the item's record (rec, of kvs) or history says, and what runs
// now.
func (c *Client) ended(ctx context.Context, job string, item int, fence int64, now *keyspace.KillRun, rec keyspace.ItemRecord, kvs []*mvccpb.KeyValue) error {
	how := fmt.Sprintf("is not running (item %d has no such run in its history)", item)
	var found *keyspace.ItemRecord
	switch {
	case len(kvs) > 0 && keyspace.RunFence(&rec, kvs[0].ModRevision) == fence:
		found = &rec
	default:
		hist, err := c.Records(ctx, job)
		if err != nil {
			return fmt.Errorf("kill job %q: the run of item %d with fence %d is not running; read the history to say how it ended: %w", job, item, fence, err)
		}
		for i := range hist {
			if hist[i].Item == item && hist[i].Fence == fence {
				found = &hist[i]
			}
		}
	}
	switch {
	case found == nil:
	case found.State == keyspace.StateRunning:
		how = "has lost its instance (cut off or stopped, its lease expired): the item's next owner fails it over or records it lost"
	default:
		what := found.State
		if found.Reason != "" {
			what += "/" + found.Reason
		}
		how = fmt.Sprintf("has ended (%s at %s)", what, found.End.UTC().Format(time.RFC3339))
	}
	cur := fmt.Sprintf("item %d is not running now", item)
	if now != nil {
		cur = fmt.Sprintf("item %d now runs fence %d on %s", item, now.Fence, now.Instance)
	}
	return opErr(ErrRefused, "job %q: the run of item %d with fence %d %s; %s: nothing killed", job, item, fence, how, cur)
}

// putKill puts k under lease if every run it names still holds its item
// (the item's running marker was created at the run's fence), in one Txn;
// it reports whether it did.
func (c *Client) putKill(ctx context.Context, job string, k keyspace.Kill, lease clientv3.LeaseID) (Killing, bool, error) {
	val, err := json.Marshal(k)
	if err != nil {
		return Killing{}, false, err
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(c.keys.Kill(job, k.ID)), "=", 0)}
	for _, r := range k.Runs {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(c.keys.RunningItem(job, r.Item)), "=", r.Fence))
	}
	put, err := c.cli.Txn(ctx).If(cmps...).Then(clientv3.OpPut(c.keys.Kill(job, k.ID), string(val), clientv3.WithLease(lease))).Commit()
	if err != nil {
		return Killing{}, false, fmt.Errorf("kill job %q: %w", job, err)
	}
	if !put.Succeeded {
		return Killing{}, false, nil
	}
	return Killing{Kill: k, Rev: put.Header.Revision}, true, nil
}

// idleWhy says why an item has no run to kill.
func idleWhy(item int, rec keyspace.ItemRecord, ok bool) string {
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
	keyspace.KillRun
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
func (c *Client) WaitKill(ctx context.Context, job string, k keyspace.Kill) ([]KillResult, error) {
	out := make([]KillResult, len(k.Runs))
	for i, r := range k.Runs {
		out[i].KillRun = r
	}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ops := make([]clientv3.Op, len(k.Runs))
		for i, r := range k.Runs {
			ops[i] = clientv3.OpGet(c.keys.Item(job, r.Item))
		}
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return out, fmt.Errorf("read the killed items of job %q: %w", job, err)
		}
		pending := 0
		for i, r := range k.Runs {
			var rec keyspace.ItemRecord
			var rev int64
			if kvs := resp.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
				json.Unmarshal(kvs[0].Value, &rec)
				rev = kvs[0].ModRevision
			}
			switch {
			case rec.State == keyspace.StateRunning && rev == r.Fence: // a RUNNING record's fence is its claim's revision
				pending++
			case rec.Fence == r.Fence && rec.CutByFailure():
				// Cut by its instance's fence or stop before the kill
				// reached it: the item's owner settles it next, KILLED by
				// the operator (the kill request stands) or failed over.
				pending++
			case rec.Fence == r.Fence:
				out[i].State, out[i].Reason, out[i].Error = rec.State, rec.Reason, rec.Error
			case rev > r.Fence:
				// The record has moved on (the item's next run, or fires
				// recorded skipped): the run's own record is in the history.
				ended, err := c.endOf(ctx, job, r)
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
func (c *Client) endOf(ctx context.Context, job string, r keyspace.KillRun) (KillResult, error) {
	res := KillResult{KillRun: r}
	recs, err := c.Records(ctx, job)
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
