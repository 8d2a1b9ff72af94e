package api

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/config"
)

// Who may do what. A request is made by one of the named tokens of the
// token files, given as a bearer token (API) or through a console session
// (made at login from a token: a cookie and a key, see below). A token's
// role is read (see everything) or write (also act). Reads need a token
// only when some token has the read role; writes always need a write
// token, and are refused by an instance that has none.

// Roles of a token.
const (
	RoleRead  = "read"
	RoleWrite = "write"
)

// Token is one named bearer token.
type Token struct {
	Name   string
	Role   string
	Secret string
}

// MinSecret is the shortest secret a token may have.
const MinSecret = 16

// ParseTokens reads a token file. Each line that is not blank or a
// comment (#) is either
//
//	NAME ROLE SECRET     a named token: ROLE is read or write
//	SECRET               a token of the file's default name and role
//
// (the second form is the one-token file of earlier versions: only its
// first such line counts, as before). Names are job-name-like and unique;
// secrets are at least MinSecret characters and unique.
func ParseTokens(text, file, defaultName, defaultRole string) ([]Token, error) {
	var out []Token
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	bare := false
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		var t Token
		switch len(f) {
		case 1:
			if bare {
				continue // the old format: the first line is the token
			}
			bare, t = true, Token{Name: defaultName, Role: defaultRole, Secret: f[0]}
		case 3:
			t = Token{Name: f[0], Role: f[1], Secret: f[2]}
		default:
			return nil, fmt.Errorf("%s:%d: want NAME ROLE SECRET (or a lone SECRET), got %d fields", file, n, len(f))
		}
		if err := config.CheckName(t.Name); err != nil {
			return nil, fmt.Errorf("%s:%d: token name %v", file, n, err)
		}
		if t.Role != RoleRead && t.Role != RoleWrite {
			return nil, fmt.Errorf("%s:%d: token %q: role must be read or write, got %q", file, n, t.Name, t.Role)
		}
		if len(t.Secret) < MinSecret {
			return nil, fmt.Errorf("%s:%d: token %q: the secret must be at least %d characters", file, n, t.Name, MinSecret)
		}
		for _, o := range out {
			if o.Name == t.Name {
				return nil, fmt.Errorf("%s:%d: token name %q is used twice", file, n, t.Name)
			}
			if o.Secret == t.Secret {
				return nil, fmt.Errorf("%s:%d: token %q has the same secret as token %q", file, n, t.Name, o.Name)
			}
		}
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return out, nil
}

// tokens finds the token of a secret.
type tokens []Token

// lookup returns the token whose secret is s, comparing in constant time
// against every token.
func (ts tokens) lookup(s string) (Token, bool) {
	var found Token
	ok := 0
	for _, t := range ts {
		if subtle.ConstantTimeCompare([]byte(s), []byte(t.Secret)) == 1 {
			found, ok = t, 1
		}
	}
	return found, ok == 1 && s != ""
}

func (ts tokens) has(role string) bool {
	return slices.ContainsFunc(ts, func(t Token) bool { return t.Role == role })
}

// A console session is two random halves, both needed (docs/security.md,
// "Console sessions"): the id, in the session cookie, and the key, which
// the login gives the console's page, whose script keeps it in the
// origin's localStorage and sends it in KeyHeader. A browser sends a
// host's cookies to every port of that host, so another local user's
// server on another port receives the cookie and can replay it here with
// any header; it never receives the key, which web storage keeps per
// origin (port included). A request with the cookie alone is anonymous.
//
// Sessions live in memory, at most maxSessionsPerToken per token (a login
// beyond that ends that token's oldest-expiring session, never another
// token's), and end after the idle TTL; only a request with the key
// extends one.

// session is a console login: a token, for a while.
type session struct {
	token   Token
	key     string
	expires time.Time
}

// sessions are the console's logins on this instance (in memory: a
// restart logs everyone out).
type sessions struct {
	mu   sync.Mutex
	byID map[string]*session
	ttl  time.Duration
	now  func() time.Time
}

// SessionCookie is the console session's cookie: the session's id.
const SessionCookie = "shardd_session"

const sessionCookie = SessionCookie

// KeyHeader carries a console session's key, the half of the session
// that is not in its cookie.
const KeyHeader = "X-Shardd-Key"

// maxSessionsPerToken bounds the logins kept for one token; the
// oldest-expiring of that token goes first.
const maxSessionsPerToken = 100

func newSessions(ttl time.Duration) *sessions {
	return &sessions{byID: map[string]*session{}, ttl: ttl, now: time.Now}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// create logs t in and returns the session's id and key.
func (s *sessions) create(t Token) (id, key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var oldest string
	n := 0
	for id, ss := range s.byID {
		switch {
		case !now.Before(ss.expires):
			delete(s.byID, id)
		case ss.token.Name == t.Name:
			n++
			if oldest == "" || ss.expires.Before(s.byID[oldest].expires) {
				oldest = id
			}
		}
	}
	if n >= maxSessionsPerToken {
		delete(s.byID, oldest)
	}
	id, key = randomHex(32), randomHex(32)
	s.byID[id] = &session{token: t, key: key, expires: now.Add(s.ttl)}
	return id, key
}

// find returns the live session of id whose key is key, nil if none.
// s.mu must be held.
func (s *sessions) find(id, key string) *session {
	ss, ok := s.byID[id]
	if !ok {
		return nil
	}
	if !s.now().Before(ss.expires) {
		delete(s.byID, id)
		return nil
	}
	if key == "" || subtle.ConstantTimeCompare([]byte(key), []byte(ss.key)) != 1 {
		return nil
	}
	return ss
}

// get returns the live session of id whose key is key, extending it.
func (s *sessions) get(id, key string) (*session, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.find(id, key)
	if ss == nil {
		return nil, false
	}
	ss.expires = s.now().Add(s.ttl)
	return ss, true
}

// live reports whether id names a live session, whatever its key; it
// extends nothing.
func (s *sessions) live(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.byID[id]
	return ok && s.now().Before(ss.expires)
}

// remove ends the session of id if key is its key.
func (s *sessions) remove(id, key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.find(id, key) == nil {
		return false
	}
	delete(s.byID, id)
	return true
}

// Caller is who made a request.
type Caller struct {
	Token Token
	// Session is set when the request came with a console session: its
	// cookie and its key.
	Session bool
}

// Actor names the caller in the audit log.
func (c *Caller) Actor() string {
	if c == nil {
		return "anonymous"
	}
	return "token:" + c.Token.Name
}

type callerKey struct{}

// CallerOf returns who made r, nil when no token or session came with it.
func CallerOf(ctx context.Context) *Caller {
	c, _ := ctx.Value(callerKey{}).(*Caller)
	return c
}

// Auth decides who makes a request: the named tokens, and the console's
// sessions made from them. The API and the console share one.
type Auth struct {
	tokens   tokens
	sessions *sessions
	logins   *loginLimit
	secure   bool // cookies only over TLS
}

// NewAuth returns the authority of tokens; console logins last ttl while
// idle (default 12h); secure marks cookies Secure (the server is TLS).
func NewAuth(ts []Token, ttl time.Duration, secure bool) *Auth {
	if ttl <= 0 {
		ttl = 12 * time.Hour
	}
	return &Auth{tokens: tokens(slices.Clone(ts)), sessions: newSessions(ttl), logins: newLoginLimit(), secure: secure}
}

// ReadsOpen reports whether reading needs no token (no token has the read
// role).
func (a *Auth) ReadsOpen() bool { return !a.tokens.has(RoleRead) }

// Writable reports whether any token may write.
func (a *Auth) Writable() bool { return a.tokens.has(RoleWrite) }

// Identify finds the caller of r: its bearer token, else its console
// session (the cookie and the key in KeyHeader). A bearer token that
// matches none is an error (401); a session cookie without its key, with
// another key, or of no live session is ignored (an expired login, or a
// cookie replayed by whoever received it): nil, nil.
func (a *Auth) Identify(r *http.Request) (*Caller, error) {
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
	if c, err := r.Cookie(sessionCookie); err == nil {
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
func (a *Auth) KeyMissing(r *http.Request) bool {
	c, err := r.Cookie(sessionCookie)
	return err == nil && r.Header.Get(KeyHeader) == "" && a.sessions.live(c.Value)
}

// Login starts a console session for the token whose secret is given,
// asked for by r; it sets the session's cookie (HttpOnly, SameSite=Strict,
// Secure over TLS) and returns the session's key, for the console's page
// and never for a cookie. Logins are rate-limited per source address and
// on the instance (see loginLimit) before the secret is looked at: a
// refused one is a *LimitError.
func (a *Auth) Login(w http.ResponseWriter, r *http.Request, secret string) (*Caller, string, error) {
	if err := a.logins.allow(r.RemoteAddr, a.sessions.now()); err != nil {
		return nil, "", err
	}
	tok, ok := a.tokens.lookup(strings.TrimSpace(secret))
	if !ok {
		return nil, "", fmt.Errorf("no token of this instance has that secret")
	}
	id, key := a.sessions.create(tok)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: "/", HttpOnly: true, Secure: a.secure,
		SameSite: http.SameSiteStrictMode, MaxAge: int(a.sessions.ttl / time.Second)})
	return &Caller{Token: tok, Session: true}, key, nil
}

// Logout clears r's session cookie, and ends its session if key is the
// session's (whoever received the cookie alone cannot end it). It
// reports whether it ended one.
func (a *Auth) Logout(w http.ResponseWriter, r *http.Request, key string) bool {
	ended := false
	if c, err := r.Cookie(sessionCookie); err == nil {
		ended = a.sessions.remove(c.Value, key)
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", HttpOnly: true, Secure: a.secure,
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
	return ended
}

// ReadSecret returns the bearer secret with which to read for a caller
// on another instance (a proxied run log): none when reads are open (the
// instances share their token files), else a read-role secret, the
// caller's own or this instance's first. A write secret never leaves
// this instance: the read needs none.
func (a *Auth) ReadSecret(c *Caller) string {
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

// WithCaller returns ctx carrying c (see CallerOf).
func WithCaller(ctx context.Context, c *Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}
