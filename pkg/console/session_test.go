package console

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/api"
	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// apiCluster is fakeCluster with what the API needs besides; it records
// the writes and the audit.
type apiCluster struct {
	*fakeCluster
	mu       sync.Mutex
	disabled []admin.Target
	audit    []keyspace.AuditEntry
}

var errNoWrites = errors.New("apiCluster: no definitions are written here")

func (a *apiCluster) Apply(ctx context.Context, jobs []*config.Job, o admin.ApplyOptions) ([]admin.ApplyResult, error) {
	return nil, errNoWrites
}
func (a *apiCluster) DeleteApplied(ctx context.Context, job, by string, wait time.Duration) (bool, error) {
	return false, errNoWrites
}
func (a *apiCluster) Rollback(ctx context.Context, job string, to int64, by string) (admin.ApplyResult, error) {
	return admin.ApplyResult{}, errNoWrites
}

func (a *apiCluster) Instances(ctx context.Context) ([]keyspace.InstanceInfo, error) {
	return []keyspace.InstanceInfo{{ID: a.ID()}}, nil
}
func (a *apiCluster) RecentRuns(ctx context.Context, job string, item int) ([]keyspace.ItemRecord, error) {
	return a.History(ctx, job, item)
}
func (a *apiCluster) Up() bool                              { return true }
func (a *apiCluster) Impaired() error                       { return nil }
func (a *apiCluster) View(job string) (coord.JobView, bool) { return coord.JobView{}, false }
func (a *apiCluster) Trigger(ctx context.Context, r admin.TriggerRequest) (admin.Triggered, error) {
	return admin.Triggered{}, errors.New("no trigger in this test")
}
func (a *apiCluster) Kill(ctx context.Context, r admin.KillRequest) (admin.Killing, error) {
	return admin.Killing{}, errors.New("no kill in this test")
}
func (a *apiCluster) WaitKill(ctx context.Context, job string, k keyspace.Kill) ([]admin.KillResult, error) {
	return nil, nil
}
func (a *apiCluster) SetDisabled(ctx context.Context, t admin.Target, on, force bool) (admin.Disabling, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.disabled = append(a.disabled, t)
	return admin.Disabling{Target: t, Changed: true, Disabled: on, Message: t.String() + " disabled"}, nil
}
func (a *apiCluster) Remove(ctx context.Context, job string) (int64, error) { return 0, nil }
func (a *apiCluster) RecordAudit(ctx context.Context, e keyspace.AuditEntry) (keyspace.AuditEntry, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.audit = append(a.audit, e)
	return e, nil
}

// newInstance is the API with the console, as shardd serves them.
func newInstance(ac *apiCluster, ts ...auth.Token) http.Handler {
	au := auth.New(ts, 0, false)
	ui := New(Options{Instance: ac.ID(), Admin: ac, Auth: au, Endpoints: []string{"https://127.0.0.1:2379"}, Version: "test", Logger: quiet, Warm: -1})
	return api.Handler(api.Options{Instance: ac, Admin: ac, Auth: au, UI: ui, Logger: quiet})
}

// A browser sends a host's cookies to every port of the host: another
// local user's server on another port receives the console's session
// cookie, and replays it to this instance's port with any header it
// likes. With the cookie alone it reads no page and no API endpoint
// (reads need a token here), finds no CSRF token or key to go with it,
// changes nothing and cannot log the operator out; the operator's
// session, with its key, goes on.
func TestSessionCookieAloneGivesNothing(t *testing.T) {
	ac := &apiCluster{fakeCluster: &fakeCluster{n: 5}}
	h := newInstance(ac, auth.Token{Name: "alice", Role: auth.RoleWrite, Secret: writeSecret}, auth.Token{Name: "bob", Role: auth.RoleRead, Secret: readSecret})
	req := httptest.NewRequest("POST", "/login", strings.NewReader(url.Values{"token": {writeSecret}, "next": {"/jobs"}}.Encode()))
	req.Host = "127.0.0.1:9741"
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	login := httptest.NewRecorder()
	h.ServeHTTP(login, req)
	var cookie string // the Cookie header the other server received
	for _, c := range login.Result().Cookies() {
		if c.Name == sessionCookieName {
			cookie = c.Name + "=" + c.Value
		}
	}
	if cookie == "" {
		t.Fatalf("login: %d, no session cookie", login.Code)
	}
	replay := func(method, path, body string, header map[string]string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Host = "127.0.0.1:9741"
		req.RemoteAddr = "127.0.0.1:40000"
		req.Header.Set("Cookie", cookie)
		if body != "" {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}

	// Reads: what the pages would show, and anything to act with.
	var found []string
	for _, p := range []string{"/", "/jobs", "/jobs/job-00001", "/jobs/job-00001?run=90-0", "/instances", "/audit", "/no/such/page", "/login"} {
		rec := replay("GET", p, "", nil)
		body := rec.Body.String()
		for _, secret := range []string{"job-00001", "job-00002", "alice", "<td>h1</td>", `class="act`} {
			if strings.Contains(body, secret) {
				t.Errorf("GET %s with the cookie alone: %d, the answer shows %q", p, rec.Code, secret)
			}
		}
		for _, attr := range []string{`name="csrf" content="`, `name="shardd-key" content="`} {
			if v := between(body, attr, `"`); v != "" {
				found = append(found, v)
			}
		}
	}
	for _, p := range []string{"/api/v1/jobs", "/api/v1/jobs/job-00001", "/api/v1/jobs/job-00001/history", "/api/v1/instances", "/api/v1/audit", "/api/v1/jobs/job-00001/runs/90-0/log"} {
		if rec := replay("GET", p, "", nil); rec.Code != http.StatusUnauthorized {
			t.Errorf("GET %s with the cookie alone: %d, want 401\n%s", p, rec.Code, rec.Body)
		}
	}
	if len(found) > 0 {
		t.Errorf("pages given to the cookie alone hold %d token(s) to act with", len(found))
	}

	// Writes, with whatever was found or guessed.
	for _, v := range append(found, "", "none") {
		for _, hdr := range []string{"X-Shardd-CSRF", "X-Shardd-Key"} {
			if rec := replay("POST", "/api/v1/jobs/job-00001/disable", "", map[string]string{hdr: v}); rec.Code < 400 {
				t.Errorf("POST disable with the cookie and %s %q: %d %s", hdr, v, rec.Code, rec.Body)
			}
		}
	}
	if len(ac.disabled) != 0 {
		t.Errorf("the cookie alone disabled %v", ac.disabled)
	}
	for _, e := range ac.audit {
		if e.Actor == "token:alice" {
			t.Errorf("audited as the operator: %+v", e)
		}
	}

	// Logout with the cookie alone ends nothing.
	for _, v := range append(found, "") {
		replay("POST", "/logout", url.Values{"csrf": {v}, "key": {v}}.Encode(), nil)
	}

	// The operator, with the key the login gave the page, reads and acts.
	key := between(login.Body.String(), `<meta name="shardd-key" content="`, `"`)
	rec := replay("GET", "/jobs/job-00001", "", map[string]string{"X-Shardd-Key": key})
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), "alice") || !strings.Contains(rec.Body.String(), `id="disable-item-1"`) {
		t.Errorf("the operator's page, with the session's key: %d\n%s", rec.Code, rec.Body)
	}
	if rec := replay("POST", "/api/v1/jobs/job-00001/disable?item=1", "", map[string]string{"X-Shardd-Key": key}); rec.Code != 200 {
		t.Errorf("the operator's disable, with the session's key: %d %s", rec.Code, rec.Body)
	}
	if len(ac.audit) != 1 || ac.audit[0].Actor != "token:alice" || ac.audit[0].Target != "item 1 of job job-00001" {
		t.Errorf("audit %+v, want the operator's disable only", ac.audit)
	}
}

// Where reads are open, the cookie alone gets no more than anyone does:
// not the operator's login, not an action.
func TestSessionCookieAloneGivesNothingWhenReadsAreOpen(t *testing.T) {
	ac := &apiCluster{fakeCluster: &fakeCluster{n: 5}}
	h := newInstance(ac, auth.Token{Name: "alice", Role: auth.RoleWrite, Secret: writeSecret})
	s := login(t, h, writeSecret)
	for _, withKey := range []bool{false, true} {
		req := httptest.NewRequest("GET", "/jobs/job-00001", nil)
		req.AddCookie(s.cookie)
		if withKey {
			req.Header.Set(auth.KeyHeader, "a guess")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if body := rec.Body.String(); rec.Code != 200 || strings.Contains(body, `id="who"`) || strings.Contains(body, `class="act`) {
			t.Errorf("the job page for the cookie (key sent: %v): %d, shows the operator or an action:\n%s", withKey, rec.Code, body)
		}
	}
}

// A navigation (which sends the cookie only) gets the bootstrap page, with
// no data, whose script asks again with the key; with a wrong key the
// answer is what anyone gets: the login, saying the session has expired.
func TestNavigationGetsTheBootstrap(t *testing.T) {
	h := newTestConsole(&fakeCluster{n: 3}, auth.Token{Name: "alice", Role: auth.RoleWrite, Secret: writeSecret}, auth.Token{Name: "bob", Role: auth.RoleRead, Secret: readSecret})
	s := login(t, h, writeSecret)
	req := httptest.NewRequest("GET", "/jobs/job-00001?run=90-0", nil)
	req.AddCookie(s.cookie)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	body := rec.Body.String()
	if rec.Code != 200 || !strings.Contains(body, `id="boot"`) || !strings.Contains(body, `<script src="/static/console.js" defer></script>`) || strings.Contains(body, "job-00001") {
		t.Errorf("navigation with the cookie: %d\n%s", rec.Code, body)
	}
	if rec.Header().Get("Cache-Control") != "no-store" || !strings.Contains(rec.Header().Get("Content-Security-Policy"), "script-src 'self'") {
		t.Errorf("bootstrap's headers %v", rec.Header())
	}
	req = httptest.NewRequest("GET", "/jobs/job-00001", nil)
	req.AddCookie(s.cookie)
	req.Header.Set(auth.KeyHeader, "none")
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != "/login?next=%2Fjobs%2Fjob-00001&expired=1" {
		t.Errorf("page asked for with a wrong key: %d to %q, want the login", rec.Code, rec.Header().Get("Location"))
	}
	if code, body, _ := get(h, "/jobs/job-00001", s); code != 200 || !strings.Contains(body, "alice") || strings.Contains(body, `id="boot"`) {
		t.Errorf("page asked for with the key: %d", code)
	}
}

// Logins are limited per source address, before the secret is looked
// at: attempts in parallel from one address get 429 beyond the budget,
// saying how long to wait, the right secret too; another address still
// logs in.
func TestLoginRateLimit(t *testing.T) {
	h := newTestConsole(&fakeCluster{n: 3}, auth.Token{Name: "alice", Role: auth.RoleWrite, Secret: writeSecret})
	post := func(secret, remote string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/login", strings.NewReader(url.Values{"token": {secret}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.RemoteAddr = remote
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	const n = 40
	start := time.Now()
	recs := make([]*httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { recs[i] = post("wrong-secret-0123456789-"+string(rune('a'+i%26)), "192.0.2.7:40000") })
	}
	wg.Wait()
	// The budget: 10, and one more every 6 s the attempts took.
	budget := 10 + int(time.Since(start)/(6*time.Second))
	tried, limited := 0, 0
	for _, rec := range recs {
		switch rec.Code {
		case http.StatusUnauthorized:
			tried++
		case http.StatusTooManyRequests:
			limited++
			if body := rec.Body.String(); !strings.Contains(body, "too many login attempts from 192.0.2.7 (at most 10 a minute from one address): try again in") || rec.Header().Get("Retry-After") == "" {
				t.Errorf("429 says %q, Retry-After %q", between(body, `class="problem" role="alert">`, "<"), rec.Header().Get("Retry-After"))
			}
		default:
			t.Errorf("wrong secret: %d", rec.Code)
		}
	}
	t.Logf("%d wrong secrets in parallel from one address: %d tried, %d refused (429)", n, tried, limited)
	if tried > budget || limited == 0 {
		t.Errorf("%d attempts in parallel from one address: %d tried, %d refused; want at most %d tried", n, tried, limited, budget)
	}
	if rec := post(writeSecret, "192.0.2.7:40001"); rec.Code != http.StatusTooManyRequests || len(rec.Result().Cookies()) != 0 {
		t.Errorf("the right secret from the address over its budget: %d, cookies %v; want 429 and no session", rec.Code, rec.Result().Cookies())
	}
	if rec := post(writeSecret, "192.0.2.8:40000"); rec.Code != http.StatusOK || len(rec.Result().Cookies()) != 1 {
		t.Errorf("login from another address: %d, want 200 and a session", rec.Code)
	}
}
