package admin

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// The kill request is put only if each run it names still holds its
// item, compared in the put's Txn: a run that ends between the read of the
// runs and the put is never asked to stop, and neither is its successor.
// A run holds its item while the item's running marker, created by the
// run's claim at its fence, exists.
func TestKillIsRecordedOnlyWhileItsRunsRun(t *testing.T) {
	srv := etcdtest.Start(t)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	c := New(cli, keys)
	claim := func() int64 { // a run's claim: the marker's creation is its fence
		t.Helper()
		resp, err := cli.Put(ctx, keys.RunningItem("orders", 0), "a")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	first := claim()
	seen := []keyspace.KillRun{{Item: 0, Fence: first, Instance: "a"}}
	// Read, then the run ends and the next starts, then the put.
	if _, err := cli.Delete(ctx, keys.RunningItem("orders", 0)); err != nil {
		t.Fatal(err)
	}
	next := claim()
	lease, err := cli.Grant(ctx, int64(keyspace.KillTTL/time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := c.putKill(ctx, "orders", keyspace.Kill{ID: "k1", Runs: seen, By: "test", At: time.Now()}, lease.ID); err != nil || ok {
		t.Fatalf("put of a kill of fence %d after it ended (fence %d runs): applied %v, %v; want not applied", first, next, ok, err)
	}
	if resp, err := cli.Get(ctx, keys.Kills("orders"), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Errorf("kill requests in etcd: %v (%v), want none", resp, err)
	}
	now := []keyspace.KillRun{{Item: 0, Fence: next, Instance: "a"}}
	if _, ok, err := c.putKill(ctx, "orders", keyspace.Kill{ID: "k2", Runs: now, By: "test", At: time.Now()}, lease.ID); err != nil || !ok {
		t.Fatalf("put of a kill of the run in progress: applied %v, %v", ok, err)
	}
}
