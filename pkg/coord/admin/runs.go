package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// FindRuns returns the runs of job that etcd records, newest (highest
// fence) first, one record per run (fence and item): each item's current
// record, a run in progress among them, and its history (the last
// HistoryPerItem records of each item). A run in progress has its claim's
// revision as Fence (its record is written before the fence is known).
// Records of fires that did not run (SKIPPED: no fence) are left out.
// item >= 0 keeps that item's runs, fence > 0 that fence's (the items of
// one claim share it). An unknown job is ErrUnknownJob, naming the job
// meant when it is near one; an item out of range is ErrBadTarget.
func (c *Client) FindRuns(ctx context.Context, job string, item int, fence int64) ([]keyspace.ItemRecord, error) {
	if err := c.requireItem(ctx, job, item); err != nil {
		return nil, err
	}
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpGet(c.keys.Items(job), clientv3.WithPrefix()),
		clientv3.OpGet(c.keys.HistoryPrefix(job), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("read the runs of job %q: %w", job, err)
	}
	type run struct {
		fence int64
		item  int
	}
	latest := map[run]int64{} // a run's newest record: its ModRevision
	var out []keyspace.ItemRecord
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			var rec keyspace.ItemRecord
			if json.Unmarshal(kv.Value, &rec) != nil {
				continue
			}
			if rec.State == keyspace.StateRunning && rec.Fence == 0 {
				rec.Fence = kv.ModRevision // the claim wrote it
			}
			if rec.Fence <= 0 || (item >= 0 && rec.Item != item) || (fence > 0 && rec.Fence != fence) {
				continue
			}
			k := run{rec.Fence, rec.Item}
			if rev, seen := latest[k]; seen {
				if rev >= kv.ModRevision {
					continue
				}
				i := slices.IndexFunc(out, func(o keyspace.ItemRecord) bool { return o.Fence == k.fence && o.Item == k.item })
				out = slices.Delete(out, i, i+1)
			}
			latest[k] = kv.ModRevision
			out = append(out, rec)
		}
	}
	slices.SortStableFunc(out, func(a, b keyspace.ItemRecord) int {
		if a.Fence != b.Fence {
			if a.Fence > b.Fence {
				return -1
			}
			return 1
		}
		return a.Item - b.Item
	})
	return out, nil
}

// Instance returns the registration of instance id; ok is false when
// no live instance has that id (its key goes with its lease).
func (c *Client) Instance(ctx context.Context, id string) (info keyspace.InstanceInfo, ok bool, err error) {
	resp, err := c.cli.Get(ctx, c.keys.Instance(id))
	if err != nil {
		return keyspace.InstanceInfo{}, false, fmt.Errorf("read instance %q: %w", id, err)
	}
	if len(resp.Kvs) == 0 {
		return keyspace.InstanceInfo{}, false, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &info); err != nil {
		return keyspace.InstanceInfo{ID: id}, true, fmt.Errorf("instance %q: malformed registration: %w", id, err)
	}
	if info.ID == "" {
		info.ID = id
	}
	return info, true, nil
}

// ItemCount returns how many items job has now (the registered definition's
// shardingTotalCount; for BROADCAST, its map's): ok is false when etcd has
// neither readable. An unknown job is ErrUnknownJob.
func (c *Client) ItemCount(ctx context.Context, job string) (n int, ok bool, err error) {
	f, err := c.requireJob(ctx, job)
	if err != nil {
		return 0, false, err
	}
	n, ok = f.total()
	return n, ok, nil
}
