package coord

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Item states in an ItemRecord.
const (
	StateRunning = "RUNNING" // claimed, not completed
	StateDone    = "DONE"    // completed successfully
	StateFailed  = "FAILED"  // completed, failed (after its retries)
	StateSkipped = "SKIPPED" // fires up to Fire were skipped by policy, not run
	StateKilled  = "KILLED"  // stopped before it ended; Reason says why
)

// Reasons of a KILLED record.
const (
	// ReasonShutdown: shardd stopped and its shutdown grace ran out.
	ReasonShutdown = "shutdown"
	// ReasonFence: the instance's session fenced itself (etcd unreachable
	// or the process paused); the run could no longer own its item.
	ReasonFence = "fence"
	// ReasonTimeout: the job's timeout ran out.
	ReasonTimeout = "timeout"
	// ReasonOperator: an operator stopped the run.
	ReasonOperator = "operator"
	// ReasonLost: the run's instance died or was cut off mid-run and the
	// job says failover: false; the item's next owner recorded it so and
	// did not run it again (ElasticJob's at-most-once without failover).
	ReasonLost = "lost"
	// ReasonNotStarted: the claim was won but the work never started (the
	// session fenced or shardd stopped first). Such a fire is run again
	// whatever the failover policy: it never ran.
	ReasonNotStarted = "not-started"
)

// Reasons of a SKIPPED record.
const (
	// SkipDisabled: the item or its job was disabled.
	SkipDisabled = "disabled"
	// SkipTooOld: the latest missed fire was older than the misfire window.
	SkipTooOld = "too-old"
	// SkipBusy: the fires came while the item ran, and misfire is off.
	SkipBusy = "busy"
	// SkipUpstreamFailed: the parent fire that triggered this run of a
	// job with dependsOn did not succeed (an item of it failed or was
	// skipped); Error says which.
	SkipUpstreamFailed = "upstream-failed"
)

// CutByFailure reports whether a record is a run that a failure cut short:
// RUNNING with no running marker (its instance died or was cut off), or
// KILLED at a shutdown or fence. With failover: true such a run is re-run.
func (r *ItemRecord) CutByFailure() bool {
	return r.State == StateRunning || (r.State == StateKilled && (r.Reason == ReasonShutdown || r.Reason == ReasonFence))
}

// Failed reports whether the record is a run that failed: FAILED, or
// KILLED by its timeout.
func (r *ItemRecord) Failed() bool {
	return r.State == StateFailed || (r.State == StateKilled && r.Reason == ReasonTimeout)
}

// NeverStarted reports whether the record is a claim whose work never
// started: its fire is still to run.
func (r *ItemRecord) NeverStarted() bool {
	return r.State == StateKilled && r.Reason == ReasonNotStarted
}

// Watermark is the latest scheduled fire the record accounts for: every
// scheduled fire up to it was run or recorded as skipped. Manual runs do not
// move it.
func (r *ItemRecord) Watermark() time.Time {
	if !r.Sched.IsZero() {
		return r.Sched
	}
	return r.Fire // written before Sched existed
}

// Execution sources.
const (
	SourceNormal   = "NORMAL"
	SourceMisfire  = "MISFIRE"
	SourceFailover = "FAILOVER"
	SourceManual   = "MANUAL"
	// SourceUpstream: a run of a job with dependsOn, triggered by a
	// completed fire of its parent (Upstream).
	SourceUpstream = "UPSTREAM"
)

// OffSchedule reports whether source is a run by request (an operator's
// or a parent fire's), not of the job's schedule: any member may serve
// it, at once, and it does not move the item's watermark.
func OffSchedule(source string) bool { return source == SourceManual || source == SourceUpstream }

// HistoryPerItem is how many past executions of each item etcd keeps.
const HistoryPerItem = 10

// ItemRecord is the value of jobs/<job>/items/<n>: the item's last claimed
// fire and how it went. It is also the value of history entries.
type ItemRecord struct {
	Job      string    `json:"job"`
	Item     int       `json:"item"`
	Fire     time.Time `json:"fire"`
	State    string    `json:"state"`
	Instance string    `json:"instance"`
	Attempt  int       `json:"attempt"`
	Source   string    `json:"source"`
	// Seq counts the item's records; history keeps the last HistoryPerItem.
	Seq int64 `json:"seq"`
	// Fence is the etcd revision of the claim (0 for SKIPPED records).
	Fence int64     `json:"fence"`
	Start time.Time `json:"start,omitzero"`
	End   time.Time `json:"end,omitzero"`
	// ExitCode of a script; -1 when there is none (a hook, a kill, a skip).
	ExitCode int `json:"exitCode"`
	// HTTPStatus of a hook's response; absent for scripts.
	HTTPStatus int    `json:"httpStatus,omitempty"`
	Error      string `json:"error,omitempty"`
	Output     string `json:"output,omitempty"`
	// Skipped counts the fires before Fire that were not run (misfire policy).
	Skipped int `json:"skipped,omitempty"`
	// Reason is why a KILLED run was stopped (Reason* constants) or why
	// SKIPPED fires were not run (Skip* constants).
	Reason string `json:"reason,omitempty"`
	// Sched is the record's watermark (see Watermark): for scheduled runs
	// and skips it is Fire; a manual run carries the previous one over.
	Sched time.Time `json:"sched,omitzero"`
	// Trigger is the etcd revision of the last manual trigger this item
	// ran; a trigger at or below it has been served.
	Trigger int64 `json:"trigger,omitempty"`
	// Param is the operator's one-off parameter of a MANUAL run (kept by
	// its failover re-runs).
	Param string `json:"param,omitempty"`
	// KilledBy names who stopped a run KILLED with reason operator.
	KilledBy string `json:"killedBy,omitempty"`
	// By names who triggered a MANUAL run (kept by its re-runs).
	By string `json:"by,omitempty"`
	// Iterations counts a streaming (dataflow) run's iterations.
	Iterations int `json:"iterations,omitempty"`
	// FireKey names a manual run's fire (ManualFireKey), kept by its
	// re-runs; "" for a scheduled fire (see FireKey).
	FireKey string `json:"fireKey,omitempty"`
	// Upstream is the parent fire an UPSTREAM run serves (kept by its
	// re-runs); NoPropagate is set on a manual run whose outcome does not
	// trigger the job's children.
	Upstream    *Upstream `json:"upstream,omitempty"`
	NoPropagate bool      `json:"noPropagate,omitempty"`
	// Total is the job's item count when the run was claimed: its fire's
	// barrier waits for that many items (0 in records older than it).
	Total int `json:"total,omitempty"`
}

// ItemState is what etcd says about one item at one revision.
type ItemState struct {
	// Record is nil when the item was never claimed. It may be shared
	// with the item cache: read it; copy it to change it.
	Record *ItemRecord
	// Rev is the ModRevision of the record, 0 when there is none.
	Rev int64
	// RunningBy is the instance holding the running marker, "" when none.
	RunningBy string
	// RunningMine is set when the marker is under this node's current
	// session lease: this session claimed the item.
	RunningMine bool
	// Disabled is set when an operator disabled the item.
	Disabled bool
}

// JobItems is a snapshot of a job's items.
type JobItems struct {
	Rev   int64
	Items map[int]ItemState
}

// ReadItems reads every item record, running marker and item-disable mark
// of job in one request.
func (n *Node) ReadItems(ctx context.Context, job string) (JobItems, error) {
	c := n.itemCacheOf(job)
	items, gen, ok := n.cachedItems(ctx, job, c)
	if ok {
		return items, nil
	}
	k := n.keys
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Txn(rctx).Then(
		clientv3.OpGet(k.Items(job), clientv3.WithPrefix()),
		clientv3.OpGet(k.Running(job), clientv3.WithPrefix()),
		clientv3.OpGet(k.DisabledItems(job), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return JobItems{}, fmt.Errorf("read items of job %q: %w", job, err)
	}
	if c != nil {
		n.learnRead(job, resp.Responses[0].GetResponseRange().Kvs, resp.Header.Revision, -1)
		if rw := n.hist.Rewound(); rw != nil {
			return JobItems{}, fmt.Errorf("read items of job %q: %w", job, rw)
		}
		c.fill(gen, resp)
	}
	lease := n.currentLease()
	out := JobItems{Rev: resp.Header.Revision, Items: map[int]ItemState{}}
	for i, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			item, err := strconv.Atoi(lastSegment(string(kv.Key)))
			if err != nil {
				continue
			}
			st := out.Items[item]
			n.decodeItemKey(job, item, i, kv, lease, &st)
			out.Items[item] = st
		}
	}
	return out, nil
}

// ReadItem reads one item's record, running marker and disable mark.
func (n *Node) ReadItem(ctx context.Context, job string, item int) (ItemState, error) {
	k := n.keys
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Txn(rctx).Then(
		clientv3.OpGet(k.Item(job, item)),
		clientv3.OpGet(k.RunningItem(job, item)),
		clientv3.OpGet(k.DisabledItem(job, item), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return ItemState{}, fmt.Errorf("read item %d of job %q: %w", item, job, err)
	}
	if n.itemCacheOf(job) != nil { // a local job: its records are known from now on
		n.learnRead(job, resp.Responses[0].GetResponseRange().Kvs, resp.Header.Revision, item)
		if rw := n.hist.Rewound(); rw != nil {
			return ItemState{}, fmt.Errorf("read item %d of job %q: %w", item, job, rw)
		}
	}
	lease := n.currentLease()
	var st ItemState
	for i, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			n.decodeItemKey(job, item, i, kv, lease, &st)
		}
	}
	return st, nil
}

// decodeItemKey folds one key read by ReadItems or ReadItem into st: kind
// 0 is the item record, 1 the running marker, 2 the disable mark.
func (n *Node) decodeItemKey(job string, item, kind int, kv *mvccpb.KeyValue, lease clientv3.LeaseID, st *ItemState) {
	switch kind {
	case 0:
		var rec ItemRecord
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			n.log.Error("ignoring malformed item record", "job", job, "key", string(kv.Key), "err", err)
			rec = ItemRecord{Job: job, Item: item, State: StateFailed}
		}
		st.Record, st.Rev = &rec, kv.ModRevision
	case 1:
		st.RunningBy = string(kv.Value)
		if st.RunningBy == "" {
			st.RunningBy = "?"
		}
		st.RunningMine = lease != clientv3.NoLease && clientv3.LeaseID(kv.Lease) == lease
	case 2:
		st.Disabled = true
	}
}

// currentLease is the lease of the current session, NoLease without one.
func (n *Node) currentLease() clientv3.LeaseID {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.session == nil {
		return clientv3.NoLease
	}
	return n.session.lease
}

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
	// Prev is the item's state the decision was made on; MapRev the
	// ModRevision of the shard map it was made on (0: do not check the map,
	// for manual runs).
	Prev   ItemState
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
	Upstream    *Upstream
	NoPropagate bool
	Total       int
}

// Grant is a won claim.
type Grant struct {
	// Fence is the claim's revision: strictly increasing per (job, item).
	Fence int64
	// Ctx is cancelled when the session that holds the claim fences itself:
	// the work must stop at once.
	Ctx    context.Context
	record ItemRecord
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
	resp, err := n.opts.Client.Txn(wctx).If(append(n.claimShared(c, member), p.cmps...)...).Then(p.ops...).Commit()
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
	rec  ItemRecord
	val  []byte
	cmps []clientv3.Cmp
	ops  []clientv3.Op
}

// claimTxn builds c's guards (the item record read, no running marker)
// and writes (the record, the marker under s's lease).
func (n *Node) claimTxn(s *session, c Claim) (claimParts, error) {
	k := n.keys
	rec := ItemRecord{
		Job: c.Job, Item: c.Item, Fire: c.Fire.UTC(), State: StateRunning, Instance: n.opts.ID,
		Attempt: c.Attempt, Source: c.Source, Start: n.opts.Now().UTC(), ExitCode: -1, Skipped: c.Skipped,
		Sched: c.Sched.UTC(), Trigger: c.Trigger, Param: c.Param, By: c.By, FireKey: c.FireKey,
		Upstream: c.Upstream, NoPropagate: c.NoPropagate, Total: c.Total,
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
	return claimParts{rec: rec, val: val,
		cmps: cmps,
		ops: []clientv3.Op{
			clientv3.OpPut(k.Item(c.Job, c.Item), string(val)),
			clientv3.OpPut(k.RunningItem(c.Job, c.Item), n.opts.ID, clientv3.WithLease(s.lease)),
		},
	}, nil
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

// claimsPerTxn bounds the items of one claim Txn: etcd's default
// --max-txn-ops (128) bounds its guards (2 shared, 2 per item) and its
// writes (2 per item).
const claimsPerTxn = 60

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
	for from := 0; from < len(claims); from += claimsPerTxn {
		chunk := claims[from:min(from+claimsPerTxn, len(claims))]
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
	resp, err := n.opts.Client.Txn(wctx).If(cmps...).Then(ops...).
		Else(clientv3.OpGet(n.keys.Member(c0.Job, n.opts.ID)), clientv3.OpGet(n.keys.Shards(c0.Job))).Commit()
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
func (n *Node) Adopt(ctx context.Context, job string, item int, st ItemState) (*Grant, error) {
	n.mu.Lock()
	s := n.session
	n.mu.Unlock()
	if s == nil {
		return nil, ErrNotUp
	}
	cur, err := n.ReadItem(ctx, job, item)
	if err != nil {
		return nil, err
	}
	rec := cur.Record
	if rec == nil || cur.Rev != st.Rev || !cur.RunningMine || rec.State != StateRunning || rec.Instance != n.opts.ID {
		// st came from the cache: what etcd says now differs, so the
		// cache is not to decide again (a restored etcd looped here).
		n.refused(job)
		return nil, fmt.Errorf("adopt item %d of job %q: %w", item, job, ErrClaimLost)
	}
	r := *rec
	r.Fence = cur.Rev
	return &Grant{Fence: cur.Rev, Ctx: s.ctx, record: r}, nil
}

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
			err = n.completions.do(ctx, n, rec, g.Fence) // with the outcomes of others
		} else {
			err = n.finish(ctx, rec, g.Fence, true)
		}
		if errors.Is(err, ErrClaimLost) && po.written() {
			return nil // written by the repair after etcd went back (rewind.go)
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
func (g *Grant) Final(o Outcome) ItemRecord {
	rec := g.record
	rec.State, rec.Reason, rec.ExitCode, rec.HTTPStatus, rec.Error, rec.Output = o.State, o.Reason, o.ExitCode, o.HTTPStatus, o.Err, o.Output
	rec.KilledBy, rec.Iterations = o.KilledBy, o.Iterations
	if !o.Start.IsZero() {
		rec.Start = o.Start.UTC()
	}
	rec.End = o.End.UTC()
	return rec
}

// Skip records that skipped fires up to fire were not run for item, and
// why (Skip* reasons), visible in history.
func (n *Node) Skip(ctx context.Context, job string, item int, fire time.Time, skipped int, reason string, prev ItemState) error {
	now := n.opts.Now().UTC()
	rec := ItemRecord{Job: job, Item: item, Fire: fire.UTC(), Sched: fire.UTC(), State: StateSkipped, Instance: n.opts.ID, ExitCode: -1,
		Skipped: skipped, Reason: reason, Start: now, End: now}
	if prev.Record != nil {
		rec.Seq = prev.Record.Seq + 1
		rec.Trigger = prev.Record.Trigger
	}
	return n.finish(ctx, rec, prev.Rev, false)
}

// Settle records a run cut by a failure that will not be re-run (the job
// says failover: false): KILLED, reason lost, in the item's record and
// history, guarded by the record read. The fires after it go on.
func (n *Node) Settle(ctx context.Context, job string, item int, st ItemState) error {
	if st.Record == nil {
		return nil
	}
	rec := *st.Record
	rec.State, rec.Reason, rec.End, rec.Fence = StateKilled, ReasonLost, n.opts.Now().UTC(), st.Rev
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
		rec := ItemRecord{Job: job, Item: item, Fire: sched.UTC(), Sched: sched.UTC(), State: StateSkipped, Instance: n.opts.ID, ExitCode: -1}
		val, err := json.Marshal(rec)
		if err != nil {
			return false, err
		}
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(n.keys.Item(job, item)), "=", 0))
		ops = append(ops, clientv3.OpPut(n.keys.Item(job, item), string(val)))
	}
	wctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Txn(wctx).If(cmps...).Then(ops...).Commit()
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

// finish writes rec to the item and its history if the item record is still
// at revision rev, and removes the running marker when clearRunning is set.
func (n *Node) finish(ctx context.Context, rec ItemRecord, rev int64, clearRunning bool) error {
	cmp, ops, err := n.finishTxn(rec, rev, clearRunning)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	key := n.keys.Item(rec.Job, rec.Item)
	resp, err := n.opts.Client.Txn(wctx).If(cmp).Then(ops...).Else(clientv3.OpGet(key)).Commit()
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
		if len(kvs) == 0 || kvs[0].ModRevision < rev {
			// The record is gone or older than the claim that wrote it
			// (a local job's records are never deleted): etcd went back.
			// Not lost: the repair writes the outcome (rewind.go).
			got := int64(0)
			if len(kvs) > 0 {
				got = kvs[0].ModRevision
			}
			return fmt.Errorf("record %s of item %d of job %q: %w", rec.State, rec.Item, rec.Job,
				n.hist.noteKeyRevision(key, rev, got))
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
func (n *Node) finishApplied(ctx context.Context, rec ItemRecord, put clientv3.Op) bool {
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
func (n *Node) History(ctx context.Context, job string) ([]ItemRecord, error) {
	return ReadHistory(ctx, n.opts.Client, n.keys, job)
}

// ReadHistory reads job's history from etcd, oldest first.
func ReadHistory(ctx context.Context, cli *clientv3.Client, keys Keys, job string) ([]ItemRecord, error) {
	resp, err := cli.Get(ctx, keys.HistoryPrefix(job), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read history of job %q: %w", job, err)
	}
	out := make([]ItemRecord, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var rec ItemRecord
		if json.Unmarshal(kv.Value, &rec) == nil {
			out = append(out, rec)
		}
	}
	sortRecords(out)
	return out, nil
}

func sortRecords(recs []ItemRecord) {
	slices.SortStableFunc(recs, func(a, b ItemRecord) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		if a.Item != b.Item {
			return a.Item - b.Item
		}
		return int(a.Seq - b.Seq)
	})
}

// finishTxn is the guard and the writes of finish.
func (n *Node) finishTxn(rec ItemRecord, rev int64, clearRunning bool) (clientv3.Cmp, []clientv3.Op, error) {
	k := n.keys
	val, err := json.Marshal(rec)
	if err != nil {
		return clientv3.Cmp{}, nil, err
	}
	ops := []clientv3.Op{
		clientv3.OpPut(k.Item(rec.Job, rec.Item), string(val)),
		clientv3.OpPut(k.History(rec.Job, rec.Item, rec.Seq%HistoryPerItem), string(val)),
	}
	if clearRunning {
		ops = append(ops, clientv3.OpDelete(k.RunningItem(rec.Job, rec.Item)))
	}
	if rec.Failed() {
		ops = append(ops, clientv3.OpPut(k.LastFailure(rec.Job), string(val)))
	}
	return clientv3.Compare(clientv3.ModRevision(k.Item(rec.Job, rec.Item)), "=", rev), ops, nil
}

// oneLastFailure keeps, of the puts in ops of a job's last-failure key
// (finishTxn's), only the record of the run that ended last: a Txn of the
// outcomes of several items may hold two failures of one job, and etcd
// refuses a Txn that writes a key twice ("duplicate key given in txn
// request").
func (k Keys) oneLastFailure(ops []clientv3.Op) []clientv3.Op {
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

// completer groups the outcomes of runs into shared Txns by group commit:
// an outcome that comes while no Txn of outcomes is in flight is written at
// once; those that come while one is are written together by the next.
// Each keeps its own guard (its claim's fence); when a shared Txn's guards
// fail, each outcome is written on its own, so that one taken-over item
// does not fail the others.
//
// Siblings, the runs of one claim Txn (one fence), were released together
// and often end together: an outcome whose siblings are still running waits
// for them, at most siblingLinger, and the last one writes them all in one
// Txn (measured: an outcome Txn per item execution without it, for the
// items of a job that an instance runs at each fire). Only siblings wait.
type completer struct {
	mu      sync.Mutex
	busy    bool // a flush is writing
	pending []*completion
	// siblings counts, by fence, the runs of a shared claim whose outcome
	// has not come yet.
	siblings map[int64]int
}

// siblingLinger bounds how long an outcome waits for its siblings'.
const siblingLinger = 5 * time.Millisecond

// maxSiblingFences bounds the fences expect tracks: claims whose runs never
// report an outcome here (a run that never started is recorded elsewhere)
// would otherwise stay; past it the map starts over (their outcomes are
// then written without waiting).
const maxSiblingFences = 4096

// expect records that count runs were claimed together under fence.
func (c *completer) expect(fence int64, count int) {
	if count < 2 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.siblings == nil || len(c.siblings) >= maxSiblingFences {
		c.siblings = map[int64]int{}
	}
	c.siblings[fence] = count
}

// kick starts a flush of what is pending, if none is in progress.
func (c *completer) kick(n *Node) {
	c.mu.Lock()
	if c.busy || len(c.pending) == 0 {
		c.mu.Unlock()
		return
	}
	c.busy = true
	c.mu.Unlock()
	c.drain(n)
}

type completion struct {
	rec   ItemRecord
	fence int64
	done  chan error // buffered(1)
}

// completionsPerTxn bounds a shared Txn: up to 4 writes per outcome
// (record, history, marker, and a failure's last-failure key) within
// etcd's default --max-txn-ops of 128.
const completionsPerTxn = 32

// do writes rec's outcome, guarded by fence, with others' if they come
// together; it returns finish's error for it, or ctx's when ctx ends first
// (a shutdown's bound: the write goes on, guarded by the fence). The
// caller that finds no flush in progress starts a goroutine that writes
// batches while there are some, so that no run's caller is held by
// others' outcomes, nor past its ctx by its own.
func (c *completer) do(ctx context.Context, n *Node, rec ItemRecord, fence int64) error {
	req := &completion{rec: rec, fence: fence, done: make(chan error, 1)}
	c.mu.Lock()
	c.pending = append(c.pending, req)
	waiting := 0 // siblings still running
	if left, ok := c.siblings[fence]; ok {
		if waiting = left - 1; waiting > 0 {
			c.siblings[fence] = waiting
		} else {
			delete(c.siblings, fence)
		}
	}
	flusher := !c.busy && waiting == 0
	if flusher {
		c.busy = true
	}
	c.mu.Unlock()
	switch {
	case flusher:
		go c.drain(n)
	case waiting > 0:
		// The last sibling, or this timer, writes it.
		time.AfterFunc(siblingLinger, func() {
			c.mu.Lock()
			delete(c.siblings, fence) // late siblings do not wait
			c.mu.Unlock()
			c.kick(n)
		})
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// flushOne writes the next batch of pending outcomes and says whether more
// are pending (else the completer is idle again).
func (c *completer) flushOne(n *Node) (more bool) {
	c.mu.Lock()
	batch := c.pending[:min(len(c.pending), completionsPerTxn)]
	c.pending = c.pending[len(batch):]
	c.mu.Unlock()
	if len(batch) > 0 {
		c.write(n, batch)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) == 0 {
		c.busy = false
		return false
	}
	return true
}

// drain writes pending outcomes until none is left.
func (c *completer) drain(n *Node) {
	for c.flushOne(n) {
	}
}

func (c *completer) write(n *Node, batch []*completion) {
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
	resp, err := n.opts.Client.Txn(ctx).If(cmps...).Then(n.keys.oneLastFailure(ops)...).Commit()
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
