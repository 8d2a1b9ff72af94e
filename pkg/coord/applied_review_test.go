package coord

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
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
