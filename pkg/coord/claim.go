package coord

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrClaimLost is returned by Claim when the claim's guard failed: another
// instance claimed or runs the item, the map changed, or this instance is no
// longer a member under its session. Re-read and decide again.
var ErrClaimLost = errors.New("coord: claim lost")

// ErrNotUp is returned when the instance holds no session.
var ErrNotUp = errors.New("coord: no session")

// Claim is one request to run (job, item, fire).
type Claim struct {
	Job     string
	Item    int
	Fire    time.Time
	Attempt int
	Source  string
	Skipped int
	// Excluded counts the fires before Fire that calendars excluded.
	Excluded int
	// Prev is the item's state the decision was made on; MapRev the
	// ModRevision of the shard map it was made on (0: do not check the map,
	// for manual runs).
	Prev   keyspace.ItemState
	MapRev int64
	// Sched is the record's watermark after the claim: Fire for scheduled
	// runs, the previous watermark for manual ones. Trigger is the manual
	// trigger's revision (0 for scheduled runs, which carry the previous one).
	Sched   time.Time
	Trigger int64
	// Param is the run's one-off parameter (manual runs and their re-runs);
	// By who triggered it; FireKey names a manual fire (see FireKey).
	Param   string
	By      string
	FireKey string
	// TriggerID, when set, names the trigger (at revision Trigger) this
	// claim serves: the claim holds only while its key does, so that a
	// trigger deleted (served, or dropped for a disabled item) is never
	// served on a view that lags the deletion.
	TriggerID string
	// Upstream, NoPropagate and Total are the record's (see ItemRecord).
	Upstream    *keyspace.Upstream
	NoPropagate bool
	Total       int
	// Slot, when > 0, is the cluster-wide slot (clusterConcurrency) the
	// run takes, plus one: the claim holds only while the slot's key is
	// absent, puts it under the session's lease, and deletes the item's
	// waiting key.
	Slot int
	// StartAt is when the work of a claim made ahead starts (its fire, or
	// the fire plus its jitter offset): the record's start, rather than
	// the claim's time, so that no record shows a start before its fire.
	StartAt time.Time
}

// Grant is a won claim.
type Grant struct {
	// Fence is the claim's revision: strictly increasing per (job, item).
	Fence int64
	// Ctx is cancelled when the session that holds the claim fences itself:
	// the work must stop at once.
	Ctx    context.Context
	record keyspace.ItemRecord
}

// Claim records that this instance starts (job, item, fire) and creates the
// item's running marker under its session lease, in one transaction guarded
// by: the member key of this session, the map revision acted on, the item
// record read (nobody claimed since), and the absence of a running marker.
func (n *Node) Claim(ctx context.Context, c Claim) (*Grant, error) {
	s, member := n.sessionFor(c.Job)
	if s == nil || member == 0 || s.ctx.Err() != nil { // no claim from a fenced session
		return nil, ErrNotUp
	}
	p, err := n.claimTxn(s, c)
	if err != nil {
		return nil, err
	}
	rec, val := p.rec, p.val
	wctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	// With other jobs' claims due at the same instant (batch.go): each keeps
	// its guards, and a failed one is answered on its own.
	resp, err := n.txns.Txn(wctx, append(n.claimShared(c, member), p.cmps...), p.ops, nil)
	if refusedWrite(err) {
		return nil, fmt.Errorf("claim item %d of job %q: %w", c.Item, c.Job, err)
	}
	if err != nil {
		// Unknown outcome. If the claim applied, its marker holds the item
		// for as long as this session lives: nobody else may run the item,
		// and no later fire here would either. Read it back.
		n.log.Warn("claim outcome unknown; reading it back", "job", c.Job, "item", c.Item, "fire", c.Fire, "err", err)
		fence, rerr := n.readBackClaim(ctx, s, c, val)
		if rerr != nil {
			n.refused(c.Job)
			return nil, rerr
		}
		n.wroteItems(fence)
		rec.Fence = fence
		return &Grant{Fence: fence, Ctx: s.ctx, record: rec}, nil
	}
	if !resp.Succeeded {
		n.refused(c.Job)
		return nil, ErrClaimLost
	}
	n.wroteItems(resp.Header.Revision)
	n.learnWrite(c.Job, c.Item, val, resp.Header.Revision)
	rec.Fence = resp.Header.Revision
	return &Grant{Fence: resp.Header.Revision, Ctx: s.ctx, record: rec}, nil
}

// claimParts are one item's part of a claim Txn: its guards and writes,
// and the record it writes.
type claimParts struct {
	rec  keyspace.ItemRecord
	val  []byte
	cmps []clientv3.Cmp
	ops  []clientv3.Op
}

// claimTxn builds c's guards (the item record read, no running marker)
// and writes (the record, the marker under s's lease).
func (n *Node) claimTxn(s *session, c Claim) (claimParts, error) {
	k := n.keys
	now := n.opts.Now().UTC()
	start := now
	if c.StartAt.After(start) {
		start = c.StartAt.UTC()
	}
	rec := keyspace.ItemRecord{
		Job: c.Job, Item: c.Item, Fire: c.Fire.UTC(), State: keyspace.StateRunning, Instance: n.opts.ID,
		Attempt: c.Attempt, Source: c.Source, Start: start, ExitCode: -1, Skipped: c.Skipped, Excluded: c.Excluded,
		Sched: c.Sched.UTC(), Trigger: c.Trigger, Param: c.Param, By: c.By, FireKey: c.FireKey,
		Upstream: c.Upstream, NoPropagate: c.NoPropagate, Total: c.Total, Slot: c.Slot,
	}
	if c.Prev.Record != nil {
		rec.Seq = c.Prev.Record.Seq + 1
		if rec.Trigger == 0 {
			rec.Trigger = c.Prev.Record.Trigger
		}
	}
	val, err := json.Marshal(rec)
	if err != nil {
		return claimParts{}, err
	}
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(k.Item(c.Job, c.Item)), "=", c.Prev.Rev),
		clientv3.Compare(clientv3.CreateRevision(k.RunningItem(c.Job, c.Item)), "=", 0),
	}
	if c.TriggerID != "" {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k.Trigger(c.Job, c.TriggerID)), "=", c.Trigger))
	}
	ops := []clientv3.Op{
		clientv3.OpPut(k.Item(c.Job, c.Item), string(val)),
		clientv3.OpPut(k.RunningItem(c.Job, c.Item), n.opts.ID, clientv3.WithLease(s.lease)),
	}
	if c.Slot > 0 {
		slot := k.Slot(c.Job, c.Slot-1)
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(slot), "=", 0))
		ops = append(ops, clientv3.OpPut(slot, fmt.Sprintf("%s %d", n.opts.ID, c.Item), clientv3.WithLease(s.lease)),
			clientv3.OpDelete(k.WaitingItem(c.Job, c.Item)))
	}
	if cut, ok := cutRecord(c, rec, now); ok {
		cv, err := json.Marshal(cut)
		if err != nil {
			return claimParts{}, err
		}
		ops = append(ops, clientv3.OpPut(k.History(c.Job, c.Item, cut.Seq%keyspace.HistoryPerItem), string(cv)))
	}
	return claimParts{rec: rec, val: val, cmps: cmps, ops: ops}, nil
}

// cutsARun reports whether claim c takes over from a run that was cut:
// the item's record still says RUNNING, and (the claim's guard) its
// running marker is gone with its instance's lease.
func cutsARun(c Claim) bool {
	return c.Prev.Record != nil && c.Prev.Record.State == keyspace.StateRunning
}

// cutRecord is the history record of the run the claim c (whose record is
// next) takes over from, when that run was cut: KILLED, reason lost, under
// its own fence and sequence (the slot its outcome would have written),
// ended at the claim's time, now.
// Without it, the claim's record replaces the cut run's, and nothing in
// etcd would say the run began and was cut (its log is on the instance
// that died).
func cutRecord(c Claim, next keyspace.ItemRecord, now time.Time) (keyspace.ItemRecord, bool) {
	if !cutsARun(c) {
		return keyspace.ItemRecord{}, false
	}
	cut := *c.Prev.Record
	cut.State, cut.Reason, cut.End, cut.Fence = keyspace.StateKilled, keyspace.ReasonLost, now, keyspace.RunFence(c.Prev.Record, c.Prev.Rev)
	cut.Error = "its session ended before its outcome was recorded (its instance died or was cut off, or its last write was lost)"
	if next.Fire.Equal(cut.Fire) && next.Attempt > cut.Attempt {
		cut.Error = fmt.Sprintf("run again as attempt %d (%s): %s", next.Attempt, next.Source, cut.Error)
	}
	return cut, true
}

// claimShared are the guards every claim of c's job shares: the member
// key of this session, and the map revision acted on (when c has one).
func (n *Node) claimShared(c Claim, member int64) []clientv3.Cmp {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(n.keys.Member(c.Job, n.opts.ID)), "=", member)}
	if c.MapRev != 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(n.keys.Shards(c.Job)), "=", c.MapRev))
	}
	return cmps
}

// maxClaimTxnBytes bounds the records one claim Txn writes: well under
// etcd's default --max-request-bytes (1.5 MiB).
const maxClaimTxnBytes = 1 << 20

// claimChunkEnd is where the claim Txn that begins at claims[from] ends:
// etcd's default --max-txn-ops (128, maxBatchOps) bounds its guards (2
// shared; 2 per item, 3 for a claim that serves a trigger) and its writes
// (2 per item, 3 for one that takes over from a cut run), and
// maxClaimTxnBytes their size (a manual run's parameter may be 16 KiB).
func claimChunkEnd(claims []Claim, from int) int {
	cmps, ops, bytes, to := 2, 0, 0, from
	for ; to < len(claims); to++ {
		c, o, records := 2, 2, 1
		if claims[to].TriggerID != "" {
			c++
		}
		if cutsARun(claims[to]) { // and the cut run's history record
			o++
			records++
		}
		if claims[to].Slot > 0 { // the slot's guard, its put, the waiting key's delete
			c, o = c+1, o+2
		}
		// A record is about 1 KiB, and its parameter up to 6 bytes a
		// character in JSON (a "<" is \u003c).
		b := records * (1<<10 + 6*len(claims[to].Param))
		if to > from && (cmps+c > maxBatchOps || ops+o > maxBatchOps || bytes+b > maxClaimTxnBytes) {
			break
		}
		cmps, ops, bytes = cmps+c, ops+o, bytes+b
	}
	return to
}

// ClaimResult is the outcome of one claim of ClaimAll.
type ClaimResult struct {
	Grant *Grant
	Err   error
}

// ClaimAll makes claims of one job (same Job and MapRev) in as few Txns as
// it can: each item keeps its own guards, and the claims of a Txn are won
// together, at one revision (their fence). When a Txn's guards fail (one
// item was claimed meanwhile, or the map changed), its claims are made one
// by one, so that the others are still won. Results are in claims' order.
func (n *Node) ClaimAll(ctx context.Context, claims []Claim) []ClaimResult {
	out := make([]ClaimResult, len(claims))
	if len(claims) == 0 {
		return out
	}
	for from, to := 0, 0; from < len(claims); from = to {
		to = claimChunkEnd(claims, from)
		chunk := claims[from:to]
		res := out[from : from+len(chunk)]
		if len(chunk) == 1 {
			res[0].Grant, res[0].Err = n.Claim(ctx, chunk[0])
			continue
		}
		if !n.claimTogether(ctx, chunk, res) {
			for i, c := range chunk {
				res[i].Grant, res[i].Err = n.Claim(ctx, c)
			}
		}
	}
	return out
}

// claimTogether tries chunk in one Txn and fills res; false: it did not
// apply (a guard failed), the claims are to be made one by one.
func (n *Node) claimTogether(ctx context.Context, chunk []Claim, res []ClaimResult) bool {
	c0 := chunk[0]
	s, member := n.sessionFor(c0.Job)
	if s == nil || member == 0 || s.ctx.Err() != nil {
		for i := range res {
			res[i].Err = ErrNotUp
		}
		return true
	}
	cmps := n.claimShared(c0, member)
	var ops []clientv3.Op
	parts := make([]claimParts, len(chunk))
	for i, c := range chunk {
		if c.Job != c0.Job || c.MapRev != c0.MapRev {
			return false // not one job's: one by one
		}
		p, err := n.claimTxn(s, c)
		if err != nil {
			return false
		}
		parts[i] = p
		cmps = append(cmps, p.cmps...)
		ops = append(ops, p.ops...)
	}
	wctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	// Else: the shared guards' keys, to tell a failed shared guard (no claim
	// of this job can be won: not one by one either) from an item's.
	resp, err := n.txns.Txn(wctx, cmps, ops,
		[]clientv3.Op{clientv3.OpGet(n.keys.Member(c0.Job, n.opts.ID)), clientv3.OpGet(n.keys.Shards(c0.Job))})
	if err != nil && refused(err) {
		// Refused whole (too large a request, too many operations): it did
		// not apply; one by one, each its own request, they may.
		n.log.Warn("claims refused together; claiming them one by one", "job", c0.Job, "items", len(chunk), "err", err)
		return false
	}
	if err != nil {
		// Unknown outcome: read each claim back, as Claim does.
		n.log.Warn("claims' outcome unknown; reading them back", "job", c0.Job, "items", len(chunk), "err", err)
		for i, c := range chunk {
			fence, rerr := n.readBackClaim(ctx, s, c, parts[i].val)
			if rerr != nil {
				n.refused(c.Job)
				res[i].Err = rerr
				continue
			}
			n.wroteItems(fence)
			rec := parts[i].rec
			rec.Fence = fence
			res[i].Grant = &Grant{Fence: fence, Ctx: s.ctx, record: rec}
		}
		return true
	}
	if !resp.Succeeded {
		n.refused(c0.Job)
		if !sharedGuardsHold(resp, member, c0.MapRev) {
			for i := range res {
				res[i].Err = ErrClaimLost
			}
			return true
		}
		return false
	}
	n.wroteItems(resp.Header.Revision)
	for i := range chunk {
		rec := parts[i].rec
		rec.Fence = resp.Header.Revision
		res[i].Grant = &Grant{Fence: resp.Header.Revision, Ctx: s.ctx, record: rec}
	}
	n.completions.expect(resp.Header.Revision, len(chunk))
	return true
}

// sharedGuardsHold reports whether the shared guards of a refused claim
// Txn (the member key's CreateRevision, the map's ModRevision when mapRev
// is set) held, from its Else reads: then an item's guard failed.
func sharedGuardsHold(resp *clientv3.TxnResponse, member, mapRev int64) bool {
	if len(resp.Responses) < 2 {
		return true // no Else reads: try one by one
	}
	memberKV, shardsKV := resp.Responses[0].GetResponseRange().GetKvs(), resp.Responses[1].GetResponseRange().GetKvs()
	if len(memberKV) == 0 || memberKV[0].CreateRevision != member {
		return false
	}
	return mapRev == 0 || (len(shardsKV) > 0 && shardsKV[0].ModRevision == mapRev)
}

// readBackClaim settles a claim whose transaction ended with an unknown
// outcome: it returns the claim's fence if the transaction applied (the
// item record is the one written and the running marker was created with
// it, under s's lease) and ErrClaimLost if it did not. It retries until it
// can read or s ends (then ErrNotUp: the lease takes the marker with it).
func (n *Node) readBackClaim(ctx context.Context, s *session, c Claim, written []byte) (int64, error) {
	b := backoff{min: 100 * time.Millisecond, max: time.Second}
	for {
		if s.ctx.Err() != nil {
			return 0, ErrNotUp
		}
		rctx, cancel := context.WithTimeout(s.ctx, n.opts.TTL)
		resp, err := n.opts.Client.Txn(rctx).Then(
			clientv3.OpGet(n.keys.Item(c.Job, c.Item)),
			clientv3.OpGet(n.keys.RunningItem(c.Job, c.Item)),
		).Commit()
		cancel()
		if err == nil {
			items, running := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
			if len(items) == 1 && len(running) == 1 && bytes.Equal(items[0].Value, written) &&
				clientv3.LeaseID(running[0].Lease) == s.lease && running[0].CreateRevision == items[0].ModRevision {
				n.log.Info("claim had applied", "job", c.Job, "item", c.Item, "fire", c.Fire, "fence", items[0].ModRevision)
				return items[0].ModRevision, nil
			}
			return 0, ErrClaimLost
		}
		if ctx.Err() != nil {
			// The caller gave up; the session still ends any claim that applied.
			return 0, fmt.Errorf("claim item %d of job %q: outcome unknown: %w", c.Item, c.Job, ctx.Err())
		}
		sleep(s.ctx, b.next())
	}
}

// Adopt returns the grant of a claim this session made but whose run this
// process does not know: the claim's reply was lost and it applied after
// its read-back said it had not. It reads the item again and adopts only if
// the record is still the claim's (RUNNING by this instance, unchanged since
// st) and the running marker is under this session's lease: a state read
// while a run of this process was ending must not start it a second time.
// The grant's fence is the claim's revision.
func (n *Node) Adopt(ctx context.Context, job string, item int, st keyspace.ItemState) (*Grant, error) {
	n.mu.Lock()
	s := n.session
	n.mu.Unlock()
	if s == nil {
		return nil, ErrNotUp
	}
	// No refusal check here: the claim applied already (its marker is
	// this session's), and the engine decided to adopt it on a view whose
	// definition this instance may run (it runs nothing of one it may
	// not: JobView.Refused), which is the definition the run uses.
	cur, err := n.ReadItem(ctx, job, item)
	if err != nil {
		return nil, err
	}
	rec := cur.Record
	if rec == nil || cur.Rev != st.Rev || !cur.RunningMine || rec.State != keyspace.StateRunning || rec.Instance != n.opts.ID {
		// st came from the cache: what etcd says now differs, so the
		// cache is not to decide again (a restored etcd looped here).
		n.refused(job)
		return nil, fmt.Errorf("adopt item %d of job %q: %w", item, job, ErrClaimLost)
	}
	r := *rec
	r.Fence = cur.Rev
	return &Grant{Fence: cur.Rev, Ctx: s.ctx, record: r}, nil
}
