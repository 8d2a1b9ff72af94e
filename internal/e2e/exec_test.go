package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/ledger"
)

// ledgerScript appends start/end lines to the ledger and holds the item's
// lock file while it runs; finding the lock held is an observed overlap.
const ledgerScript = `exec 9>>"$LEDGER_DIR/lock.$SHARDD_JOB.$SHARDD_ITEM"
ctx="$SHARDD_JOB $SHARDD_ITEM $SHARDD_FIRE_TIME $SHARDD_ATTEMPT $SHARDD_FENCE $SHARDD_INSTANCE $SHARDD_SOURCE"
flock -n 9 || echo "overlap $ctx $(date +%s%N)" >> "$LEDGER_DIR/ledger"
echo "start $ctx $(date +%s%N)" >> "$LEDGER_DIR/ledger"
sleep "$LEDGER_SLEEP"
echo "end $ctx $(date +%s%N)" >> "$LEDGER_DIR/ledger"
`

func writeLedgerConfig(t *testing.T, dir string) string {
	cfg := `jobs:
  - name: tick
    cron: "@every 1s"
    shardingTotalCount: 6
    failover: true
    script:
      command: ` + yamlQuote(ledgerScript) + `
      env: {LEDGER_DIR: ` + yamlQuote(dir) + `, LEDGER_SLEEP: "0.3"}
  # Runs longer than the TTL: a paused owner's run would still go on when
  # the item fails over, unless the guard kills it at the fence deadline.
  - name: slow
    cron: "@every 1s"
    shardingTotalCount: 2
    failover: true
    script:
      command: ` + yamlQuote(ledgerScript) + `
      env: {LEDGER_DIR: ` + yamlQuote(dir) + `, LEDGER_SLEEP: "3"}
`
	path := filepath.Join(dir, "jobs.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func yamlQuote(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s) + `"`
}

// The guarantees under faults: 3 instances run a 6-item job every second and
// a 2-item job whose runs outlast the TTL, failover on; one instance is
// killed -9, later another is paused for 2 x TTL. The ledger the jobs write
// must show no overlap (G1), no duplicate (G2), no miss beyond TTL + 2s for
// the every-second job (G3) and fences increasing per item (G4).
func TestExecutionGuaranteesUnderFaults(t *testing.T) {
	dir := t.TempDir()
	e := startEtcd(t)
	cli := e.client()
	cfg := writeLedgerConfig(t, dir)
	a := startShardd(t, e, "a", cfg)
	b := startShardd(t, e, "b", cfg)
	c := startShardd(t, e, "c", cfg)
	waitFor(t, 15*time.Second, "agreement", func() bool {
		return agreed(t, cli, "tick", map[string][]int{"a": {0, 1}, "b": {2, 3}, "c": {4, 5}}, a, b, c) &&
			agreed(t, cli, "slow", map[string][]int{"a": {0}, "b": {1}, "c": {}}, a, b, c)
	})
	from := time.Now()

	// Faults land 150 ms after a fire, while the items run, so that the
	// runs die mid-way and must fail over.
	midRun := func(after time.Duration) {
		time.Sleep(time.Until(time.Now().Add(after).Truncate(time.Second).Add(150 * time.Millisecond)))
	}
	midRun(15 * time.Second) // steady state first
	c.stop(syscall.SIGKILL)
	t.Logf("killed c at %s", time.Now().Format(time.RFC3339Nano))
	midRun(15 * time.Second)
	b.signal(syscall.SIGSTOP)
	t.Logf("paused b at %s", time.Now().Format(time.RFC3339Nano))
	time.Sleep(2 * ttl)
	b.signal(syscall.SIGCONT)
	t.Logf("resumed b at %s", time.Now().Format(time.RFC3339Nano))
	time.Sleep(20 * time.Second) // about a minute in all
	to := time.Now()
	a.stop(syscall.SIGTERM)
	b.stop(syscall.SIGTERM)

	if d := os.Getenv("SHARDD_E2E_KEEP"); d != "" { // keep the ledger for a look
		b, _ := os.ReadFile(filepath.Join(dir, "ledger"))
		os.WriteFile(filepath.Join(d, "ledger"), b, 0o644)
	}
	f, err := os.Open(filepath.Join(dir, "ledger"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	events, err := ledger.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	r := ledger.Check(events, ledger.Options{
		Items: map[string]int{"tick": 6}, Period: time.Second, Bound: ttl + 2*time.Second, From: from, To: to,
	})
	slowRuns := 0
	for _, ev := range events {
		if ev.Job == "slow" && ev.Kind == "start" {
			slowRuns++
		}
	}
	if slowRuns < 10 {
		t.Errorf("the slow job ran %d times", slowRuns)
	}
	t.Logf("ledger: %s", r)
	for _, v := range r.Violations {
		t.Error(v)
	}
	if r.Starts < 250 {
		t.Errorf("too few runs to judge: %s", r)
	}
	if r.Failovers == 0 {
		t.Errorf("no failover happened although runs were cut mid-way: %s", r)
	}
}
