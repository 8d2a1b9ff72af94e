package engine

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Under BROADCAST, a member rejoining right after a fire runs its item of
// the fire with a larger map: the fire's barrier waits for that item too
// (notes take the larger total), so the child never runs before every item
// of the fire ended, nor after one of them failed.
func TestDepsBroadcastRejoin(t *testing.T) {
	t.Parallel()
	longFaults(t)
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := `jobs:
  - name: parent
    strategy: BROADCAST
    cron: "*/4 * * * * ?"
    script: 'S=$(date +%s%N); if [ "$SHARDD_INSTANCE" = c ]; then sleep 3; echo "$SHARDD_FIRE_TIME c $SHARDD_ITEM $S $(date +%s%N) FAIL" >> ` + dir + `/parent; exit 1; fi; sleep 1.5; echo "$SHARDD_FIRE_TIME $SHARDD_INSTANCE $SHARDD_ITEM $S $(date +%s%N) ok" >> ` + dir + `/parent'
  - name: child
    dependsOn: [parent]
    script: 'echo "$SHARDD_PARENT_FIRE $(date +%s%N)" >> ` + dir + `/child'
`
	a := instance(t, srv, "a", yaml)
	instance(t, srv, "b", yaml)
	_, stopC := startInstance(t, srv.Client(), "c", yaml)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 20*time.Second, "3 members and the children index", func() bool {
		v, _ := a.View("parent")
		return len(v.Children["child"].Parents) == 1 && v.Map != nil && v.Map.Total == 3
	})
	// c runs at least one fire (item 2 gets a record), then leaves.
	etcdtest.Eventually(t, 20*time.Second, "c to run a parent item", func() bool {
		for _, l := range lines(filepath.Join(dir, "parent")) {
			if strings.Contains(l, "_c_") {
				return true
			}
		}
		return false
	})
	time.Sleep(500 * time.Millisecond)
	stopC()
	etcdtest.Eventually(t, 20*time.Second, "the map to shrink to 2", func() bool {
		v, _ := a.View("parent")
		return v.Map != nil && v.Map.Total == 2
	})
	violation := func() (string, bool) {
		parent := lines(filepath.Join(dir, "parent"))
		for _, c := range lines(filepath.Join(dir, "child")) {
			f := strings.Split(c, "_")
			for _, p := range parent {
				g := strings.Split(p, "_")
				if g[0] == f[0] && (g[5] == "FAIL" || g[4] > f[1]) {
					return "child run " + c + " for parent fire " + f[0] + ", whose item ran as " + p + " (fire_instance_item_startns_endns_outcome)", true
				}
			}
		}
		return "", false
	}
	for try := 0; try < 4; try++ {
		// Rejoin just after a fire: a and b have claimed it under the 2-item map.
		time.Sleep(time.Until(time.Now().Truncate(4 * time.Second).Add(4*time.Second + 150*time.Millisecond)))
		_, stopC = startInstance(t, srv.Client(), "c", yaml)
		time.Sleep(6 * time.Second)
		if why, bad := violation(); bad {
			resp, _ := cli.Get(ctx, keys.Fires("parent"), clientv3.WithPrefix())
			for _, kv := range resp.Kvs {
				t.Logf("barrier %s = %s", kv.Key, kv.Value)
			}
			t.Logf("parent runs: %v", lines(filepath.Join(dir, "parent")))
			t.Logf("child runs: %v", lines(filepath.Join(dir, "child")))
			t.Fatalf("try %d: %s", try, why)
		}
		stopC()
		time.Sleep(5 * time.Second)
	}
	t.Logf("no violation seen; parent runs %v child runs %v", lines(filepath.Join(dir, "parent")), lines(filepath.Join(dir, "child")))
}
