package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/shardd/shardd/pkg/coord"
)

func TestParseTokens(t *testing.T) {
	const s1, s2 = "0123456789abcdef", "fedcba9876543210"
	tests := []struct {
		name, text string
		want       []Token
		err        string
	}{
		{"bare token (the old format)", s1 + "\n", []Token{{"default", RoleWrite, s1}}, ""},
		{"bare token: only the first line counts", s1 + "\n" + s2 + "\n", []Token{{"default", RoleWrite, s1}}, ""},
		{"named tokens and comments", "# who role secret\nalice write " + s1 + "\n\n  bob read " + s2 + "  \n", []Token{{"alice", RoleWrite, s1}, {"bob", RoleRead, s2}}, ""},
		{"empty file", "# nothing\n", nil, ""},
		{"bad role", "alice admin " + s1, nil, `tokens:1: token "alice": role must be read or write, got "admin"`},
		{"short secret", "alice write short", nil, `tokens:1: token "alice": the secret must be at least 16 characters`},
		{"two fields", "alice " + s1, nil, "tokens:1: want NAME ROLE SECRET (or a lone SECRET), got 2 fields"},
		{"name twice", "a write " + s1 + "\na read " + s2, nil, `tokens:2: token name "a" is used twice`},
		{"secret twice", "a write " + s1 + "\nb read " + s1, nil, `tokens:2: token "b" has the same secret as token "a"`},
		{"bad name", "a/b write " + s1, nil, "tokens:1: token name"},
	}
	for _, tt := range tests {
		got, err := ParseTokens(tt.text, "tokens", "default", RoleWrite)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("%s: error %v, want %q", tt.name, err, tt.err)
			}
			continue
		}
		if err != nil || len(got) != len(tt.want) {
			t.Errorf("%s: %v, %v; want %v", tt.name, got, err, tt.want)
			continue
		}
		for i := range got {
			if got[i] != tt.want[i] {
				t.Errorf("%s: token %d = %+v, want %+v", tt.name, i, got[i], tt.want[i])
			}
		}
	}
}

// Writes record who did what in the audit log, under the token's name;
// the trigger's parameter and fire reach the cluster from the query or a
// JSON body.
func TestWritesAreAudited(t *testing.T) {
	fc := &fakeCluster{up: true}
	h := Handler(Options{Cluster: fc, Tokens: []Token{{"alice", RoleWrite, "alice-secret-0123456789"}}})
	req := httptest.NewRequest("POST", "/api/v1/jobs/orders/trigger", strings.NewReader(`{"item": 1, "param": "day=2026-11-30", "fire": "2026-11-30T03:00:00Z"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer alice-secret-0123456789")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusAccepted {
		t.Fatalf("trigger: %d %s", rec.Code, rec.Body)
	}
	got := fc.triggers[0]
	if got.Param != "day=2026-11-30" || got.Fire != "2026-11-30T03:00:00Z" || len(got.Items) != 1 || got.Items[0] != 1 || got.By != "token:alice" {
		t.Errorf("trigger request %+v", got)
	}
	code, body := do(t, h, "POST", "/api/v1/jobs/orders/kill?item=0&wait=1s", "alice-secret-0123456789")
	if code != http.StatusAccepted || !strings.Contains(body, `"reason": "operator"`) || !strings.Contains(body, "asked to kill item 0 (fence 42 on a)") {
		t.Errorf("kill: %d %s", code, body)
	}
	code, _ = do(t, h, "POST", "/api/v1/jobs/nope/disable", "alice-secret-0123456789")
	if code != http.StatusNotFound {
		t.Errorf("disable of an unknown job: %d", code)
	}
	code, _ = do(t, h, "POST", "/api/v1/jobs/orders/kill?wait=1m", "alice-secret-0123456789")
	if code != http.StatusBadRequest {
		t.Errorf("kill with a bad wait: %d", code)
	}
	want := []struct{ action, outcome, target string }{
		{"trigger", coord.AuditOK, "item 1 of job orders"},
		{"kill", coord.AuditOK, "item 0 of job orders"},
		{"disable", coord.AuditRefused, "job nope"},
	}
	if len(fc.audit) != len(want) {
		t.Fatalf("audit %+v, want %d entries", fc.audit, len(want))
	}
	for i, w := range want {
		e := fc.audit[i]
		if e.Actor != "token:alice" || e.Action != w.action || e.Outcome != w.outcome || !strings.Contains(e.Target, w.target) {
			t.Errorf("audit entry %d: %+v, want %v", i, e, w)
		}
	}
	if !strings.Contains(fc.audit[0].Detail, `param="day=2026-11-30"`) {
		t.Errorf("trigger's audit detail %q", fc.audit[0].Detail)
	}
}

// A kill names the run the caller saw (?fence=F&instance=I): the request
// carries them to the cluster, which refuses a run that has ended; the API
// answers 409 with the cluster's words, and the audit keeps the fence.
func TestKillNamesTheRunShown(t *testing.T) {
	fc := &fakeCluster{up: true}
	h := Handler(Options{Cluster: fc, Tokens: []Token{{"alice", RoleWrite, "alice-secret-0123456789"}}})
	code, body := do(t, h, "POST", "/api/v1/jobs/orders/kill?item=0&fence=42&instance=a&wait=1s", "alice-secret-0123456789")
	if code != http.StatusAccepted || !strings.Contains(body, "asked to kill item 0 (fence 42 on a)") {
		t.Errorf("kill of the run in progress: %d %s", code, body)
	}
	if got := fc.kills[len(fc.kills)-1]; got.Fence != 42 || got.Instance != "a" || len(got.Items) != 1 || got.Items[0] != 0 {
		t.Errorf("kill request %+v, want item 0, fence 42 on a", got)
	}
	code, body = do(t, h, "POST", "/api/v1/jobs/orders/kill?item=0&fence=7&instance=a", "alice-secret-0123456789")
	if code != http.StatusConflict || !strings.Contains(body, "the run of item 0 with fence 7 has ended") {
		t.Errorf("kill of an ended run: %d %s, want 409 saying it has ended", code, body)
	}
	for _, bad := range []string{"x", "0", "-7"} {
		n := len(fc.kills)
		code, body = do(t, h, "POST", "/api/v1/jobs/orders/kill?item=0&fence="+bad, "alice-secret-0123456789")
		if code != http.StatusBadRequest || !strings.Contains(body, "fence must be a positive integer") || len(fc.kills) != n {
			t.Errorf("kill with fence %q: %d %s", bad, code, body)
		}
	}
	if len(fc.audit) != 2 || fc.audit[0].Detail != "fence 42 on a" || fc.audit[1].Outcome != coord.AuditRefused || fc.audit[1].Detail != "fence 7 on a" {
		t.Errorf("audit %+v, want the kill and the refused one, with their fences", fc.audit)
	}
}

// A console session acts only with its CSRF token, and only with the
// write role.
func TestSessionWrites(t *testing.T) {
	auth := NewAuth([]Token{{"alice", RoleWrite, "alice-secret-0123456789"}, {"bob", RoleRead, "bob-secret-0123456789"}}, 0, true)
	fc := &fakeCluster{up: true}
	h := Handler(Options{Cluster: fc, Auth: auth})
	session := func(secret string) (*http.Cookie, string) {
		rec := httptest.NewRecorder()
		c, err := auth.Login(rec, secret)
		if err != nil {
			t.Fatal(err)
		}
		ck := rec.Result().Cookies()[0]
		if !ck.HttpOnly || !ck.Secure || ck.SameSite != http.SameSiteStrictMode {
			t.Errorf("cookie %+v: want HttpOnly, Secure (TLS) and SameSite=Strict", ck)
		}
		return ck, c.CSRF
	}
	post := func(ck *http.Cookie, csrf string) int {
		req := httptest.NewRequest("POST", "/api/v1/jobs/orders/trigger", nil)
		req.AddCookie(ck)
		if csrf != "" {
			req.Header.Set(csrfHeader, csrf)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	alice, aliceCSRF := session("alice-secret-0123456789")
	bob, bobCSRF := session("bob-secret-0123456789")
	if c := post(alice, ""); c != http.StatusForbidden {
		t.Errorf("session write without CSRF: %d, want 403", c)
	}
	if c := post(alice, bobCSRF); c != http.StatusForbidden {
		t.Errorf("session write with another session's CSRF: %d, want 403", c)
	}
	if c := post(alice, aliceCSRF); c != http.StatusAccepted {
		t.Errorf("session write: %d, want 202", c)
	}
	if c := post(bob, bobCSRF); c != http.StatusForbidden {
		t.Errorf("read-role session write: %d, want 403", c)
	}
	if a := fc.audit; len(a) != 1 || a[0].Actor != "token:alice" {
		t.Errorf("audit %+v: want alice's trigger only (a reader's refused writes are logged, not audited: no reader can flush the audit log)", a)
	}
	// Reads with the session cookie (the console's log view) need no token.
	req := httptest.NewRequest("GET", "/api/v1/jobs", nil)
	req.AddCookie(bob)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Errorf("session read: %d", rec.Code)
	}
	if _, err := auth.Login(httptest.NewRecorder(), "not-a-secret"); err == nil {
		t.Error("login with an unknown secret succeeded")
	}
}

// propagate=false (query or body) reaches the cluster as NoPropagate; a
// bad value is refused before anything is triggered.
func TestTriggerPropagate(t *testing.T) {
	fc := &fakeCluster{up: true}
	h := Handler(Options{Cluster: fc, Tokens: []Token{{"alice", RoleWrite, "alice-secret-0123456789"}}})
	for _, path := range []string{"/api/v1/jobs/orders/trigger", "/api/v1/jobs/orders/trigger?propagate=true", "/api/v1/jobs/orders/trigger?propagate=false"} {
		if code, body := do(t, h, "POST", path, "alice-secret-0123456789"); code != http.StatusAccepted {
			t.Fatalf("%s: %d %s", path, code, body)
		}
	}
	req := httptest.NewRequest("POST", "/api/v1/jobs/orders/trigger", strings.NewReader(`{"propagate": false}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer alice-secret-0123456789")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusAccepted {
		t.Fatalf("body propagate=false: %d %s", rec.Code, rec.Body)
	}
	var got []bool
	for _, tr := range fc.triggers {
		got = append(got, tr.NoPropagate)
	}
	if want := []bool{false, false, true, true}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("NoPropagate of the 4 triggers = %v, want %v", got, want)
	}
	if code, body := do(t, h, "POST", "/api/v1/jobs/orders/trigger?propagate=no", "alice-secret-0123456789"); code != http.StatusBadRequest || !strings.Contains(body, "propagate must be true or false") {
		t.Errorf("propagate=no: %d %s", code, body)
	}
	if len(fc.triggers) != 4 {
		t.Errorf("a refused trigger reached the cluster: %d triggers", len(fc.triggers))
	}
}
