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

// A fire's barrier (jobs/<job>/fires/<fire>) says how each item of one fire
// of a job ended, wherever it ran: the fan-in a child job of dependsOn
// waits for (docs/design.md, Dependencies). Each final outcome of an item
// is noted in it by a compare-and-swap on the key's ModRevision, so that
// outcomes noted at once on several instances all count; the note that
// makes it complete learns so, exactly once.
// The completing note also triggers the job's children (deps.go).

// FireKey names the fire a record is a run of: its FireKey, set by the
// claim of a manual run (ManualFireKey: a manual fire, even a re-run of a
// past fire, is not the scheduled one) and kept by its re-runs; else
// "t<unix nanoseconds>" (19 digits) of its scheduled fire, which its
// re-runs, failover or not, share.
func FireKey(rec *ItemRecord) string {
	if rec.FireKey != "" {
		return rec.FireKey
	}
	return fmt.Sprintf("t%019d", rec.Fire.UnixNano())
}

// ManualFireKey is the FireKey of the runs of a manual (or upstream)
// trigger: "m", the time it was asked for (19 digits of Unix nanoseconds:
// barriers sort by it, and old ones are removed by range) and its
// revision (its identity).
func ManualFireKey(tr Trigger) string {
	return fmt.Sprintf("m%019d-%d", tr.Fire.UnixNano(), tr.Rev)
}

// fireAsked is when fire (a FireKey) happened, for the children index's
// Since: a manual (or upstream) fire when it was asked for, the time its
// key carries, whatever fire it runs (a re-run of a past fire is asked for
// now); a scheduled one its scheduled time, sched.
func fireAsked(fire string, sched time.Time) time.Time {
	var nanos, rev int64
	if n, err := fmt.Sscanf(fire, "m%019d-%d", &nanos, &rev); err == nil && n == 2 {
		return time.Unix(0, nanos).UTC()
	}
	return sched
}

// Barrier is how the items of one fire ended.
type Barrier struct {
	Total   int   `json:"total"`
	Done    []int `json:"done,omitempty"`
	Failed  []int `json:"failed,omitempty"`
	Skipped []int `json:"skipped,omitempty"`
	// Completed is when the last item's outcome was noted (zero: items
	// are still to end), CompletedBy that note's run (item/fence): a note
	// retried after a lost reply knows it completed the barrier.
	Completed   time.Time `json:"completed,omitzero"`
	CompletedBy string    `json:"completedBy,omitempty"`
}

// Complete reports whether every item has ended: items 0 to Total-1.
func (b *Barrier) Complete() bool {
	for item := range b.Total {
		if !b.ended(item) {
			return false
		}
	}
	return true
}

// Succeeded reports whether every item ended DONE.
func (b *Barrier) Succeeded() bool { return b.Complete() && len(b.Failed)+len(b.Skipped) == 0 }

// ended reports whether item's outcome is noted.
func (b *Barrier) ended(item int) bool {
	return slices.Contains(b.Done, item) || slices.Contains(b.Failed, item) || slices.Contains(b.Skipped, item)
}

// NoteOutcome notes the final outcome of rec's item in its fire's barrier
// (a job of total items), creating the barrier with the first outcome. It
// returns the barrier after the note, and completed set when this note made
// it complete (only one note of a fire does); that note's Txn also
// triggers the children in idx (childOps). An item noted before (a retried
// note after a lost reply) changes nothing.
func (n *Node) NoteOutcome(ctx context.Context, job string, total int, rec ItemRecord, idx ParentsOf) (b Barrier, completed bool, err error) {
	key := n.keys.Fire(job, FireKey(&rec))
	for {
		rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
		resp, err := n.opts.Client.Get(rctx, key)
		cancel()
		if err != nil {
			return b, false, fmt.Errorf("read barrier %s: %w", key, err)
		}
		b = Barrier{Total: total}
		cmp := clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		if len(resp.Kvs) > 0 {
			if err := json.Unmarshal(resp.Kvs[0].Value, &b); err != nil {
				return b, false, fmt.Errorf("barrier %s is malformed: %w", key, err)
			}
			cmp = clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)
			if total > b.Total && !b.Complete() {
				b.Total = total // items of the fire claimed under a larger map
			}
		}
		me := strconv.Itoa(rec.Item) + "/" + strconv.FormatInt(rec.Fence, 10)
		if b.ended(rec.Item) || b.Complete() {
			return b, b.Complete() && b.CompletedBy == me, nil // ours applied, its reply lost
		}
		switch {
		case rec.State == StateDone:
			b.Done = append(b.Done, rec.Item)
		case rec.State == StateSkipped:
			b.Skipped = append(b.Skipped, rec.Item)
		default:
			b.Failed = append(b.Failed, rec.Item)
		}
		cmps := []clientv3.Cmp{cmp}
		var ops []clientv3.Op
		if b.Complete() {
			b.Completed, b.CompletedBy = n.opts.Now().UTC(), me
			c, o, err := n.childOps(ctx, job, FireKey(&rec), rec.Fire, b, idx)
			if err != nil {
				return b, false, err
			}
			cmps, ops = append(cmps, c...), o
		}
		val, _ := json.Marshal(b)
		ops = append(ops, clientv3.OpPut(key, string(val)))
		ops = append(ops, n.oldBarriers(job, FireKey(&rec))...)
		wctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
		w, err := n.opts.Client.Txn(wctx).If(cmps...).Then(ops...).Commit()
		cancel()
		if err != nil {
			// Unknown outcome: the caller notes again later, and an
			// applied note is found then (completed included: CompletedBy).
			return b, false, fmt.Errorf("note item %d in barrier %s: %w", rec.Item, key, err)
		}
		if w.Succeeded {
			return b, b.Complete(), nil
		}
		// Another item's note came first: read it and note ours on top.
	}
}
