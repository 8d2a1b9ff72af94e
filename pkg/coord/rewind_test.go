package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/faultproxy"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// historyNode runs instance id with one job, orders, of 2 items, on a client
// whose History the node is given, as shardd run wires them.
func historyNode(t *testing.T, srv *etcdtest.Server, id string) (*Node, *logBuffer) {
	t.Helper()
	hist := NewRevisions()
	cli, err := NewClient(ClientOptions{Endpoints: []string{srv.Endpoint()}, Revisions: hist, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lb := &logBuffer{}
	n, err := New(Options{Client: cli, ID: id, TTL: testTTL, Revisions: hist,
		Logger: slog.New(slog.NewTextHandler(lb, &slog.HandlerOptions{Level: slog.LevelDebug}))}, jobs(t, "jobs:\n"+job("orders", 2)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		cli.Close()
		if t.Failed() {
			t.Logf("log of %s:\n%s", id, lb.String())
		}
	})
	etcdtest.Eventually(t, 10*time.Second, id+"'s membership", func() bool { s, m := n.sessionFor("orders"); return s != nil && m != 0 })
	return n, lb
}

// runFire claims item 0's fire on n and completes it DONE; it returns the
// fence.
func runFire(t *testing.T, n *Node, fire time.Time) int64 {
	t.Helper()
	g := claimItem(t, n, 0, fire, keyspace.SourceNormal, 1)
	if err := n.Complete(context.Background(), g, Outcome{State: keyspace.StateDone, Start: fire, End: fire}); err != nil {
		t.Fatal(err)
	}
	return g.Fence
}

func readRecord(t *testing.T, cli *clientv3.Client, key string) (keyspace.ItemRecord, int64) {
	t.Helper()
	resp, err := cli.Get(context.Background(), key)
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("read %s: %v (%d keys)", key, err, len(resp.Kvs))
	}
	var rec keyspace.ItemRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		t.Fatal(err)
	}
	return rec, resp.Header.Revision
}

// etcd restored from a backup, or wiped, comes back at a lower revision
// with the state of the past. The node sees it in the first answer, refuses
// it, fences, and recovers by itself: etcd's revision is raised past every
// one it saw (new fences rise above old ones), and the records of fires
// that ran after the backup are written back (no fire that ran runs again).
func TestEtcdGoneBackIsRecoveredFrom(t *testing.T) {
	for _, tc := range []struct {
		name string
		back func(srv *etcdtest.Server, backup string)
	}{
		{"restored", func(srv *etcdtest.Server, backup string) { srv.Restore(backup) }},
		{"wiped", func(srv *etcdtest.Server, _ string) { srv.Wipe() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := etcdtest.Start(t)
			n, lb := historyNode(t, srv, "a")
			cli := srv.Client()
			base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
			runFire(t, n, base)
			backup := srv.Backup()
			runFire(t, n, base.Add(time.Minute))
			last := runFire(t, n, base.Add(2*time.Minute))
			before, _ := readRecord(t, cli, n.keys.Item("orders", 0))

			tc.back(srv, backup)
			etcdtest.Eventually(t, 20*time.Second, "the rewind to be seen", func() bool { return n.Rewound() != nil || strings.Contains(lb.String(), "etcd went back in time") })
			etcdtest.Eventually(t, 30*time.Second, "recovery", func() bool { return n.Rewound() == nil && n.Up() })

			rec, rev := readRecord(t, cli, n.keys.Item("orders", 0))
			if rec.Seq != before.Seq || rec.Fence != last || rec.State != keyspace.StateDone || !rec.Fire.Equal(before.Fire) {
				t.Errorf("item 0's record after recovery: seq %d fence %d %s fire %s; want the last one before: seq %d fence %d DONE fire %s",
					rec.Seq, rec.Fence, rec.State, rec.Fire, before.Seq, last, before.Fire)
			}
			if rev <= last {
				t.Errorf("etcd's revision after recovery is %d, not above the last fence %d", rev, last)
			}
			if f := runFire(t, n, base.Add(3*time.Minute)); f <= last {
				t.Errorf("a new claim's fence %d is not above the last before the rewind, %d", f, last)
			}
			resp, err := cli.Get(context.Background(), n.keys.Rewind("a"))
			if err != nil || len(resp.Kvs) == 0 {
				t.Fatalf("no rewind record: %v", err)
			}
			var rr keyspace.RewindRecord
			json.Unmarshal(resp.Kvs[0].Value, &rr)
			if rr.Recovered.IsZero() || rr.Seen < last || rr.Repaired < 1 {
				t.Errorf("rewind record %+v: want recovered, seen >= %d, at least one record repaired", rr, last)
			}
		})
	}
}

// While rewound, no answer reaches the code that asked.
func TestRewoundHistoryRefusesAnswers(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	hist := NewRevisions()
	cli, err := NewClient(ClientOptions{Endpoints: []string{srv.Endpoint()}, Revisions: hist})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	for range 5 {
		if _, err := cli.Put(ctx, "k", "v"); err != nil {
			t.Fatal(err)
		}
	}
	backup := srv.Backup()
	for range 5 {
		if _, err := cli.Put(ctx, "k", "v"); err != nil {
			t.Fatal(err)
		}
	}
	srv.Restore(backup)
	var first error
	etcdtest.Eventually(t, 10*time.Second, "an answer", func() bool { _, first = cli.Get(ctx, "k"); return !isUnavailable(first) })
	var rw *RewindError
	if !errors.As(first, &rw) || rw.Got >= rw.Seen {
		t.Fatalf("first answer after the restore: %v; want a RewindError with a lower revision", first)
	}
	if _, err := cli.Put(ctx, "k", "v"); !errors.Is(err, ErrRewound) {
		t.Errorf("a write while rewound: %v, want ErrRewound", err)
	}
	if _, err := cli.Get(recovering(ctx), "k"); err != nil {
		t.Errorf("a recovery's read: %v", err)
	}
}

func isUnavailable(err error) bool {
	return err != nil && !errors.Is(err, ErrRewound)
}

// etcd's NOSPACE alarm (raised as etcd raises it when its database reaches
// its quota) makes every write fail: the node says so until a write goes
// through again, and status lists the alarm. A defragmentation and a
// compaction, the operator's remedies, are not taken for a rewind.
func TestNoSpaceAlarmIsSaid(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	n, _ := historyNode(t, srv, "a")
	cli := srv.Client()
	ctx := context.Background()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	runFire(t, n, base)
	disarm := etcdtest.RaiseNoSpace(t, cli)
	prev, err := n.ReadItem(ctx, "orders", 0)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := n.View("orders")
	if _, err := n.Claim(ctx, Claim{Job: "orders", Item: 0, Fire: base.Add(time.Minute), Attempt: 1, Source: keyspace.SourceNormal, Prev: prev, MapRev: v.MapRev}); err == nil {
		t.Fatal("a claim went through under the NOSPACE alarm")
	}
	var ns *NoSpaceError
	if !errors.As(n.Impaired(), &ns) {
		t.Fatalf("impaired under the NOSPACE alarm: %v, want a NoSpaceError", n.Impaired())
	}
	st, err := admin.New(cli, n.keys).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.EtcdProblems()) != 1 || !strings.Contains(st.EtcdProblems()[0], "NOSPACE") {
		t.Errorf("status under the NOSPACE alarm says %q, want the alarm", st.EtcdProblems())
	}

	disarm()
	if _, err := cli.Compact(ctx, st.Revision); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Defragment(ctx, srv.Endpoint()); err != nil {
		t.Fatal(err)
	}
	runFire(t, n, base.Add(2*time.Minute))
	if err := n.Impaired(); err != nil {
		t.Errorf("impaired after the alarm was disarmed, the store compacted and defragmented: %v", err)
	}
}

// A run that ends while etcd is away and comes back restored from a backup
// taken before the run's claim: its outcome is written by the recovery (the
// claim's record, which Complete's guard names, is gone with the history),
// not dropped as if another instance had taken the item over, which would
// fail the run over and run its fire again.
func TestOutcomeOfARunEndedAcrossARestoreIsWritten(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	n, _ := historyNode(t, srv, "a")
	cli := srv.Client()
	ctx := context.Background()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	runFire(t, n, base)
	backup := srv.Backup()

	g := claimItem(t, n, 0, base.Add(time.Minute), keyspace.SourceNormal, 1)
	claimed, _ := readRecord(t, cli, n.keys.Item("orders", 0))
	srv.Stop()
	done := make(chan error, 1)
	go func() { done <- n.Complete(ctx, g, Outcome{State: keyspace.StateDone, Start: base, End: base}) }()
	srv.Restore(backup)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Complete of the run that ended across the restore: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Complete did not return within a minute of the restore")
	}
	rec, _ := readRecord(t, cli, n.keys.Item("orders", 0))
	if rec.State != keyspace.StateDone || rec.Fence != g.Fence || rec.Seq != claimed.Seq {
		t.Errorf("item 0's record after the restore: %s fence %d seq %d; want the run's outcome, DONE fence %d seq %d", rec.State, rec.Fence, rec.Seq, g.Fence, claimed.Seq)
	}
}

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
	hist := NewRevisions()
	cli, err := NewClient(ClientOptions{Endpoints: []string{"http://" + p.Addr()}, Revisions: hist, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lb := &logBuffer{}
	n, err := New(Options{Client: cli, ID: id, TTL: ttl, Revisions: hist,
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
	etcdtest.Eventually(t, 20*time.Second, id+"'s membership", func() bool { s, m := n.sessionFor("orders"); return s != nil && m != 0 })
	return rn
}

// claimItem claims fire of item on n (on the item as etcd has it, and n's
// view of the map), retrying until the claim is won.
func claimItem(t *testing.T, n *Node, item int, fire time.Time, source string, attempt int) *Grant {
	t.Helper()
	ctx := context.Background()
	var g *Grant
	var last error
	etcdtest.Eventually(t, 20*time.Second, fmt.Sprintf("%s's claim of item %d at %s", n.ID(), item, fire.Format(time.TimeOnly)), func() bool {
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
	etcdtest.Eventually(t, 20*time.Second, n.ID()+" to see the rewind", func() bool {
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
	// Sessions that outlive the restarts of etcd: a writes nothing of its own.
	a := startRewindNode(t, srv, "a", 30*time.Second, yaml)
	b := startRewindNode(t, srv, "b", 30*time.Second, yaml)
	cli := srv.Client()
	ctx := context.Background()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

	ranDone(t, a.Node, 0, base, base)
	backup := srv.Backup()
	ranDone(t, a.Node, 0, base.Add(time.Minute), base)
	h := a.revs.Highest()

	fillRevisions(t, cli, "/another-app/key", 1500)
	gb := claimItem(t, b.Node, 1, base.Add(time.Minute), keyspace.SourceNormal, 1)
	if err := b.Complete(ctx, gb, Outcome{State: keyspace.StateDone, Start: base, End: base}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "a to know b's record of item 1", func() bool { return knownModRevision(a.Node, 1) > gb.Fence })
	t.Logf("a's highest revision seen %d; b's fence of item 1 %d", h, gb.Fence)
	b.proxy.Blackhole()
	// a's highest revision counts what its watch delivered (b's record):
	// the recovery raises etcd past b's fence.
	h = a.revs.Highest()

	srv.Restore(backup)
	waitRewindSeen(t, a)
	etcdtest.Eventually(t, 60*time.Second, "a's recovery", func() bool { return a.Rewound() == nil && a.Up() })

	rec, _ := readRecord(t, cli, a.keys.Item("orders", 1))
	if rec.Fence != gb.Fence {
		t.Logf("item 1's record after recovery has fence %d (b's was %d)", rec.Fence, gb.Fence)
	}
	ga := claimItem(t, a.Node, 1, base.Add(2*time.Minute), keyspace.SourceNormal, 1)
	t.Logf("a's claim of item 1 after the recovery: fence %d", ga.Fence)
	if ga.Fence <= gb.Fence {
		t.Errorf("fence of item 1 fell: a's claim after the recovery has fence %d, b's before the restore had %d (a saw it; a raised etcd only past %d+%d)",
			ga.Fence, gb.Fence, h, rewindMargin)
	}
}

// After a rewind: an instance whose watch waits at a future revision never
// learns of it.
//
// Scenario: instances a and b run orders; their sessions began before the
// backup, so their leases come back with the restore and they keep them. After a
// backup of etcd, b claims item 1 and runs it (a long run: b sends etcd
// nothing meanwhile); a claims and completes item 0 (the highest revision a
// saw in an answer is h). 1,500 writes to other jobs' keys follow (jobs a
// and b do not run; or, on an etcd shared with other applications, a
// progress notification): b's watch delivers them, and is at h+1500. etcd
// is restored from the backup. a sees it, reports it (rewinds/a, at about
// the backup's revision and again past h+1000) and recovers, writing b's
// record of item 1 back (RUNNING by b, with no running marker: the backup
// had none). b's watch resumes after h+1500, and etcd delivers it nothing
// below that: neither of a's reports. b's next answers are above the
// highest b saw, and its read of item 1 shows a later revision than b knew
// (a's write-back). So b never learns that etcd went back (docs/
// operations.md: another instance's report makes it fence itself): its run
// goes on unfenced, and when it ends its outcome is refused (the record's
// revision is a's write-back, not b's claim), leaving item 1 RUNNING with
// no marker: a run cut by a failure, which failover runs again though it
// completed (G2). Had the restored map given item 1 to a, a's failover
// would overlap b's run (G1).
func TestInstanceWithWatchAheadLearnsOfAnotherInstancesRewind(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	yaml := "jobs:\n" + job("orders", 2)
	// Sessions that outlive the restarts of etcd: no membership changes.
	a := startRewindNode(t, srv, "a", 30*time.Second, yaml)
	b := startRewindNode(t, srv, "b", 30*time.Second, yaml)
	cli := srv.Client()
	ctx := context.Background()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

	ranDone(t, a.Node, 0, base, base)
	backup := srv.Backup()
	gb := claimItem(t, b.Node, 1, base.Add(time.Minute), keyspace.SourceNormal, 1) // b's run: not completed
	ranDone(t, a.Node, 0, base.Add(time.Minute), base)
	etcdtest.Eventually(t, 10*time.Second, "a to know b's claim of item 1", func() bool { return knownModRevision(a.Node, 1) >= gb.Fence })
	end := a.revs.Highest() + 1500
	fillRevisions(t, cli, keyspace.NewKeys("").Jobs()+"reports/k", 1500)
	etcdtest.Eventually(t, 10*time.Second, "b's watch to deliver the other jobs' writes", func() bool { return b.hub.deliveredRev() >= end })
	t.Logf("a's highest revision seen %d, b's %d; b's watch at %d", a.revs.Highest(), b.revs.Highest(), b.hub.deliveredRev())

	srv.Restore(backup)
	waitRewindSeen(t, a)
	etcdtest.Eventually(t, 60*time.Second, "a's recovery", func() bool { return a.Rewound() == nil && a.Up() })
	b.ReadItem(ctx, "orders", 1) // b reads etcd: not even that shows it
	select {
	case <-gb.Ctx.Done():
		return // b fenced itself: it learned of the rewind
	case <-time.After(15 * time.Second):
	}
	t.Errorf("b's run of item 1 (fence %d) is still unfenced 15 s after a recovered from the restore; b rewound: %v, b's watch at %d",
		gb.Fence, b.Rewound(), b.hub.deliveredRev())
	if err := b.Complete(ctx, gb, Outcome{State: keyspace.StateDone, Start: base, End: base}); err != nil {
		rec, _ := readRecord(t, cli, b.keys.Item("orders", 1))
		t.Errorf("b's run ended DONE, and its outcome was refused (%v): item 1's record is %s by %s (attempt %d), which failover runs again", err, rec.State, rec.Instance, rec.Attempt)
	}
}

// G2 across a rewind: the outcome of a run that ended after the restore.
//
// Scenario: one instance, a. After a backup of etcd, a claims item 0's
// fire t1 (a knows the claim's record through its watch) and runs it.
// etcd is restored from the backup, which has the record of t0. The run
// ends DONE; its outcome's write is the first answer a gets after the
// restore: refused (etcd went back), and retried by Complete. a recovers:
// it writes back the claim's record it knew (t1 RUNNING by a), at a new
// revision. Complete's retry is guarded by the claim's revision (its
// fence), which that record no longer has: refused for good (claim lost).
// Item 0's record stays RUNNING with no running marker: a run cut by a
// failure, which failover runs again, though it ran to the end and its
// outcome was in hand (G2 allows a re-run only of an attempt whose instance
// died mid-run).
func TestOutcomeOfRunEndedAcrossRewindIsRecorded(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	a := startRewindNode(t, srv, "a", testTTL, "jobs:\n"+job("orders", 2))
	cli := srv.Client()
	ctx := context.Background()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

	g := ranDone(t, a.Node, 0, base, base)
	backup := srv.Backup()
	t1 := base.Add(time.Minute)
	g = claimItem(t, a.Node, 0, t1, keyspace.SourceNormal, 1)
	etcdtest.Eventually(t, 10*time.Second, "a to know its claim's record", func() bool { return knownModRevision(a.Node, 0) >= g.Fence })

	srv.Restore(backup)
	cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	err := a.Complete(cctx, g, Outcome{State: keyspace.StateDone, Start: t1, End: t1.Add(time.Second)})
	etcdtest.Eventually(t, 60*time.Second, "a's recovery", func() bool { return a.Rewound() == nil && a.Up() })
	rec, _ := readRecord(t, cli, a.keys.Item("orders", 0))
	if err != nil || rec.State != keyspace.StateDone || !rec.Fire.Equal(t1) {
		t.Errorf("the run of t1 ended DONE after the restore; Complete: %v; item 0's record after the recovery: %s fire %s attempt %d (want DONE, fire %s): failover runs it again",
			err, rec.State, rec.Fire.Format(time.TimeOnly), rec.Attempt, t1.Format(time.TimeOnly))
	}
}

// NOSPACE: what the instance says follows etcd's alarm.
//
// Scenario: one instance, a. An operator disabled item 1. etcd raises its
// NOSPACE alarm; a's claim is refused for it, and a says so (Impaired,
// /readyz 503, shardd_etcd_nospace). (1) The operator enables item 1 (the
// API on a's client): a delete, which etcd's quota lets through under the
// alarm (it costs no space), and a takes it for "writes go through again":
// a says it is no longer impaired while every claim is still refused. (2)
// The operator disarms the alarm; a writes nothing (its jobs are not due):
// it keeps saying NOSPACE, /readyz 503, until its next write, which for an
// hourly or daily job is an hour or a day away.
func TestNoSpaceImpairmentFollowsTheAlarm(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t) // of its own: the alarm stops every write to the server
	a := startRewindNode(t, srv, "a", testTTL, "jobs:\n"+job("orders", 2))
	cli := srv.Client()
	ctx := context.Background()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	ranDone(t, a.Node, 0, base, base)
	if _, err := adminOf(a).SetDisabled(ctx, admin.Target{Job: "orders", Item: 1}, true, false); err != nil {
		t.Fatal(err)
	}
	members, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := members.Members[0].ID
	if _, err := etcdserverpb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, &etcdserverpb.AlarmRequest{
		Action: etcdserverpb.AlarmRequest_ACTIVATE, MemberID: id, Alarm: etcdserverpb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	claim := func() error {
		prev, err := a.ReadItem(ctx, "orders", 0)
		if err != nil {
			return err
		}
		v, _ := a.View("orders")
		_, err = a.Claim(ctx, Claim{Job: "orders", Item: 0, Fire: base.Add(time.Minute), Attempt: 1, Source: keyspace.SourceNormal, Prev: prev, MapRev: v.MapRev})
		return err
	}
	if err := claim(); err == nil {
		t.Fatal("a claim went through under the NOSPACE alarm")
	}
	if a.NoSpace() == nil {
		t.Fatal("not impaired after a claim refused for NOSPACE")
	}

	if _, err := adminOf(a).SetDisabled(ctx, admin.Target{Job: "orders", Item: 1}, false, false); err != nil {
		t.Logf("enable under the alarm: %v", err)
	}
	if a.NoSpace() == nil {
		err := claim() // refused again, and impaired again for the part below
		t.Errorf("a says it is not impaired after an enable (a delete) went through under the NOSPACE alarm; yet its next claim is refused (%v; impaired again: %v)", err, a.NoSpace() != nil)
	}

	if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: id, Alarm: etcdserverpb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for a.NoSpace() != nil && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if ns := a.NoSpace(); ns != nil {
		t.Errorf("15 s after the NOSPACE alarm was disarmed a still says %q (it wrote nothing since)", ns)
	}
}

// The write-back after a rewind never puts back an older fire.
//
// Scenario: instance a runs orders; after a backup of etcd it runs item
// 0's fires t1 and t2 (a knows the record of t2, Seq 2). a is cut off from
// etcd (a partition), and etcd is restored from the backup (item 0's record
// is t0's, Seq 0). Meanwhile instance c starts (a new or restarted host; it
// knows nothing of the history that went) and runs item 0's latest due
// fire, t5: its record is Seq 1, the record after the restored one. a's
// partition heals; a sees the rewind and writes back what it knew ahead of
// etcd's, comparing Seq first: its t2 (Seq 2) is "ahead" of c's t5 (Seq
// 1), and goes back over it. Item 0's watermark goes back from t5 to t2:
// t5, which ran after the restore, is due again and runs a second time
// (G2), and so does every fire between.
func TestRewindWriteBackNeverPutsBackAnOlderFire(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	yaml := "jobs:\n" + job("orders", 2)
	a := startRewindNode(t, srv, "a", testTTL, yaml)
	cli := srv.Client()
	ctx := context.Background()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	run := func(n *Node, fire time.Time) {
		g := claimItem(t, n, 0, fire, keyspace.SourceNormal, 1)
		if err := n.Complete(ctx, g, Outcome{State: keyspace.StateDone, Start: fire, End: fire}); err != nil {
			t.Fatal(err)
		}
	}
	run(a.Node, base)
	backup := srv.Backup()
	run(a.Node, base.Add(time.Minute))
	run(a.Node, base.Add(2*time.Minute))
	etcdtest.Eventually(t, 10*time.Second, "a to know its record of t2", func() bool {
		kv := a.knownRecords("orders")[0]
		return kv != nil && strings.Contains(string(kv.Value), `"seq":2`)
	})
	// Other applications' writes, and a read of a's: a saw etcd 200 past
	// the backup, more than c writes below.
	fillRevisions(t, cli, "/another-app/key", 200)
	if _, err := a.ReadItem(ctx, "orders", 0); err != nil {
		t.Fatal(err)
	}

	a.proxy.Blackhole()
	srv.Restore(backup)
	c := startRewindNode(t, srv, "c", testTTL, yaml)
	t5 := base.Add(5 * time.Minute)
	run(c.Node, t5)
	before, rev := readRecord(t, cli, a.keys.Item("orders", 0))
	t.Logf("item 0's record after c's run: seq %d fire %s; etcd at %d, a saw %d", before.Seq, before.Fire.Format(time.TimeOnly), rev, a.revs.Highest())

	a.proxy.Restore()
	waitRewindSeen(t, a)
	etcdtest.Eventually(t, 60*time.Second, "a's recovery", func() bool { return a.Rewound() == nil && a.Up() })
	rec, _ := readRecord(t, cli, a.keys.Item("orders", 0))
	if rec.Watermark().Before(t5) {
		t.Errorf("item 0's record after a's recovery is seq %d fire %s %s by %s: its watermark went back from %s (c's run after the restore), which runs again",
			rec.Seq, rec.Fire.Format(time.TimeOnly), rec.State, rec.Instance, t5.Format(time.TimeOnly))
	}
}

// A restore with --bump-revision --mark-compacted, the procedure
// docs/operations.md recommends, after the shard map changed.
//
// Scenario: instance a runs orders (an hourly or daily job: no fire between
// the snapshot and the restore). A snapshot of etcd is saved; then b joins
// and leaves (a deploy: the map's epoch rises by two; no item record
// changes). etcd is restored from the snapshot with etcdutl --bump-revision
// --mark-compacted: its map is the snapshot's, at a lower epoch. No answer
// is below what a saw, no key a knows went back: a sees no rewind. Its
// watch is told its revision was compacted and reads the map again, but a
// view takes only a map of a higher epoch, so a keeps the map that went,
// and its ModRevision, which every claim is guarded by: each is refused.
// The leader (a) finds the stored map right for the instances there are,
// and writes none. No fire of the job runs again (G3).
func TestClaimsGoOnAfterRestoreWithBumpedRevision(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	yaml := "jobs:\n" + job("orders", 2)
	a := startRewindNode(t, srv, "a", testTTL, yaml)
	cli := srv.Client()
	ctx := context.Background()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	ranDone(t, a.Node, 0, base, base)
	snap := srv.Snapshot()
	before := etcdtest.StoredMap(cli, "orders")

	b := startRewindNode(t, srv, "b", testTTL, yaml)
	etcdtest.Eventually(t, 10*time.Second, "b to own an item", func() bool { v, _ := b.View("orders"); return len(v.Map.ItemsOf("b")) > 0 })
	b.stop()
	etcdtest.Eventually(t, 10*time.Second, "a to own both items again", func() bool {
		v, _ := a.View("orders")
		return v.Map != nil && len(v.Map.ItemsOf("a")) == 2 && v.Map.Epoch > before.Epoch
	})
	v, _ := a.View("orders")
	t.Logf("map epoch %d at the snapshot, %d before the restore", before.Epoch, v.Map.Epoch)

	srv.RestoreSnapshot(snap, 1_000_000_000, true)
	var last error
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		v, ok := a.View("orders")
		prev, err := a.ReadItem(ctx, "orders", 0)
		if err == nil && ok && v.Map != nil {
			if _, last = a.Claim(ctx, Claim{Job: "orders", Item: 0, Fire: base.Add(time.Hour), Attempt: 1, Source: keyspace.SourceNormal,
				Prev: prev, Sched: base.Add(time.Hour), MapRev: v.MapRev}); last == nil {
				return
			}
		} else {
			last = err
		}
		time.Sleep(200 * time.Millisecond)
	}
	v, _ = a.View("orders")
	now := etcdtest.StoredMap(cli, "orders")
	t.Errorf("no claim of item 0 won in 30 s after the restore (last: %v); a's view: map epoch %d; etcd's map: epoch %d; a rewound: %v",
		last, v.Map.Epoch, now.Epoch, a.Rewound())
}

// A rewind seen by an instance that sent etcd nothing since the backup.
//
// Scenario: instances a and b run orders, with sessions that outlive the
// restarts of etcd; b leads the job and runs item 1, a owns no item that
// is due (it sends etcd nothing but keepalives). A backup of etcd is taken
// (at the highest revision a saw in an answer). b runs item 1's fire t1;
// a's watch delivers the record. b's host dies, and etcd is restored from
// the backup (item 1's record is t0's again). a's answers are all at or
// above the highest it saw, and no read of a's shows a key below a
// revision it knew at a read revision above it: a sees no rewind. Its
// watch resumes after the revision it had reached, in the history that
// went: etcd delivers it nothing below that, so the deletions of b's
// member and election keys when b's lease expires, at lower revisions,
// never reach it. a never leads (its campaign waits for a deletion it is
// never told of), no map is written, and item 1, still b's, never runs
// again (G3). Had a taken item 1 over, etcd's record says t1 is due: a
// would run it a second time (G2), with a fence below b's (G4); nobody
// wrote back b's record.
func TestIdleInstanceAfterRestoreTakesOverOrSeesTheRewind(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	yaml := "jobs:\n" + job("orders", 2)
	a := startRewindNode(t, srv, "a", 30*time.Second, yaml)
	b := startRewindNode(t, srv, "b", 15*time.Second, yaml)
	ctx := context.Background()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	t1 := base.Add(time.Minute)
	ranDone(t, b.Node, 1, base, base)
	if _, err := a.ReadItems(ctx, "orders"); err != nil { // as a's engine does at each sweep
		t.Fatal(err)
	}
	backup := srv.Backup()
	gb := claimItem(t, b.Node, 1, t1, keyspace.SourceNormal, 1)
	if err := b.Complete(ctx, gb, Outcome{State: keyspace.StateDone, Start: t1, End: t1}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "a to know b's record of t1", func() bool { return knownModRevision(a.Node, 1) > gb.Fence })
	t.Logf("a's highest revision seen %d; b's fence of t1 %d; a's watch at %d", a.revs.Highest(), gb.Fence, a.hub.deliveredRev())
	b.proxy.Blackhole()

	srv.Restore(backup)
	owns := func() bool { v, _ := a.View("orders"); return v.Map != nil && len(v.Map.ItemsOf("a")) == 2 }
	seen := func() bool { return a.Rewound() != nil || countRecoveries(a.log) > 0 }
	deadline := time.Now().Add(60 * time.Second)
	for !owns() && !seen() && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	switch {
	case seen():
		return
	case !owns():
		v, _ := a.View("orders")
		t.Errorf("60 s after the restore (and b's lease of 15 s) a neither saw the rewind nor took item 1 over: a's map epoch %d gives a %v; a leads: %v; a's watch at %d",
			v.Map.Epoch, v.Map.ItemsOf("a"), v.Leading, a.hub.deliveredRev())
		return
	}
	t.Errorf("a saw no rewind: etcd is below b's record of item 1 that a knew (revision %d)", knownModRevision(a.Node, 1))
	st, err := a.ReadItem(ctx, "orders", 1)
	if err != nil || st.Record == nil {
		t.Fatalf("read item 1: %v", err)
	}
	v, _ := a.View("orders")
	if ga, err := a.Claim(ctx, Claim{Job: "orders", Item: 1, Fire: t1, Attempt: 1, Source: keyspace.SourceNormal, Prev: st, Sched: t1, MapRev: v.MapRev}); err == nil {
		t.Errorf("etcd's record of item 1 is fire %s, so t1 is due: a, its owner now, claimed t1 again (fence %d, b's was %d)",
			st.Record.Fire.Format(time.TimeOnly), ga.Fence, gb.Fence)
	}
}

// A rewind's repair of two failures of one job.
//
// Scenario: one instance, a, runs items 0 and 1 of orders; both runs fail
// while etcd is down, and etcd comes back wiped. Their outcomes wait, as
// Complete retries them, for the recovery's repair: it writes both in one
// Txn, each with the job's last-failure key, and etcd refuses a Txn that
// writes a key twice ("duplicate key given in txn request"). The repair
// fails at every retry: a never recovers, and runs nothing again.
func TestRepairOfTwoFailuresOfOneJob(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	a := startRewindNode(t, srv, "a", testTTL, "jobs:\n"+job("orders", 2))
	cli := srv.Client()
	ctx := context.Background()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	g0 := claimItem(t, a.Node, 0, base, keyspace.SourceNormal, 1)
	g1 := claimItem(t, a.Node, 1, base, keyspace.SourceNormal, 1)

	srv.Stop()
	done := make(chan error, 2)
	for i, g := range []*Grant{g0, g1} {
		end := base.Add(time.Duration(i+1) * time.Second)
		go func() {
			done <- a.Complete(ctx, g, Outcome{State: keyspace.StateFailed, ExitCode: 1, Start: base, End: end})
		}()
	}
	srv.Wipe()
	etcdtest.Eventually(t, 30*time.Second, "a's recovery", func() bool { return countRecoveries(a.log) > 0 && a.Rewound() == nil && a.Up() })
	for range 2 {
		if err := <-done; err != nil {
			t.Errorf("Complete of a run that failed across the wipe: %v", err)
		}
	}
	for item := range 2 {
		if rec, _ := readRecord(t, cli, a.keys.Item("orders", item)); rec.State != keyspace.StateFailed || !rec.Fire.Equal(base) {
			t.Errorf("item %d's record after the recovery: %s fire %s; want the run's outcome, FAILED fire %s", item, rec.State, rec.Fire.Format(time.TimeOnly), base.Format(time.TimeOnly))
		}
	}
	if rec, _ := readRecord(t, cli, a.keys.LastFailure("orders")); rec.Item != 1 {
		t.Errorf("orders' last failure after the recovery is item %d's; want item 1's, which ended last", rec.Item)
	}
}

// One wipe, one recovery each: the report of an instance whose answers
// all came after the other's recovery.
//
// Scenario: instances a and b run orders. While a is cut off, b claims and
// completes item 1's first fire: a never knows that record. b is cut off,
// etcd is wiped, and a comes back: it sees the rewind (an answer below the
// highest revision it saw), recovers and resumes (its floor F, past every
// revision it saw). Then b comes back: its answers are above every revision
// it saw (a raised etcd's), and only its read of item 1, whose record is
// gone, shows the rewind. b reports it with the highest revision it had
// seen, which is above F: of the new history, read since a recovered. a
// takes that report, past its floor, for a new rewind: it fences itself
// and recovers a second time from one wipe, at the same moment as b (both
// raise etcd's revision to about the same target), and the instances'
// recoveries go from one to three at once.
func TestReportOfALateInstanceIsNotANewRewind(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	yaml := "jobs:\n" + job("orders", 2)
	a := startRewindNode(t, srv, "a", testTTL, yaml)
	b := startRewindNode(t, srv, "b", testTTL, yaml)
	ctx := context.Background()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	a.proxy.Blackhole()
	ranDone(t, b.Node, 1, base, base)
	b.proxy.Blackhole()
	srv.Wipe()
	a.proxy.Restore()
	waitRewindSeen(t, a)
	etcdtest.Eventually(t, 30*time.Second, "a's recovery", func() bool { return a.Rewound() == nil && a.Up() })
	floor := a.rewindFloor.Load()

	b.proxy.Restore()
	etcdtest.Eventually(t, 30*time.Second, "b to see the rewind", func() bool {
		b.ReadItem(ctx, "orders", 1)
		return b.Rewound() != nil || countRecoveries(b.log) > 0
	})
	etcdtest.Eventually(t, 30*time.Second, "b's recovery", func() bool { return countRecoveries(b.log) > 0 && b.Rewound() == nil && b.Up() })
	resp, err := srv.Client().Get(ctx, b.keys.Rewind("b"))
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("b's rewind record: %v", err)
	}
	var rec keyspace.RewindRecord
	if err := json.Unmarshal(resp.Kvs[0].Value, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Seen > floor {
		t.Errorf("b's report of the wipe says it saw revision %d go back, past a's floor %d after a recovered from it: a takes it for a new rewind (%s)", rec.Seen, floor, rec.Reason)
	}
	// a would be fenced again within a second or so of b's report.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && countRecoveries(a.log) == 1 && a.Rewound() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	if n := countRecoveries(a.log); n != 1 || a.Rewound() != nil {
		t.Errorf("a recovered %d times from one wipe (rewound now: %v)", n, a.Rewound())
	}
}

// G2 across a wipe: the outcome of a run whose claim's record is gone.
//
// Scenario: instances a and b run orders. While a is cut off, b claims
// item 1's first fire and runs it: a never knows the claim's record. b is
// cut off, etcd is wiped, and a comes back, sees the rewind and recovers
// (it knows no record of item 1 to write back). Then b comes back and its
// run ends DONE: its answers are above every revision it saw (a raised
// etcd's), and the outcome's guard (the claim's revision) fails on a record
// that is gone. Complete took that for a claim taken over: the outcome was
// dropped, and item 1, with no record, runs its fire again (G2).
func TestOutcomeOfRunWhoseClaimWasWipedIsRecorded(t *testing.T) {
	t.Parallel()
	_, b, g, cli := wipedUnderBsRun(t)
	ctx, base := context.Background(), wipeFire

	b.proxy.Restore()
	// The run ends as b's connection is back (before a's report can reach
	// b's watch).
	etcdtest.Eventually(t, 30*time.Second, "b's connection", func() bool {
		gctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := b.cli.Get(gctx, "/elsewhere")
		return err == nil
	})
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := b.Complete(cctx, g, Outcome{State: keyspace.StateDone, Start: base, End: base}); err != nil {
		t.Fatalf("Complete of b's run, which ended DONE after the wipe: %v", err)
	}
	rec, _ := readRecord(t, cli, b.keys.Item("orders", 1))
	if rec.State != keyspace.StateDone || !rec.Fire.Equal(base) || rec.Instance != "b" {
		t.Errorf("item 1's record after the wipe: %s fire %s by %s; want b's outcome, DONE fire %s", rec.State, rec.Fire.Format(time.TimeOnly), rec.Instance, base.Format(time.TimeOnly))
	}
}

// The same, with b's own recovery first: b writes back the RUNNING record
// it knew (at a revision of the repair's, keeping the claim's as its
// fence), and only then does its run end. The outcome's guard (the claim's
// revision) fails on that record: it is still b's claim, and its outcome
// is written over it, not dropped as a claim taken over (which left item 1
// RUNNING with no marker: its fire run again, G2).
func TestOutcomeAfterItsOwnRepairIsRecorded(t *testing.T) {
	t.Parallel()
	_, b, g, cli := wipedUnderBsRun(t)
	ctx, base := context.Background(), wipeFire
	b.proxy.Restore()
	etcdtest.Eventually(t, 30*time.Second, "b's recovery, its record of item 1 written back", func() bool {
		resp, err := cli.Get(ctx, b.keys.Item("orders", 1))
		if err != nil || len(resp.Kvs) == 0 || b.Rewound() != nil {
			return false
		}
		var rec keyspace.ItemRecord
		return json.Unmarshal(resp.Kvs[0].Value, &rec) == nil && rec.State == keyspace.StateRunning && rec.Instance == "b"
	})
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := b.Complete(cctx, g, Outcome{State: keyspace.StateDone, Start: base, End: base}); err != nil {
		t.Fatalf("Complete of b's run after b wrote its claim back: %v", err)
	}
	rec, _ := readRecord(t, cli, b.keys.Item("orders", 1))
	if rec.State != keyspace.StateDone || !rec.Fire.Equal(base) || rec.Instance != "b" || rec.Fence != g.Fence {
		t.Errorf("item 1's record: %s fire %s by %s fence %d; want b's outcome, DONE, fence %d", rec.State, rec.Fire.Format(time.TimeOnly), rec.Instance, rec.Fence, g.Fence)
	}
}

// A run whose job an operator removed while its instance was cut off (its
// lease expired, so `shardd remove` found no live member, marker or
// leader) ends with its record gone: the claim is lost, not a rewind. Taken
// for a rewind, the instance fenced, raised etcd's revision, wrote the
// removed job's records back, and its report made every other instance
// fence too. A record gone after an instance recovered from a wipe (the
// floor raised past the claim) is still a rewind
// (TestOutcomeOfRunWhoseClaimWasWipedIsRecorded).
func TestOutcomeOfARemovedJobsRunIsNotARewind(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	a := startRewindNode(t, srv, "a", testTTL, "jobs:\n"+job("orders", 1))
	cli := srv.Client()
	ctx := context.Background()
	base := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	g := claimItem(t, a.Node, 0, base, keyspace.SourceNormal, 1)
	// What remove deletes: every key of the job.
	if _, err := cli.Delete(ctx, a.keys.JobPrefix("orders"), clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := a.Complete(cctx, g, Outcome{State: keyspace.StateDone, Start: base, End: base}); !errors.Is(err, ErrClaimLost) {
		t.Errorf("Complete of a run whose job was removed: %v; want ErrClaimLost", err)
	}
	if rw := a.Rewound(); rw != nil {
		t.Errorf("a removed job's missing record was taken for a rewind: %v", rw)
	}
	if resp, err := cli.Get(ctx, a.keys.Item("orders", 0)); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("the removed job's record was written back: %v (%v)", resp, err)
	}
}

// ranDone claims item of orders on n for fire (a NORMAL first attempt)
// and records its run DONE, started and ended at at.
func ranDone(t *testing.T, n *Node, item int, fire, at time.Time) *Grant {
	t.Helper()
	g := claimItem(t, n, item, fire, keyspace.SourceNormal, 1)
	if err := n.Complete(context.Background(), g, Outcome{State: keyspace.StateDone, Start: at, End: at}); err != nil {
		t.Fatal(err)
	}
	return g
}

// A rewind's repair never ends another instance's run: after a wipe, a
// (recovered) claims item 1 for the fire b's cut-off run also ran; b's
// repair writes b's outcome over that claim's record but leaves a's running
// marker while a's run goes on (review of #30: the repair deleted it, so
// the next fire could be claimed beside a's run, G1). a's outcome then
// finds its claim lost, and deletes its own marker, so that the item is
// not held for as long as a's session lives. The fire ran twice across the
// wipe (at least once), recorded once.
func TestRepairLeavesAnotherInstancesMarker(t *testing.T) {
	t.Parallel()
	a, b, g, cli := wipedUnderBsRun(t)
	ctx, base := context.Background(), wipeFire
	ga := claimItem(t, a.Node, 1, base, keyspace.SourceNormal, 1)

	// b's run ends while b is still cut off: its outcome is pending when
	// b learns of the rewind, and its recovery's repair writes it.
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- b.Complete(cctx, g, Outcome{State: keyspace.StateDone, Start: base, End: base}) }()
	time.Sleep(500 * time.Millisecond) // the outcome's first write is on its way
	b.proxy.Restore()
	err := <-done
	t.Logf("b's outcome: %v", err)
	marker := func() []*mvccpb.KeyValue {
		t.Helper()
		resp, err := cli.Get(ctx, a.keys.RunningItem("orders", 1))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Kvs
	}
	if kvs := marker(); len(kvs) != 1 || string(kvs[0].Value) != "a" {
		t.Fatalf("item 1's running marker after b's outcome: %v; want a's, whose run (fence %d) still goes", kvs, ga.Fence)
	}
	aErr := a.Complete(cctx, ga, Outcome{State: keyspace.StateDone, Start: base, End: base})
	t.Logf("a's outcome: %v", aErr)
	if kvs := marker(); len(kvs) != 0 {
		t.Errorf("item 1's running marker after a's run ended: %v; want none (the item would be held while a lives)", kvs)
	}
	if rec, _ := readRecord(t, cli, a.keys.Item("orders", 1)); rec.State != keyspace.StateDone || !rec.Fire.Equal(base) {
		t.Errorf("item 1's record: %s fire %s by %s; want DONE of fire %s", rec.State, rec.Fire.Format(time.TimeOnly), rec.Instance, base.Format(time.TimeOnly))
	}
}

// wipedUnderBsRun starts a and b on a fresh etcd; b claims item 1 of
// orders for wipeFire while a is cut off, then b is cut off, etcd is
// wiped, and a comes back and recovers from the rewind. b's run (g) goes
// on, its instance still cut off.
func wipedUnderBsRun(t *testing.T) (a, b *rewindNode, g *Grant, cli *clientv3.Client) {
	t.Helper()
	srv := etcdtest.Start(t)
	yaml := "jobs:\n" + job("orders", 2)
	a = startRewindNode(t, srv, "a", testTTL, yaml)
	b = startRewindNode(t, srv, "b", testTTL, yaml)
	a.proxy.Blackhole()
	g = claimItem(t, b.Node, 1, wipeFire, keyspace.SourceNormal, 1)
	b.proxy.Blackhole()
	srv.Wipe()
	a.proxy.Restore()
	waitRewindSeen(t, a)
	etcdtest.Eventually(t, 30*time.Second, "a's recovery", func() bool { return a.Rewound() == nil && a.Up() })
	return a, b, g, srv.Client()
}

// wipeFire is the fire of b's run in wipedUnderBsRun.
var wipeFire = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
