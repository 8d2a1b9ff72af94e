package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/ledger"
)

// etcd restored from a snapshot (down for less or more than the session
// TTL, with or without --bump-revision), or wiped: two shardd processes go
// on without a restart. The snapshot is taken while a fire's items run, and
// fires run after it; after the restore none of them runs again, no fence
// falls, and fires run again once the instances have recovered by
// themselves. The ledger checks every due fire of a 10 s and a 2 s job
// (G1-G4).
func TestEtcdRestoredOrWiped(t *testing.T) {
	longE2E(t)
	for _, tc := range []struct {
		name    string
		outage  time.Duration // etcd down between stop and start
		restore []string      // testetcd restore flags; nil: wipe
	}{
		{name: "restored, down less than the TTL", restore: []string{}},
		{name: "restored, down longer than the TTL", outage: 3 * ttl, restore: []string{}},
		{name: "restored with --bump-revision --mark-compacted", restore: []string{"--bump-revision", "1000000", "--mark-compacted"}},
		{name: "wiped", outage: time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) { etcdGoesBack(t, tc.outage, tc.restore) })
	}
}

func etcdGoesBack(t *testing.T, outage time.Duration, restore []string) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "jobs.yaml")
	jobs := "jobs:\n" + cronLedgerJob(dir, "ten", "@every 10s", 3, "3") + cronLedgerJob(dir, "two", "@every 2s", 2, "0.5")
	if err := os.WriteFile(cfg, []byte(jobs), 0o644); err != nil {
		t.Fatal(err)
	}
	e := startEtcd(t)
	procs := []*proc{startShardd(t, e, "n1", cfg), startShardd(t, e, "n2", cfg)}
	cli := e.client()
	etcdtest.Eventually(t, 30*time.Second, "both instances in ten's map", func() bool {
		m := etcdtest.StoredMap(cli, "ten")
		return m != nil && len(m.Instances) == 2
	})
	from := time.Now()
	bound := ttl + 2*time.Second

	// The snapshot, 1 s into a fire of ten: its items run.
	etcdtest.Eventually(t, 15*time.Second, "1 s into a fire of ten", func() bool { return time.Now().Unix()%10 == 1 })
	snap := filepath.Join(t.TempDir(), "snap.db")
	saveSnapshot(t, e, snap)
	t.Logf("snapshot at %s", time.Now().Format(time.RFC3339Nano))
	time.Sleep(20 * time.Second) // fires run after the snapshot; ten's runs at it end
	// etcd stops 1 s into a fire of ten, whose runs (3 s) end while it is
	// away: their outcomes wait for a recovery that writes them.
	etcdtest.Eventually(t, 15*time.Second, "1 s into a fire of ten", func() bool { return time.Now().Unix()%10 == 1 })
	stop := time.Now()
	e.signal(syscall.SIGTERM)
	e.dir = t.TempDir()
	if restore != nil {
		args := append([]string{"restore", "--snapshot", snap, "--data-dir", e.dir, "--peer-url", e.peerURL}, restore...)
		if out, err := exec.Command(bin.etcd, args...).CombinedOutput(); err != nil {
			t.Fatalf("restore: %v\n%s", err, out)
		}
	}
	time.Sleep(outage)
	e.start()
	t.Logf("etcd stopped at %s, back (restored: %v) at %s", stop.Format(time.RFC3339Nano), restore != nil, time.Now().Format(time.RFC3339Nano))
	recoveries := func(p *proc) int {
		return len(p.find(msg("recovered from etcd going back: resuming with a new session; fences rise above every one seen")))
	}
	// Restored with --bump-revision --mark-compacted, an instance whose
	// answers all came after another had recovered may have nothing to
	// recover from: the compaction made it read everything again, and what
	// it read was already the write-back. Otherwise each sees the rewind
	// (or hears of it) and recovers.
	// Each at least once: a count of exactly two would miss the moment
	// when one recovers twice at the same time as the other once (a
	// report taken for a new rewind), and time out; the count is checked
	// below.
	bumped := len(restore) > 0
	etcdtest.Eventually(t, 60*time.Second, "the instances to recover", func() bool {
		n1, n2 := recoveries(procs[0]), recoveries(procs[1])
		return (n1 > 0 && n2 > 0) || (bumped && n1+n2 > 0)
	})
	healed := time.Now()
	t.Logf("recovered by %s", healed.Format(time.RFC3339Nano))
	time.Sleep(25 * time.Second)
	to := time.Now()
	for _, p := range procs {
		// One recovery each: a report passed on by the other instance is
		// not taken for a second rewind.
		if n := recoveries(p); n > 1 || (n == 0 && !bumped) {
			t.Errorf("%s recovered %d times from one rewind", p.name, n)
		}
		select {
		case <-p.exited:
			t.Fatalf("%s exited: %v", p.name, p.err)
		default:
		}
		p.signal(syscall.SIGTERM)
		<-p.exited
	}

	events := ledgerEvents(t, dir)
	r := ledger.Check(events, ledger.Options{
		Jobs: map[string]ledger.Job{
			"ten": {Items: 3, Schedule: mustSchedule(t, "@every 10s"), Failover: true},
			"two": {Items: 2, Schedule: mustSchedule(t, "@every 2s"), Failover: true},
		},
		Bound: bound, From: from, To: to,
		// The rewind fences every session: runs in flight are cut, and
		// fires due until the instances recovered run when they have.
		Failures: []ledger.Failure{{At: stop}},
		Faults:   []ledger.Window{{From: stop, To: healed.Add(bound)}},
		Records:  policyRecords(t, procs),
	})
	t.Logf("ledger: %s", r)
	for _, v := range r.Violations {
		t.Error(v)
	}
	ranAfter := map[string]bool{}
	for _, ev := range events {
		if ev.Kind == "start" && ev.At.After(healed) {
			ranAfter[ev.Job], ranAfter[ev.Instance] = true, true
		}
	}
	if !ranAfter["ten"] || !ranAfter["two"] || !ranAfter["n1"] || !ranAfter["n2"] {
		t.Errorf("jobs and instances that ran after the recovery: %v; want both jobs, on both instances", ranAfter)
	}
	said := 0
	for _, p := range procs {
		said += len(p.find(msg("etcd went back in time (restored from a snapshot, wiped, or another cluster): this instance stops starting runs, fences itself and drops what it knew; it resumes by itself once etcd's revision passes every one it saw, after writing back the item records it knew (see docs/operations.md)")))
	}
	if said == 0 {
		t.Errorf("no instance logged an ERROR saying etcd went back")
	}

	out, err := exec.Command(bin.shardd, "status", "--etcd", e.clientURL).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "etcd went back in time: n") || !strings.Contains(string(out), "recovered at") {
		t.Errorf("status after the recovery does not say etcd went back and was recovered from (%v):\n%s", err, out)
	}
}

// saveSnapshot saves etcd's snapshot to path, as etcdctl snapshot save does.
func saveSnapshot(t *testing.T, e *etcdProc, path string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, err := e.client().Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadFrom(rc); err != nil {
		t.Fatal(fmt.Errorf("save snapshot: %w", err))
	}
}

// etcd's NOSPACE alarm, raised as etcd raises it at its quota: shardd says
// so (/readyz 503 naming it, status) instead of OK, starts nothing it
// cannot record, and runs the missed fires once the alarm is disarmed.
func TestEtcdNoSpaceAlarm(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "jobs.yaml")
	if err := os.WriteFile(cfg, []byte("jobs:\n"+cronLedgerJob(dir, "two", "@every 2s", 2, "0.2")), 0o644); err != nil {
		t.Fatal(err)
	}
	e := startEtcd(t)
	addr := etcdtest.FreeAddr(t)
	p := startShardd(t, e, "n1", cfg, "--listen", addr)
	cli := e.client()
	ready := func() (int, string) {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	etcdtest.Eventually(t, 30*time.Second, "n1 ready", func() bool { code, _ := ready(); return code == 200 })
	etcdtest.Eventually(t, 30*time.Second, "a run", func() bool { return len(readLedger(t, dir)) > 0 })

	disarm := etcdtest.RaiseNoSpace(t, cli)
	raised := time.Now()
	var body string
	etcdtest.Eventually(t, 15*time.Second, "/readyz to say NOSPACE", func() bool {
		var code int
		code, body = ready()
		return code == 503 && strings.Contains(body, "NOSPACE")
	})
	t.Logf("under the alarm, /readyz: %s", strings.TrimSpace(body))
	out, _ := exec.Command(bin.shardd, "status", "--etcd", e.clientURL).CombinedOutput()
	if !strings.Contains(string(out), "etcd alarm: NOSPACE") {
		t.Errorf("status under the NOSPACE alarm does not name it:\n%s", out)
	}
	time.Sleep(5 * time.Second)
	for _, ev := range readLedger(t, dir) {
		if ev.At.After(raised.Add(2 * time.Second)) {
			t.Errorf("a run started under the NOSPACE alarm, where its claim cannot be written: %+v", ev)
		}
	}
	disarm()
	disarmed := time.Now()
	etcdtest.Eventually(t, 20*time.Second, "a run after the disarm, and /readyz 200", func() bool {
		code, _ := ready()
		for _, ev := range readLedger(t, dir) {
			if ev.At.After(disarmed) && code == 200 {
				return true
			}
		}
		return false
	})
	p.signal(syscall.SIGTERM)
	<-p.exited
}
