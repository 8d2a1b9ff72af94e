package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A fire's barrier (jobs/<job>/fires/<fire>) says how each item of one fire
// of a job ended, wherever it ran: the fan-in a child job of dependsOn
// waits for (docs/design.md, Dependencies). Each final outcome of an item
// is noted in it by a compare-and-swap on the key's ModRevision, so that
// outcomes noted at once on several instances all count; the note that
// makes it complete learns so, exactly once.
// The completing note also triggers the job's children (deps.go).

// NoteOutcome notes the final outcome of rec's item in its fire's barrier
// (a job of total items), creating the barrier with the first outcome. It
// returns the barrier after the note, and completed set when this note made
// it complete (only one note of a fire does); that note's Txn also
// triggers the children in idx (childOps). An item noted before (a retried
// note after a lost reply) changes nothing.
func (n *Node) NoteOutcome(ctx context.Context, job string, total int, rec keyspace.ItemRecord, idx keyspace.ParentsOf) (b keyspace.Barrier, completed bool, err error) {
	key := n.keys.Fire(job, keyspace.FireKey(&rec))
	for {
		rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
		resp, err := n.opts.Client.Get(rctx, key)
		cancel()
		if err != nil {
			return b, false, fmt.Errorf("read barrier %s: %w", key, err)
		}
		b = keyspace.Barrier{Total: total}
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
		if b.Ended(rec.Item) || b.Complete() {
			return b, b.Complete() && b.CompletedBy == me, nil // ours applied, its reply lost
		}
		switch {
		case rec.State == keyspace.StateDone:
			b.Done = append(b.Done, rec.Item)
		case rec.State == keyspace.StateSkipped:
			b.Skipped = append(b.Skipped, rec.Item)
		default:
			b.Failed = append(b.Failed, rec.Item)
		}
		cmps := []clientv3.Cmp{cmp}
		var ops []clientv3.Op
		if b.Complete() {
			b.Completed, b.CompletedBy = n.opts.Now().UTC(), me
			c, o, err := n.childOps(ctx, job, keyspace.FireKey(&rec), rec.Fire, b, idx)
			if err != nil {
				return b, false, err
			}
			cmps, ops = append(cmps, c...), o
		}
		val, _ := json.Marshal(b)
		ops = append(ops, clientv3.OpPut(key, string(val)))
		ops = append(ops, n.oldBarriers(job, keyspace.FireKey(&rec))...)
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
