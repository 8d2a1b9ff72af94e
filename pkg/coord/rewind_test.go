package coord

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// historyNode runs instance id with one job, orders, of 2 items, on a client
// whose History the node is given, as shardd run wires them.
func historyNode(t *testing.T, srv *etcdtest.Server, id string) (*Node, *logBuffer) {
	t.Helper()
	hist := NewHistory()
	cli, err := NewClient(ClientOptions{Endpoints: []string{srv.Endpoint()}, History: hist, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lb := &logBuffer{}
	n, err := New(Options{Client: cli, ID: id, TTL: testTTL, History: hist,
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
	waitFor(t, 10*time.Second, id+"'s membership", func() bool { s, m := n.sessionFor("orders"); return s != nil && m != 0 })
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
			waitFor(t, 20*time.Second, "the rewind to be seen", func() bool { return n.Rewound() != nil || strings.Contains(lb.String(), "etcd went back in time") })
			waitFor(t, 30*time.Second, "recovery", func() bool { return n.Rewound() == nil && n.Up() })

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
	hist := NewHistory()
	cli, err := NewClient(ClientOptions{Endpoints: []string{srv.Endpoint()}, History: hist})
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
	waitFor(t, 10*time.Second, "an answer", func() bool { _, first = cli.Get(ctx, "k"); return !isUnavailable(first) })
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
