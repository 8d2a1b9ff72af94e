package engine

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A child deployed after a parent fire completed does not run for that
// fire: fires from before the child depended on the parent trigger nothing
// (the index entry's since).
func TestDepsNewChildSkipsOlderParentFires(t *testing.T) {
	t.Parallel()
	longFaults(t)
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	parentOnly := `jobs:
  - name: parent
    shardingTotalCount: 2
    script: 'echo "$SHARDD_ITEM" >> ` + dir + `/parent'
`
	withChild := parentOnly + `  - name: child
    dependsOn: [parent]
    script: 'echo "$SHARDD_PARENT_FIRE" >> ` + dir + `/child'
`
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	a, stopA := startInstance(t, srv.Client(), "a", parentOnly)
	etcdtest.Eventually(t, 15*time.Second, "parent map", func() bool { v, _ := a.View("parent"); return v.Map != nil })
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "parent"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 15*time.Second, "the parent's fire", func() bool { return len(lines(filepath.Join(dir, "parent"))) == 2 })
	time.Sleep(3 * time.Second)
	stopA()
	deployed := time.Now()
	instance(t, srv, "a", withChild) // the child is deployed; the parent does not fire again
	time.Sleep(15 * time.Second)     // past the sweep (10 s)
	resp, _ := cli.Get(ctx, keys.Fires("parent"), clientv3.WithPrefix())
	for _, kv := range resp.Kvs {
		t.Logf("barrier %s = %s", kv.Key, kv.Value)
	}
	if got := lines(filepath.Join(dir, "child")); len(got) != 0 {
		t.Fatalf("the child, deployed at %s, ran %v for a parent fire that completed before it existed (parent ran %d items, all before the deploy)",
			deployed.UTC().Format(time.RFC3339), got, len(lines(filepath.Join(dir, "parent"))))
	}
}
