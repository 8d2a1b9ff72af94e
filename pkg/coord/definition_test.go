package coord

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

func TestPublishDecision(t *testing.T) {
	t.Parallel()
	v1 := jobs(t, "jobs:\n"+job("orders", 3))[0]
	v2 := jobs(t, "jobs:\n"+job("orders", 5))[0]
	v2over := jobs(t, "jobs:\n"+job("orders", 5, "    overwrite: true\n"))[0]
	reg := func(j *config.Job, superseded ...*config.Job) *keyspace.RegisteredConfig {
		rc := &keyspace.RegisteredConfig{Hash: j.Hash()}
		for _, s := range superseded {
			rc.Superseded = append(rc.Superseded, s.Hash())
		}
		return rc
	}
	applied := func(rc *keyspace.RegisteredConfig) *keyspace.RegisteredConfig {
		rc.Source = keyspace.SourceApplied
		return rc
	}
	const gen = 40 // the registered definition's generation
	for _, tc := range []struct {
		name    string
		local   *config.Job
		reg     *keyspace.RegisteredConfig
		state   keyspace.DefinitionState
		loaded  loadedState
		first   bool
		publish bool
	}{
		{"nothing registered", v1, nil, keyspace.DefinitionMissing, loadedState{}, true, true},
		{"garbage registered", v1, reg(v2), keyspace.DefinitionGarbage, loadedState{v1.Hash(), 10}, false, true},
		{"a definition this version cannot read", v1, reg(v2), keyspace.DefinitionUnreadable, loadedState{v2.Hash(), 10}, true, false},
		{"one it cannot read, overwrite", v2over, reg(v1), keyspace.DefinitionUnreadable, loadedState{v2.Hash(), 10}, true, true},
		{"same definition", v1, reg(v1), keyspace.DefinitionGood, loadedState{v1.Hash(), 10}, true, false},
		{"edited on this host", v2, reg(v1), keyspace.DefinitionGood, loadedState{v1.Hash(), 10}, true, true},
		{"rolled back on this host, the cluster unmoved", v1, reg(v2, v1), keyspace.DefinitionGood, loadedState{v2.Hash(), gen}, false, true},
		{"a superseded one on a host that was away (the cluster moved on)", v2, reg(v1, v2), keyspace.DefinitionGood, loadedState{v1.Hash(), 10}, true, false},
		{"this host is behind", v1, reg(v2, v1), keyspace.DefinitionGood, loadedState{v1.Hash(), 10}, true, false},
		{"new host with a superseded definition", v1, reg(v2, v1), keyspace.DefinitionGood, loadedState{}, true, false},
		{"new host with a definition new to the cluster", v2, reg(v1), keyspace.DefinitionGood, loadedState{}, true, true},
		{"overwrite, first registration in this process", v2over, reg(v1, v2), keyspace.DefinitionGood, loadedState{v2.Hash(), 10}, true, true},
		{"overwrite, again (a reconnect)", v2over, reg(v1, v2), keyspace.DefinitionGood, loadedState{v2.Hash(), 10}, false, false},
		{"overwrite equal to the registered one", v2over, reg(v2), keyspace.DefinitionGood, loadedState{v2.Hash(), 10}, true, false},
		// No file publishes over an applied definition (docs/applied.md).
		{"edited on this host, the job applied", v2, applied(reg(v1)), keyspace.DefinitionGood, loadedState{v1.Hash(), 10}, true, false},
		{"new to the cluster, the job applied", v2, applied(reg(v1)), keyspace.DefinitionGood, loadedState{}, true, false},
		{"overwrite, the job applied", v2over, applied(reg(v1)), keyspace.DefinitionGood, loadedState{v2.Hash(), 10}, true, false},
		{"overwrite over an unreadable applied one", v2over, applied(reg(v1)), keyspace.DefinitionUnreadable, loadedState{v2.Hash(), 10}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := publishDecision(tc.local, tc.reg, tc.state, gen, tc.loaded, tc.first)
			if got != tc.publish {
				t.Errorf("publish = %v (%q), want %v", got, why, tc.publish)
			}
			if got && why == "" {
				t.Error("a publication without a reason to log")
			}
		})
	}
	if v2.Hash() != v2over.Hash() {
		t.Error("overwrite changes the definition's hash; it must not (it says how to publish, not how to run)")
	}
}

// registered reads the job's config key: the definition's hash, writer and
// generation.
func registered(t *testing.T, cli *clientv3.Client, job string) (keyspace.RegisteredConfig, int64) {
	t.Helper()
	resp, err := cli.Get(context.Background(), keyspace.NewKeys("").Config(job))
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("read config of %s: %v", job, err)
	}
	var rc keyspace.RegisteredConfig
	if err := json.Unmarshal(resp.Kvs[0].Value, &rc); err != nil {
		t.Fatal(err)
	}
	return rc, resp.Kvs[0].ModRevision
}

// runsTotal waits until every node's effective definition of orders has
// want items and the stored map has want items.
func runsTotal(t *testing.T, cli *clientv3.Client, want int, nodes ...*testNode) {
	t.Helper()
	etcdtest.Eventually(t, 10*time.Second, "every instance on the registered definition", func() bool {
		for _, n := range nodes {
			if v, ok := n.View("orders"); !ok || v.Job.ShardingTotalCount != want {
				return false
			}
		}
		m := etcdtest.StoredMap(cli, "orders")
		return m != nil && m.Total == want
	})
}

func conflicts(nodes ...*testNode) map[string]bool {
	out := map[string]bool{}
	for _, n := range nodes {
		v, _ := n.View("orders")
		out[n.ID()] = v.Conflict
	}
	return out
}

func wantConflicts(t *testing.T, want map[string]bool, nodes ...*testNode) {
	t.Helper()
	etcdtest.Eventually(t, 5*time.Second, "conflicts", func() bool {
		got := conflicts(nodes...)
		for id, w := range want {
			if got[id] != w {
				return false
			}
		}
		return true
	})
}

// One registered definition runs everywhere; an edit on any host takes
// effect everywhere, without overwrite; a host whose file is behind runs
// the registered definition and shows a conflict, and never puts its old
// definition back, neither at a restart nor as a new instance.
func TestOneDefinitionRunsEverywhere(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	v := func(n int) []*config.Job { return jobs(t, "jobs:\n"+job("orders", n)) }
	a := startNode(t, srv, "a", v(3))
	b := startNode(t, srv, "b", v(3))
	runsTotal(t, cli, 3, a, b)
	wantConflicts(t, map[string]bool{"a": false, "b": false}, a, b)

	// An edit on a (a reload) reaches b.
	a.SetJobs(v(5))
	runsTotal(t, cli, 5, a, b)
	wantConflicts(t, map[string]bool{"a": false, "b": true}, a, b)
	if rc, _ := registered(t, cli, "orders"); rc.Writer != "a" {
		t.Errorf("registered by %s, want a", rc.Writer)
	}
	if !strings.Contains(b.log.String(), "job definition changed") {
		t.Error("b did not log the definition change")
	}
	etcdtest.Eventually(t, 5*time.Second, "status to report b's conflict", func() bool {
		st, err := admin.New(cli, keyspace.NewKeys("")).Status(context.Background())
		return err == nil && len(st.Jobs) == 1 && len(st.Jobs[0].Problems) == 1 &&
			strings.Contains(st.Jobs[0].Problems[0], "instance b has a different local definition")
	})

	// b restarts on its unchanged file: it is behind, not editing.
	_, gen := registered(t, cli, "orders")
	b.stop(t)
	b = startNode(t, srv, "b", v(3))
	// c is new, with the definition the cluster left behind.
	c := startNode(t, srv, "c", v(3))
	runsTotal(t, cli, 5, a, b, c)
	wantConflicts(t, map[string]bool{"a": false, "b": true, "c": true}, a, b, c)
	if _, now := registered(t, cli, "orders"); now != gen {
		t.Fatalf("generation %d -> %d: a host that is behind published its definition", gen, now)
	}

	// An edit on b, then a rollback on b, both take effect everywhere.
	b.SetJobs(v(4))
	runsTotal(t, cli, 4, a, b, c)
	wantConflicts(t, map[string]bool{"a": true, "b": false, "c": true}, a, b, c)
	b.SetJobs(v(3))
	runsTotal(t, cli, 3, a, b, c)
	wantConflicts(t, map[string]bool{"a": true, "b": false, "c": false}, a, b, c)
	_, g1 := registered(t, cli, "orders")

	// a's file is behind now: its reconnect (a new session) changes nothing.
	a.proxy.Blackhole()
	etcdtest.Eventually(t, 3*testTTL, "a to fence", func() bool { return !a.Up() })
	a.proxy.Restore()
	etcdtest.Eventually(t, 10*time.Second, "a back", a.Up)
	runsTotal(t, cli, 3, a, b, c)
	if _, g2 := registered(t, cli, "orders"); g2 != g1 {
		t.Errorf("generation %d -> %d after a's reconnect", g1, g2)
	}
}

// Two hosts with overwrite: true and different definitions: one
// definition runs on both, the other host shows the conflict, and a
// reconnect does not flip it back (each overwrites once, when it starts or
// reloads).
func TestOverwriteSplitBrain(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	over := func(n int) []*config.Job { return jobs(t, "jobs:\n"+job("orders", n, "    overwrite: true\n")) }
	a := startNode(t, srv, "a", over(3))
	runsTotal(t, cli, 3, a)
	b := startNode(t, srv, "b", over(4))
	runsTotal(t, cli, 4, a, b)
	wantConflicts(t, map[string]bool{"a": true, "b": false}, a, b)
	_, gen := registered(t, cli, "orders")

	for _, n := range []*testNode{a, b} {
		n.proxy.Blackhole()
		etcdtest.Eventually(t, 3*testTTL, n.ID()+" to fence", func() bool { return !n.Up() })
		n.proxy.Restore()
		etcdtest.Eventually(t, 10*time.Second, n.ID()+" back", n.Up)
	}
	time.Sleep(500 * time.Millisecond) // the re-registrations are done once Up; let any stray write land
	runsTotal(t, cli, 4, a, b)
	wantConflicts(t, map[string]bool{"a": true, "b": false}, a, b)
	if _, now := registered(t, cli, "orders"); now != gen {
		t.Errorf("generation %d -> %d: a reconnect overwrote the definition", gen, now)
	}
	if rc, _ := registered(t, cli, "orders"); rc.Writer != "b" {
		t.Errorf("registered by %s, want b", rc.Writer)
	}
}

// a host that was down during a deploy and its rollback comes back
// with the deployed (bad) file and republishes it cluster-wide: "edited on
// this host" ignores that the cluster superseded that definition.
func TestHostBehindARollbackDoesNotUndoIt(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli := srv.Client()
	a := startNode(t, srv, "a", reviewV(t, 3))
	c := startNode(t, srv, "c", reviewV(t, 3))
	runsTotal(t, cli, 3, a, c)
	c.stop(t) // c is down for maintenance

	a.SetJobs(reviewV(t, 5)) // deploy v5 (c's file gets it too, c's daemon is down)
	runsTotal(t, cli, 5, a)
	a.SetJobs(reviewV(t, 3)) // v5 is bad: roll back (c is unreachable, keeps v5 on disk)
	runsTotal(t, cli, 3, a)

	c2 := startNode(t, srv, "c", reviewV(t, 5))
	waitRegistered(t, c2)
	if rc, _ := registered(t, cli, "orders"); rc.Hash != reviewV(t, 3)[0].Hash() {
		t.Errorf("the rolled-back definition (total 5) is registered again, written by %s: a host that missed the rollback undid it cluster-wide", rc.Writer)
	}
}

// A definition published by a newer shardd (a field this version does
// not know) is not garbage: neither this version's registration nor its
// leader replaces it; this host keeps its last good one and shows a conflict.
func TestDefinitionOfANewerVersionIsKept(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	a := startNode(t, srv, "a", reviewV(t, 3))
	runsTotal(t, cli, 3, a)

	var m map[string]any
	if err := json.Unmarshal(reviewV(t, 5)[0].JSON(), &m); err != nil {
		t.Fatal(err)
	}
	m["someNewField"] = true // what a newer version's Job.JSON would carry
	raw, _ := json.Marshal(m)
	val, _ := json.Marshal(keyspace.RegisteredConfig{Hash: "newer-hash", Job: raw, Writer: "newer", Written: time.Now().UTC(), Superseded: []string{reviewV(t, 3)[0].Hash()}})
	if _, err := cli.Put(context.Background(), keyspace.NewKeys("").Config("orders"), string(val)); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 5*time.Second, "a's conflict", func() bool { v, _ := a.View("orders"); return v.Conflict })
	a.proxy.Blackhole() // and a reconnect, which registers again, changes nothing
	etcdtest.Eventually(t, 3*testTTL, "a to fence", func() bool { return !a.Up() })
	a.proxy.Restore()
	etcdtest.Eventually(t, 10*time.Second, "a back", a.Up)
	time.Sleep(time.Second)
	if rc, _ := registered(t, cli, "orders"); rc.Writer != "newer" {
		t.Errorf("a newer version's definition was overwritten by %s as malformed", rc.Writer)
	}
	if v, _ := a.View("orders"); !v.Conflict || v.Job.ShardingTotalCount != 3 {
		t.Errorf("a: conflict %v, running total %d; want a conflict and its last good definition (3)", v.Conflict, v.Job.ShardingTotalCount)
	}
}

// overwrite: true added by a reload publishes (the hash leaves overwrite
// out: the worker restart and publishDecision's first must not).
func TestOverwriteAddedByReloadPublishes(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli := srv.Client()
	a := startNode(t, srv, "a", reviewV(t, 3))
	runsTotal(t, cli, 3, a)
	b := startNode(t, srv, "b", reviewV(t, 5)) // a new host: publishes total 5
	runsTotal(t, cli, 5, a, b)

	a.SetJobs(reviewV(t, 3, "    overwrite: true\n")) // the operator forces a's definition
	want := reviewV(t, 3)[0].Hash()
	etcdtest.Eventually(t, 5*time.Second, "a's forced definition (total 3) registered", func() bool {
		rc, _ := registered(t, cli, "orders")
		return rc.Hash == want
	})
}

// A definition edited on one host is recorded in the audit log, as the
// instance that published it.
func TestDefinitionChangeIsAudited(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	a := startNode(t, srv, "a", jobs(t, "jobs:\n"+job("orders", 3)))
	etcdtest.Eventually(t, 10*time.Second, "orders' map", func() bool { m := etcdtest.StoredMap(cli, "orders"); return m != nil && m.Total == 3 })
	a.SetJobs(jobs(t, "jobs:\n"+job("orders", 4)))
	etcdtest.Eventually(t, 10*time.Second, "the edit's audit entry", func() bool {
		es, _ := admin.New(cli, keys).Audit(ctx, admin.AuditFilter{Job: "orders"})
		return len(es) == 1 && es[0].Action == "definition" && es[0].Actor == "instance:a" && strings.Contains(es[0].Message, "edited on this host")
	})
}

func reviewV(t *testing.T, n int, extra ...string) []*config.Job {
	return jobs(t, "jobs:\n"+job("orders", n, extra...))
}

func waitRegistered(t *testing.T, n *testNode) {
	t.Helper()
	etcdtest.Eventually(t, 10*time.Second, n.ID()+" registered", func() bool {
		v, ok := n.View("orders")
		return ok && v.Generation > 0 && n.Up()
	})
	time.Sleep(500 * time.Millisecond) // let any publication land
}
