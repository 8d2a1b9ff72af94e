package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/shardd/shardd/internal/browsertest"
	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// dialogs accepts every confirmation the page asks for and keeps what it
// asked: an action's confirmation is part of what is tested.
type dialogs struct {
	mu   sync.Mutex
	seen []string
}

func acceptDialogs(t *testing.T, ctx context.Context) *dialogs {
	d := &dialogs{}
	chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			d.mu.Lock()
			d.seen = append(d.seen, e.Message)
			d.mu.Unlock()
			// Not from the listener: it must not run a command itself.
			go chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	})
	return d
}

func (d *dialogs) last() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.seen) == 0 {
		return ""
	}
	return d.seen[len(d.seen)-1]
}

// text returns the text of the first element that sel matches.
func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	return browsertest.Run(t, ctx, chromedp.Text(chromedp.CSS(sel)))
}

// waitText waits until the element sel contains want.
func waitText(t *testing.T, ctx context.Context, sel, want string, timeout time.Duration) string {
	t.Helper()
	var s string
	deadline := time.Now().Add(timeout)
	for {
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		var err error
		s, err = chromedp.Run(tctx, chromedp.Text(chromedp.CSS(sel)))
		cancel()
		if err == nil && strings.Contains(s, want) {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %q after %s; it says %q (%v)", sel, want, timeout, s, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitPage reloads the page until the element sel contains want: what the
// page shows comes from the server, as of the page's load.
func waitPage(t *testing.T, ctx context.Context, sel, want string, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(300 * time.Millisecond) {
		browsertest.Do(t, ctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(sel)))
		if strings.Contains(text(t, ctx, sel), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %q after %s of reloads; it says %q", sel, want, timeout, text(t, ctx, sel))
		}
	}
}

// The console in a real browser, as an operator uses it: log in, find a
// job, run it now with a parameter and watch its log appear, kill a long
// run, disable an item, and find it all in the audit page; then a
// read-role login, which sees the same pages and cannot act.
func TestConsoleInABrowser(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	e := startEtcd(t)
	etcd := e.client()
	var jobs strings.Builder
	jobs.WriteString(`jobs:
  - name: nightly-report
    script: 'echo "report for $SHARDD_TRIGGER_PARAMETER"; for i in 1 2 3 4 5 6; do echo "line $i"; sleep 1; done; echo "warning: 3 late rows" >&2'
  - name: long-import
    failover: true
    script: 'echo importing; sleep 120'
  - name: regions
    cron: '0 0 3 * * ?'
    shardingTotalCount: 3
    shardingItemParameters: '0=Beijing,1=Shanghai,2=Guangzhou'
    script: [/bin/true]
`)
	for i := range 30 { // enough jobs that finding one needs the search
		fmt.Fprintf(&jobs, "  - name: filler-%02d\n    cron: '0 0 4 * * ?'\n    script: [/bin/true]\n", i)
	}
	cfg := filepath.Join(dir, "jobs.yaml")
	os.WriteFile(cfg, []byte(jobs.String()), 0o644)
	tokens := tokenFile(t)
	api := etcdtest.FreeAddr(t)
	a := startShardd(t, e, "a", cfg, "--listen", api, "--api-token-file", tokens)
	etcdtest.Eventually(t, 20*time.Second, "the maps", func() bool {
		return agreed(t, etcd, "regions", map[string][]int{"a": {0, 1, 2}}, a) && agreed(t, etcd, "nightly-report", map[string][]int{"a": {0}}, a)
	})
	base := "http://" + api

	ctx := browsertest.New(t, browsertest.WithTimeout(3*time.Minute), browsertest.WithWindowSize(1280, 900))
	d := acceptDialogs(t, ctx)

	// Log in: reads need a token here (bob has the read role).
	browsertest.Do(t, ctx,
		chromedp.Navigate(base+"/jobs"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
	)
	browsertest.Screenshot(t, ctx, "login")
	browsertest.Do(t, ctx,
		chromedp.SendKeys(chromedp.CSS("#token"), aliceSecret),
		chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#jobs")),
	)
	if who := text(t, ctx, "#who"); !strings.Contains(who, "alice") || !strings.Contains(who, "write") {
		t.Errorf("logged in as %q, want alice (write)", who)
	}

	// Find the job by searching.
	browsertest.Do(t, ctx,
		chromedp.SendKeys(chromedp.CSS("#q"), "report"),
		chromedp.Submit(chromedp.CSS("#q")),
	)
	// The unfiltered list shows the job too: wait for the search's page.
	waitText(t, ctx, "#matched", "1 job", 10*time.Second)
	browsertest.Do(t, ctx, chromedp.WaitVisible(chromedp.CSS(`a[href="/jobs/nightly-report"]`)))
	if n := text(t, ctx, "#matched"); !strings.HasPrefix(n, "1 job") {
		t.Errorf("search for report: %q, want 1 job", n)
	}
	browsertest.Screenshot(t, ctx, "jobs-search")
	browsertest.Do(t, ctx,
		chromedp.Click(chromedp.CSS(`a[href="/jobs/nightly-report"]`)),
		chromedp.WaitVisible(chromedp.CSS("#run-now")),
	)

	// Run it now with a parameter; the page says so and shows the run.
	browsertest.Do(t, ctx,
		chromedp.SendKeys(chromedp.CSS("#rn-param"), "2026-11-30"),
		chromedp.Click(chromedp.CSS("#run-now button")),
	)
	waitText(t, ctx, "#flash", `with parameter "2026-11-30"`, 15*time.Second)
	if q := d.last(); q != `Run job nightly-report now with parameter "2026-11-30"?` {
		t.Errorf("the confirmation asked %q", q)
	}
	// The run's log, followed live: its lines appear while it runs.
	waitPage(t, ctx, "#items", "RUNNING on a", 15*time.Second)
	browsertest.Do(t, ctx, chromedp.Click(chromedp.CSS(`#item-0 a[href*="run="]`)), chromedp.WaitVisible(chromedp.CSS("#log-text")))
	waitText(t, ctx, "#log-text", "report for 2026-11-30", 15*time.Second)
	waitText(t, ctx, "#log-state", "following", 5*time.Second)
	browsertest.Screenshot(t, ctx, "job-log-live")
	waitText(t, ctx, "#log-text", "warning: 3 late rows", 20*time.Second)
	waitText(t, ctx, "#log-state", "the run has ended", 10*time.Second)
	browsertest.Do(t, ctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#history")))
	if h := text(t, ctx, "#history"); !strings.Contains(h, "MANUAL") || !strings.Contains(h, "2026-11-30") || !strings.Contains(h, "DONE") {
		t.Errorf("history after the run:\n%s", h)
	}
	waitText(t, ctx, "#log-state", "End of the log", 10*time.Second)
	browsertest.Screenshot(t, ctx, "console-job") // the README's picture

	// Kill a long run.
	browsertest.Do(t, ctx, chromedp.Navigate(base+"/jobs/long-import"), chromedp.WaitVisible(chromedp.CSS("#run-now")),
		chromedp.Click(chromedp.CSS("#run-now button")))
	waitText(t, ctx, "#flash", "Triggered", 15*time.Second)
	waitPage(t, ctx, "#items", "RUNNING on a", 20*time.Second)
	fence := strings.TrimSpace(text(t, ctx, "#item-0 td:nth-child(7)")) // the Fence column
	browsertest.Do(t, ctx, chromedp.Click(chromedp.CSS("#kill-0")))
	waitText(t, ctx, "#flash", "KILLED/operator", 20*time.Second)
	if q := d.last(); !strings.Contains(q, "Kill the run of item 0 on a (fence "+fence+")?") {
		t.Errorf("the kill's confirmation asked %q, want the run of fence %s", q, fence)
	}
	waitText(t, ctx, "#history", "KILLED/operator", 10*time.Second)
	if h := text(t, ctx, "#history"); !strings.Contains(h, "token:alice") {
		t.Errorf("history of the killed run does not say who killed it:\n%s", h)
	}

	// Disable an item.
	browsertest.Do(t, ctx, chromedp.Navigate(base+"/jobs/regions"), chromedp.WaitVisible(chromedp.CSS("#disable-item-1")),
		chromedp.Click(chromedp.CSS("#disable-item-1")))
	waitText(t, ctx, "#flash", "item 1 of job regions", 15*time.Second)
	waitText(t, ctx, "#item-1", "DISABLED", 10*time.Second)
	browsertest.Screenshot(t, ctx, "item-disabled")
	if off, err := admin.New(etcd, keyspace.NewKeys("")).JobStatus(ctx, "regions"); err != nil || len(off.Jobs) != 1 || fmt.Sprint(off.Jobs[0].DisabledItems) != "[1]" {
		t.Errorf("regions' disabled items in etcd: %+v, %v", off, err)
	}

	// All of it in the audit page.
	browsertest.Do(t, ctx, chromedp.Navigate(base+"/audit"), chromedp.WaitVisible(chromedp.CSS("#audit")))
	audit := text(t, ctx, "#audit")
	for _, want := range []string{"token:alice trigger job nightly-report", "token:alice kill", "token:alice disable item 1 of job regions"} {
		if !strings.Contains(strings.Join(strings.Fields(audit), " "), want) {
			t.Errorf("audit page has no %q:\n%s", want, audit)
		}
	}
	browsertest.Screenshot(t, ctx, "audit")
	browsertest.NoConsoleErrors(t, ctx)

	// A Kill clicked on a page that shows a run which has ended since (the
	// next run holds the item) stops nothing: the page names the run it
	// shows, and the API refuses it, saying so. (After NoConsoleErrors: the
	// browser logs the 409.)
	browsertest.Do(t, ctx, chromedp.Navigate(base+"/jobs/long-import"), chromedp.WaitVisible(chromedp.CSS("#run-now")),
		chromedp.Click(chromedp.CSS("#run-now button")))
	waitText(t, ctx, "#flash", "Triggered", 15*time.Second)
	waitPage(t, ctx, "#items", "RUNNING on a", 20*time.Second)
	shown := strings.TrimSpace(text(t, ctx, "#item-0 td:nth-child(7)"))
	if code, out := cli(t, e, nil, "kill", "long-import", "--item", "0", "--fence", shown); code != 0 || !strings.Contains(out, "KILLED/operator") {
		t.Fatalf("shardd kill --fence %s: exit %d\n%s", shown, code, out)
	}
	if code, out := cli(t, e, nil, "trigger", "long-import"); code != 0 {
		t.Fatalf("shardd trigger long-import: exit %d\n%s", code, out)
	}
	var next int64
	etcdtest.Eventually(t, 20*time.Second, "long-import's next run", func() bool {
		runs, err := admin.New(etcd, keyspace.NewKeys("")).JobRuns(ctx, []string{"long-import"})
		rec := runs["long-import"].Records[0]
		next = rec.Fence
		return err == nil && rec.State == keyspace.StateRunning && fmt.Sprint(rec.Fence) != shown
	})
	browsertest.Do(t, ctx, chromedp.Click(chromedp.CSS("#kill-0")))
	refused := waitText(t, ctx, "#flash", "has ended", 20*time.Second)
	for _, want := range []string{"Refused: ", "the run of item 0 with fence " + shown + " has ended (KILLED/operator", fmt.Sprintf("item 0 now runs fence %d on a: nothing killed", next)} {
		if !strings.Contains(refused, want) {
			t.Errorf("the kill from the stale page says %q, want %q", refused, want)
		}
	}
	if runs, err := admin.New(etcd, keyspace.NewKeys("")).JobRuns(ctx, []string{"long-import"}); err != nil || runs["long-import"].Records[0].State != keyspace.StateRunning || runs["long-import"].Records[0].Fence != next {
		t.Errorf("after the kill from the stale page, long-import's item 0: %+v, %v; want fence %d still running", runs["long-import"].Records[0], err, next)
	}

	// Log out, and in as bob (read role): the same pages, no action.
	browsertest.Do(t, ctx, chromedp.Click(chromedp.CSS(`form[action="/logout"] button`)), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), bobSecret), chromedp.Click(chromedp.CSS("#login")), chromedp.WaitVisible(chromedp.CSS("#counts-h")),
		chromedp.Navigate(base+"/jobs/regions"), chromedp.WaitVisible(chromedp.CSS("#items")))
	acts := browsertest.Run(t, ctx, chromedp.Evaluate[int](`document.querySelectorAll("form.act, button.bulk-act").length`))
	if acts != 0 {
		t.Errorf("a read-role login sees %d action forms", acts)
	}
	// Even a hand-made request from the page is refused by the API.
	status := browsertest.Run(t, ctx, chromedp.Evaluate[int](`fetch("/api/v1/jobs/regions/enable?item=1", {method: "POST", headers: {"X-Shardd-Key": localStorage.getItem("shardd-key")}}).then(r => r.status)`, chromedp.EvalAwaitPromise))
	if status != 403 {
		t.Errorf("a read-role session's POST: %d, want 403", status)
	}
	if off, _ := admin.New(etcd, keyspace.NewKeys("")).JobStatus(ctx, "regions"); fmt.Sprint(off.Jobs[0].DisabledItems) != "[1]" {
		t.Errorf("the read-role session changed regions: disabled items %v", off.Jobs[0].DisabledItems)
	}
}

// A browser sends a host's cookies to every port of the host. The
// operator logs in to the console, then opens a page of another local
// user's server on another port of 127.0.0.1: that server receives the
// console's cookie (the browser does send it) but cannot read the
// console's key (web storage is per origin, and the port is part of it).
// Replaying the cookie to the console's port, it reads no page and no API
// endpoint, changes nothing and logs nobody out; the operator's session
// goes on.
func TestConsoleCookieOnAnotherPortIsWorthNothingInABrowser(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	e := startEtcd(t)
	etcd := e.client()
	cfg := filepath.Join(dir, "jobs.yaml")
	os.WriteFile(cfg, []byte(`jobs:
  - name: regions
    cron: '0 0 3 * * ?'
    shardingTotalCount: 3
    script: [/bin/true]
`), 0o644)
	api := etcdtest.FreeAddr(t)
	a := startShardd(t, e, "a", cfg, "--listen", api, "--api-token-file", tokenFile(t))
	etcdtest.Eventually(t, 20*time.Second, "the map", func() bool { return agreed(t, etcd, "regions", map[string][]int{"a": {0, 1, 2}}, a) })
	base := "http://" + api

	// The other user's server: it keeps the Cookie headers it receives.
	var mu sync.Mutex
	var received []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		received = append(received, r.Header.Get("Cookie"))
		mu.Unlock()
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		io.WriteString(w, `<!doctype html><html><head><link rel="icon" href="data:,"><title>cat pictures</title></head><body><p id="cats">cats</p></body></html>`)
	}))
	defer other.Close()
	if !strings.HasPrefix(other.URL, "http://127.0.0.1:") || !strings.HasPrefix(base, "http://127.0.0.1:") {
		t.Fatalf("the console at %s and the other server at %s are not on the same host", base, other.URL)
	}

	ctx := browsertest.New(t, browsertest.WithTimeout(2*time.Minute))
	browsertest.Do(t, ctx,
		chromedp.Navigate(base+"/jobs/regions"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), aliceSecret),
		chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#disable-job")),
	)
	browsertest.Do(t, ctx, chromedp.Navigate(other.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#cats")))
	mu.Lock()
	stolen := strings.Join(received, "; ")
	mu.Unlock()
	if !strings.Contains(stolen, "shardd_session=") {
		t.Fatalf("the server on another port received no console cookie (Cookie: %q): this test's premise, that browsers send a host's cookies to all its ports, no longer holds", stolen)
	}
	if key := browsertest.Run(t, ctx, chromedp.Evaluate[string](`String(localStorage.getItem("shardd-key")) + " " + localStorage.length`)); key != "null 0" {
		t.Errorf("a page of the other server reads the console's storage: %q", key)
	}

	// The other user replays the cookie, with what it can find.
	replay := func(method, path string, header map[string]string) (int, string) {
		req, _ := http.NewRequest(method, base+path, nil)
		req.Header.Set("Cookie", stolen)
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	var tokens []string
	for _, p := range []string{"/", "/jobs", "/jobs/regions", "/instances", "/audit"} {
		code, body := replay("GET", p, nil)
		for _, secret := range []string{"regions", "alice", "/bin/true"} {
			if strings.Contains(body, secret) {
				t.Errorf("GET %s with the cookie from the other server: %d, the page shows %q", p, code, secret)
			}
		}
		if _, rest, ok := strings.Cut(body, `name="csrf" content="`); ok {
			v, _, _ := strings.Cut(rest, `"`)
			tokens = append(tokens, v)
		}
	}
	for _, p := range []string{"/api/v1/jobs", "/api/v1/jobs/regions", "/api/v1/audit"} {
		if code, body := replay("GET", p, nil); code != http.StatusUnauthorized {
			t.Errorf("GET %s with the cookie from the other server: %d, want 401: %.200s", p, code, body)
		}
	}
	for _, v := range append(tokens, "") {
		if code, body := replay("POST", "/api/v1/jobs/regions/disable", map[string]string{"X-Shardd-CSRF": v, "X-Shardd-Key": v}); code < 400 {
			t.Errorf("POST disable with the cookie from the other server: %d %s", code, body)
		}
	}
	replay("POST", "/logout", nil)
	if st, err := admin.New(etcd, keyspace.NewKeys("")).JobStatus(ctx, "regions"); err != nil || len(st.Jobs) != 1 || st.Jobs[0].Status == admin.StatusDisabled {
		t.Errorf("regions after the replays: %+v, %v; want it enabled", st, err)
	}
	if entries, err := admin.New(etcd, keyspace.NewKeys("")).Audit(ctx, admin.AuditFilter{Job: "regions", Limit: 10}); err != nil || len(entries) != 0 {
		t.Errorf("audit of regions after the replays: %+v, %v; want none", entries, err)
	}

	// The operator's session goes on: back on the console, still alice,
	// still able to act.
	browsertest.Do(t, ctx, chromedp.Navigate(base+"/jobs/regions"), chromedp.WaitVisible(chromedp.CSS("#disable-job")))
	if who := text(t, ctx, "#who"); !strings.Contains(who, "alice") {
		t.Errorf("back on the console: logged in as %q, want alice", who)
	}
	browsertest.NoConsoleErrors(t, ctx)

	// The other server's page itself, in the operator's browser (same
	// site, another origin), sends a write and a logout with the browser's
	// cookies: refused, and the session goes on. (After NoConsoleErrors:
	// the browser logs the refusals.)
	browsertest.Do(t, ctx, chromedp.Navigate(other.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#cats")))
	browsertest.Run(t, ctx, chromedp.Evaluate[string](`fetch("`+base+`/api/v1/jobs/regions/disable", {method: "POST", mode: "no-cors", credentials: "include"}).then(() => "sent", e => String(e))`, chromedp.EvalAwaitPromise))
	browsertest.Do(t, ctx, chromedp.Evaluate[chromedp.Void](`const f = document.createElement("form"); f.method = "POST"; f.action = "`+base+`/logout"; document.body.appendChild(f); f.submit()`))
	waitText(t, ctx, "body", "logout refused", 10*time.Second)
	browsertest.Do(t, ctx, chromedp.Navigate(base+"/jobs/regions"), chromedp.WaitVisible(chromedp.CSS("#disable-job")))
	if who := text(t, ctx, "#who"); !strings.Contains(who, "alice") {
		t.Errorf("after the other page's logout: logged in as %q, want alice", who)
	}
	if st, err := admin.New(etcd, keyspace.NewKeys("")).JobStatus(ctx, "regions"); err != nil || len(st.Jobs) != 1 || st.Jobs[0].Status == admin.StatusDisabled {
		t.Errorf("regions after the other page's write: %+v, %v; want it enabled", st, err)
	}
}
