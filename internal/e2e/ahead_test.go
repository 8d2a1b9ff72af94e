package e2e

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/ledger"
)

// A claim made ahead of its fire is not used once its fence is gone: the
// owner claims the fire a few milliseconds ahead and is paused (SIGSTOP)
// before the fire, past its lease. The other instance takes the item over
// and runs the fire (failover); the paused one, continued, must not start
// it (it would run beside the other's run, breaking G1).
func TestClaimAheadNotUsedAfterItsFenceIsGone(t *testing.T) {
	faultTest(t)
	e := startEtcd(t)
	cli := e.client()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "jobs.yaml")
	writeFile(t, cfg, `jobs:
  - name: ahead
    cron: "*/3 * * * * ?"
    shardingTotalCount: 1
    failover: true
    script:
      command: `+etcdtest.YAMLQuote(ledgerScript)+`
      env: {LEDGER_DIR: `+etcdtest.YAMLQuote(dir)+`, LEDGER_SLEEP: "0.1"}
`)
	procs := map[string]*proc{"a": startShardd(t, e, "a", cfg), "b": startShardd(t, e, "b", cfg)}
	var owner string
	etcdtest.Eventually(t, 30*time.Second, "a map of both instances", func() bool {
		m := etcdtest.StoredMap(cli, "ahead")
		if m == nil || len(m.Items) != 2 {
			return false
		}
		owner = m.Owner(0)
		return owner != ""
	})
	victim, other := procs[owner], procs["a"]
	if owner == "a" {
		other = procs["b"]
	}
	claimedAhead := func(r map[string]any) bool { return r["msg"] == "run" && r["starts_in"] != nil }

	// Pause the owner between its claim and the fire. The claim is made
	// 10-250 ms ahead; a pause that comes too late (the work began) is
	// undone and tried at the next fire.
	var fire time.Time
	for try := 0; fire.IsZero(); try++ {
		if try == 8 {
			t.Fatal("could not pause the owner between its claim ahead and the fire in 8 tries")
		}
		seen := len(victim.find(claimedAhead))
		var rec map[string]any
		for deadline := time.Now().Add(10 * time.Second); rec == nil; time.Sleep(200 * time.Microsecond) {
			if time.Now().After(deadline) {
				t.Fatal("no run claimed ahead")
			}
			if recs := victim.find(claimedAhead); len(recs) > seen {
				rec = recs[seen]
			}
		}
		victim.signal(syscall.SIGSTOP)
		stoppedAt := time.Now()
		f, err := time.Parse(time.RFC3339Nano, rec["fire"].(string))
		if err != nil {
			t.Fatal(err)
		}
		if !stoppedAt.Before(f) {
			t.Logf("try %d: paused %s after the fire of %s: too late", try, stoppedAt.Sub(f), f.Format(time.TimeOnly))
			victim.signal(syscall.SIGCONT)
			continue
		}
		t.Logf("try %d: %s paused %s before the fire of %s, which it claimed ahead", try, owner, f.Sub(stoppedAt), f.Format(time.TimeOnly))
		fire = f
	}
	time.Sleep(time.Until(fire.Add(ttl + 2*time.Second))) // its lease expires; the other takes over
	victim.signal(syscall.SIGCONT)
	etcdtest.Eventually(t, 15*time.Second, "the continued owner to give up its claim ahead", func() bool {
		return len(victim.find(func(r map[string]any) bool {
			return r["msg"] == "killed" && r["reason"] == "not-started" && r["fire"] == fire.UTC().Format(time.RFC3339)
		})) > 0
	})
	var taken *ledger.Event
	etcdtest.Eventually(t, 15*time.Second, "the other instance to run the fire", func() bool {
		for _, ev := range readLedger(t, dir) {
			if ev.Job == "ahead" && ev.Fire.Equal(fire) && ev.Instance == other.name {
				taken = &ev
				return true
			}
		}
		return false
	})
	if d := taken.At.Sub(fire); d > ttl+2*time.Second {
		t.Errorf("the fire of %s ran %s after it on %s: later than G3's bound (TTL + 2s)", fire.Format(time.TimeOnly), d, other.name)
	}
	time.Sleep(time.Second) // a start the paused owner made would be in the ledger by now
	for _, ev := range readLedger(t, dir) {
		if ev.Fire.Equal(fire) && ev.Instance == owner {
			t.Errorf("%s started the fire of %s (attempt %d, fence %d) after its fence was gone", owner, fire.Format(time.TimeOnly), ev.Attempt, ev.Fence)
		}
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
