package coord

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Outcome is how a granted run ended.
type Outcome struct {
	// State is StateDone, StateFailed or StateKilled; Reason says why a
	// KILLED run was stopped.
	State, Reason string
	// ExitCode of the script, -1 when none; HTTPStatus of the hook's
	// response, 0 when none.
	ExitCode   int
	HTTPStatus int
	Err        string
	Output     string
	// LastLine is the last line of stderr, else stdout (from the run log).
	LastLine   string
	Start, End time.Time
	// KilledBy names who stopped a run killed by an operator.
	KilledBy string
	// Iterations counts a streaming run's iterations (0: not streaming).
	Iterations int
}

// Complete records the outcome of a granted run, removes its running marker
// and appends it to the item's history, guarded by the claim's fence. The
// outcome is known here and nowhere else, so a write whose result is
// unknown or failed is retried with backoff, even after the session ended,
// until it lands, the guard fails (another instance took the item over:
// ErrClaimLost), or ctx is done.
func (n *Node) Complete(ctx context.Context, g *Grant, o Outcome) error {
	rec := g.Final(o)
	po := n.outcomes.add(rec, g.Fence) // a rewind's repair writes it if the claim's record went
	defer n.outcomes.remove(po)
	b := backoff{min: 100 * time.Millisecond, max: 2 * time.Second}
	for try := 0; ; try++ {
		var err error
		if try == 0 {
			err = n.completions.do(ctx, rec, g.Fence) // with the outcomes of others
		} else {
			err = n.finish(ctx, rec, g.Fence, true)
		}
		if errors.Is(err, ErrClaimLost) && po.written() {
			return nil // written by the repair after etcd went back (rewind.go)
		}
		if errors.Is(err, ErrClaimLost) {
			n.dropOwnMarker(ctx, rec, g.Fence)
		}
		if err == nil || errors.Is(err, ErrClaimLost) {
			return err
		}
		n.log.Warn("record the outcome; retrying", "job", rec.Job, "item", rec.Item, "fence", g.Fence, "err", err)
		if !sleep(ctx, b.next()) {
			return err
		}
	}
}

// Final is the record Complete writes for the run of g with outcome o.
func (g *Grant) Final(o Outcome) keyspace.ItemRecord {
	rec := g.record
	rec.State, rec.Reason, rec.ExitCode, rec.HTTPStatus, rec.Error, rec.Output = o.State, o.Reason, o.ExitCode, o.HTTPStatus, o.Err, o.Output
	rec.KilledBy, rec.Iterations, rec.LastLine = o.KilledBy, o.Iterations, o.LastLine
	if !o.Start.IsZero() {
		rec.Start = o.Start.UTC()
	}
	rec.End = o.End.UTC()
	return rec
}

// Skip is the record of fires of an item skipped by a policy.
type Skip struct {
	Job  string
	Item int
	// Fire is the latest fire skipped; Skipped counts the fires up to it
	// not run, and Reason says why (keyspace.Skip* reasons).
	Fire    time.Time
	Skipped int
	// Excluded counts the fires up to Fire that calendars excluded.
	Excluded int
	// Waited: the item may have a waiting key (clusterConcurrency), which
	// the skip deletes: its fires no longer wait.
	Waited bool
	Reason string
	// Prev is the item's state as read: the write is guarded by it.
	Prev keyspace.ItemState
}

// Skip records that skipped fires up to s.Fire were not run for s.Item,
// and why, visible in history.
func (n *Node) Skip(ctx context.Context, s Skip) error {
	now := n.opts.Now().UTC()
	rec := keyspace.ItemRecord{Job: s.Job, Item: s.Item, Fire: s.Fire.UTC(), Sched: s.Fire.UTC(), State: keyspace.StateSkipped, Instance: n.opts.ID, ExitCode: -1,
		Skipped: s.Skipped, Excluded: s.Excluded, Reason: s.Reason, Start: now, End: now}
	if s.Prev.Record != nil {
		rec.Seq = s.Prev.Record.Seq + 1
		rec.Trigger = s.Prev.Record.Trigger
	}
	if s.Waited {
		return n.finish(ctx, rec, s.Prev.Rev, false, clientv3.OpDelete(n.keys.WaitingItem(s.Job, s.Item)))
	}
	return n.finish(ctx, rec, s.Prev.Rev, false)
}

// Settle records a run cut by a failure that will not be re-run (the job
// says failover: false): KILLED, reason lost, in the item's record and
// history, guarded by the record read. The fires after it go on.
func (n *Node) Settle(ctx context.Context, job string, item int, st keyspace.ItemState) error {
	if st.Record == nil {
		return nil
	}
	rec := *st.Record
	rec.State, rec.Reason, rec.End, rec.Fence = keyspace.StateKilled, keyspace.ReasonLost, n.opts.Now().UTC(), st.Rev
	rec.Error = "its instance died or was cut off mid-run; failover: false, not run again"
	return n.finish(ctx, rec, st.Rev, false)
}

// Begin starts the record of items never claimed: the scheduled fires up
// to sched are accounted for (there were none to run: the items did not
// exist, as far as anyone knows). Without it, every instance would guess
// when an item began, and an owner restarting across an item's first fire
// would never run it. An item claimed meanwhile is left alone, and nothing
// is written once the map acted on (mapRev, 0: not checked) has changed.
// The records are written in transactions of up to 64 items; a transaction
// that does not apply is retried item by item.
func (n *Node) Begin(ctx context.Context, job string, items []int, sched time.Time, mapRev int64) error {
	for len(items) > 0 {
		batch := items[:min(len(items), 64)]
		items = items[len(batch):]
		ok, err := n.begin(ctx, job, batch, sched, mapRev)
		if err != nil {
			return err
		}
		if !ok && len(batch) > 1 {
			// One of them has a record now, or the map changed: one by one.
			for _, item := range batch {
				if _, err := n.begin(ctx, job, []int{item}, sched, mapRev); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// begin writes the first records of items in one transaction, guarded by
// the absence of each and the map revision acted on; it reports whether it
// applied.
func (n *Node) begin(ctx context.Context, job string, items []int, sched time.Time, mapRev int64) (bool, error) {
	cmps := make([]clientv3.Cmp, 0, len(items)+1)
	ops := make([]clientv3.Op, 0, len(items))
	if mapRev != 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(n.keys.Shards(job)), "=", mapRev))
	}
	for _, item := range items {
		rec := keyspace.ItemRecord{Job: job, Item: item, Fire: sched.UTC(), Sched: sched.UTC(), State: keyspace.StateSkipped, Instance: n.opts.ID, ExitCode: -1}
		val, err := json.Marshal(rec)
		if err != nil {
			return false, err
		}
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(n.keys.Item(job, item)), "=", 0))
		ops = append(ops, clientv3.OpPut(n.keys.Item(job, item), string(val)))
	}
	wctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.txns.Txn(wctx, cmps, ops, nil) // with other jobs' (at a start, every job begins its items)
	if err != nil {
		return false, fmt.Errorf("begin items of job %q: %w", job, err)
	}
	if resp.Succeeded {
		n.wroteItems(resp.Header.Revision)
	} else {
		n.refused(job)
	}
	return resp.Succeeded, nil
}

// repairedClaim reports whether the item record value cur is the RUNNING
// record of the run whose outcome is rec, claimed at revision rev, as a
// rewind's repair puts it back: the claim's revision kept in its fence.
func repairedClaim(cur []byte, rec keyspace.ItemRecord, rev int64) bool {
	var c keyspace.ItemRecord
	if json.Unmarshal(cur, &c) != nil {
		return false
	}
	return c.State == keyspace.StateRunning && c.Fence == rev && rev > 0 && c.Instance == rec.Instance &&
		c.Attempt == rec.Attempt && c.Fire.Equal(rec.Fire) && c.Seq == rec.Seq
}

// finish writes rec to the item and its history if the item record is still
// at revision rev, and removes the running marker when clearRunning is set.
func (n *Node) finish(ctx context.Context, rec keyspace.ItemRecord, rev int64, clearRunning bool, extra ...clientv3.Op) error {
	cmp, ops, err := n.finishTxn(rec, rev, clearRunning)
	if err != nil {
		return err
	}
	ops = append(ops, extra...)
	wctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	key := n.keys.Item(rec.Job, rec.Item)
	resp, err := n.opts.Client.Txn(wctx).If(cmp).Then(ops...).Else(clientv3.OpGet(key), clientv3.OpGet(n.keys.Floor(), clientv3.WithKeysOnly())).Commit()
	if refusedWrite(err) {
		return fmt.Errorf("record %s of item %d of job %q: %w", rec.State, rec.Item, rec.Job, err)
	}
	if err != nil {
		// Unknown outcome (a timeout, a member lost, or ctx ended with the
		// request on its way): read it back, so that a record written is
		// reported written (the caller logs the policy it applied), not
		// left to look unwritten to everyone but etcd.
		if n.finishApplied(ctx, rec, ops[0]) {
			return nil
		}
		return fmt.Errorf("record %s of item %d of job %q: %w", rec.State, rec.Item, rec.Job, err)
	}
	if !resp.Succeeded {
		n.refused(rec.Job)
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) > 0 && bytes.Equal(kvs[0].Value, ops[0].ValueBytes()) {
			return nil // written already (a write whose answer was lost, or a rewind's repair)
		}
		floor := resp.Responses[1].GetResponseRange().Kvs
		raised := len(floor) > 0 && floor[0].ModRevision > rev
		if (len(kvs) > 0 && kvs[0].ModRevision < rev) || (len(kvs) == 0 && raised) {
			// The record is older than the claim that wrote it, or gone
			// since an instance raised etcd's revision past the claim's
			// to recover from a rewind (a wiped etcd): etcd went back. Not
			// lost: the repair writes the outcome (rewind.go). A record
			// gone otherwise is one an operator removed with its job
			// (shardd remove, once no live instance held it): the claim is
			// lost, not a rewind; a wipe nobody recovered from yet shows
			// in the revision of this very answer (Revisions).
			got := int64(0)
			if len(kvs) > 0 {
				got = kvs[0].ModRevision
			}
			return fmt.Errorf("record %s of item %d of job %q: %w", rec.State, rec.Item, rec.Job,
				n.revs.noteKeyRevision(key, rev, got))
		}
		if len(kvs) > 0 && repairedClaim(kvs[0].Value, rec, rev) {
			// Our claim's record, put back by a rewind's repair at a
			// revision of its own (it keeps the claim's as its fence): the
			// run is ours, and nobody claimed it since (a claim rewrites
			// the record). Its outcome is written over it, guarded by
			// that revision.
			return n.finish(ctx, rec, kvs[0].ModRevision, clearRunning)
		}
		// Our claim was taken over (after a fence): its record is not ours to write.
		return fmt.Errorf("record %s of item %d of job %q: %w", rec.State, rec.Item, rec.Job, ErrClaimLost)
	}
	n.wroteItems(resp.Header.Revision)
	n.learnWrite(rec.Job, rec.Item, ops[0].ValueBytes(), resp.Header.Revision)
	return nil
}

// refusedWrite reports whether etcd refused a write outright, so that it
// did not apply: its NOSPACE alarm, or a rewind History found. Such a
// write's outcome is known; it is not read back.
func refusedWrite(err error) bool {
	return err != nil && (errors.Is(err, ErrRewound) || errors.Is(rpctypes.Error(err), rpctypes.ErrNoSpace))
}

// finishApplied reports whether a finish whose outcome is unknown applied:
// the item record holds what it wrote (each record written is unique: it
// carries its end time). One read, even after ctx ended (then a short one:
// ctx ends at shutdown, which an etcd without a leader must not hold).
func (n *Node) finishApplied(ctx context.Context, rec keyspace.ItemRecord, put clientv3.Op) bool {
	wait := n.opts.TTL
	if ctx.Err() != nil {
		wait = min(wait, time.Second)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), wait)
	defer cancel()
	// ctx ending during the read leaves it a second more, not a TTL.
	defer context.AfterFunc(ctx, func() { time.AfterFunc(time.Second, cancel) })()
	resp, err := n.opts.Client.Get(rctx, n.keys.Item(rec.Job, rec.Item))
	if err != nil || len(resp.Kvs) == 0 || !bytes.Equal(resp.Kvs[0].Value, put.ValueBytes()) {
		return false
	}
	n.wroteItems(resp.Kvs[0].ModRevision)
	return true
}

// History returns the recorded executions of job, oldest first.
func (n *Node) History(ctx context.Context, job string) ([]keyspace.ItemRecord, error) {
	resp, err := n.opts.Client.Get(ctx, n.keys.HistoryPrefix(job), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read history of job %q: %w", job, err)
	}
	values := make([][]byte, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		values[i] = kv.Value
	}
	return keyspace.ParseHistory(values), nil
}

// finishTxn is the guard and the writes of finish.
func (n *Node) finishTxn(rec keyspace.ItemRecord, rev int64, clearRunning bool) (clientv3.Cmp, []clientv3.Op, error) {
	k := n.keys
	val, err := json.Marshal(rec)
	if err != nil {
		return clientv3.Cmp{}, nil, err
	}
	ops := []clientv3.Op{
		clientv3.OpPut(k.Item(rec.Job, rec.Item), string(val)),
		clientv3.OpPut(k.History(rec.Job, rec.Item, rec.Seq%keyspace.HistoryPerItem), string(val)),
	}
	if clearRunning {
		ops = append(ops, n.clearRunningOps(rec, false)...)
	}
	if rec.Failed() {
		ops = append(ops, clientv3.OpPut(k.LastFailure(rec.Job), string(val)))
	}
	return clientv3.Compare(clientv3.ModRevision(k.Item(rec.Job, rec.Item)), "=", rev), ops, nil
}

// dropOwnMarker deletes the running marker of rec's run, a claim lost at
// its outcome, if it is still there (created by the claim, at fence): a
// rewind's repair wrote another outcome over the claim's record while the
// run went on (it leaves a marker that is not its own), and the run's end
// must free the item. A claim taken over the usual way has no marker left
// (its session ended): the delete finds none.
func (n *Node) dropOwnMarker(ctx context.Context, rec keyspace.ItemRecord, fence int64) {
	marker := n.keys.RunningItem(rec.Job, rec.Item)
	rec.Fence = fence // the slot's guard too (clearRunningOps)
	wctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Txn(wctx).If(clientv3.Compare(clientv3.CreateRevision(marker), "=", fence)).Then(n.clearRunningOps(rec, false)...).Commit()
	switch {
	case err != nil:
		n.log.Warn("delete the running marker of a run whose claim was lost", "job", rec.Job, "item", rec.Item, "fence", fence, "err", err)
	case resp.Succeeded:
		n.log.Warn("deleted the running marker of a run whose record another outcome replaced (a rewind's repair)", "job", rec.Job, "item", rec.Item, "fence", fence)
	}
}

// clearRunningOps delete rec's run's running marker and give back its
// cluster slot, with its outcome. The slot goes if it is still this run's:
// created by its claim (at its fence); a session that ended gave it back
// with its lease, and another run may hold it now. onlyMine deletes the
// marker only while it is this instance's: a rewind's repair, which writes
// an outcome over a record as etcd says it now, must not end another
// instance's run of the item claimed since (its outcome's own Txn is
// guarded by its claim, whose marker it deletes whatever its revision).
func (n *Node) clearRunningOps(rec keyspace.ItemRecord, onlyMine bool) []clientv3.Op {
	k := n.keys
	marker := k.RunningItem(rec.Job, rec.Item)
	del := clientv3.OpDelete(marker)
	if onlyMine {
		del = clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(marker), "=", n.opts.ID)}, []clientv3.Op{del}, nil)
	}
	ops := []clientv3.Op{del}
	if rec.Slot > 0 {
		slot := k.Slot(rec.Job, rec.Slot-1)
		ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(slot), "=", rec.Fence)},
			[]clientv3.Op{clientv3.OpDelete(slot)}, nil))
	}
	return ops
}

// oneLastFailure keeps, of the puts in ops of a job's last-failure key
// (finishTxn's), only the record of the run that ended last: a Txn of the
// outcomes of several items may hold two failures of one job, and etcd
// refuses a Txn that writes a key twice ("duplicate key given in txn
// request").
func oneLastFailure(k keyspace.Keys, ops []clientv3.Op) []clientv3.Op {
	at := map[string]int{} // last-failure key -> its put's index in out
	out := make([]clientv3.Op, 0, len(ops))
	for _, op := range ops {
		key := string(op.KeyBytes())
		if !op.IsPut() || key != k.LastFailure(k.JobOf(key)) {
			out = append(out, op)
			continue
		}
		i, ok := at[key]
		if !ok {
			at[key] = len(out)
			out = append(out, op)
			continue
		}
		if r, prev := decodeRecord(op.ValueBytes()), decodeRecord(out[i].ValueBytes()); r != nil && (prev == nil || r.End.After(prev.End)) {
			out[i] = op
		}
	}
	return out
}

// writeOutcomes is the completer's write: the batch's outcomes in one Txn,
// each under its own guard; when a guard fails, each on its own (finish),
// so that one taken-over item does not fail the others.
func (n *Node) writeOutcomes(batch []*completion) {
	ctx, cancel := context.WithTimeout(context.Background(), n.opts.TTL)
	defer cancel()
	if len(batch) == 1 {
		batch[0].done <- n.finish(ctx, batch[0].rec, batch[0].fence, true)
		return
	}
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	ok := batch[:0:0]
	for _, r := range batch {
		cmp, o, err := n.finishTxn(r.rec, r.fence, true)
		if err != nil {
			r.done <- err
			continue
		}
		cmps, ops, ok = append(cmps, cmp), append(ops, o...), append(ok, r)
	}
	batch = ok
	resp, err := n.opts.Client.Txn(ctx).If(cmps...).Then(oneLastFailure(n.keys, ops)...).Commit()
	switch {
	case err != nil: // unknown outcome: read back; those not written retry on their own
		for _, r := range batch {
			if _, o, _ := n.finishTxn(r.rec, r.fence, true); n.finishApplied(ctx, r.rec, o[0]) {
				r.done <- nil
				continue
			}
			r.done <- fmt.Errorf("record %s of item %d of job %q: %w", r.rec.State, r.rec.Item, r.rec.Job, err)
		}
	case resp.Succeeded:
		n.wroteItems(resp.Header.Revision)
		for _, r := range batch {
			if _, o, err := n.finishTxn(r.rec, r.fence, true); err == nil {
				n.learnWrite(r.rec.Job, r.rec.Item, o[0].ValueBytes(), resp.Header.Revision)
			}
			r.done <- nil
		}
	default: // some guard failed: each on its own
		for _, r := range batch {
			r.done <- n.finish(ctx, r.rec, r.fence, true)
		}
	}
}
