package api

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Writes record who did what in the audit log, under the token's name;
// the trigger's parameter and fire reach the cluster from the query or a
// JSON body.
func TestWritesAreAudited(t *testing.T) {
	fc := &fakeCluster{up: true}
	h := Handler(Options{Instance: fc, Admin: fc, Tokens: []auth.Token{{Name: "alice", Role: auth.RoleWrite, Secret: "alice-secret-0123456789"}}})
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
		{"trigger", keyspace.AuditOK, "item 1 of job orders"},
		{"kill", keyspace.AuditOK, "item 0 of job orders"},
		{"disable", keyspace.AuditRefused, "job nope"},
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
	h := Handler(Options{Instance: fc, Admin: fc, Tokens: []auth.Token{{Name: "alice", Role: auth.RoleWrite, Secret: "alice-secret-0123456789"}}})
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
	if len(fc.audit) != 2 || fc.audit[0].Detail != "fence 42 on a" || fc.audit[1].Outcome != keyspace.AuditRefused || fc.audit[1].Detail != "fence 7 on a" {
		t.Errorf("audit %+v, want the kill and the refused one, with their fences", fc.audit)
	}
}

// A console session acts only with its key, and only with the write role.
func TestSessionWrites(t *testing.T) {
	au := auth.New([]auth.Token{{Name: "alice", Role: auth.RoleWrite, Secret: "alice-secret-0123456789"}, {Name: "bob", Role: auth.RoleRead, Secret: "bob-secret-0123456789"}}, 0, true)
	fc := &fakeCluster{up: true}
	h := Handler(Options{Instance: fc, Admin: fc, Auth: au})
	session := func(secret string) (*http.Cookie, string) {
		rec := httptest.NewRecorder()
		_, key, err := au.Login(rec, httptest.NewRequest("POST", "/login", nil), secret)
		if err != nil {
			t.Fatal(err)
		}
		ck := rec.Result().Cookies()[0]
		if !ck.HttpOnly || !ck.Secure || ck.SameSite != http.SameSiteStrictMode {
			t.Errorf("cookie %+v: want HttpOnly, Secure (TLS) and SameSite=Strict", ck)
		}
		return ck, key
	}
	post := func(ck *http.Cookie, key string) int {
		req := httptest.NewRequest("POST", "/api/v1/jobs/orders/trigger", nil)
		req.AddCookie(ck)
		if key != "" {
			req.Header.Set(auth.KeyHeader, key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code
	}
	alice, aliceKey := session("alice-secret-0123456789")
	bob, bobKey := session("bob-secret-0123456789")
	if c := post(alice, ""); c != http.StatusUnauthorized {
		t.Errorf("session write without the key: %d, want 401", c)
	}
	if c := post(alice, bobKey); c != http.StatusUnauthorized {
		t.Errorf("session write with another session's key: %d, want 401", c)
	}
	if c := post(alice, aliceKey); c != http.StatusAccepted {
		t.Errorf("session write: %d, want 202", c)
	}
	if c := post(bob, bobKey); c != http.StatusForbidden {
		t.Errorf("read-role session write: %d, want 403", c)
	}
	if a := fc.audit; len(a) != 1 || a[0].Actor != "token:alice" {
		t.Errorf("audit %+v: want alice's trigger only (a reader's refused writes are logged, not audited: no reader can flush the audit log)", a)
	}
	// Reads with the session (the console's log view) need no token.
	req := httptest.NewRequest("GET", "/api/v1/jobs", nil)
	req.AddCookie(bob)
	req.Header.Set(auth.KeyHeader, bobKey)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Errorf("session read: %d", rec.Code)
	}
	if _, _, err := au.Login(httptest.NewRecorder(), httptest.NewRequest("POST", "/login", nil), "not-a-secret"); err == nil {
		t.Error("login with an unknown secret succeeded")
	}
}

// propagate=false (query or body) reaches the cluster as NoPropagate; a
// bad value is refused before anything is triggered.
func TestTriggerPropagate(t *testing.T) {
	fc := &fakeCluster{up: true}
	h := Handler(Options{Instance: fc, Admin: fc, Tokens: []auth.Token{{Name: "alice", Role: auth.RoleWrite, Secret: "alice-secret-0123456789"}}})
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
