package coord

// Regressions found by review of the definition rule: each failed before
// its fix.

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

func reviewV(t *testing.T, n int, extra ...string) []*config.Job {
	return jobs(t, "jobs:\n"+job("orders", n, extra...))
}

func waitRegistered(t *testing.T, n *testNode) {
	t.Helper()
	waitFor(t, 10*time.Second, n.ID()+" registered", func() bool {
		v, ok := n.View("orders")
		return ok && v.Generation > 0 && n.Up()
	})
	time.Sleep(500 * time.Millisecond) // let any publication land
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
	waitFor(t, 5*time.Second, "a's conflict", func() bool { v, _ := a.View("orders"); return v.Conflict })
	a.proxy.Blackhole() // and a reconnect, which registers again, changes nothing
	waitFor(t, 3*testTTL, "a to fence", func() bool { return !a.Up() })
	a.proxy.Restore()
	waitFor(t, 10*time.Second, "a back", a.Up)
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
	time.Sleep(2 * time.Second)
	if rc, _ := registered(t, cli, "orders"); rc.Hash != reviewV(t, 3)[0].Hash() {
		t.Errorf("overwrite: true added by a reload did not publish; registered by %s", rc.Writer)
	}
}

// remove must not succeed while a leaving instance still leads the job:
// its reconcile would see the config missing and write it back. remove
// refuses while an election key exists; a leaving instance does not
// campaign again, so once it resigned remove works, and stays done.
func TestRemoveWaitsForALeavingLeader(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli := srv.Client()
	a := startNode(t, srv, "a", reviewV(t, 3))
	runsTotal(t, cli, 3, a)
	waitFor(t, 5*time.Second, "a leads", func() bool { v, _ := a.View("orders"); return v.Leading })
	if err := a.Leave(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Withdrawn but still leading (a shutdown in progress): refused.
	if _, err := admin.New(cli, keyspace.NewKeys("")).Remove(context.Background(), "orders"); !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), "leads or campaigns") {
		t.Fatalf("remove while a leads: %v", err)
	}
	a.stop(t) // the shutdown ends: a resigns and revokes
	n, err := admin.New(cli, keyspace.NewKeys("")).Remove(context.Background(), "orders")
	if err != nil {
		t.Fatalf("remove: %v", err)
	}
	t.Logf("remove deleted %d keys", n)
	time.Sleep(time.Second)
	resp, err := cli.Get(context.Background(), keyspace.NewKeys("").Config("orders"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) > 0 {
		t.Errorf("remove said it deleted the job, but the leaving leader wrote its config back")
	}
}

// A session lost while etcd stays unreachable: the instance goes on
// retrying (and says so) although a waiting campaign's cleanup, which
// concurrency.Election does without a deadline, blocks until etcd is back.
func TestReconnectDoesNotWaitForAStuckCampaign(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	a := startNode(t, srv, "a", reviewV(t, 2))
	b := startNode(t, srv, "b", reviewV(t, 2))
	runsTotal(t, cli, 2, a, b)
	waiting := a // the candidate that does not lead waits in Campaign
	if v, _ := a.View("orders"); v.Leading {
		waiting = b
	}
	waiting.proxy.Blackhole()
	defer waiting.proxy.Restore()
	waitFor(t, 3*testTTL, "the fence", func() bool { return !waiting.Up() })
	waitFor(t, 3*testTTL, "a reconnect attempt while etcd is still unreachable", func() bool {
		return strings.Contains(waiting.log.String(), "session ended; reconnecting")
	})
}
