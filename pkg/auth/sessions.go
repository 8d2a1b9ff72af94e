package auth

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"sync"
	"time"
)

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
