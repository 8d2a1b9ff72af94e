package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/embedetcd"
)

// logsCLI runs the shardd command line against e with the environment
// env and returns its exit code, stdout and stderr apart.
func logsCLI(t *testing.T, e *etcdProc, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(bin.shardd, append(args, "--etcd", e.clientURL)...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String(), errOut.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String(), errOut.String()
	}
	t.Fatalf("shardd %v: %v", args, err)
	return 0, "", ""
}

// runOf waits for a run of job's item that state says is there, and
// returns it.
func runOf(t *testing.T, e *etcdProc, job string, item int, state string) keyspace.ItemRecord {
	t.Helper()
	etcd := e.client()
	var rec keyspace.ItemRecord
	etcdtest.Eventually(t, 10*time.Second, job+" item "+strconv.Itoa(item)+" "+state, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		recs, err := admin.New(etcd, keyspace.NewKeys("")).FindRuns(ctx, job, item, 0)
		if err != nil || len(recs) == 0 || recs[0].State != state {
			return false
		}
		rec = recs[0]
		return true
	})
	return rec
}

// apiGet asks url with token and returns the answer; the body is read by
// the caller.
func apiGet(t *testing.T, c *http.Client, url, token string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Run logs through the API and `shardd logs`, on two real instances: a
// finished run's log, a live run followed to its end (through the other
// instance's proxy, too), unknown jobs and runs, and the command line.
func TestRunLogsThroughTheAPI(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	e := startEtcd(t)
	etcd := e.client()
	const token = "run-log-read-token-0123"
	tokenFile := filepath.Join(dir, "token")
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
	cfg := filepath.Join(dir, "jobs.yaml")
	os.WriteFile(cfg, []byte(`jobs:
  - name: quick
    shardingTotalCount: 2
    script:
      command: 'echo "quick $SHARDD_ITEM"; echo "warn $SHARDD_ITEM" >&2'
  - name: slow
    shardingTotalCount: 2
    script:
      command: 'echo "begin $SHARDD_ITEM"; sleep 2; echo "finish $SHARDD_ITEM"'
`), 0o644)
	apiA, apiB := etcdtest.FreeAddr(t), etcdtest.FreeAddr(t)
	a := startShardd(t, e, "a", cfg, "--listen", apiA, "--api-read-token-file", tokenFile)
	b := startShardd(t, e, "b", cfg, "--listen", apiB, "--api-read-token-file", tokenFile)
	for _, job := range []string{"quick", "slow"} {
		etcdtest.Eventually(t, 15*time.Second, job+"'s map", func() bool {
			return agreed(t, etcd, job, map[string][]int{"a": {0}, "b": {1}}, a, b)
		})
	}
	c := &http.Client{Timeout: 20 * time.Second}
	logURL := func(api, job, run string) string {
		return "http://" + api + "/api/v1/jobs/" + job + "/runs/" + run + "/log"
	}

	// (a) a finished run's log, from the instance that ran it; (c) one
	// that ran on b, asked of a: b serves it through a's proxy.
	shardd(t, e, "trigger", "quick")
	runA, runB := runOf(t, e, "quick", 0, keyspace.StateDone), runOf(t, e, "quick", 1, keyspace.StateDone)
	if runA.Instance != "a" || runB.Instance != "b" {
		t.Fatalf("quick ran on %s and %s, want a and b", runA.Instance, runB.Instance)
	}
	for _, tc := range []struct {
		run, servedBy, want string
	}{
		{strconv.FormatInt(runA.Fence, 10) + "-0", "a", "quick 0"},
		{strconv.FormatInt(runB.Fence, 10) + "-1", "b", "quick 1"},
		{strconv.FormatInt(runB.Fence, 10), "b", "quick 1"}, // FENCE alone: one item ran under it
	} {
		resp := apiGet(t, c, logURL(apiA, "quick", tc.run), token)
		got := body(t, resp)
		if resp.StatusCode != 200 || resp.Header.Get("X-Shardd-Served-By") != tc.servedBy {
			t.Errorf("run %s asked of a: %s, served by %q: %s", tc.run, resp.Status, resp.Header.Get("X-Shardd-Served-By"), got)
			continue
		}
		item := tc.want[len(tc.want)-1:]
		for _, w := range []string{" shardd run job=quick item=" + item, " out " + tc.want + "\n", " err warn " + item + "\n", " shardd end state=DONE exit=0 "} {
			if !strings.Contains(got, w) {
				t.Errorf("run %s: log lacks %q:\n%s", tc.run, w, got)
			}
		}
	}

	// (d) what is not there, and who may not ask.
	for _, tc := range []struct {
		url, token string
		code       int
		want       []string
	}{
		{logURL(apiA, "quik", "5-0"), token, 404, []string{`no job \"quik\"`, "did you mean quick?"}},
		{logURL(apiB, "quick", "999999-0"), token, 404, []string{`job \"quick\" has no run 999999-0`, "shardd history quick"}},
		{logURL(apiA, "quick", "first"), token, 400, []string{"FENCE-ITEM"}},
		{logURL(apiA, "quick", strconv.FormatInt(runB.Fence, 10)+"-1"), "", 401, []string{"token"}},
		{logURL(apiA, "quick", strconv.FormatInt(runB.Fence, 10)+"-1"), "wrong-token-0123456789", 401, []string{"invalid token"}},
	} {
		resp := apiGet(t, c, tc.url, tc.token)
		got := body(t, resp)
		if resp.StatusCode != tc.code {
			t.Errorf("%s: %s %s, want %d", tc.url, resp.Status, got, tc.code)
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %s does not say %q", tc.url, got, w)
			}
		}
	}

	// (b) a live run followed: its records come while it runs, and the
	// answer ends when it does; item 1 ran on b, asked of a.
	shardd(t, e, "trigger", "slow")
	live := []keyspace.ItemRecord{runOf(t, e, "slow", 0, keyspace.StateRunning), runOf(t, e, "slow", 1, keyspace.StateRunning)}
	type followed struct {
		at    map[string]time.Time
		ended time.Time
	}
	results := make([]chan followed, 2)
	for item, instance := range []string{"a", "b"} {
		resp := apiGet(t, c, logURL(apiA, "slow", strconv.FormatInt(live[item].Fence, 10)+"-"+strconv.Itoa(item))+"?follow=1", token)
		if resp.StatusCode != 200 || resp.Header.Get("X-Shardd-Served-By") != instance {
			t.Fatalf("follow of slow item %d: %s, served by %q", item, resp.Status, resp.Header.Get("X-Shardd-Served-By"))
		}
		results[item] = make(chan followed, 1)
		go func() {
			f := followed{at: map[string]time.Time{}}
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				for _, w := range []string{" out begin ", " out finish ", " shardd end state=DONE"} {
					if strings.Contains(sc.Text(), w) {
						f.at[w] = time.Now()
					}
				}
			}
			f.ended = time.Now()
			results[item] <- f
		}()
	}
	for item := range 2 {
		var f followed
		select {
		case f = <-results[item]:
		case <-time.After(10 * time.Second):
			t.Fatalf("follow of slow item %d did not end", item)
		}
		begin, finish, end := f.at[" out begin "], f.at[" out finish "], f.at[" shardd end state=DONE"]
		if begin.IsZero() || finish.IsZero() || end.IsZero() {
			t.Fatalf("follow of slow item %d: lines at %v", item, f.at)
		}
		if finish.Sub(begin) < 500*time.Millisecond {
			t.Errorf("follow of slow item %d: begin came %s before finish; want it while the run slept 2s", item, finish.Sub(begin))
		}
		if f.ended.Sub(end) > 2*time.Second {
			t.Errorf("follow of slow item %d: the answer ended %s after the run's end record", item, f.ended.Sub(end))
		}
		if rec := runOf(t, e, "slow", item, keyspace.StateDone); rec.Fence != live[item].Fence {
			t.Errorf("slow item %d: followed fence %d, then fence %d ended", item, live[item].Fence, rec.Fence)
		}
	}

	// (e) the command line.
	tokenEnv := []string{"SHARDD_API_TOKEN_FILE=" + tokenFile}
	code, out, errOut := logsCLI(t, e, tokenEnv, "logs", "quick", "--item", "1")
	if code != 0 || out != "quick 1\n" || !strings.HasPrefix(errOut, "warn 1\n") ||
		!strings.Contains(errOut, "shardd logs: run "+strconv.FormatInt(runB.Fence, 10)+"-1 of job quick (item 1") ||
		!strings.Contains(errOut, "on instance b, from instance b's API: printed its stdout on stdout (1 line, 8 bytes) and its stderr on stderr (1 line, 7 bytes); the run ended: end state=DONE exit=0") {
		t.Errorf("logs quick --item 1: exit %d\nstdout %q\nstderr %q", code, out, errOut)
	}
	code, out, _ = logsCLI(t, e, tokenEnv, "logs", "quick", "--run", strconv.FormatInt(runA.Fence, 10), "--raw")
	if recs := strings.Split(strings.TrimSpace(out), "\n"); code != 0 || len(recs) != 4 || !strings.Contains(out, " out quick 0\n") || !strings.Contains(recs[3], " shardd end ") {
		t.Errorf("logs --run FENCE --raw: exit %d\n%s", code, out)
	}
	cutDir := t.TempDir()
	os.MkdirAll(filepath.Join(cutDir, "runs", "gone", "quick"), 0o700)
	os.WriteFile(filepath.Join(cutDir, "runs", "gone", "quick", "999998-1.log"), nil, 0o600)
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"unknown job", tokenEnv, []string{"logs", "quik"}, "did you mean quick?"},
		{"several items, no --item (SHARDD_ITEM is the job's, not the command's)", append(tokenEnv, "SHARDD_ITEM=1"), []string{"logs", "quick"}, "job quick has items 0-1: give --item N"},
		{"an item out of range", tokenEnv, []string{"logs", "quick", "--item", "5"}, "no item 5"},
		{"a run not recorded", tokenEnv, []string{"logs", "quick", "--run", "999999"}, "has no run 999999 that etcd records"},
		{"a run not recorded whose log this host has (a run cut by a crash)", tokenEnv, []string{"logs", "quick", "--run", "999998-1", "--data-dir", cutDir}, "this host has its log: " + filepath.Join(cutDir, "runs", "gone", "quick", "999998-1.log")},
		{"no token", nil, []string{"logs", "quick", "--item", "0"}, "--api-token-file"},
	} {
		code, out, errOut := logsCLI(t, e, tc.env, tc.args...)
		if code != 1 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 1 saying %q", tc.name, code, out, errOut, tc.want)
		}
	}
	// -f follows a live run to its end.
	shardd(t, e, "trigger", "slow", "--item", "1")
	runOf(t, e, "slow", 1, keyspace.StateRunning)
	start := time.Now()
	code, out, errOut = logsCLI(t, e, tokenEnv, "logs", "slow", "--item", "1", "-f")
	if code != 0 || out != "begin 1\nfinish 1\n" || !strings.Contains(errOut, "the run ended: end state=DONE exit=0") || time.Since(start) > 8*time.Second {
		t.Errorf("logs -f: exit %d after %s\nstdout %q\nstderr %q", code, time.Since(start), out, errOut)
	}
}

// Run logs over TLS with client certificates: a proxying instance trusts
// the others' certificates (--api-ca) and presents its own, and the
// command line does the same with --api-ca, --api-cert and --api-key.
func TestRunLogsOverTLS(t *testing.T) {
	parallel(t)
	e := startEtcd(t)
	etcd := e.client()
	files, err := embedetcd.EnsureTLS(t.TempDir(), []string{"127.0.0.1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, "j:2")
	tlsFlags := []string{"--tls-cert", files.ServerCert, "--tls-key", files.ServerKey, "--tls-client-ca", files.CA, "--api-ca", files.CA}
	apiA, apiB := etcdtest.FreeAddr(t), etcdtest.FreeAddr(t)
	a := startShardd(t, e, "a", cfg, append([]string{"--listen", apiA}, tlsFlags...)...)
	b := startShardd(t, e, "b", cfg, append([]string{"--listen", apiB}, tlsFlags...)...)
	etcdtest.Eventually(t, 15*time.Second, "j's map", func() bool { return agreed(t, etcd, "j", map[string][]int{"a": {0}, "b": {1}}, a, b) })
	shardd(t, e, "trigger", "j")
	run := runOf(t, e, "j", 1, keyspace.StateDone)

	clientCfg, err := clientTLS(files.CA, files.ClientCert, files.ClientKey, true)
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: clientCfg}}
	resp := apiGet(t, c, "https://"+apiA+"/api/v1/jobs/j/runs/"+strconv.FormatInt(run.Fence, 10)+"-1/log", "")
	got := body(t, resp)
	if resp.StatusCode != 200 || resp.Header.Get("X-Shardd-Served-By") != "b" || !strings.Contains(got, " shardd end state=DONE exit=0") {
		t.Errorf("over TLS through a: %s, served by %q: %s", resp.Status, resp.Header.Get("X-Shardd-Served-By"), got)
	}

	apiEnv := []string{"SHARDD_API_CA=" + files.CA, "SHARDD_API_CERT=" + files.ClientCert, "SHARDD_API_KEY=" + files.ClientKey}
	code, out, errOut := logsCLI(t, e, apiEnv, "logs", "j", "--item", "1", "--raw")
	if code != 0 || !strings.Contains(out, " shardd end state=DONE exit=0") || !strings.Contains(errOut, "from instance b's API") {
		t.Errorf("logs over TLS: exit %d\nstdout %q\nstderr %q", code, out, errOut)
	}
	code, _, errOut = logsCLI(t, e, nil, "logs", "j", "--item", "1")
	if code != 1 || !strings.Contains(errOut, "https://"+apiB) || !strings.Contains(errOut, "--api-ca") {
		t.Errorf("logs over TLS without the CA: exit %d, stderr %q", code, errOut)
	}
}
