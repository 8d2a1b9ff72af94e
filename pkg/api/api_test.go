package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// fakeCluster records what the API asked of it.
type fakeCluster struct {
	up          bool
	impaired    error
	refuse      bool
	trigger     []string
	disabled    []string
	historyItem []int
	triggers    []admin.TriggerRequest
	kills       []admin.KillRequest
	audit       []keyspace.AuditEntry
	// defs, when set, answers the definition endpoints (a real etcd's:
	// define_test.go); without it they fail.
	defs *admin.Client
}

var errNoDefs = errors.New("fakeCluster: no definitions here")

func (f *fakeCluster) Definition(ctx context.Context, job string) (*admin.Definition, error) {
	if f.defs == nil {
		return nil, errNoDefs
	}
	return f.defs.Definition(ctx, job)
}
func (f *fakeCluster) Apply(ctx context.Context, jobs []*config.Job, o admin.ApplyOptions) ([]admin.ApplyResult, error) {
	if f.defs == nil {
		return nil, errNoDefs
	}
	return f.defs.Apply(ctx, jobs, o)
}
func (f *fakeCluster) DeleteApplied(ctx context.Context, job, by string, wait time.Duration) (bool, error) {
	if f.defs == nil {
		return false, errNoDefs
	}
	return f.defs.DeleteApplied(ctx, job, by, wait)
}
func (f *fakeCluster) Versions(ctx context.Context, job string) ([]admin.Version, error) {
	if f.defs == nil {
		return nil, errNoDefs
	}
	return f.defs.Versions(ctx, job)
}
func (f *fakeCluster) Rollback(ctx context.Context, job string, to int64, by string) (admin.ApplyResult, error) {
	if f.defs == nil {
		return admin.ApplyResult{}, errNoDefs
	}
	return f.defs.Rollback(ctx, job, to, by)
}

// toks returns a write token named writer and a read token named reader
// with the given secrets ("" for none).
func toks(write, read string) []auth.Token {
	var out []auth.Token
	if write != "" {
		out = append(out, auth.Token{Name: "writer", Role: auth.RoleWrite, Secret: write})
	}
	if read != "" {
		out = append(out, auth.Token{Name: "reader", Role: auth.RoleRead, Secret: read})
	}
	return out
}

func (f *fakeCluster) ID() string      { return "a" }
func (f *fakeCluster) Up() bool        { return f.up }
func (f *fakeCluster) Impaired() error { return f.impaired }
func (f *fakeCluster) View(job string) (coord.JobView, bool) {
	if job != "orders" {
		return coord.JobView{}, false
	}
	return coord.JobView{Leading: true, Map: &keyspace.ShardMap{Epoch: 7, Items: map[string][]int{"a": {0, 1}}}}, true
}
func (f *fakeCluster) Status(ctx context.Context) (*admin.ClusterStatus, error) {
	return &admin.ClusterStatus{
		Jobs:      []admin.JobStatus{{Name: "orders", Status: admin.StatusOK, Leader: "a", Epoch: 7, Total: 2}},
		Instances: []admin.InstanceStatus{{InstanceInfo: keyspace.InstanceInfo{ID: "a"}}},
	}, nil
}

// The fake knows job orders with items 0 and 1; the real checks are
// coord's, tested against etcd; here, how their errors are answered.
func (f *fakeCluster) check(job string, item int) error {
	switch {
	case job != "orders":
		return fmt.Errorf("%w: no job %q", admin.ErrUnknownJob, job)
	case item > 1:
		return fmt.Errorf("%w: no item %d", admin.ErrBadTarget, item)
	}
	return nil
}
func (f *fakeCluster) RecentRuns(ctx context.Context, job string, item int) ([]keyspace.ItemRecord, error) {
	return f.History(ctx, job, item)
}
func (f *fakeCluster) Instances(ctx context.Context) ([]keyspace.InstanceInfo, error) {
	return []keyspace.InstanceInfo{{ID: "a"}}, nil
}
func (f *fakeCluster) History(ctx context.Context, job string, item int) ([]keyspace.ItemRecord, error) {
	if err := f.check(job, item); err != nil {
		return nil, err
	}
	f.historyItem = append(f.historyItem, item)
	return []keyspace.ItemRecord{{Job: job, Item: 0, State: keyspace.StateDone}}, nil
}
func (f *fakeCluster) Trigger(ctx context.Context, r admin.TriggerRequest) (admin.Triggered, error) {
	job, items := r.Job, r.Items
	for _, i := range append(items, 0) {
		if err := f.check(job, i); err != nil {
			return admin.Triggered{}, err
		}
	}
	if f.refuse {
		return admin.Triggered{}, fmt.Errorf("%w: job %q is disabled", admin.ErrRefused, job)
	}
	f.trigger = append(f.trigger, job)
	f.triggers = append(f.triggers, r)
	return admin.Triggered{Trigger: keyspace.Trigger{ID: "t1", Items: items, Fire: time.Unix(0, 0), Param: r.Param, By: r.By}, Runs: items}, nil
}
func (f *fakeCluster) Kill(ctx context.Context, r admin.KillRequest) (admin.Killing, error) {
	for _, i := range append(r.Items, 0) {
		if err := f.check(r.Job, i); err != nil {
			return admin.Killing{}, err
		}
	}
	f.kills = append(f.kills, r)
	// Item 0 runs fence 42 on a; any other fence has ended.
	if r.Fence != 0 && r.Fence != 42 {
		return admin.Killing{}, fmt.Errorf("%w: job %q: the run of item 0 with fence %d has ended (DONE at 2026-11-30T03:00:01Z); item 0 now runs fence 42 on a: nothing killed", admin.ErrRefused, r.Job, r.Fence)
	}
	return admin.Killing{Kill: keyspace.Kill{ID: "k1", By: r.By, Runs: []keyspace.KillRun{{Item: 0, Fence: 42, Instance: "a"}}}}, nil
}
func (f *fakeCluster) WaitKill(ctx context.Context, job string, k keyspace.Kill) ([]admin.KillResult, error) {
	return []admin.KillResult{{KillRun: k.Runs[0], State: keyspace.StateKilled, Reason: keyspace.ReasonOperator}}, nil
}
func (f *fakeCluster) Audit(ctx context.Context, af admin.AuditFilter) ([]keyspace.AuditEntry, error) {
	return f.audit, nil
}
func (f *fakeCluster) RecordAudit(ctx context.Context, e keyspace.AuditEntry) (keyspace.AuditEntry, error) {
	f.audit = append(f.audit, e)
	return e, nil
}
func (f *fakeCluster) SetDisabled(ctx context.Context, t admin.Target, on, force bool) (admin.Disabling, error) {
	if err := f.check(t.Job, t.Item); err != nil {
		return admin.Disabling{}, err
	}
	if t.Item >= 0 && t.Instance != "" {
		return admin.Disabling{}, fmt.Errorf("%w: an item and an instance exclude each other", admin.ErrBadTarget)
	}
	f.disabled = append(f.disabled, t.Job)
	return admin.Disabling{Changed: true, Disabled: on, Message: "ok"}, nil
}
func (f *fakeCluster) Remove(ctx context.Context, job string) (int64, error) {
	if err := f.check(job, 0); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%w: job %q is still defined by live instances (a)", admin.ErrRefused, job)
}

func do(t *testing.T, h http.Handler, method, path, token string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

func TestAuthorization(t *testing.T) {
	const w, r = "write-secret", "read-secret"
	tests := []struct {
		name                string
		writeTok, readTok   string
		method, path, token string
		want                int
	}{
		{"reads are open without a read token", w, "", "GET", "/api/v1/jobs", "", 200},
		{"write without a token", w, "", "POST", "/api/v1/jobs/orders/trigger", "", 401},
		{"write with a wrong token", w, "", "POST", "/api/v1/jobs/orders/trigger", "nope", 401},
		{"write with the write token", w, "", "POST", "/api/v1/jobs/orders/trigger", w, 202},
		{"write with the read token", w, r, "POST", "/api/v1/jobs/orders/disable", r, 403},
		{"read without the read token", w, r, "GET", "/api/v1/jobs", "", 401},
		{"read with a wrong token", w, r, "GET", "/api/v1/instances", "nope", 401},
		{"read with the read token", w, r, "GET", "/api/v1/jobs/orders", r, 200},
		{"read with the write token", w, r, "GET", "/api/v1/jobs/orders/history", w, 200},
		{"no write token: writes refused", "", "", "POST", "/api/v1/jobs/orders/enable", "", 403},
		{"no write token: a made-up token changes nothing", "", "", "POST", "/api/v1/jobs/orders/trigger", "anything", 403},
		{"no write token: remove refused", "", "", "DELETE", "/api/v1/jobs/orders", "", 403},
		{"metrics are open", w, r, "GET", "/metrics", "", 200},
		{"health is open", w, r, "GET", "/healthz", "", 200},
	}
	for _, tt := range tests {
		h := Handler(Options{Instance: &fakeCluster{up: true}, Admin: &fakeCluster{up: true}, Tokens: toks(tt.writeTok, tt.readTok),
			Metrics: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})})
		code, body := do(t, h, tt.method, tt.path, tt.token)
		if code != tt.want {
			t.Errorf("%s: %s %s = %d %s, want %d", tt.name, tt.method, tt.path, code, body, tt.want)
		}
		if code >= 400 && code != 404 {
			var e apiError
			if json.Unmarshal([]byte(body), &e) != nil || e.Error == "" {
				t.Errorf("%s: error body is not JSON with a message: %q", tt.name, body)
			}
		}
	}
}

func TestEndpoints(t *testing.T) {
	fc := &fakeCluster{up: true}
	const token = "endpoints-write-token"
	inner := Handler(Options{Instance: fc, Admin: fc, Tokens: toks(token, "")})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set("Authorization", "Bearer "+token)
		inner.ServeHTTP(w, r)
	})

	code, body := do(t, h, "GET", "/api/v1/jobs/orders", "")
	var job jobOut
	if code != 200 || json.Unmarshal([]byte(body), &job) != nil || job.Leader != "a" || job.Local == nil || job.Local.Epoch != 7 || len(job.Local.Items) != 2 || !job.Local.Leading {
		t.Errorf("job: %d %s", code, body)
	}
	if code, body := do(t, h, "GET", "/api/v1/jobs/missing", ""); code != 404 || !strings.Contains(body, `no job \"missing\"`) {
		t.Errorf("missing job: %d %s", code, body)
	}
	if code, body := do(t, h, "GET", "/api/v1/jobs/bad..name/history", ""); code != 404 && code != 400 {
		t.Errorf("odd name: %d %s", code, body)
	}
	if code, body := do(t, h, "POST", "/api/v1/jobs/orders/trigger?item=x", ""); code != 400 || !strings.Contains(body, "item must be a non-negative integer") {
		t.Errorf("bad item: %d %s", code, body)
	}
	if code, _ := do(t, h, "POST", "/api/v1/jobs/orders/trigger?item=1", ""); code != 202 || len(fc.trigger) != 1 {
		t.Errorf("trigger: %d %v", code, fc.trigger)
	}
	if code, body := do(t, h, "POST", "/api/v1/jobs/nope/trigger", ""); code != 404 {
		t.Errorf("trigger of an unknown job: %d %s", code, body)
	}
	if code, body := do(t, h, "POST", "/api/v1/jobs/orders/disable?item=1&instance=b", ""); code != 400 {
		t.Errorf("item and instance: %d %s", code, body)
	}
	if code, _ := do(t, h, "POST", "/api/v1/jobs/orders/disable?instance=b", ""); code != 200 || len(fc.disabled) != 1 {
		t.Errorf("disable: %d", code)
	}
	if code, body := do(t, h, "GET", "/api/v1/nothing", ""); code != 404 || !strings.Contains(body, "no such endpoint") {
		t.Errorf("unknown endpoint: %d %s", code, body)
	}
	if code, body := do(t, h, "DELETE", "/api/v1/jobs/orders", ""); code != 409 || !strings.Contains(body, "still defined") {
		t.Errorf("remove of a defined job: %d %s", code, body)
	}
	if code, body := do(t, h, "DELETE", "/api/v1/jobs/nope", ""); code != 404 {
		t.Errorf("remove of an unknown job: %d %s", code, body)
	}

	// Every sub-resource of an unknown job is a 404; a bad item a 400.
	for _, tc := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/api/v1/jobs/nope/history", 404},
		{"POST", "/api/v1/jobs/nope/disable", 404},
		{"POST", "/api/v1/jobs/nope/enable", 404},
		{"POST", "/api/v1/jobs/orders/trigger?item=7", 400},
		{"POST", "/api/v1/jobs/orders/trigger?item=-3", 400},
		{"GET", "/api/v1/jobs/orders/history?item=7", 400},
		{"POST", "/api/v1/jobs/orders/disable?item=5", 400},
	} {
		if code, body := do(t, h, tc.method, tc.path, ""); code != tc.want {
			t.Errorf("%s %s = %d %s, want %d", tc.method, tc.path, code, body, tc.want)
		}
	}
	// history?item= reaches the cluster.
	if code, _ := do(t, h, "GET", "/api/v1/jobs/orders/history?item=1", ""); code != 200 || len(fc.historyItem) == 0 || fc.historyItem[len(fc.historyItem)-1] != 1 {
		t.Errorf("history?item=1: %d, items asked %v", code, fc.historyItem)
	}
	// A refused command is a 409 that says why.
	fc.refuse = true
	if code, body := do(t, h, "POST", "/api/v1/jobs/orders/trigger", ""); code != 409 || !strings.Contains(body, "disabled") {
		t.Errorf("refused trigger: %d %s", code, body)
	}

	// A known path with another method is a 405 naming the allowed ones.
	req := httptest.NewRequest("PUT", "/api/v1/jobs/orders/trigger", nil)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 405 || rec.Header().Get("Allow") != "POST" || !strings.Contains(rec.Body.String(), "method not allowed") {
		t.Errorf("wrong method: %d %q %s", rec.Code, rec.Header().Get("Allow"), rec.Body.String())
	}
	if code, _ := do(t, h, "POST", "/api/v1/jobs/orders", ""); code != 405 {
		t.Errorf("POST on a job: %d, want 405", code)
	}
}

func TestReadyz(t *testing.T) {
	fc := &fakeCluster{}
	var cfgErr error
	h := Handler(Options{Instance: fc, Admin: fc, ConfigError: func() error { return cfgErr }})
	if code, body := do(t, h, "GET", "/readyz", ""); code != 503 || !strings.Contains(body, "no etcd session") {
		t.Errorf("down: %d %s", code, body)
	}
	fc.up = true
	if code, _ := do(t, h, "GET", "/readyz", ""); code != 200 {
		t.Errorf("up: %d", code)
	}
	cfgErr = errors.New(`jobs.yaml:3: job "x": shardingTotalCount must be >= 1, got 0`)
	if code, body := do(t, h, "GET", "/readyz", ""); code != 200 || !strings.Contains(body, "degraded: the last configuration reload was rejected") || !strings.Contains(body, "1 problem") ||
		strings.Contains(body, "shardingTotalCount") || strings.Contains(body, "jobs.yaml") {
		t.Errorf("failed reload: %d %s, want the problems counted, none quoted", code, body)
	}
	// Both: the session's absence decides the status, the reload is said.
	fc.up = false
	if code, body := do(t, h, "GET", "/readyz", ""); code != 503 || !strings.Contains(body, "no etcd session") || !strings.Contains(body, "reload was rejected") {
		t.Errorf("down and a failed reload: %d %s, want 503 naming both", code, body)
	}
	// A session is not enough when etcd takes no write, or went back in time.
	fc.up, cfgErr = true, nil
	for _, impaired := range []error{&coord.NoSpaceError{Since: time.Now()}, &coord.RewindError{Seen: 40, Got: 25}} {
		fc.impaired = impaired
		if code, body := do(t, h, "GET", "/readyz", ""); code != 503 || !strings.Contains(body, impaired.Error()) {
			t.Errorf("impaired (%v): %d %s, want 503 saying so", impaired, code, body)
		}
	}
}

// /readyz, open to anyone, says that a reload failed, in which jobs and
// how many problems, and quotes nothing of the files: a problem quotes
// the field's value (a webhook URL with its secret path, a wrong-typed
// value). The problems themselves are a read endpoint's.
func TestReadyzQuotesNoConfigValue(t *testing.T) {
	_, cfgErr := config.Parse("jobs.yaml", []byte(`jobs:
  - name: billing
    cron: "0 * * * * ?"
    shardingTotalCount: sekret-count
    script: [/bin/true]
    onFailure:
      webhook: "http://hooks.example/%zz/s3cr3t-path"
  - name: "bad name!"
    script: [/bin/true]
`))
	if n := len(config.Errors(cfgErr)); n != 3 {
		t.Fatalf("the config has %d problems, want 3: %v", n, cfgErr)
	}
	for _, tc := range []struct {
		name   string
		tokens []auth.Token
	}{{"reads open", nil}, {"reads need a token", toks("", "read-token-1234567")}} {
		t.Run(tc.name, func(t *testing.T) {
			h := Handler(Options{Instance: &fakeCluster{up: true}, Admin: &fakeCluster{up: true}, ConfigError: func() error { return cfgErr }, Tokens: tc.tokens})
			code, body := do(t, h, "GET", "/readyz", "")
			if code != 200 || !strings.Contains(body, "3 problems") || !strings.Contains(body, `job billing: 2`) || !strings.Contains(body, "/api/v1/config/problems") {
				t.Errorf("readyz: %d %q, want 200 counting 3 problems, 2 of job billing, and where the details are", code, body)
			}
			for _, secret := range []string{"s3cr3t-path", "hooks.example", "sekret-count", "bad name", "jobs.yaml", "webhook", "shardingTotalCount"} {
				if strings.Contains(body, secret) {
					t.Errorf("readyz quotes %q: %s", secret, body)
				}
			}
			code, body = do(t, h, "GET", "/api/v1/config/problems", "")
			if tc.tokens != nil {
				if code != 401 || strings.Contains(body, "s3cr3t") {
					t.Errorf("problems without a token, reads closed: %d %s, want 401", code, body)
				}
				code, body = do(t, h, "GET", "/api/v1/config/problems", "read-token-1234567")
			}
			var out configProblems
			if err := json.Unmarshal([]byte(body), &out); code != 200 || err != nil {
				t.Fatalf("problems: %d %s (%v)", code, body, err)
			}
			if !out.ReloadFailed || len(out.Problems) != 3 || out.Problems[0].Job != "billing" || out.Problems[0].Line != 4 || out.Problems[0].File != "jobs.yaml" ||
				!strings.Contains(out.Problems[1].Message, "s3cr3t-path") || out.Problems[2].Job != "bad name!" {
				t.Errorf("problems: %+v", out)
			}
		})
	}
	// After a successful reload: none.
	h := Handler(Options{Instance: &fakeCluster{up: true}, Admin: &fakeCluster{up: true}, ConfigError: func() error { return nil }})
	if code, body := do(t, h, "GET", "/api/v1/config/problems", ""); code != 200 || !strings.Contains(body, `"reloadFailed": false`) {
		t.Errorf("problems after a good reload: %d %s", code, body)
	}
}

// A web page cannot drive the API: cross-origin writes are refused, with
// or without a token, and a loopback server answers only to loopback names.
func TestBrowserSafe(t *testing.T) {
	const tok = "browser-test-token-123"
	h := Handler(Options{Instance: &fakeCluster{up: true}, Admin: &fakeCluster{up: true}, Tokens: toks(tok, ""), Loopback: true})
	req := func(method, host, origin, token string) int {
		r := httptest.NewRequest(method, "http://"+host+"/api/v1/jobs/orders/trigger", nil)
		if method == "GET" {
			r = httptest.NewRequest(method, "http://"+host+"/api/v1/jobs", nil)
		}
		r.Host = host
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	tests := []struct {
		name                        string
		method, host, origin, token string
		want                        int
	}{
		{"cross-origin write, no token", "POST", "127.0.0.1:9741", "http://evil.example", "", 403},
		{"cross-origin write with the token", "POST", "127.0.0.1:9741", "http://evil.example", tok, 403},
		{"same-origin write with the token", "POST", "127.0.0.1:9741", "http://127.0.0.1:9741", tok, 202},
		{"CLI-style write (no Origin)", "POST", "localhost:9741", "", tok, 202},
		{"rebound name, read", "GET", "evil.example:9741", "", "", 421},
		{"rebound name, write", "POST", "evil.example:9741", "", tok, 421},
		{"loopback name, read", "GET", "[::1]:9741", "", "", 200},
	}
	for _, tt := range tests {
		if got := req(tt.method, tt.host, tt.origin, tt.token); got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, got, tt.want)
		}
	}
}

// loginOf logs in to au with secret, returning the session's cookie and
// key.
func loginOf(t *testing.T, au *auth.Authority, secret string) (*http.Cookie, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	_, key, err := au.Login(rec, httptest.NewRequest("POST", "/login", nil), secret)
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	return rec.Result().Cookies()[0], key
}

// A request with a live session's cookie and without its key is nobody,
// and the refusal says what is missing.
func TestReadWithTheSessionCookieAlone(t *testing.T) {
	au := auth.New(toks("writer-secret-0123456789", "reader-secret-0123456789"), time.Hour, false)
	r, _ := loginOf(t, au, "reader-secret-0123456789")
	h := Handler(Options{Instance: &fakeCluster{up: true}, Admin: &fakeCluster{up: true}, Auth: au})
	req := httptest.NewRequest("GET", "/api/v1/jobs", nil)
	req.AddCookie(r)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "a console session's cookie is not enough") {
		t.Errorf("read with the cookie alone: %d %s", rec.Code, rec.Body)
	}
}
