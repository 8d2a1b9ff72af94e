package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A job's cluster-wide concurrency limit (clusterConcurrency: N,
// docs/policies.md): a run holds one of N slots, jobs/<job>/slots/<k>,
// put by its claim's Txn under the claimant's session lease and guarded by
// its absence, deleted with the run's outcome (or by the lease's end). At
// most N runs of the job hold one at any revision, wherever they run. An
// item that found no slot free puts jobs/<job>/waiting/<item> (its oldest
// due fire and the instance, under that instance's lease); slots go to the items that waited
// longest first (the engine's order, from these keys), and a claim deletes
// its item's waiting key. A waiting item's fires stay due: they run when it
// gets a slot, or are recorded skipped once older than the catch-up window.

// ClusterSlots is what a job's cluster-wide slots (clusterConcurrency)
// look like at a revision: the slots held, and the items waiting for one
// since when (the oldest fire they wait to run), with their keys.
type ClusterSlots struct {
	Held    map[int]bool
	Waiting map[int]time.Time
	// WaitingKeys are the waiting items' keys: who put each, at which
	// revision (a delete is guarded by it: a key put again since stays).
	WaitingKeys map[int]WaitingKey
}

// WaitingKey is an item's jobs/<job>/waiting/<item> key as read.
type WaitingKey struct {
	Instance string
	Rev      int64
}

// waitingValue is a waiting key's value.
type waitingValue struct {
	Since    time.Time `json:"since"`
	Instance string    `json:"instance"`
}

// ReadClusterSlots reads job's slots and waiting items.
func (n *Node) ReadClusterSlots(ctx context.Context, job string) (ClusterSlots, error) {
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Txn(rctx).Then(clientv3.OpGet(n.keys.Slots(job), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(n.keys.Waiting(job), clientv3.WithPrefix())).Commit()
	if err != nil {
		return ClusterSlots{}, fmt.Errorf("read the cluster slots of job %q: %w", job, err)
	}
	out := ClusterSlots{Held: map[int]bool{}, Waiting: map[int]time.Time{}, WaitingKeys: map[int]WaitingKey{}}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		if k, err := strconv.Atoi(keyspace.LastSegment(string(kv.Key))); err == nil {
			out.Held[k] = true
		}
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		var w waitingValue
		item, err1 := strconv.Atoi(keyspace.LastSegment(string(kv.Key)))
		err2 := json.Unmarshal(kv.Value, &w)
		if err1 == nil && err2 == nil {
			out.Waiting[item] = w.Since
			out.WaitingKeys[item] = WaitingKey{Instance: w.Instance, Rev: kv.ModRevision}
		}
	}
	return out, nil
}

// Wait records that item waits for a cluster slot since since (its
// oldest due fire), under this session's lease: the order in which the
// items of the job get slots, oldest first, on every instance.
func (n *Node) Wait(ctx context.Context, job string, item int, since time.Time) error {
	n.mu.Lock()
	s := n.session
	n.mu.Unlock()
	if s == nil {
		return ErrNotUp
	}
	val, _ := json.Marshal(waitingValue{Since: since.UTC(), Instance: n.ID()})
	_, err := n.opts.Client.Put(ctx, n.keys.WaitingItem(job, item), string(val), clientv3.WithLease(s.lease))
	if err != nil {
		return fmt.Errorf("record that item %d of job %q waits for a slot: %w", item, job, err)
	}
	return nil
}

// Unwait deletes item's waiting key if it is still the one read at rev
// (WaitingKey.Rev): its item waits for nothing (the engine's
// dropStaleWaiting). A key put again since, by whichever instance, stays.
func (n *Node) Unwait(ctx context.Context, job string, item int, rev int64) error {
	key := n.keys.WaitingItem(job, item)
	if _, err := n.opts.Client.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev)).Then(clientv3.OpDelete(key)).Commit(); err != nil {
		return fmt.Errorf("delete the waiting key of item %d of job %q: %w", item, job, err)
	}
	return nil
}
