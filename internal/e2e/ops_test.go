package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/ledger"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// ledgerEvents returns every event of dir's ledger; a missing or
// malformed ledger fails the test.
func ledgerEvents(t *testing.T, dir string) []ledger.Event {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, "ledger"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs, err := ledger.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// readLedger returns the start events in dir's ledger.
func readLedger(t *testing.T, dir string) []ledger.Event {
	return readEvents(t, dir, "start")
}

// readEvents returns the events of kind in dir's ledger.
func readEvents(t *testing.T, dir, kind string) []ledger.Event {
	f, err := os.Open(filepath.Join(dir, "ledger"))
	if err != nil {
		return nil
	}
	defer f.Close()
	evs, err := ledger.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	var starts []ledger.Event
	for _, ev := range evs {
		if ev.Kind == kind {
			starts = append(starts, ev)
		}
	}
	return starts
}

func count(evs []ledger.Event, match func(ledger.Event) bool) int {
	n := 0
	for _, ev := range evs {
		if match(ev) {
			n++
		}
	}
	return n
}

func shardd(t *testing.T, e *etcdProc, args ...string) string {
	t.Helper()
	out, err := exec.Command(bin.shardd, append(args, "--etcd", e.clientURL)...).CombinedOutput()
	if err != nil {
		t.Fatalf("shardd %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// trigger, disable/enable of an item, history: from the command line to the runs.
func TestOperations(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	e := startEtcd(t)
	cli := e.client()
	cfg := `jobs:
  - name: manual
    shardingTotalCount: 2
    script:
      command: ` + etcdtest.YAMLQuote(ledgerScript) + `
      env: {LEDGER_DIR: ` + etcdtest.YAMLQuote(dir) + `, LEDGER_SLEEP: "0.1"}
  - name: tick
    cron: "@every 1s"
    shardingTotalCount: 2
    script:
      command: ` + etcdtest.YAMLQuote(ledgerScript) + `
      env: {LEDGER_DIR: ` + etcdtest.YAMLQuote(dir) + `, LEDGER_SLEEP: "0.1"}
`
	path := filepath.Join(dir, "jobs.yaml")
	os.WriteFile(path, []byte(cfg), 0o644)
	a := startShardd(t, e, "a", path)
	b := startShardd(t, e, "b", path)
	etcdtest.Eventually(t, 15*time.Second, "agreement", func() bool {
		return agreed(t, cli, "manual", map[string][]int{"a": {0}, "b": {1}}, a, b)
	})

	manual := func(item int) func(ledger.Event) bool {
		return func(ev ledger.Event) bool { return ev.Job == "manual" && ev.Item == item && ev.Source == "MANUAL" }
	}
	if out := shardd(t, e, "trigger", "manual"); !strings.Contains(out, "triggered every item (0,1) of job manual") {
		t.Errorf("trigger said %q", out)
	}
	etcdtest.Eventually(t, 10*time.Second, "both items to run once", func() bool {
		evs := readEvents(t, dir, "end")
		return count(evs, manual(0)) == 1 && count(evs, manual(1)) == 1
	})
	shardd(t, e, "trigger", "manual", "--item", "1")
	etcdtest.Eventually(t, 10*time.Second, "item 1 to run again", func() bool { return count(readLedger(t, dir), manual(1)) == 2 })
	if n := count(readLedger(t, dir), manual(0)); n != 1 {
		t.Errorf("item 0 ran %d times, want 1", n)
	}

	// Disable item 0 of tick: it stops running; enable: it runs again.
	tick0 := func(ev ledger.Event) bool { return ev.Job == "tick" && ev.Item == 0 }
	etcdtest.Eventually(t, 10*time.Second, "tick item 0 to run", func() bool { return count(readLedger(t, dir), tick0) > 0 })
	shardd(t, e, "disable", "tick", "--item", "0")
	time.Sleep(1500 * time.Millisecond) // a run may have been claimed just before
	before := count(readLedger(t, dir), tick0)
	time.Sleep(3 * time.Second) // three fires pass
	if after := count(readLedger(t, dir), tick0); after != before {
		t.Errorf("disabled item 0 ran %d more times", after-before)
	}
	if n := count(readLedger(t, dir), func(ev ledger.Event) bool {
		return ev.Job == "tick" && ev.Item == 1 && ev.At.After(time.Now().Add(-3*time.Second))
	}); n == 0 {
		t.Error("item 1 stopped running too")
	}
	shardd(t, e, "enable", "tick", "--item", "0")
	etcdtest.Eventually(t, 5*time.Second, "item 0 to run again", func() bool { return count(readLedger(t, dir), tick0) > before })

	var recs []keyspace.ItemRecord
	_, hist, _ := logsCLI(t, e, nil, "history", "tick", "-o", "json")
	if err := json.Unmarshal([]byte(hist), &recs); err != nil {
		t.Fatal(err)
	}
	if len(recs) == 0 {
		t.Fatal("no history records")
	}
	skippedWhileDisabled := 0
	for _, r := range recs {
		switch {
		case r.Job == "tick" && r.Item == 0 && r.State == keyspace.StateSkipped && r.Reason == keyspace.SkipDisabled && r.Skipped >= 1:
			skippedWhileDisabled += r.Skipped // the fires that came while it was disabled
		case r.Job == "tick" && r.State == keyspace.StateRunning && r.Fence > 0: // a run in progress: history shows it
		case r.Job != "tick" || r.State != keyspace.StateDone || r.Fence == 0 || r.ExitCode != 0 || r.End.Before(r.Start):
			t.Errorf("history record %+v", r)
		}
	}
	if skippedWhileDisabled < 2 {
		t.Errorf("%d fires of the disabled item recorded skipped; about three passed", skippedWhileDisabled)
	}
	if out := shardd(t, e, "history", "manual"); !strings.Contains(out, "MANUAL") {
		t.Errorf("history table:\n%s", out)
	}
}
