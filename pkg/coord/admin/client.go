package admin

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Client is the operator's side of a cluster: what `shardd status`, the
// API and the console read, and the commands they send (trigger, kill,
// disable, enable, remove, audit). It keeps no state of its own; every
// method reads or writes etcd at the time of the call.
type Client struct {
	cli  *clientv3.Client
	keys keyspace.Keys
	// shown, when set, marks the context of the reads Status makes to be
	// shown, never acted on (see WithShown).
	shown func(context.Context) context.Context
}

// New returns a client of the cluster whose keys are keys, over cli.
func New(cli *clientv3.Client, keys keyspace.Keys) *Client {
	return &Client{cli: cli, keys: keys}
}

// WithShown returns a copy of c whose Status reads go through mark: a
// daemon passes its node's ShownContext, so that its API and console still
// show what etcd holds while the node refuses to act on etcd's answers
// (etcd went back in time).
func (c *Client) WithShown(mark func(context.Context) context.Context) *Client {
	d := *c
	d.shown = mark
	return &d
}

// Keys returns the keyspace the client reads.
func (c *Client) Keys() keyspace.Keys { return c.keys }

// ReadTree returns the values of the keys under prefix of cli's etcd, by
// key: the keys of another program (shardd import reads an ElasticJob
// etcd registry's job configs with it), not shardd's keyspace.
func ReadTree(ctx context.Context, cli *clientv3.Client, prefix string) (map[string][]byte, error) {
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", prefix, err)
	}
	out := make(map[string][]byte, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[string(kv.Key)] = kv.Value
	}
	return out, nil
}
