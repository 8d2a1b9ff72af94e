package admin

import (
	"context"

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
