package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
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
		pause := n.pauseOf(job)
		rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
		reads := []clientv3.Op{clientv3.OpGet(key)}
		if pause.after > 0 {
			reads = append(reads, clientv3.OpGet(n.keys.Pause(job)), clientv3.OpGet(n.keys.DisabledJob(job), clientv3.WithCountOnly()))
		}
		read, err := n.opts.Client.Txn(rctx).Then(reads...).Commit()
		cancel()
		if err != nil {
			return b, false, fmt.Errorf("read barrier %s: %w", key, err)
		}
		resp := read.Responses[0].GetResponseRange()
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
		// The note's identity is this instance's and the record's: a note
		// retried here after a lost reply learns it completed the fire, and
		// another instance noting the same record does not.
		me := n.opts.ID + ":" + strconv.Itoa(rec.Item) + "/" + strconv.FormatInt(rec.Fence, 10)
		if b.Ended(rec.Item) || b.Complete() {
			return b, b.Complete() && b.CompletedBy == me, nil // ours applied, its reply lost
		}
		switch {
		case rec.State == keyspace.StateDone:
			b.Done = append(b.Done, rec.Item)
		case rec.State == keyspace.StateSkipped:
			b.Skipped = append(b.Skipped, rec.Item)
		case rec.State == keyspace.StateKilled && !rec.Failed():
			b.Stopped = append(b.Stopped, rec.Item)
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
			if pause.after > 0 {
				c, o := n.pauseOps(job, keyspace.FireKey(&rec), &b, rec, pause, read.Responses[1].GetResponseRange().Kvs, read.Responses[2].GetResponseRange().Count > 0)
				cmps, ops = append(cmps, c...), append(ops, o...)
			}
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
			if b.Paused {
				n.log.Warn("job paused: its fires failed too many times in a row (pauseAfterFailures); shardd enable resumes it", "job", job, "after", pause.after)
			}
			return b, b.Complete(), nil
		}
		if b.Paused {
			// The definition (or the mark) changed meanwhile: let the
			// view catch up before deciding on the pause again.
			time.Sleep(50 * time.Millisecond)
		}
		// Another item's note came first: read it and note ours on top.
	}
}

// pause is what a barrier's note needs of a job's pauseAfterFailures: the
// bound (0: none), and the revision of the definition that sets it, which
// the Txn that pauses the job compares (a definition changed meanwhile
// decides again).
type pause struct {
	after int
	gen   int64
}

func (n *Node) pauseOf(job string) pause {
	v, ok := n.View(job)
	if !ok || v.Job == nil || v.Generation == 0 {
		return pause{}
	}
	return pause{after: v.Job.PauseAfterFailures, gen: v.Generation}
}

// pauseOps are the guards and writes of a fire's completing note that
// carry the job's streak of failed fires (keyspace.PauseStreak): one more
// for a failed fire, none for another that ran (a fire none of whose items
// ran leaves it as it is). The note that brings the streak to
// the bound also disables the job (disabled/job, as `shardd disable`
// does), with an audit entry whose actor is the job itself, and marks b
// Paused. A job already disabled is not paused again; `shardd enable`
// deletes the streak.
func (n *Node) pauseOps(job, fire string, b *keyspace.Barrier, rec keyspace.ItemRecord, p pause, streakKvs []*mvccpb.KeyValue, disabled bool) ([]clientv3.Cmp, []clientv3.Op) {
	key := n.keys.Pause(job)
	var st keyspace.PauseStreak
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}
	if len(streakKvs) > 0 {
		json.Unmarshal(streakKvs[0].Value, &st) // a malformed streak starts again
		cmps = []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", streakKvs[0].ModRevision)}
	}
	if disabled && !st.PausedAt.IsZero() {
		return nil, nil // paused: the streak says why until an operator enables the job
	}
	switch {
	case len(b.Failed) == 0 && len(b.Done) == 0 && len(b.Stopped) == 0:
		// None of its items ran it (busy, a calendar's day, too old,
		// disabled): it neither failed nor succeeded, and a job whose
		// failing runs alternate with skipped fires must still pause.
		return nil, nil
	case len(b.Failed) == 0:
		if st.FailedInARow == 0 && len(streakKvs) == 0 {
			return nil, nil
		}
		st = keyspace.PauseStreak{}
	default:
		st.FailedInARow++
		why := fmt.Sprintf("fire %s: item(s) %v failed", rec.Fire.UTC().Format(time.RFC3339), sortedInts(b.Failed))
		if rec.FireKey != "" {
			why = fmt.Sprintf("manual fire %s: item(s) %v failed", fire, sortedInts(b.Failed))
		}
		if rec.State != keyspace.StateDone && rec.State != keyspace.StateSkipped && rec.Error != "" {
			why += fmt.Sprintf("; item %d: %s", rec.Item, rec.Error)
		}
		st.Reasons = append(st.Reasons, why)
		if len(st.Reasons) > keyspace.MaxPauseReasons {
			st.Reasons = st.Reasons[len(st.Reasons)-keyspace.MaxPauseReasons:]
		}
	}
	var ops []clientv3.Op
	if st.FailedInARow >= p.after && !disabled {
		now := n.opts.Now().UTC()
		st.PausedAt, b.Paused = now, true
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(n.keys.Config(job)), "=", p.gen),
			clientv3.Compare(clientv3.CreateRevision(n.keys.DisabledJob(job)), "=", 0))
		e := keyspace.AuditEntry{Actor: keyspace.PausedBy(job), Action: "disable", Job: job, Target: "job " + job,
			Detail: fmt.Sprintf("pauseAfterFailures: %d fires in a row failed", st.FailedInARow), Outcome: keyspace.AuditOK,
			Message: strings.Join(st.Reasons, "; ")}
		e.Stamp(now)
		audit, _ := json.Marshal(e)
		ops = append(ops, clientv3.OpPut(n.keys.DisabledJob(job), now.Format(time.RFC3339)), clientv3.OpPut(n.keys.Audit()+e.ID, string(audit)))
	}
	val, _ := json.Marshal(st)
	return cmps, append(ops, clientv3.OpPut(key, string(val)))
}
