package auth

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// A session is its cookie and its key: either alone, or with the other
// half of another session, is nobody; only a request with both extends
// the session.
func TestSessionNeedsBothHalves(t *testing.T) {
	auth := New([]Token{{"writer", RoleWrite, "writer-secret-0123456789"}, {"reader", RoleRead, "reader-secret-0123456789"}}, time.Hour, false)
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
}

// loginOf logs in to auth with secret from a fresh address, returning the
// session's cookie and key.
func loginOf(t *testing.T, auth *Authority, secret string) (*http.Cookie, string) {
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
	auth := New([]Token{{"writer", RoleWrite, "writer-secret-0123456789"}, {"reader", RoleRead, "reader-secret-0123456789"}}, 0, false)
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
