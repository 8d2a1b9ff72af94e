package coord

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Item states in an ItemRecord.
const (
	StateRunning = "RUNNING" // claimed, not completed
	StateDone    = "DONE"    // completed successfully
	StateFailed  = "FAILED"  // completed, failed (after its retries)
	StateSkipped = "SKIPPED" // fires up to Fire were skipped by policy, not run
)

// Execution sources.
const (
	SourceNormal   = "NORMAL"
	SourceMisfire  = "MISFIRE"
	SourceFailover = "FAILOVER"
	SourceManual   = "MANUAL"
)

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
	// ExitCode of a script or HTTP status of a hook; -1 when there is none.
	ExitCode int    `json:"exitCode"`
	Error    string `json:"error,omitempty"`
	Output   string `json:"output,omitempty"`
	// Skipped counts the fires before Fire that were not run (misfire policy).
	Skipped int `json:"skipped,omitempty"`
}

// ItemState is what etcd says about one item at one revision.
type ItemState struct {
	// Record is nil when the item was never claimed.
	Record *ItemRecord
	// Rev is the ModRevision of the record, 0 when there is none.
	Rev int64
	// RunningBy is the instance holding the running marker, "" when none.
	RunningBy string
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
	k := n.keys
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Txn(rctx).Then(
		clientv3.OpGet(k.Items(job), clientv3.WithPrefix()),
		clientv3.OpGet(k.Running(job), clientv3.WithPrefix()),
		clientv3.OpGet(k.Disabled(job)+"items/", clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return JobItems{}, fmt.Errorf("read items of job %q: %w", job, err)
	}
	out := JobItems{Rev: resp.Header.Revision, Items: map[int]ItemState{}}
	get := func(key string) (int, ItemState, bool) {
		item, err := strconv.Atoi(lastSegment(key))
		if err != nil {
			return 0, ItemState{}, false
		}
		return item, out.Items[item], true
	}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		item, st, ok := get(string(kv.Key))
		if !ok {
			continue
		}
		var rec ItemRecord
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			n.log.Error("ignoring malformed item record", "job", job, "key", string(kv.Key), "err", err)
			rec = ItemRecord{Job: job, Item: item, State: StateFailed}
		}
		st.Record, st.Rev = &rec, kv.ModRevision
		out.Items[item] = st
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		if item, st, ok := get(string(kv.Key)); ok {
			st.RunningBy = string(kv.Value)
			if st.RunningBy == "" {
				st.RunningBy = "?"
			}
			out.Items[item] = st
		}
	}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		if item, st, ok := get(string(kv.Key)); ok {
			st.Disabled = true
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
	var st ItemState
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		var rec ItemRecord
		if err := json.Unmarshal(kvs[0].Value, &rec); err != nil {
			n.log.Error("ignoring malformed item record", "job", job, "key", string(kvs[0].Key), "err", err)
			rec = ItemRecord{Job: job, Item: item, State: StateFailed}
		}
		st.Record, st.Rev = &rec, kvs[0].ModRevision
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		st.RunningBy = string(kvs[0].Value)
		if st.RunningBy == "" {
			st.RunningBy = "?"
		}
	}
	st.Disabled = len(resp.Responses[2].GetResponseRange().Kvs) > 0
	return st, nil
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
	if s == nil || member == 0 {
		return nil, ErrNotUp
	}
	k := n.keys
	rec := ItemRecord{
		Job: c.Job, Item: c.Item, Fire: c.Fire.UTC(), State: StateRunning, Instance: n.opts.ID,
		Attempt: c.Attempt, Source: c.Source, Start: n.opts.Now().UTC(), ExitCode: -1, Skipped: c.Skipped,
	}
	if c.Prev.Record != nil {
		rec.Seq = c.Prev.Record.Seq + 1
	}
	val, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(k.Member(c.Job, n.opts.ID)), "=", member),
		clientv3.Compare(clientv3.ModRevision(k.Item(c.Job, c.Item)), "=", c.Prev.Rev),
		clientv3.Compare(clientv3.CreateRevision(k.RunningItem(c.Job, c.Item)), "=", 0),
	}
	if c.MapRev != 0 {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.Shards(c.Job)), "=", c.MapRev))
	}
	wctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Txn(wctx).If(cmps...).Then(
		clientv3.OpPut(k.Item(c.Job, c.Item), string(val)),
		clientv3.OpPut(k.RunningItem(c.Job, c.Item), n.opts.ID, clientv3.WithLease(s.lease)),
	).Commit()
	if err != nil {
		// Unknown outcome. If the claim applied, its marker holds the item
		// for as long as this session lives: nobody else may run the item,
		// and no later fire here would either. Read it back.
		n.log.Warn("claim outcome unknown; reading it back", "job", c.Job, "item", c.Item, "fire", c.Fire, "err", err)
		fence, rerr := n.readBackClaim(ctx, s, c, val)
		if rerr != nil {
			return nil, rerr
		}
		rec.Fence = fence
		return &Grant{Fence: fence, Ctx: s.ctx, record: rec}, nil
	}
	if !resp.Succeeded {
		return nil, ErrClaimLost
	}
	rec.Fence = resp.Header.Revision
	return &Grant{Fence: resp.Header.Revision, Ctx: s.ctx, record: rec}, nil
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

// Complete records the outcome of a granted run, removes its running marker
// and appends it to the item's history, guarded by the claim's fence.
func (n *Node) Complete(ctx context.Context, g *Grant, state string, exitCode int, errText, output string, start, end time.Time) error {
	rec := g.record
	rec.State, rec.ExitCode, rec.Error, rec.Output, rec.Start, rec.End = state, exitCode, errText, output, start.UTC(), end.UTC()
	return n.finish(ctx, rec, g.Fence, true)
}

// Skip records that fires up to fire were skipped (not run) for item: the
// misfire policy's decision, visible in history.
func (n *Node) Skip(ctx context.Context, job string, item int, fire time.Time, skipped int, prev ItemState) error {
	rec := ItemRecord{Job: job, Item: item, Fire: fire.UTC(), State: StateSkipped, Instance: n.opts.ID, ExitCode: -1,
		Skipped: skipped, Start: n.opts.Now().UTC(), End: n.opts.Now().UTC()}
	if prev.Record != nil {
		rec.Seq = prev.Record.Seq + 1
		rec.Attempt = 0
	}
	return n.finish(ctx, rec, prev.Rev, false)
}

// finish writes rec to the item and its history if the item record is still
// at revision rev, and removes the running marker when clearRunning is set.
func (n *Node) finish(ctx context.Context, rec ItemRecord, rev int64, clearRunning bool) error {
	k := n.keys
	val, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	ops := []clientv3.Op{
		clientv3.OpPut(k.Item(rec.Job, rec.Item), string(val)),
		clientv3.OpPut(k.History(rec.Job, rec.Item, rec.Seq%HistoryPerItem), string(val)),
	}
	if clearRunning {
		ops = append(ops, clientv3.OpDelete(k.RunningItem(rec.Job, rec.Item)))
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		wctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
		resp, err := n.opts.Client.Txn(wctx).If(clientv3.Compare(clientv3.ModRevision(k.Item(rec.Job, rec.Item)), "=", rev)).Then(ops...).Commit()
		cancel()
		if err == nil {
			if !resp.Succeeded {
				// Our claim was taken over (after a fence): its record is not ours to write.
				return fmt.Errorf("record %s of item %d of job %q: %w", rec.State, rec.Item, rec.Job, ErrClaimLost)
			}
			return nil
		}
		lastErr = err // unknown outcome: the guard makes the retry safe
		if ctx.Err() != nil {
			break
		}
	}
	return fmt.Errorf("record %s of item %d of job %q: %w", rec.State, rec.Item, rec.Job, lastErr)
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
