package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/ledger"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/history"
)

// historyDuration is how long TestHistoryAsLongAsTheRunLogs runs its job:
// 30 s in the default suite (15 fires, 5 more than etcd keeps per item),
// SHARDD_HISTORY_DURATION under make e2e-long (default 10m; CI: 2m).
func historyDuration(t *testing.T) time.Duration {
	if s := os.Getenv("SHARDD_HISTORY_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SHARDD_HISTORY_DURATION=%q: %v", s, err)
		}
		return d
	}
	return 30 * time.Second
}

// The history is as long as the run logs: a 3-item job firing every 2 s
// on 3 instances, item 2's runs failing. Paged through with --limit and
// --before, `shardd history --since` lists every run the ledger saw, once
// each, with its fence and result, long after etcd's records of the
// oldest rotated out; --since cuts where it says; --result FAILED gives
// item 2's runs with their stderr's last line; and the log of the oldest
// run, which etcd no longer records, is found by --run.
func TestHistoryAsLongAsTheRunLogs(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	e := startEtcd(t)
	const token = "history-read-token-0123456789"
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
	script := ledgerScript + `echo "run $SHARDD_FENCE-$SHARDD_ITEM"
if [ "$SHARDD_ITEM" = 2 ]; then echo "no route to db-$SHARDD_ITEM" >&2; exit 3; fi
`
	cfg := filepath.Join(dir, "jobs.yaml")
	os.WriteFile(cfg, []byte(`jobs:
  - name: every2
    cron: "@every 2s"
    shardingTotalCount: 3
    script:
      command: `+etcdtest.YAMLQuote(script)+`
      env: {LEDGER_DIR: `+etcdtest.YAMLQuote(dir)+`, LEDGER_SLEEP: "0.1"}
`), 0o644)
	var procs []*proc
	apiA := ""
	for _, n := range []string{"a", "b", "c"} {
		addr := etcdtest.FreeAddr(t)
		if apiA == "" {
			apiA = addr
		}
		procs = append(procs, startShardd(t, e, n, cfg, "--listen", addr, "--api-read-token-file", tokenFile))
	}
	etcdtest.Eventually(t, 15*time.Second, "agreement", func() bool {
		return agreed(t, e.client(), "every2", map[string][]int{"a": {0}, "b": {1}, "c": {2}}, procs...)
	})
	time.Sleep(historyDuration(t))
	shardd(t, e, "disable", "every2") // no run in progress while the ledger is read
	// Quiet: no run in progress, and none begun for two periods (a fire
	// decided before the disable reached an instance still runs).
	starts, quietSince := -1, time.Now()
	etcdtest.Eventually(t, 20*time.Second, "the job to be quiet", func() bool {
		n := len(ledgerSoFar(dir)) // any line: a start or an end (nil while one is being written)
		if n != starts {
			starts, quietSince = n, time.Now()
		}
		return time.Since(quietSince) > 4*time.Second && openRun(t, filepath.Join(dir, "ledger"), "every2", 0) == "" &&
			openRun(t, filepath.Join(dir, "ledger"), "every2", 1) == "" && openRun(t, filepath.Join(dir, "ledger"), "every2", 2) == ""
	})
	events := readLedger(t, dir)
	ran := map[string]ledger.Event{}
	for _, ev := range events {
		if ev.Kind == "start" {
			ran[fmt.Sprintf("%d-%d", ev.Fence, ev.Item)] = ev
		}
	}
	perItem := len(ran) / 3
	if perItem <= keyspace.HistoryPerItem {
		t.Fatalf("%d runs per item: no more than etcd keeps (%d), nothing to prove", perItem, keyspace.HistoryPerItem)
	}

	env := []string{"SHARDD_API_TOKEN_FILE=" + tokenFile}
	page := func(args ...string) ([]history.Run, string) {
		t.Helper()
		code, out, errOut := logsCLI(t, e, env, append([]string{"history", "every2", "-o", "json"}, args...)...)
		if code != 0 || strings.Contains(errOut, "not reached") {
			t.Fatalf("shardd history %v: exit %d\n%s", args, code, errOut)
		}
		var rows []history.Run
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("shardd history %v: %v\n%s", args, err, out)
		}
		next := ""
		if m := regexp.MustCompile(`--before (\S+)`).FindStringSubmatch(errOut); m != nil {
			next = m[1]
		}
		return rows, next
	}
	// Every run, paged: 50 at a time, newest first.
	limit := "50"
	if len(ran) < 100 {
		limit = "7"
	}
	var all []history.Run
	pages := 0
	for next := ""; ; pages++ {
		args := []string{"--since", "15m", "--limit", limit}
		if next != "" {
			args = append(args, "--before", next)
		}
		rows, n := page(args...)
		all = append(all, rows...)
		if next = n; next == "" || pages > 1000 {
			break
		}
	}
	seen := map[string]bool{}
	notRecorded := 0
	var oldest history.Run
	for i, r := range all {
		name := fmt.Sprintf("%d-%d", r.Fence, r.Item)
		switch {
		case seen[name]:
			t.Errorf("run %s listed twice", name)
		case i > 0 && all[i-1].At().Before(r.At()):
			t.Errorf("run %s (at %s) after %s (at %s): not newest first", name, r.At(), fmt.Sprintf("%d-%d", all[i-1].Fence, all[i-1].Item), all[i-1].At())
		}
		seen[name] = true
		if r.State == keyspace.StateSkipped {
			continue // the disable's record
		}
		ev, ok := ran[name]
		want := map[bool]string{true: keyspace.StateFailed, false: keyspace.StateDone}[r.Item == 2]
		switch {
		case !ok:
			t.Errorf("history lists run %s (%s), which the ledger never saw", name, r.State)
		case r.State != want || r.Instance != ev.Instance || !r.Fire.Equal(ev.Fire):
			t.Errorf("run %s: %s on %s fire %s; the ledger: on %s fire %s, want %s", name, r.State, r.Instance, r.Fire, ev.Instance, ev.Fire, want)
		case r.Log != name:
			t.Errorf("run %s: log %q", name, r.Log)
		}
		if !r.Recorded {
			notRecorded++
		}
		oldest = r
	}
	for name := range ran {
		if !seen[name] {
			t.Errorf("the ledger's run %s is not in the history", name)
		}
	}
	t.Logf("%d runs in the ledger, %d rows in %d pages of %s, %d of them from the run logs alone (etcd no longer records them)", len(ran), len(all), pages+1, limit, notRecorded)
	if notRecorded == 0 {
		t.Error("every row had its etcd record: the run logs were not read")
	}

	// The API merges the same history: every run, with the read token.
	resp := apiGet(t, &http.Client{Timeout: 20 * time.Second}, "http://"+apiA+"/api/v1/jobs/every2/runs?since=15m&limit=1000", token)
	var ans history.Answer
	if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil || resp.StatusCode != 200 || len(ans.Unreachable) > 0 || ans.Next != "" {
		t.Fatalf("the API's history: %s, %v, unreachable %v, next %q", resp.Status, err, ans.Unreachable, ans.Next)
	}
	apiRuns := 0
	for _, r := range ans.Runs {
		if _, ok := ran[fmt.Sprintf("%d-%d", r.Fence, r.Item)]; ok {
			apiRuns++
		}
	}
	if apiRuns != len(ran) {
		t.Errorf("the API's history has %d of the ledger's %d runs", apiRuns, len(ran))
	}

	// --since cuts where it says: the rows since a time in the middle are
	// those of the whole at or after it.
	mid := all[len(all)/2].At()
	rows, _ := page("--since", mid.Format(time.RFC3339Nano), "--limit", "1000")
	// (SKIPPED records of the disabled job's fires go on meanwhile.)
	runs := func(rows []history.Run) int {
		n := 0
		for _, r := range rows {
			if r.State != keyspace.StateSkipped && !r.At().Before(mid) {
				n++
			}
		}
		return n
	}
	if got, want := runs(rows), runs(all); got != want || len(rows) < got {
		t.Errorf("--since %s: %d runs, the whole has %d at or after it", mid.Format(time.RFC3339Nano), got, want)
	}

	// --result FAILED: item 2's runs, with the line they wrote on stderr.
	rows, _ = page("--since", "15m", "--result", "failed", "--limit", "1000")
	failed := 0
	for _, ev := range ran {
		if ev.Item == 2 {
			failed++
		}
	}
	if len(rows) != failed {
		t.Errorf("--result failed: %d rows, the ledger has %d runs of item 2", len(rows), failed)
	}
	for _, r := range rows {
		if r.Item != 2 || r.State != keyspace.StateFailed || r.ExitCode != 3 || r.LastLine != "no route to db-2" {
			t.Errorf("a failed run: item %d %s exit %d last line %q", r.Item, r.State, r.ExitCode, r.LastLine)
		}
	}
	code, out, errOut := logsCLI(t, e, env, "history", "every2", "--result", "failed", "--limit", "3")
	if code != 0 || !strings.Contains(out, "no route to db-2") || !strings.Contains(errOut, "older ones: --before ") {
		t.Errorf("history table of failures: exit %d\n%s\n%s", code, out, errOut)
	}

	// The oldest run's log, which etcd no longer records.
	if oldest.Recorded {
		t.Fatalf("the oldest run %d-%d is still recorded in etcd", oldest.Fence, oldest.Item)
	}
	name := fmt.Sprintf("%d-%d", oldest.Fence, oldest.Item)
	code, out, errOut = logsCLI(t, e, env, "logs", "every2", "--run", name)
	if code != 0 || out != "run "+name+"\n" && !strings.HasPrefix(out, "run "+name+"\n") {
		t.Errorf("shardd logs --run %s: exit %d\n%s\n%s", name, code, out, errOut)
	}
}
