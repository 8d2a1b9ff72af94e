package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ReadItems reads every item record, running marker and item-disable mark
// of job in one request.
func (n *Node) ReadItems(ctx context.Context, job string) (keyspace.JobItems, error) {
	c := n.itemCacheOf(job)
	items, gen, ok := n.cachedItems(ctx, job, c)
	if ok {
		return items, nil
	}
	k := n.keys
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.txns.Txn(rctx, nil, []clientv3.Op{
		clientv3.OpGet(k.Items(job), clientv3.WithPrefix()),
		clientv3.OpGet(k.Running(job), clientv3.WithPrefix()),
		clientv3.OpGet(k.DisabledItems(job), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
	}, nil)
	if err != nil {
		return keyspace.JobItems{}, fmt.Errorf("read items of job %q: %w", job, err)
	}
	if c != nil {
		n.learnRead(job, resp.Responses[0].GetResponseRange().Kvs, resp.Header.Revision, -1)
		if rw := n.revs.Rewound(); rw != nil {
			return keyspace.JobItems{}, fmt.Errorf("read items of job %q: %w", job, rw)
		}
		c.fill(gen, resp)
	}
	lease := n.currentLease()
	out := keyspace.JobItems{Rev: resp.Header.Revision, Items: map[int]keyspace.ItemState{}}
	for i, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			item, err := strconv.Atoi(keyspace.LastSegment(string(kv.Key)))
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
func (n *Node) ReadItem(ctx context.Context, job string, item int) (keyspace.ItemState, error) {
	k := n.keys
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Txn(rctx).Then(
		clientv3.OpGet(k.Item(job, item)),
		clientv3.OpGet(k.RunningItem(job, item)),
		clientv3.OpGet(k.DisabledItem(job, item), clientv3.WithKeysOnly()),
	).Commit()
	if err != nil {
		return keyspace.ItemState{}, fmt.Errorf("read item %d of job %q: %w", item, job, err)
	}
	if n.itemCacheOf(job) != nil { // a local job: its records are known from now on
		n.learnRead(job, resp.Responses[0].GetResponseRange().Kvs, resp.Header.Revision, item)
		if rw := n.revs.Rewound(); rw != nil {
			return keyspace.ItemState{}, fmt.Errorf("read item %d of job %q: %w", item, job, rw)
		}
	}
	lease := n.currentLease()
	var st keyspace.ItemState
	for i, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			n.decodeItemKey(job, item, i, kv, lease, &st)
		}
	}
	return st, nil
}

// decodeItemKey folds one key read by ReadItems or ReadItem into st: kind
// 0 is the item record, 1 the running marker, 2 the disable mark.
func (n *Node) decodeItemKey(job string, item, kind int, kv *mvccpb.KeyValue, lease clientv3.LeaseID, st *keyspace.ItemState) {
	switch kind {
	case 0:
		var rec keyspace.ItemRecord
		if err := json.Unmarshal(kv.Value, &rec); err != nil {
			n.log.Error("ignoring malformed item record", "job", job, "key", string(kv.Key), "err", err)
			rec = keyspace.ItemRecord{Job: job, Item: item, State: keyspace.StateFailed}
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
