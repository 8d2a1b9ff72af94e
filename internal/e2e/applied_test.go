package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

const defineSecret = "dana-secret-0123456789x"

// ledgerLines reads the runs a job's script appended to path: "VERSION
// INSTANCE ITEM FENCE" a line, deduplicated by fence and item.
func ledgerLines(t *testing.T, path string) [][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out [][]string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if f := strings.Fields(l); len(f) == 4 {
			out = append(out, f)
		}
	}
	return out
}

// ranSince lists the instances (and the versions they ran) in the ledger
// after its first n lines.
func ranSince(lines [][]string, n int) (instances, versions map[string]bool) {
	instances, versions = map[string]bool{}, map[string]bool{}
	for _, l := range lines[min(n, len(lines)):] {
		versions[l[0]], instances[l[1]] = true, true
	}
	return
}

// The acceptance of applied definitions (docs/applied.md), over three
// processes: an applied job runs only on the hosts that accept applied
// definitions and match its selector; a relabelled host (restarted) takes
// or leaves its items; a rollback reaches every instance within the
// reload bound; a write token cannot apply, a define token can, each
// audited; a host without --accept-applied never runs it, and status
// says why.
func TestAppliedDefinitionsAcrossHosts(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	e := startEtcd(t)
	etcd := e.client()
	adm := admin.New(etcd, keyspace.NewKeys(""))
	ledger := filepath.Join(dir, "ledger")
	empty := filepath.Join(dir, "empty.yaml")
	os.WriteFile(empty, []byte("jobs: []\n"), 0o644)
	own := writeConfig(t, "local-c:1") // c has a job of its own, and no --accept-applied
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("alice write "+aliceSecret+"\ndana define "+defineSecret+"\n"), 0o600)
	api := etcdtest.FreeAddr(t)
	a := startShardd(t, e, "a", empty, "--accept-applied", "--label", "role=db,zone=a", "--listen", api, "--api-token-file", tokens)
	emptyDir := filepath.Join(dir, "conf.d") // a directory without job files: b runs applied jobs only
	os.Mkdir(emptyDir, 0o755)
	b := startShardd(t, e, "b", emptyDir, "--accept-applied", "--label", "role=db", "--label", "zone=b")
	startShardd(t, e, "c", own, "--label", "role=db")

	// The job, in the file format, applied with the CLI.
	def := func(version string) string {
		return `jobs:
  - name: etl
    cron: "* * * * * ?"
    shardingTotalCount: 2
    instances: {selector: "role=db,zone in (a,b)"}
    script: [/bin/sh, -c, 'echo "` + version + ` $SHARDD_INSTANCE $SHARDD_ITEM $SHARDD_FENCE" >> ` + ledger + `']
`
	}
	file := filepath.Join(dir, "etl.yaml")
	os.WriteFile(file, []byte(def("v1")), 0o644)
	if code, out := cli(t, e, nil, "apply", "-f", file); code != 0 || !strings.Contains(out, "job etl: created (version 1") {
		t.Fatalf("apply: %d %s", code, out)
	}
	etcdtest.Eventually(t, 30*time.Second, "etl on a and b", func() bool {
		return agreed(t, etcd, "etl", map[string][]int{"a": {0}, "b": {1}}, a, b)
	})
	etcdtest.Eventually(t, 20*time.Second, "runs of etl on a and b", func() bool {
		ran, _ := ranSince(ledgerLines(t, ledger), 0)
		return ran["a"] && ran["b"]
	})
	// c matches the selector's role but not its zone: not selected, no
	// refusal. Labelled zone=a it would match: status says why it still
	// does not run the job. Here its refusal is shown for a selector
	// that matches it.
	st, err := adm.JobStatus(context.Background(), "etl")
	if err != nil || len(st.Jobs) != 1 || st.Jobs[0].Placement == nil || !slices.Equal(st.Jobs[0].Placement.Matching, []string{"a", "b"}) {
		t.Fatalf("status of etl: %+v, %v", st, err)
	}

	// Widen the selector to role=db: c matches and refuses (it does not
	// accept applied definitions); status says so, and c never runs it.
	os.WriteFile(file, []byte(strings.Replace(def("v1"), `"role=db,zone in (a,b)"`, `"role=db"`, 1)), 0o644)
	if code, out := cli(t, e, nil, "apply", "-f", file); code != 0 || !strings.Contains(out, "instances.selector: role=db,zone in (a,b) -> role=db") {
		t.Fatalf("apply of the wider selector: %d %s", code, out)
	}
	etcdtest.Eventually(t, 20*time.Second, "status to say why c does not run etl", func() bool {
		code, out := cli(t, e, nil, "status")
		return code == 0 && strings.Contains(out, "instance c matches the selector but does not run the applied job: this instance does not run applied definitions (start it with --accept-applied)")
	})

	// Relabel b (a restart) out of the selector: its item moves to a.
	b.stop(syscall.SIGTERM)
	b = startShardd(t, e, "b", empty, "--accept-applied", "--label", "role=web")
	etcdtest.Eventually(t, 30*time.Second, "etl on a only", func() bool {
		return agreed(t, etcd, "etl", map[string][]int{"a": {0, 1}}, a)
	})
	mark := len(ledgerLines(t, ledger))
	time.Sleep(3 * time.Second)
	if ran, _ := ranSince(ledgerLines(t, ledger), mark); len(ran) != 1 || !ran["a"] {
		t.Errorf("after b's relabel, etl ran on %v; want a only", ran)
	}
	// Relabel it back in: it takes its share again.
	b.stop(syscall.SIGTERM)
	b = startShardd(t, e, "b", empty, "--accept-applied", "--label", "role=db")
	etcdtest.Eventually(t, 30*time.Second, "etl on a and b again", func() bool {
		return agreed(t, etcd, "etl", map[string][]int{"a": {0}, "b": {1}}, a, b)
	})

	// Tokens: a write token cannot apply, a define token can; both audited.
	base := "http://" + api
	body := strings.Replace(def("v2"), `"role=db,zone in (a,b)"`, `"role=db"`, 1)
	code, resp := callRaw(t, "PUT", base+"/api/v1/definitions/etl", aliceSecret, body)
	if code != http.StatusForbidden || !strings.Contains(resp, "needs the define role") {
		t.Fatalf("a write token applying: %d %s", code, resp)
	}
	code, resp = callRaw(t, "PUT", base+"/api/v1/definitions/etl", defineSecret, body)
	if code != http.StatusOK || !strings.Contains(resp, `"version": 3`) {
		t.Fatalf("a define token applying: %d %s", code, resp)
	}
	changed := time.Now()
	var v2At time.Duration
	etcdtest.Eventually(t, 20*time.Second, "v2 runs on every host", func() bool {
		lines := ledgerLines(t, ledger)
		ran := map[string]bool{}
		for _, l := range lines {
			if l[0] == "v2" {
				ran[l[1]] = true
			}
		}
		v2At = time.Since(changed)
		return ran["a"] && ran["b"]
	})
	t.Logf("the applied change ran on every host %s after the PUT", v2At.Round(time.Millisecond))

	// Roll back to version 2 (v1 with the wide selector): within the
	// reload bound every host runs v1 again, none v2.
	if code, out := cli(t, e, nil, "rollback", "etl", "--to", "2"); code != 0 || !strings.Contains(out, "rolled back to version 2, registered as version 4") {
		t.Fatalf("rollback: %d %s", code, out)
	}
	rolled := time.Now()
	time.Sleep(reloadBound)
	mark = len(ledgerLines(t, ledger))
	time.Sleep(3 * time.Second)
	ran, versions := ranSince(ledgerLines(t, ledger), mark)
	if !ran["a"] || !ran["b"] || ran["c"] || !versions["v1"] || versions["v2"] {
		t.Errorf("%s after the rollback (+3s), the runs were of %v on %v; want v1 only, on a and b", reloadBound, versions, ran)
	}
	t.Logf("rollback at %s checked from %s on", rolled.Format(time.TimeOnly), reloadBound)
	code, out := cli(t, e, nil, "history", "--definitions", "etl")
	if code != 0 || !strings.Contains(out, "rollback to 2") || !strings.Contains(out, "token:dana") {
		t.Errorf("history --definitions: %d %s", code, out)
	}

	// The audit log: the CLI's applies and rollback, the define token's
	// apply, the write token's refusal.
	entries, err := adm.Audit(context.Background(), admin.AuditFilter{Job: "etl"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, en := range entries {
		who := en.Actor
		if strings.HasPrefix(who, "cli:") {
			who = "cli"
		}
		got = append(got, who+" "+en.Action+" "+en.Outcome)
	}
	want := []string{"cli rollback ok", "token:dana apply ok", "token:alice apply refused", "cli apply ok", "cli apply ok"}
	if !slices.Equal(got, want) {
		t.Errorf("audit of etl: %q, want %q", got, want)
	}

	// c never ran the job.
	for _, l := range ledgerLines(t, ledger) {
		if l[1] == "c" {
			t.Fatalf("c, which does not accept applied definitions, ran etl: %v", l)
		}
	}
}

// reloadBound is how long a definition change takes to reach every
// instance: one watch event, a task's restart, and the next fire.
const reloadBound = 5 * time.Second

// callRaw makes an API request with a raw body and returns the status and
// the body.
func callRaw(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}
