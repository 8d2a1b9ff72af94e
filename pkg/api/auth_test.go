package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
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
	h := Handler(Options{Instance: fc, Admin: fc, Tokens: []Token{{"alice", RoleWrite, "alice-secret-0123456789"}}})
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
	h := Handler(Options{Instance: fc, Admin: fc, Tokens: []Token{{"alice", RoleWrite, "alice-secret-0123456789"}}})
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
	auth := NewAuth([]Token{{"alice", RoleWrite, "alice-secret-0123456789"}, {"bob", RoleRead, "bob-secret-0123456789"}}, 0, true)
	fc := &fakeCluster{up: true}
	h := Handler(Options{Instance: fc, Admin: fc, Auth: auth})
	session := func(secret string) (*http.Cookie, string) {
		rec := httptest.NewRecorder()
		_, key, err := auth.Login(rec, httptest.NewRequest("POST", "/login", nil), secret)
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
			req.Header.Set(KeyHeader, key)
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
	req.Header.Set(KeyHeader, bobKey)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Errorf("session read: %d", rec.Code)
	}
	if _, _, err := auth.Login(httptest.NewRecorder(), httptest.NewRequest("POST", "/login", nil), "not-a-secret"); err == nil {
		t.Error("login with an unknown secret succeeded")
	}
}

// A session is its cookie and its key: either alone, or with the other
// half of another session, is nobody; only a request with both extends
// the session, and one without the key says what is missing.
func TestSessionNeedsBothHalves(t *testing.T) {
	auth := NewAuth(toks("writer-secret-0123456789", "reader-secret-0123456789"), time.Hour, false)
	now := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	auth.sessions.now = func() time.Time { return now }
	w, wKey := loginOf(t, auth, "writer-secret-0123456789")
	r, rKey := loginOf(t, auth, "reader-secret-0123456789")
	who := func(ck *http.Cookie, key string) string {
		req := httptest.NewRequest("GET", "/api/v1/jobs", nil)
		if ck != nil {
			req.AddCookie(ck)
		}
		if key != "" {
			req.Header.Set(KeyHeader, key)
		}
		c, err := auth.Identify(req)
		if err != nil || c == nil {
			return fmt.Sprint("nobody ", err)
		}
		return c.Token.Name
	}
	for _, tc := range []struct {
		name string
		ck   *http.Cookie
		key  string
		want string
	}{
		{"cookie alone", w, "", "nobody <nil>"},
		{"key alone", nil, wKey, "nobody <nil>"},
		{"cookie and a wrong key", w, "none", "nobody <nil>"},
		{"cookie and the key of another session", w, rKey, "nobody <nil>"},
		{"cookie and the key as the cookie's value", w, w.Value, "nobody <nil>"},
		{"both", w, wKey, "writer"},
		{"both, the other session", r, rKey, "reader"},
	} {
		if got := who(tc.ck, tc.key); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, got, tc.want)
		}
	}
	// The cookie alone keeps nothing alive; the key does.
	for range 3 {
		now = now.Add(40 * time.Minute)
		who(w, "")
		who(r, rKey)
	}
	if got := who(w, wKey); got != "nobody <nil>" {
		t.Errorf("a session used only with its cookie for 2 h (TTL 1 h): %s, want expired", got)
	}
	if got := who(r, rKey); got != "reader" {
		t.Errorf("a session used with its key every 40 min: %s, want live", got)
	}
	h := Handler(Options{Instance: &fakeCluster{up: true}, Admin: &fakeCluster{up: true}, Auth: auth})
	req := httptest.NewRequest("GET", "/api/v1/jobs", nil)
	req.AddCookie(r)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized || !strings.Contains(rec.Body.String(), "a console session's cookie is not enough") {
		t.Errorf("read with the cookie alone: %d %s", rec.Code, rec.Body)
	}
}

// loginOf logs in to auth with secret from a fresh address, returning the
// session's cookie and key.
func loginOf(t *testing.T, auth *Auth, secret string) (*http.Cookie, string) {
	t.Helper()
	loginAddr++
	req := httptest.NewRequest("POST", "/login", nil)
	req.RemoteAddr = fmt.Sprintf("10.%d.%d.%d:5000", loginAddr>>16&255, loginAddr>>8&255, loginAddr&255)
	rec := httptest.NewRecorder()
	_, key, err := auth.Login(rec, req, secret)
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	ck := rec.Result().Cookies()[0]
	if ck.Value == key || len(key) != 64 {
		t.Fatalf("session key %q, cookie %q: want a 256-bit key of its own", key, ck.Value)
	}
	return ck, key
}

var loginAddr int

// A token's logins end that token's oldest sessions, never another
// token's: a holder of one token cannot log out the users of another by
// logging in again and again.
func TestSessionsOfOneTokenDoNotEvictAnothers(t *testing.T) {
	auth := NewAuth(toks("writer-secret-0123456789", "reader-secret-0123456789"), 0, false)
	now := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	tick := func() time.Time { now = now.Add(time.Second); return now } // past the instance's login budget
	auth.sessions.now = tick
	operator, key := loginOf(t, auth, "writer-secret-0123456789")
	first, firstKey := loginOf(t, auth, "reader-secret-0123456789")
	for range 1000 {
		loginOf(t, auth, "reader-secret-0123456789")
	}
	live := func(ck *http.Cookie, key string) bool {
		req := httptest.NewRequest("GET", "/", nil)
		req.AddCookie(ck)
		req.Header.Set(KeyHeader, key)
		c, _ := auth.Identify(req)
		return c != nil
	}
	if !live(operator, key) {
		t.Error("1001 logins of the reader's token ended the writer's session")
	}
	if live(first, firstKey) {
		t.Errorf("the reader's first of 1001 sessions is live: want its token's oldest ended (at most %d a token)", maxSessionsPerToken)
	}
	n := 0
	for _, ss := range auth.sessions.byID {
		if ss.token.Name == "reader" {
			n++
		}
	}
	if n != maxSessionsPerToken {
		t.Errorf("the reader's token has %d sessions, want %d", n, maxSessionsPerToken)
	}
}

// Logins are limited per source address (an IPv6 /64) and on the
// instance, before the secret is looked at; the budgets refill with time.
func TestLoginLimit(t *testing.T) {
	l := newLoginLimit()
	now := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	for i := range loginsPerSource {
		if err := l.allow("192.0.2.1:4000", now); err != nil {
			t.Fatalf("attempt %d: %v", i+1, err)
		}
	}
	err := l.allow("192.0.2.1:4001", now)
	var le *LimitError
	if !errors.As(err, &le) || le.Source != "192.0.2.1" || le.Retry != sourceRefill {
		t.Fatalf("attempt %d from one address: %v, want a LimitError for it, retry in %s", loginsPerSource+1, err, sourceRefill)
	}
	if want := "too many login attempts from 192.0.2.1 (at most 10 a minute from one address): try again in 6s"; err.Error() != want {
		t.Errorf("the refusal says %q, want %q", err, want)
	}
	if err := l.allow("192.0.2.2:4000", now); err != nil {
		t.Errorf("another address: %v", err)
	}
	if err := l.allow("192.0.2.1:4000", now.Add(sourceRefill-time.Millisecond)); err == nil {
		t.Error("an attempt before the budget refilled was allowed")
	}
	if err := l.allow("192.0.2.1:4000", now.Add(sourceRefill)); err != nil {
		t.Errorf("an attempt once the budget refilled by one: %v", err)
	}
	// One IPv6 /64 is one source.
	for i := range loginsPerSource {
		if err := l.allow(fmt.Sprintf("[2001:db8:1:2::%x]:4000", i+1), now); err != nil {
			t.Fatalf("IPv6 attempt %d: %v", i+1, err)
		}
	}
	if err := l.allow("[2001:db8:1:2:ffff::1]:4000", now); !errors.As(err, &le) || le.Source != "2001:db8:1:2::/64" {
		t.Errorf("another address of the same /64: %v, want its budget spent", err)
	}
	// The instance's budget: 60 at once from as many addresses, then one a second.
	l = newLoginLimit()
	for i := range loginsInAll {
		if err := l.allow(fmt.Sprintf("198.51.100.%d:4000", i), now); err != nil {
			t.Fatalf("attempt %d from its own address: %v", i+1, err)
		}
	}
	if err := l.allow("203.0.113.1:4000", now); !errors.As(err, &le) || le.Source != "" || le.Retry != allRefill ||
		err.Error() != "too many login attempts on this instance (at most 60 a minute from all addresses): try again in 1s" {
		t.Errorf("attempt %d on the instance: %v", loginsInAll+1, err)
	}
	if err := l.allow("203.0.113.1:4000", now.Add(allRefill)); err != nil {
		t.Errorf("an attempt a second later: %v", err)
	}
	// Full budgets are forgotten.
	l.allow("203.0.113.9:4000", now.Add(time.Hour))
	if len(l.bySource) != 1 {
		t.Errorf("%d sources kept an hour later, want 1", len(l.bySource))
	}
}

// propagate=false (query or body) reaches the cluster as NoPropagate; a
// bad value is refused before anything is triggered.
func TestTriggerPropagate(t *testing.T) {
	fc := &fakeCluster{up: true}
	h := Handler(Options{Instance: fc, Admin: fc, Tokens: []Token{{"alice", RoleWrite, "alice-secret-0123456789"}}})
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
