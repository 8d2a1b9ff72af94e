package coord

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/faultproxy"
)

// Tests of the recovery from an etcd that went back in time (rewind.go,
// history.go) under interleavings of several instances: what an instance
// saw through its watch but not in an answer, reports that cannot reach an
// instance, and a second rewind report of the same restore.

// rewindNode is one instance running the jobs of yaml with session TTL ttl,
// on a client whose History the node is given (as shardd run wires them).
// stop ends it (leaving the cluster as at a shutdown) and is idempotent.
type rewindNode struct {
	*Node
	log   *logBuffer
	cli   *clientv3.Client
	proxy *faultproxy.Proxy // between the node and etcd
	stop  func()
}

func startRewindNode(t *testing.T, srv *etcdtest.Server, id string, ttl time.Duration, yaml string) *rewindNode {
	t.Helper()
	p, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	hist := NewHistory()
	cli, err := NewClient(ClientOptions{Endpoints: []string{"http://" + p.Addr()}, History: hist, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lb := &logBuffer{}
	n, err := New(Options{Client: cli, ID: id, TTL: ttl, History: hist,
		Logger: slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug}))}, jobs(t, yaml))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	stopped := false
	rn := &rewindNode{Node: n, log: lb, cli: cli, proxy: p}
	rn.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		<-done
	}
	t.Cleanup(func() {
		p.Restore()
		rn.stop()
		cli.Close()
		p.Close()
		if t.Failed() {
			t.Logf("log of %s:\n%s", id, lb.String())
		}
	})
	waitFor(t, 20*time.Second, id+"'s membership", func() bool { s, m := n.sessionFor("orders"); return s != nil && m != 0 })
	return rn
}

// claimItem claims fire of item on n (on the item as etcd has it, and n's
// view of the map), retrying until the claim is won.
func claimItem(t *testing.T, n *Node, item int, fire time.Time, source string, attempt int) *Grant {
	t.Helper()
	ctx := context.Background()
	var g *Grant
	var last error
	waitFor(t, 20*time.Second, fmt.Sprintf("%s's claim of item %d at %s", n.ID(), item, fire.Format(time.TimeOnly)), func() bool {
		v, ok := n.View("orders")
		if !ok || v.Map == nil {
			return false
		}
		prev, err := n.ReadItem(ctx, "orders", item)
		if err != nil {
			last = err
			return false
		}
		g, last = n.Claim(ctx, Claim{Job: "orders", Item: item, Fire: fire, Attempt: attempt, Source: source, Prev: prev, Sched: fire, MapRev: v.MapRev})
		return last == nil
	})
	_ = last
	return g
}

// fillRevisions raises etcd's revision by count with writes no shardd
// instance makes: another application's keys when key is outside the
// prefix, other jobs' keys when it is under jobs/.
func fillRevisions(t *testing.T, cli *clientv3.Client, key string, count int) {
	t.Helper()
	ctx := context.Background()
	for i := range count {
		if _, err := cli.Put(ctx, key, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
}

// knownModRevision is the ModRevision of the record of item n knows.
func knownModRevision(n *Node, item int) int64 {
	kv := n.knownRecords("orders")[item]
	if kv == nil {
		return 0
	}
	return kv.ModRevision
}

// waitRewindSeen pokes n with linearizable reads until it has seen the rewind.
func waitRewindSeen(t *testing.T, n *rewindNode) {
	t.Helper()
	waitFor(t, 20*time.Second, n.ID()+" to see the rewind", func() bool {
		n.ReadItem(context.Background(), "orders", 0)
		return n.Rewound() != nil || strings.Contains(n.log.String(), "etcd went back in time")
	})
}

func countRecoveries(lb *logBuffer) int {
	return strings.Count(lb.String(), "recovered from etcd going back")
}

// G4 after a recovery: a fence an instance saw only through its watch.
//
// Scenario: instances a and b run orders. After a backup of etcd, a claims
// and completes item 0 (the highest revision a saw in an answer is then h).
// etcd's revision then grows by 1,500 through writes a does not make
// itself (another application sharing the cluster, or jobs a does not run),
// and b claims and completes item 1 at fence F > h+1000, which downstream
// systems see; a's watch delivers b's record. b's host goes down (cut off
// here; its lease outlives the restore, so a writes nothing before it). etcd is restored from the backup; a sees it
// and recovers, raising etcd's revision past h+1000 only, and writes b's
// record of item 1 back (fence F). a's next claim of item 1 then gets a
// fence below F: the fence of item 1 falls, though a knew F
// (docs/operations.md: "every fence it hands out from now on is above every
// fence anyone saw before").
func TestFencesAfterRecoveryRiseAboveFencesSeenOnlyThroughTheWatch(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	yaml := "jobs:\n" + job("orders", 2)
	a := startRewindNode(t, srv, "a", testTTL, yaml)
	b := startRewindNode(t, srv, "b", 10*time.Second, yaml)
	cli := srv.Client()
	ctx := context.Background()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

	g := claimItem(t, a.Node, 0, base, SourceNormal, 1)
	if err := a.Complete(ctx, g, Outcome{State: StateDone, Start: base, End: base}); err != nil {
		t.Fatal(err)
	}
	backup := srv.Backup()
	g = claimItem(t, a.Node, 0, base.Add(time.Minute), SourceNormal, 1)
	if err := a.Complete(ctx, g, Outcome{State: StateDone, Start: base, End: base}); err != nil {
		t.Fatal(err)
	}
	h := a.hist.Highest()

	fillRevisions(t, cli, "/another-app/key", 1500)
	gb := claimItem(t, b.Node, 1, base.Add(time.Minute), SourceNormal, 1)
	if err := b.Complete(ctx, gb, Outcome{State: StateDone, Start: base, End: base}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a to know b's record of item 1", func() bool { return knownModRevision(a.Node, 1) > gb.Fence })
	t.Logf("a's highest revision seen %d; b's fence of item 1 %d", h, gb.Fence)
	b.proxy.Blackhole()
	t.Logf("a's highest revision seen before the restore %d", a.hist.Highest())

	srv.Restore(backup)
	waitRewindSeen(t, a)
	waitFor(t, 60*time.Second, "a's recovery", func() bool { return a.Rewound() == nil && a.Up() })

	rec, _ := readRecord(t, cli, a.keys.Item("orders", 1))
	if rec.Fence != gb.Fence {
		t.Logf("item 1's record after recovery has fence %d (b's was %d)", rec.Fence, gb.Fence)
	}
	ga := claimItem(t, a.Node, 1, base.Add(2*time.Minute), SourceNormal, 1)
	t.Logf("a's claim of item 1 after the recovery: fence %d", ga.Fence)
	if ga.Fence <= gb.Fence {
		t.Errorf("fence of item 1 fell: a's claim after the recovery has fence %d, b's before the restore had %d (a saw it; a raised etcd only past %d+%d)",
			ga.Fence, gb.Fence, h, rewindMargin)
	}
}
