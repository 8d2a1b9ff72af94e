package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Records reads job's history from etcd, oldest first, whatever the job's
// state (History checks the job and the item first). A RUNNING record
// gets its run's fence (keyspace.RunFence), as the records written after
// it have theirs.
func (c *Client) Records(ctx context.Context, job string) ([]keyspace.ItemRecord, error) {
	resp, err := c.cli.Get(ctx, c.keys.HistoryPrefix(job), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read history of job %q: %w", job, err)
	}
	recs := make([]keyspace.ItemRecord, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var rec keyspace.ItemRecord
		if json.Unmarshal(kv.Value, &rec) != nil {
			continue // as ParseHistory: a value that does not decode is left out
		}
		rec.Fence = keyspace.RunFence(&rec, kv.ModRevision)
		recs = append(recs, rec)
	}
	keyspace.SortHistory(recs)
	return recs, nil
}

// Instances returns the live instances' registrations, by id; one that
// does not decode is left out.
func (c *Client) Instances(ctx context.Context) ([]keyspace.InstanceInfo, error) {
	resp, err := c.cli.Get(ctx, c.keys.Instances(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read the live instances: %w", err)
	}
	out := make([]keyspace.InstanceInfo, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var info keyspace.InstanceInfo
		if json.Unmarshal(kv.Value, &info) != nil {
			continue
		}
		if info.ID == "" {
			info.ID = strings.TrimPrefix(string(kv.Key), c.keys.Instances())
		}
		out = append(out, info)
	}
	return out, nil
}

// History reads a job's history (Records), only item's when item
// >= 0, after checking that the job and the item exist.
func (c *Client) History(ctx context.Context, job string, item int) ([]keyspace.ItemRecord, error) {
	if err := c.requireItem(ctx, job, item); err != nil {
		return nil, err
	}
	recs, err := c.Records(ctx, job)
	if err != nil || item < 0 {
		return recs, err
	}
	return slices.DeleteFunc(recs, func(r keyspace.ItemRecord) bool { return r.Item != item }), nil
}

// RecentRuns is what etcd says of job's recent runs: its history
// (History), and the runs in progress, whose records are their items' own
// until they end (the history keys get them then), read in one request,
// so that a run that ends meanwhile is in one of the two, not in neither.
func (c *Client) RecentRuns(ctx context.Context, job string, item int) ([]keyspace.ItemRecord, error) {
	if err := c.requireItem(ctx, job, item); err != nil {
		return nil, err
	}
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpGet(c.keys.HistoryPrefix(job), clientv3.WithPrefix()),
		clientv3.OpGet(c.keys.Items(job), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("read history of job %q: %w", job, err)
	}
	var recs []keyspace.ItemRecord
	for i, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			var rec keyspace.ItemRecord
			if json.Unmarshal(kv.Value, &rec) != nil || (item >= 0 && rec.Item != item) {
				continue
			}
			if i == 1 && rec.State != keyspace.StateRunning {
				continue // an item's ended record is in its history too
			}
			rec.Fence = keyspace.RunFence(&rec, kv.ModRevision)
			recs = append(recs, rec)
		}
	}
	keyspace.SortHistory(recs)
	return recs, nil
}
