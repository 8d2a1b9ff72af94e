package auth

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Authority decides who makes a request: the named tokens, and the console's
// sessions made from them. The API and the console share one.
type Authority struct {
	tokens   tokens
	sessions *sessions
	logins   *loginLimit
	secure   bool // cookies only over TLS
}

// New returns the authority of tokens; console logins last ttl while
// idle (default 12h); secure marks cookies Secure (the server is TLS).
func New(ts []Token, ttl time.Duration, secure bool) *Authority {
	if ttl <= 0 {
		ttl = 12 * time.Hour
	}
	return &Authority{tokens: tokens(slices.Clone(ts)), sessions: newSessions(ttl), logins: newLoginLimit(), secure: secure}
}

// ReadsOpen reports whether reading needs no token (no token has the read
// role).
func (a *Authority) ReadsOpen() bool { return !a.tokens.has(RoleRead) }

// Writable reports whether any token may write.
func (a *Authority) Writable() bool { return a.tokens.has(RoleWrite) }

// Definable reports whether any token may define jobs.
func (a *Authority) Definable() bool { return a.tokens.has(RoleDefine) }

// Identify finds the caller of r: its bearer token, else its console
// session (the cookie and the key in KeyHeader). A bearer token that
// matches none is an error (401); a session cookie without its key, with
// another key, or of no live session is ignored (an expired login, or a
// cookie replayed by whoever received it): nil, nil.
func (a *Authority) Identify(r *http.Request) (*Caller, error) {
	if h := r.Header.Get("Authorization"); h != "" {
		t, ok := strings.CutPrefix(h, "Bearer ")
		if !ok {
			return nil, fmt.Errorf("the Authorization header must be \"Bearer TOKEN\"")
		}
		tok, ok := a.tokens.lookup(strings.TrimSpace(t))
		if !ok {
			return nil, fmt.Errorf("invalid token")
		}
		return &Caller{Token: tok}, nil
	}
	if c, err := r.Cookie(SessionCookie); err == nil {
		if ss, ok := a.sessions.get(c.Value, r.Header.Get(KeyHeader)); ok {
			return &Caller{Token: ss.token, Session: true}, nil
		}
	}
	return nil, nil
}

// KeyMissing reports whether r carries the cookie of a live console
// session but no key at all: a navigation of the console's (which sends
// cookies only), whose page then asks again with the key. It extends
// nothing.
func (a *Authority) KeyMissing(r *http.Request) bool {
	c, err := r.Cookie(SessionCookie)
	return err == nil && r.Header.Get(KeyHeader) == "" && a.sessions.live(c.Value)
}

// Login starts a console session for the token whose secret is given,
// asked for by r; it sets the session's cookie (HttpOnly, SameSite=Strict,
// Secure over TLS) and returns the session's key, for the console's page
// and never for a cookie. Logins are rate-limited per source address and
// on the instance (see loginLimit) before the secret is looked at: a
// refused one is a *LimitError.
func (a *Authority) Login(w http.ResponseWriter, r *http.Request, secret string) (*Caller, string, error) {
	if err := a.logins.allow(r.RemoteAddr, a.sessions.now()); err != nil {
		return nil, "", err
	}
	tok, ok := a.tokens.lookup(strings.TrimSpace(secret))
	if !ok {
		return nil, "", fmt.Errorf("no token of this instance has that secret")
	}
	id, key := a.sessions.create(tok)
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: id, Path: "/", HttpOnly: true, Secure: a.secure,
		SameSite: http.SameSiteStrictMode, MaxAge: int(a.sessions.ttl / time.Second)})
	return &Caller{Token: tok, Session: true}, key, nil
}

// Logout clears r's session cookie, and ends its session if key is the
// session's (whoever received the cookie alone cannot end it). It
// reports whether it ended one.
func (a *Authority) Logout(w http.ResponseWriter, r *http.Request, key string) bool {
	ended := false
	if c, err := r.Cookie(SessionCookie); err == nil {
		ended = a.sessions.remove(c.Value, key)
	}
	http.SetCookie(w, &http.Cookie{Name: SessionCookie, Value: "", Path: "/", HttpOnly: true, Secure: a.secure,
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
	return ended
}

// ReadSecret returns the bearer secret with which to read for a caller
// on another instance (a proxied run log): none when reads are open (the
// instances share their token files), else a read-role secret, the
// caller's own or this instance's first. A write secret never leaves
// this instance: the read needs none.
func (a *Authority) ReadSecret(c *Caller) string {
	if a.ReadsOpen() || c == nil {
		return ""
	}
	if c.Token.Role == RoleRead {
		return c.Token.Secret
	}
	for _, t := range a.tokens {
		if t.Role == RoleRead {
			return t.Secret
		}
	}
	return ""
}
