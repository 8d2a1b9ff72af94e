package admin

import (
	"context"
	"errors"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Records reads job's history from etcd, oldest first, whatever the job's
// state (History checks the job and the item first).
func (c *Client) Records(ctx context.Context, job string) ([]keyspace.ItemRecord, error) {
	resp, err := c.cli.Get(ctx, c.keys.HistoryPrefix(job), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read history of job %q: %w", job, err)
	}
	values := make([][]byte, len(resp.Kvs))
	for i, kv := range resp.Kvs {
		values[i] = kv.Value
	}
	return keyspace.ParseHistory(values), nil
}

// History reads a job's history (Records), only item's when item
// >= 0, after checking that the job and the item exist.
func (c *Client) History(ctx context.Context, job string, item int) ([]keyspace.ItemRecord, error) {
	f, err := c.requireJob(ctx, job)
	if err != nil {
		return nil, err
	}
	if item >= 0 {
		if err := f.checkItem(item); err != nil && !errors.Is(err, ErrRefused) {
			return nil, err
		}
	}
	recs, err := c.Records(ctx, job)
	if err != nil || item < 0 {
		return recs, err
	}
	return slices.DeleteFunc(recs, func(r keyspace.ItemRecord) bool { return r.Item != item }), nil
}
