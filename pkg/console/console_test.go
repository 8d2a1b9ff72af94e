package console

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/history"
	"github.com/shardd/shardd/pkg/runlog"
	sched "github.com/shardd/shardd/pkg/schedule"
)

// fakeCluster is a cluster of n jobs named job-00000...; job-00001's item 0
// runs now and job-00002's item 1 failed. The console's reads of etcd are
// coord's, tested against etcd; here, the pages.
type fakeCluster struct {
	n        int
	statuses atomic.Int32
	slow     chan struct{} // when set, Status waits for it
}

func (f *fakeCluster) ID() string { return "a" }

func (f *fakeCluster) status(names ...string) *admin.ClusterStatus {
	st := &admin.ClusterStatus{Prefix: "/shardd", Revision: 42, Instances: []admin.InstanceStatus{{InstanceInfo: keyspace.InstanceInfo{ID: "a", Host: "h1", Version: "v1", Jobs: []string{"job-00000"}, ReloadRejected: "2026-12-04T01:00:00Z: 2 problems (job x: 2)"}}},
		Etcd: &admin.EtcdHealth{Voters: 3, Up: 2, Quorum: 2, FaultTolerance: 0, Members: []admin.EtcdMember{
			{ID: "8e9e05c52164694d", Name: "n1", Up: true, Leader: true, DBSize: 3 << 20, DBSizeInUse: 1 << 20, Version: "3.7.3", ClientURLs: []string{"https://10.0.0.1:2379"}},
			{ID: "91bc3c398fb3c146", Name: "n2", Up: true, DBSize: 3 << 20, DBSizeInUse: 1 << 20, Version: "3.7.3"},
			{ID: "fd422379fda50e48", Name: "n3", Error: "context deadline exceeded"}}}}
	// As config.Job.JSON writes it.
	def := []byte(`{"name":"%s","cron":"0 */5 * * * ?","timeZone":"UTC","shardingTotalCount":2,"strategy":"AVG_ALLOCATION","failover":true,"misfire":true,"monitorExecution":true,"disabled":false,"overwrite":false,"maxTimeDiffSeconds":-1,"reconcileIntervalMinutes":10,"timeout":"0s","retries":0,"retryBackoff":"1s","maxConcurrency":0,"script":{"command":{"shell":"true"}},"logRetention":{"maxAge":"168h0m0s","maxBytesPerRun":"16MiB","maxTotalBytes":"256MiB"}}`)
	for _, name := range names {
		js := admin.JobStatus{Name: name, Status: admin.StatusOK, Leader: "a", Total: 2, Strategy: "AVG_ALLOCATION",
			Items: []admin.ItemStatus{{Item: 0, Instance: "a"}, {Item: 1, Instance: "a"}}, Eligible: []string{"a"},
			Definition: &admin.DefinitionStatus{Generation: 7, Writer: "a", Job: []byte(fmt.Sprintf(string(def), name))}}
		if name == "job-00003" {
			js.Status = admin.StatusDisabled
			js.Paused = &keyspace.PauseStreak{FailedInARow: 3, Reasons: []string{"fire 2026-12-04T01:00:00Z: item(s) [1] failed"}, PausedAt: time.Date(2026, 12, 4, 1, 0, 5, 0, time.UTC)}
			js.Slots = &admin.SlotsStatus{Limit: 2, InUse: 2, Waiting: []int{0, 1}}
		}
		if name == "job-00002" {
			js.Health = &admin.Health{State: admin.HealthFailing, Failing: []admin.FailingItem{{Item: 1, InARow: 4, Since: time.Date(2026, 12, 4, 1, 0, 0, 0, time.UTC)}},
				Late: []admin.LateItem{{Item: 0, Due: time.Date(2026, 12, 4, 1, 55, 0, 0, time.UTC)}}}
		}
		st.Jobs = append(st.Jobs, js)
	}
	return st
}

func (f *fakeCluster) names() []string {
	names := make([]string, f.n)
	for i := range names {
		names[i] = fmt.Sprintf("job-%05d", i)
	}
	return names
}

func (f *fakeCluster) Status(ctx context.Context) (*admin.ClusterStatus, error) {
	f.statuses.Add(1)
	if f.slow != nil {
		<-f.slow
	}
	return f.status(f.names()...), nil
}

func (f *fakeCluster) JobStatus(ctx context.Context, job string) (*admin.ClusterStatus, error) {
	if !strings.HasPrefix(job, "job-") {
		return f.status(), nil
	}
	return f.status(job), nil
}

func (f *fakeCluster) JobRuns(ctx context.Context, jobs []string) (map[string]admin.JobRuns, error) {
	out := map[string]admin.JobRuns{}
	now := time.Now()
	for _, j := range jobs {
		jr := admin.JobRuns{Records: map[int]keyspace.ItemRecord{}, Running: map[int]string{}}
		switch j {
		case "job-00001":
			jr.Running[0] = "a"
			jr.Records[0] = keyspace.ItemRecord{Job: j, State: keyspace.StateRunning, Fence: 90, Fire: now}
		case "job-00002":
			jr.Records[1] = keyspace.ItemRecord{Job: j, Item: 1, State: keyspace.StateFailed, Fence: 91, Fire: now, End: now, ExitCode: 3, Error: "exit status 3"}
			f := jr.Records[1]
			jr.LastFailure = &f
		case "job-00004": // failed half an hour ago; its latest run succeeded
			jr.Records[0] = keyspace.ItemRecord{Job: j, Item: 0, State: keyspace.StateDone, Fence: 95, Fire: now, End: now, ExitCode: 0}
			jr.LastFailure = &keyspace.ItemRecord{Job: j, Item: 0, State: keyspace.StateFailed, Fence: 93, End: now.Add(-30 * time.Minute), ExitCode: 1,
				Error: "exit status 1", Output: "connecting\nupstream timeout: bank API 504\n"}
		}
		out[j] = jr
	}
	return out, nil
}

func (f *fakeCluster) History(ctx context.Context, job string, item int) ([]keyspace.ItemRecord, error) {
	return []keyspace.ItemRecord{
		{Job: job, Item: 0, State: keyspace.StateDone, Source: keyspace.SourceNormal, Fence: 80, Fire: time.Now().Add(-time.Minute)},
		{Job: job, Item: 1, State: keyspace.StateKilled, Reason: keyspace.ReasonOperator, KilledBy: "token:alice", Source: keyspace.SourceManual, Param: "p<1>", Fence: 81, Fire: time.Now()},
	}, nil
}

func (f *fakeCluster) Audit(ctx context.Context, af admin.AuditFilter) ([]keyspace.AuditEntry, error) {
	return []keyspace.AuditEntry{{Time: time.Now(), Actor: "token:alice", Action: "kill", Job: "job-00001", Target: "item 0 of job job-00001", Outcome: keyspace.AuditOK}}, nil
}

// Definition and Versions: the definition's page is tested in a browser
// against a real etcd (internal/e2e); here, its template renders.
func (f *fakeCluster) Definition(ctx context.Context, job string) (*admin.Definition, error) {
	if !strings.HasPrefix(job, "job-") {
		return nil, fmt.Errorf("%w: no job %q", admin.ErrUnknownJob, job)
	}
	j, err := config.ParseJobJSON("fake", []byte(`{"name":"`+job+`","cron":"0 */5 * * * ?","script":{"command":{"argv":["/bin/true"]}}}`))
	if err != nil {
		return nil, err
	}
	return &admin.Definition{Name: job, Job: j, Generation: 7, Registered: keyspace.RegisteredConfig{Source: keyspace.SourceApplied, By: "token:dana", Version: 2}}, nil
}

func (f *fakeCluster) Versions(ctx context.Context, job string) ([]admin.Version, error) {
	return []admin.Version{{VersionRecord: keyspace.VersionRecord{Version: 2, By: "token:dana", Change: "apply"}, Generation: 7, Current: true,
		Diff: []config.FieldChange{{Field: "cron", Old: "0 * * * * ?", New: "0 */5 * * * ?"}}},
		{VersionRecord: keyspace.VersionRecord{Version: 1, By: "token:dana", Change: "apply"}, Generation: 5}}, nil
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

const (
	writeSecret = "write-secret-0123456789"
	readSecret  = "read-secret-0123456789"
)

func newTestConsole(f *fakeCluster, ts ...auth.Token) http.Handler {
	return New(Options{Instance: f.ID(), Admin: f, Auth: auth.New(ts, 0, false), Endpoints: []string{"https://127.0.0.1:2379"}, Version: "test", Logger: quiet, Warm: -1})
}

// session is what a browser keeps of a login: the cookie, and the key
// that the console's script keeps and sends.
type session struct {
	cookie *http.Cookie
	key    string
}

// add makes req a request of the session's, as the console's script makes
// them.
func (s *session) add(req *http.Request) {
	req.AddCookie(s.cookie)
	req.Header.Set(auth.KeyHeader, s.key)
}

// login logs in with secret as a browser does:
// the answer sets the session cookie and gives the page the session's key.
func login(t *testing.T, h http.Handler, secret string) *session {
	t.Helper()
	req := httptest.NewRequest("POST", "/login", strings.NewReader(url.Values{"token": {secret}, "next": {"/jobs"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	body := rec.Body.String()
	if rec.Code != http.StatusOK || !strings.Contains(body, `id="next" href="/jobs"`) {
		t.Fatalf("login: %d, want 200 and a way on to /jobs:\n%s", rec.Code, body)
	}
	if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
		t.Errorf("login's answer (with the key): Cache-Control %q, want no-store", cc)
	}
	s := &session{key: between(body, `<meta name="shardd-key" content="`, `"`)}
	if len(s.key) != 64 {
		t.Fatalf("login's answer gives the page no key:\n%s", body)
	}
	for _, c := range rec.Result().Cookies() {
		if c.Name == sessionCookieName {
			if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode {
				t.Errorf("session cookie %+v: want HttpOnly and SameSite=Strict", c)
			}
			if strings.Contains(c.Value, s.key) {
				t.Errorf("the session cookie holds the key")
			}
			s.cookie = c
			return s
		}
	}
	t.Fatal("login set no session cookie")
	return nil
}

const sessionCookieName = "shardd_session"

func get(h http.Handler, path string, s *session) (int, string, http.Header) {
	req := httptest.NewRequest("GET", path, nil)
	if s != nil {
		s.add(req)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String(), rec.Header()
}

func TestPages(t *testing.T) {
	f := &fakeCluster{n: 120}
	h := newTestConsole(f, auth.Token{Name: "alice", Role: auth.RoleWrite, Secret: writeSecret}, auth.Token{Name: "bob", Role: auth.RoleRead, Secret: readSecret})
	alice := login(t, h, writeSecret)
	tests := []struct {
		path string
		code int
		want []string
	}{
		{"/", 200, []string{"Instance <a href=\"/instances\">a</a> is DEGRADED: its last configuration reload was rejected (2026-12-04T01:00:00Z: 2 problems (job x: 2))", "1</strong> failing or late", "120</strong> jobs", "1</strong> running now", "2</strong> failed in the last hour", "1</strong> disabled", "exit status 3", "upstream timeout: bank API 504"}},
		{"/jobs?filter=failed-last-hour", 200, []string{"2 job(s)", `href="/jobs/job-00002"`, `href="/jobs/job-00004"`}},
		{"/jobs", 200, []string{"120 job(s), page 1 of 3", `href="/jobs/job-00000"`, "1 running", "(1 failing)", `rel="next"`, "Disable selected"}},
		{"/jobs?page=3", 200, []string{"page 3 of 3", `href="/jobs/job-00119"`, `rel="prev"`}},
		{"/jobs?q=0011", 200, []string{"11 job(s)", `href="/jobs/job-00110"`}},
		{"/jobs?filter=running", 200, []string{"1 job(s)", `href="/jobs/job-00001"`}},
		{"/jobs?filter=failing", 200, []string{"1 job(s)", `href="/jobs/job-00002"`}},
		{"/jobs?q=nothing-like-this", 200, []string{"No job matches."}},
		{"/jobs/job-00001", 200, []string{"RUNNING on a", "failover on", "<code>0 */5 * * * ?</code> (UTC); next:", `id="kill-0"`, `data-url="/api/v1/jobs/job-00001/kill?item=0&amp;fence=90&amp;instance=a&amp;wait=5s"`, "Kill the run of item 0 on a (fence 90)?", `id="run-now"`, `id="rerun"`, "KILLED/operator", "killed by token:alice", "p&lt;1&gt;", `id="disable-item-1"`}},
		{"/jobs/job-00002?run=91-1", 200, []string{`data-src="/api/v1/jobs/job-00002/runs/91-1/log"`, "Log of run 91-1"}},
		{"/jobs/job-00002?result=KILLED", 200, []string{"KILLED/operator"}},
		{"/jobs?filter=failing", 200, []string{`href="/jobs/job-00002"`, "FAILING 1/2"}},
		{"/jobs/job-00002", 200, []string{`id="job-health">FAILING<`, "map OK", `id="health"`, "FAILING", "item 1 failed its last 4 runs (since 2026-12-04 01:00:00Z)", "item 0 is late: its fire of 2026-12-04 01:55:00Z has not run", "no success in etcd's records"}},
		{"/jobs/job-00002?item=x", 200, []string{"item must be a number"}},
		{"/jobs/job-00002?run=../../x", 200, []string{"is not a run (FENCE-ITEM"}},
		{"/jobs/nope", 404, []string{`no job &#34;nope&#34;`, `href="/jobs?q=nope"`}},
		{"/jobs/jbo-00001", 404, []string{`(did you mean job-00001?)`, `href="/jobs/job-00001"`}},
		{"/jobs/job-00003", 200, []string{"disabled: its fires do not run (next would be"}},
		{"/jobs/job-00002", 200, []string{`id="definition"`, "&#34;cron&#34;: &#34;0 */5 * * * ?&#34;", `<datalist id="past-fires">`}},
		{"/instances", 200, []string{"h1", "<td>240</td>", "<td>120</td>", `id="reload-rejected-a"`, "3 voting member(s), 2 up, quorum 2", "tolerates 0 more failure(s)", `<td>1: <a href="/jobs/job-00001">job-00001</a>/0</td>`, "up, leader", "3.0 MiB (1.0 MiB)", ">DOWN<", "etcd member n3 (fd422379fda50e48) is down (it does not answer from here): context deadline exceeded", "one more down and it loses its quorum"}},
		{"/audit", 200, []string{"token:alice", "item 0 of job job-00001"}},
		{"/no/such/page", 404, []string{"no page /no/such/page"}},
	}
	for _, tt := range tests {
		code, body, hdr := get(h, tt.path, alice)
		if code != tt.code {
			t.Errorf("GET %s = %d, want %d", tt.path, code, tt.code)
		}
		for _, w := range tt.want {
			if !strings.Contains(body, w) {
				t.Errorf("GET %s: no %q in the page", tt.path, w)
			}
		}
		if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
			t.Errorf("GET %s: CSP %q", tt.path, csp)
		}
	}
	if code, body, _ := get(h, "/static/console.js", nil); code != 200 || !strings.Contains(body, `"X-Shardd-Key"`) {
		t.Errorf("GET /static/console.js = %d", code)
	}
}

// A read-role login sees every page and no action; without a login, pages
// redirect to the login when some token has the read role.
func TestRolesAndLogin(t *testing.T) {
	f := &fakeCluster{n: 5}
	h := newTestConsole(f, auth.Token{Name: "alice", Role: auth.RoleWrite, Secret: writeSecret}, auth.Token{Name: "bob", Role: auth.RoleRead, Secret: readSecret})
	if code, _, hdr := get(h, "/jobs/job-00001?item=1", nil); code != http.StatusSeeOther || hdr.Get("Location") != "/login?next="+url.QueryEscape("/jobs/job-00001?item=1") {
		t.Errorf("anonymous GET = %d to %q, want a redirect to the login", code, hdr.Get("Location"))
	}
	bob := login(t, h, readSecret)
	for _, p := range []string{"/jobs", "/jobs/job-00001"} {
		code, body, _ := get(h, p, bob)
		if code != 200 || !strings.Contains(body, "bob") {
			t.Errorf("GET %s as bob = %d", p, code)
		}
		for _, no := range []string{`class="act`, "bulk-act", `id="kill-0"`, `id="run-now"`} {
			if strings.Contains(body, no) {
				t.Errorf("GET %s as a read-role login shows %q", p, no)
			}
		}
	}
	// A wrong token is refused, saying so; no cookie is set.
	req := httptest.NewRequest("POST", "/login", strings.NewReader("token=not-a-token-at-all"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "not the secret of any of this instance") || len(rec.Result().Cookies()) != 0 {
		t.Errorf("wrong token login: %d, cookies %v", rec.Code, rec.Result().Cookies())
	}
	// A login from another site's page is refused.
	req = httptest.NewRequest("POST", "/login", strings.NewReader("token="+writeSecret))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://evil.example")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusForbidden {
		t.Errorf("cross-origin login: %d, want 403", rec.Code)
	}
	// Logout without the key (the form the page's script fills) clears
	// the cookie and ends nothing; with it, it ends the session.
	logout := func(key string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/logout", strings.NewReader(url.Values{"key": {key}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(bob.cookie)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	rec = logout("")
	if c := rec.Result().Cookies(); rec.Code != http.StatusSeeOther || len(c) != 1 || c[0].MaxAge >= 0 {
		t.Errorf("logout without the key: %d, cookies %v; want 303 and the cookie cleared", rec.Code, c)
	}
	if code, body, _ := get(h, "/jobs", bob); code != 200 || !strings.Contains(body, "bob") {
		t.Errorf("GET after a logout without the key = %d, want bob's page", code)
	}
	if rec = logout(bob.key); rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/login?bye=1" {
		t.Errorf("logout: %d to %q", rec.Code, rec.Header().Get("Location"))
	}
	if code, _, hdr := get(h, "/jobs", bob); code != http.StatusSeeOther || !strings.Contains(hdr.Get("Location"), "expired=1") {
		t.Errorf("GET after logout = %d to %q, want a redirect to the login", code, hdr.Get("Location"))
	}
}

func between(s, from, to string) string {
	_, rest, _ := strings.Cut(s, from)
	v, _, _ := strings.Cut(rest, to)
	return v
}

// Without a read-role token, pages are open and show no action to an
// anonymous visitor.
func TestOpenReads(t *testing.T) {
	h := newTestConsole(&fakeCluster{n: 3}, auth.Token{Name: "alice", Role: auth.RoleWrite, Secret: writeSecret})
	code, body, _ := get(h, "/jobs/job-00001", nil)
	if code != 200 || strings.Contains(body, `class="act`) || !strings.Contains(body, `id="login-link"`) {
		t.Errorf("anonymous job page: %d, actions shown %v", code, strings.Contains(body, `class="act`))
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{"/jobs?q=a": "/jobs?q=a", "/jobs/a?run=5-0#log": "/jobs/a?run=5-0#log", "//evil.example/x": "/", "/\\evil.example": "/",
		"/./\\evil.example/x": "/", "/\t/evil.example/x": "/", "https://evil.example": "/", "": "/"} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

// Pages served while the snapshot is stale start one refresh, not one
// each, and show the stale snapshot meanwhile.
func TestSnapshotRefreshesOnce(t *testing.T) {
	f := &fakeCluster{n: 3}
	now := time.Now()
	var mu sync.Mutex
	c := New(Options{Instance: f.ID(), Admin: f, Auth: auth.New(nil, 0, false), Logger: quiet, MaxAge: time.Second, Warm: -1,
		Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	if code, _, _ := get(c, "/jobs", nil); code != 200 || f.statuses.Load() != 1 {
		t.Fatalf("first page: %d, %d reads", code, f.statuses.Load())
	}
	f.slow = make(chan struct{})
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if code, body, _ := get(c, "/jobs", nil); code != 200 || !strings.Contains(body, "data as of 2s ago") {
				t.Errorf("stale page: %d", code)
			}
		}()
	}
	wg.Wait() // the pages did not wait for the slow read
	close(f.slow)
	s := &c.(*console).snap
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		busy := s.refreshing != nil
		s.mu.Unlock()
		if !busy || time.Now().After(deadline) {
			break
		}
	}
	if n := f.statuses.Load(); n != 2 {
		t.Errorf("%d reads for 10 pages on a stale snapshot, want 1 more", n-1)
	}
}

// BenchmarkJobsPage10k measures a page of the job list of 10,000 jobs
// served from a snapshot: the search and the rendering, not etcd.
func BenchmarkJobsPage10k(b *testing.B) {
	h := newTestConsole(&fakeCluster{n: 10000})
	get(h, "/jobs", nil) // the snapshot
	for _, path := range []string{"/jobs?page=100", "/jobs?q=0999", "/jobs?filter=failing", "/"} {
		b.Run(path, func(b *testing.B) {
			for b.Loop() {
				if code, _, _ := get(h, path, nil); code != 200 {
					b.Fatal(code)
				}
			}
		})
	}
}

// A snapshot older than a minute is not shown: the page waits for a fresh
// one.
func TestVeryStaleSnapshotIsNotShown(t *testing.T) {
	f := &fakeCluster{n: 3}
	now := time.Now()
	var mu sync.Mutex
	c := New(Options{Instance: f.ID(), Admin: f, Auth: auth.New(nil, 0, false), Logger: quiet, Warm: -1,
		Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	get(c, "/jobs", nil)
	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	code, body, _ := get(c, "/jobs", nil)
	if code != 200 || strings.Contains(body, "data as of 2m") || f.statuses.Load() != 2 {
		t.Errorf("page after 2 minutes: %d, %d reads, stale shown: %v", code, f.statuses.Load(), strings.Contains(body, "data as of 2m"))
	}
}

// With etcd down, a page answers within PageWait: the last snapshot with
// a warning that says how old it is, or, with none, an error naming etcd.
func TestEtcdDownPagesAnswerFast(t *testing.T) {
	f := &fakeCluster{n: 3}
	now := time.Now()
	var mu sync.Mutex
	c := New(Options{Instance: f.ID(), Admin: f, Auth: auth.New(nil, 0, false), Logger: quiet, PageWait: 200 * time.Millisecond, Warm: -1,
		Endpoints: []string{"https://127.0.0.1:2379"}, Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	get(c, "/jobs", nil)
	f.slow = make(chan struct{}) // etcd stops answering
	defer close(f.slow)
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	start := time.Now()
	code, body, _ := get(c, "/jobs", nil)
	if took := time.Since(start); code != 200 || took > 2*time.Second || !strings.Contains(body, "this is the cluster as it was 1m0s ago") {
		t.Errorf("jobs page with etcd down: %d after %s; warning shown: %v", code, took, strings.Contains(body, "as it was"))
	}
	fresh := New(Options{Instance: "a", Admin: &fakeCluster{n: 3, slow: f.slow}, Auth: auth.New(nil, 0, false), Logger: quiet, PageWait: 200 * time.Millisecond, Warm: -1,
		Endpoints: []string{"https://127.0.0.1:2379"}})
	code, body, _ = get(fresh, "/", nil)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "etcd at https://127.0.0.1:2379 has not answered within 200ms") {
		t.Errorf("overview of an instance that never read etcd, etcd down: %d\n%s", code, between(body, `id="error">`, "<"))
	}
}

// After a write through the API, the next page shows the cluster as it is
// now, not the snapshot from before the write.
func TestWriteMakesTheNextPageFresh(t *testing.T) {
	f := &fakeCluster{n: 3}
	c := New(Options{Instance: f.ID(), Admin: f, Auth: auth.New(nil, 0, false), Logger: quiet, Warm: -1})
	get(c, "/jobs", nil)
	get(c, "/jobs", nil)
	if n := f.statuses.Load(); n != 1 {
		t.Fatalf("%d reads for two pages within MaxAge, want 1", n)
	}
	Invalidate(c)
	get(c, "/jobs", nil)
	if n := f.statuses.Load(); n != 2 {
		t.Errorf("%d reads: the page after a write did not read the cluster again", n)
	}
}

// toggleCluster is fakeCluster whose job-00000 is DISABLED once disabled is
// set. Status reads the state when it begins, as a read of etcd does at its
// revision, and then, while gate is set, says so on entered and waits for
// gate to close.
type toggleCluster struct {
	fakeCluster
	disabled atomic.Bool
	mu       sync.Mutex
	gate     chan struct{}
	entered  chan struct{}
}

func (f *toggleCluster) Status(ctx context.Context) (*admin.ClusterStatus, error) {
	st := f.fakeCluster.status(f.names()...)
	if f.disabled.Load() {
		st.Jobs[0].Status = admin.StatusDisabled
	}
	f.mu.Lock()
	gate, entered := f.gate, f.entered
	f.gate, f.entered = nil, nil // one read waits
	f.mu.Unlock()
	if gate != nil {
		close(entered)
		<-gate
	}
	return st, nil
}

// holdNextRead makes the next read of f wait, once it has read the
// cluster, until release is called; entered is closed when it has.
func (f *toggleCluster) holdNextRead() (entered <-chan struct{}, release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	gate, in := make(chan struct{}), make(chan struct{})
	f.gate, f.entered = gate, in
	return in, func() { close(gate) }
}

// waitIdle waits until no read of the console's snapshot is in progress.
func waitIdle(t *testing.T, h http.Handler) {
	t.Helper()
	s := &h.(*console).snap
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		busy := s.refreshing != nil
		s.mu.Unlock()
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the snapshot's read did not end within 10s")
		}
	}
}

// A write through the API (Invalidate) while a background read of the
// snapshot is in progress, a read that began before the write: the next
// page shows the cluster after the write, not what that read saw, whether
// the page comes after the read ended or while it still goes on.
func TestWriteDuringARefreshMakesTheNextPageFresh(t *testing.T) {
	for _, pageDuringRead := range []bool{false, true} {
		t.Run(fmt.Sprintf("page during the read %v", pageDuringRead), func(t *testing.T) {
			f := &toggleCluster{fakeCluster: fakeCluster{n: 3}}
			var (
				nowMu sync.Mutex
				now   = time.Now()
				onNow func()
			)
			clock := func() time.Time {
				nowMu.Lock()
				defer nowMu.Unlock()
				if onNow != nil {
					onNow()
				}
				return now
			}
			h := New(Options{Instance: f.ID(), Admin: f, Auth: auth.New(nil, 0, false), Endpoints: []string{"https://127.0.0.1:2379"}, Version: "test", Logger: quiet, Warm: -1, Now: clock})
			page := func() string {
				_, body, _ := get(h, "/jobs?q=job-00000", nil)
				return body
			}
			if strings.Contains(page(), "DISABLED") {
				t.Fatal("job-00000 is DISABLED before the write")
			}
			// 6 s later (past MaxAge) a page starts a background read,
			// which reads the cluster before the write...
			nowMu.Lock()
			now = now.Add(6 * time.Second)
			nowMu.Unlock()
			entered, release := f.holdNextRead()
			var once sync.Once
			t.Cleanup(func() { once.Do(release) })
			page()
			<-entered
			// ...then job-00000 is disabled through the API...
			f.disabled.Store(true)
			Invalidate(h)
			// ...and the read ends with what it saw before the write.
			var p string
			if pageDuringRead {
				// The read ends once the next page has taken the
				// snapshot's lock: a page reads the clock first for
				// itself, then, under that lock, to age the snapshot.
				calls := 0
				nowMu.Lock()
				onNow = func() {
					if calls++; calls == 2 {
						once.Do(release)
					}
				}
				nowMu.Unlock()
				p = page()
				nowMu.Lock()
				onNow = nil
				nowMu.Unlock()
				if calls < 2 {
					t.Fatalf("the page read the clock %d time(s); the test releases the read at the second", calls)
				}
			} else {
				once.Do(release)
				waitIdle(t, h)
				p = page()
			}
			if !strings.Contains(p, "DISABLED") {
				warned := strings.Contains(p, "etcd did not answer") || strings.Contains(p, "has not answered")
				t.Fatalf("after the disable (and Invalidate) the jobs page shows job-00000 not DISABLED (warning shown: %v): the read begun before the write made it look fresh", warned)
			}
		})
	}
}

// While pages are asked for, the snapshot is read again in the background
// every MaxAge: a page in use does not wait for a read.
func TestSnapshotKeptWarmWhileUsed(t *testing.T) {
	f := &fakeCluster{n: 3}
	c := New(Options{Instance: f.ID(), Admin: f, Auth: auth.New(nil, 0, false), Logger: quiet, MaxAge: 50 * time.Millisecond, Warm: 300 * time.Millisecond})
	get(c, "/jobs", nil)
	deadline := time.Now().Add(5 * time.Second)
	for f.statuses.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := f.statuses.Load(); n < 3 {
		t.Fatalf("%d reads in the background after a page, want refreshes every 50 ms", n)
	}
	time.Sleep(600 * time.Millisecond) // Warm has passed since the page
	n := f.statuses.Load()
	time.Sleep(300 * time.Millisecond)
	if m := f.statuses.Load(); m != n {
		t.Errorf("%d reads after the console went unused, want none", m-n)
	}
}

// The re-run form's past fires name one instant each: a time the clocks
// showed twice (the hourly job fired at both 02:00s) carries its offset.
func TestPastFiresAroundTheClocksGoingBack(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	s, err := sched.Parse("0 0 * * * ?", berlin)
	if err != nil {
		t.Fatal(err)
	}
	j := &config.Job{Name: "hourly", Cron: config.CronList{"0 0 * * * ?"}, Schedule: s, Location: berlin}
	got := pastFires(j, time.Date(2026, 10, 25, 3, 30, 0, 0, berlin), 4)
	want := []string{"2026-10-25 03:00:00", "2026-10-25T02:00:00+01:00", "2026-10-25T02:00:00+02:00", "2026-10-25 01:00:00"}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("pastFires = %q, want %q", got, want)
	}
}

// The job page shows the history the console's History answers (the
// cluster's, merged): the page, the link to the next one with the
// filters kept, the instances not reached, a row from a log alone with
// its last line and its tries; the read token of the session goes along.
func TestJobPageShowsTheMergedHistory(t *testing.T) {
	f := &fakeCluster{n: 3}
	var asked []history.Query
	var secrets []string
	t0 := time.Now().Add(-time.Hour)
	fromLog := history.Run{ItemRecord: keyspace.ItemRecord{Job: "job-00001", Item: 1, Fence: 42, Attempt: 1, Fire: t0, Start: t0, End: t0.Add(3 * time.Second),
		State: keyspace.StateFailed, ExitCode: 3, Error: "exit status 3", Instance: "b", LastLine: "no route to db-1"}, Log: "42-1",
		Tries: []runlog.Try{{Start: t0, Finish: t0.Add(time.Second)}, {Start: t0.Add(2 * time.Second), Finish: t0.Add(3 * time.Second)}}}
	h := New(Options{Instance: f.ID(), Admin: f, Warm: -1, Logger: quiet,
		Auth: auth.New([]auth.Token{{Name: "bob", Role: auth.RoleRead, Secret: readSecret}}, 0, false),
		History: func(ctx context.Context, job string, q history.Query, secret string) (history.Answer, error) {
			asked, secrets = append(asked, q), append(secrets, secret)
			return history.Answer{Runs: []history.Run{fromLog}, Next: fromLog.Cursor().String(), Unreachable: map[string]string{"c": "its API at http://h3:8080 did not answer"}}, nil
		}})
	bob := login(t, h, readSecret)
	code, body, _ := get(h, "/jobs/job-00001?result=FAILED&since=7d&item=1", bob)
	if code != 200 {
		t.Fatalf("GET job page: %d\n%s", code, body)
	}
	for _, want := range []string{"no route to db-1", "FAILED (2 tries)", `href="/jobs/job-00001?run=42-1#log"`, "Instance c was not reached", `id="older"`, "before=" + url.QueryEscape(fromLog.Cursor().String()), "result=FAILED"} {
		if !strings.Contains(body, want) && !strings.Contains(body, strings.ReplaceAll(want, "&", "&amp;")) {
			t.Errorf("no %q in the page", want)
		}
	}
	if len(asked) != 1 || asked[0].Item != 1 || asked[0].Result != "FAILED" || time.Since(asked[0].Since) < 7*24*time.Hour-time.Minute || secrets[0] != readSecret {
		t.Errorf("History asked %+v with %q", asked, secrets)
	}
	// The next page's link asks below the cursor.
	get(h, "/jobs/job-00001?before="+url.QueryEscape(fromLog.Cursor().String()), bob)
	if len(asked) != 2 || asked[1].Before == nil || asked[1].Before.Fence != 42 {
		t.Errorf("the older page asked %+v", asked[len(asked)-1])
	}
}

// A job paused by its failures, and its cluster slots, are shown to every
// session, a reader's too (not in the actions, which only a writer sees).
func TestJobPageShowsPauseAndSlots(t *testing.T) {
	f := &fakeCluster{n: 4}
	h := newTestConsole(f, auth.Token{Name: "bob", Role: auth.RoleRead, Secret: readSecret})
	_, body, _ := get(h, "/jobs/job-00003", login(t, h, readSecret))
	for _, want := range []string{`id="job-paused"`, `id="job-paused-badge"`, "PAUSED after 3 failed fires in a row", "item(s) [1] failed", `id="job-slots"`, "2 of 2 in use", "waiting for one: item(s) 0, 1"} {
		if !strings.Contains(body, want) {
			t.Errorf("a reader's job page lacks %q", want)
		}
	}
	// The jobs list says PAUSED, not DISABLED, and counts it among the
	// disabled.
	cookie := login(t, h, readSecret)
	_, list, _ := get(h, "/jobs?filter=disabled", cookie)
	if !strings.Contains(list, `<td class="st-paused">PAUSED</td>`) || strings.Contains(list, ">DISABLED<") {
		t.Errorf("the disabled jobs' list does not show job-00003 PAUSED:\n%s", list)
	}
}

// The definition page: a define session gets the editor and a rollback
// per kept version; a write session (and a reader) the YAML only.
func TestDefinitionPage(t *testing.T) {
	f := &fakeCluster{n: 3}
	h := newTestConsole(f, auth.Token{Name: "alice", Role: auth.RoleWrite, Secret: writeSecret}, auth.Token{Name: "dana", Role: auth.RoleDefine, Secret: "define-secret-0123456789"})
	dana, alice := login(t, h, "define-secret-0123456789"), login(t, h, writeSecret)
	code, body, _ := get(h, "/jobs/job-00001/definition", dana)
	for _, w := range []string{`id="def-yaml"`, "cron: 0 */5 * * * ?", `id="def-check"`, `data-url="/api/v1/definitions/job-00001/rollback?to=1"`, "applied by token:dana", "2 (generation 7)", "<code>cron</code>: 0 * * * * ? → 0 */5 * * * ?"} {
		if code != 200 || !strings.Contains(body, w) {
			t.Errorf("define session: %d, no %q in the page", code, w)
		}
	}
	if strings.Contains(body, `rollback?to=2`) {
		t.Error("the registered version has a rollback button")
	}
	_, body, _ = get(h, "/jobs/job-00001/definition", alice)
	if strings.Contains(body, `id="def-yaml"`) || strings.Contains(body, "rollback?to=") || !strings.Contains(body, `id="def-text"`) {
		t.Errorf("a write session gets the editor or a rollback, or no YAML:\n%s", body)
	}
	if _, body, _ := get(h, "/jobs", dana); !strings.Contains(body, `id="new-job"`) {
		t.Error("no New job link for a define session")
	}
	if _, body, _ := get(h, "/jobs", alice); strings.Contains(body, `id="new-job"`) {
		t.Error("a New job link for a write session")
	}
	if code, _, _ := get(h, "/jobs/nope/definition", dana); code != 404 {
		t.Errorf("definition of an unknown job: %d", code)
	}
}
