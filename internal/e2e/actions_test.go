package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

const (
	aliceSecret = "alice-secret-0123456789"
	bobSecret   = "bob-secret-0123456789xx"
)

// tokenFile writes a token file with alice (write) and bob (read).
func tokenFile(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "tokens")
	body := "# name role secret\nalice write " + aliceSecret + "\nbob read " + bobSecret + "\n"
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// call makes an API request with a bearer token and returns the status
// and the body.
func call(t *testing.T, method, url, token string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// countLines counts the lines of path that start with prefix.
func countLines(path, prefix string) int {
	b, _ := os.ReadFile(path)
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}

// The operator actions on a two-instance cluster, through the API of
// either instance and the CLI: a trigger with a parameter, kills (API and
// CLI) that stop the runs wherever they are, recorded KILLED/operator and
// not failed over, a re-run of a past fire, named tokens with roles, and
// the audit log of it all.
func TestOperatorActionsOnACluster(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	ledgerPath := filepath.Join(dir, "ledger")
	e := startEtcd(t)
	etcd := e.client()
	cfg := filepath.Join(dir, "jobs.yaml")
	os.WriteFile(cfg, []byte(`jobs:
  - name: sleepy
    shardingTotalCount: 2
    failover: true
    script: 'echo "start $SHARDD_ITEM $SHARDD_FENCE $SHARDD_SOURCE [$SHARDD_TRIGGER_PARAMETER]" >> `+ledgerPath+`; sleep 30; echo "end $SHARDD_ITEM" >> `+ledgerPath+`'
  - name: daily
    cron: '0 0 3 * * ?'
    script: 'echo "daily $SHARDD_SOURCE $SHARDD_FIRE_TIME [$SHARDD_TRIGGER_PARAMETER]" >> `+ledgerPath+`'
`), 0o644)
	tokens := tokenFile(t)
	apiA, apiB := etcdtest.FreeAddr(t), etcdtest.FreeAddr(t)
	a := startShardd(t, e, "a", cfg, "--listen", apiA, "--api-token-file", tokens)
	b := startShardd(t, e, "b", cfg, "--listen", apiB, "--api-token-file", tokens)
	etcdtest.Eventually(t, 20*time.Second, "sleepy spread over a and b", func() bool {
		return agreed(t, etcd, "sleepy", map[string][]int{"a": {0}, "b": {1}}, a, b) || agreed(t, etcd, "sleepy", map[string][]int{"a": {1}, "b": {0}}, a, b)
	})
	itemOfB := etcdtest.StoredMap(etcd, "sleepy").ItemsOf("b")[0]
	itemOfA := 1 - itemOfB

	// The read token cannot act; the write token can, with a parameter.
	if code, body := call(t, "POST", "http://"+apiA+"/api/v1/jobs/sleepy/trigger", bobSecret, nil); code != http.StatusForbidden || !strings.Contains(string(body), `has the read role`) {
		t.Errorf("trigger with the read token: %d %s", code, body)
	}
	if code, body := call(t, "POST", "http://"+apiA+"/api/v1/jobs/sleepy/trigger", aliceSecret, map[string]any{"param": "batch 7"}); code != http.StatusAccepted {
		t.Fatalf("trigger: %d %s", code, body)
	}
	etcdtest.Eventually(t, 15*time.Second, "both items to start", func() bool { return countLines(ledgerPath, "start ") == 2 })
	if n := countLines(ledgerPath, "start "); n != 2 || !strings.Contains(mustRead(t, ledgerPath), "MANUAL [batch 7]") {
		t.Fatalf("ledger after the trigger:\n%s", mustRead(t, ledgerPath))
	}

	// Kill b's run through a's API, and a's through the CLI.
	code, body := call(t, "POST", fmt.Sprintf("http://%s/api/v1/jobs/sleepy/kill?item=%d&wait=10s", apiA, itemOfB), aliceSecret, nil)
	var killed struct {
		Runs    []keyspace.KillRun `json:"runs"`
		Results []admin.KillResult `json:"results"`
	}
	json.Unmarshal(body, &killed)
	if code != http.StatusAccepted || len(killed.Results) != 1 || killed.Results[0].Instance != "b" ||
		killed.Results[0].State != keyspace.StateKilled || killed.Results[0].Reason != keyspace.ReasonOperator {
		t.Fatalf("kill of b's run through a's API: %d %s", code, body)
	}
	codeCLI, out := cli(t, e, nil, "kill", "sleepy", "--item", fmt.Sprint(itemOfA))
	if codeCLI != 0 || !strings.Contains(out, "KILLED/operator: killed by cli:") {
		t.Fatalf("shardd kill: exit %d\n%s", codeCLI, out)
	}
	// A kill naming a run that has ended (a page loaded before it ended)
	// says so and stops nothing.
	fenceB := killed.Runs[0].Fence
	endedB := fmt.Sprintf("the run of item %d with fence %d has ended (KILLED/operator at ", itemOfB, fenceB)
	if code, body := call(t, "POST", fmt.Sprintf("http://%s/api/v1/jobs/sleepy/kill?item=%d&fence=%d&instance=b", apiA, itemOfB, fenceB), aliceSecret, nil); code != http.StatusConflict || !strings.Contains(string(body), endedB) {
		t.Errorf("kill of b's ended run by its fence through the API: %d %s, want 409 saying %q", code, body, endedB)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"kill", "sleepy", "--item", fmt.Sprint(itemOfB), "--fence", fmt.Sprint(fenceB)}, endedB},
		{[]string{"kill", "nope"}, `no job "nope"`},
		{[]string{"kill", "sleepy", "--item", "5"}, `job "sleepy" has items 0-1; there is no item 5`},
		{[]string{"kill", "sleepy"}, `no item of job "sleepy" is running: nothing to kill`},
		{[]string{"kill", "sleepy", "--item", "0"}, "item 0 is not running (its last run, fence"},
	} {
		if code, out := cli(t, e, nil, tc.args...); code != 1 || !strings.Contains(out, tc.want) {
			t.Errorf("shardd %v: exit %d, want 1 saying %q:\n%s", tc.args, code, tc.want, out)
		}
	}
	// Killed runs are not failed over: the items' records stay KILLED and
	// no run starts again (a failover would come at once, well within 3 s).
	time.Sleep(3 * time.Second)
	if n := countLines(ledgerPath, "start "); n != 2 {
		t.Errorf("%d starts after the kills, want the 2 killed ones only (no failover):\n%s", n, mustRead(t, ledgerPath))
	}
	recs, err := admin.New(etcd, keyspace.NewKeys("")).Records(t.Context(), "sleepy")
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]bool{}
	for _, r := range recs {
		if r.State != keyspace.StateKilled || r.Reason != keyspace.ReasonOperator || r.Param != "batch 7" {
			t.Errorf("history record %+v, want KILLED/operator with the trigger's parameter", r)
		}
		by[r.KilledBy] = true
	}
	if len(recs) != 2 || !by["token:alice"] {
		t.Errorf("history %+v: want 2 records, one killed by token:alice", recs)
	}

	// A re-run of yesterday's (or today's) 03:00 fire, by the CLI.
	now := time.Now().UTC()
	fire := time.Date(now.Year(), now.Month(), now.Day(), 3, 0, 0, 0, time.UTC)
	if fire.After(now) {
		fire = fire.AddDate(0, 0, -1)
	}
	codeCLI, out = cli(t, e, nil, "trigger", "daily", "--fire", fire.Format("2006-01-02 15:04"), "--param", "catch-up")
	if codeCLI != 0 || !strings.Contains(out, "for its fire "+fire.Format(time.RFC3339)) {
		t.Fatalf("trigger --fire: exit %d\n%s", codeCLI, out)
	}
	etcdtest.Eventually(t, 15*time.Second, "the re-run", func() bool { return countLines(ledgerPath, "daily ") == 1 })
	if want := "daily MANUAL " + fire.Format(time.RFC3339) + " [catch-up]"; !strings.Contains(mustRead(t, ledgerPath), want) {
		t.Errorf("ledger has no %q:\n%s", want, mustRead(t, ledgerPath))
	}

	// The audit log, read through b's API with the read token, has it all.
	code, body = call(t, "GET", "http://"+apiB+"/api/v1/audit?limit=20", bobSecret, nil)
	var entries []keyspace.AuditEntry
	if err := json.Unmarshal(body, &entries); code != http.StatusOK || err != nil {
		t.Fatalf("audit: %d %s", code, body)
	}
	var seen []string
	for _, en := range entries {
		actor := en.Actor
		if strings.HasPrefix(actor, "cli:") {
			actor = "cli"
		}
		seen = append(seen, actor+" "+en.Action+" "+en.Outcome)
	}
	for _, want := range []string{"token:alice trigger ok", "token:alice kill ok", "cli kill ok", "cli kill refused", "cli trigger ok"} {
		if !strings.Contains(strings.Join(seen, "\n"), want) {
			t.Errorf("audit has no %q: %v", want, seen)
		}
	}
	if codeCLI, out := cli(t, e, nil, "audit", "--job", "daily"); codeCLI != 0 || !strings.Contains(out, `fire=`+fire.Format("2006-01-02 15:04")+` param="catch-up"`) {
		t.Errorf("shardd audit --job daily: exit %d\n%s", codeCLI, out)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
