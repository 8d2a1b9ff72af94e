package auth

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// Console logins are rate-limited, per source address and on the
// instance, before their secret is looked at: a guess costs the guesser
// time however many connections it opens, and sessions cannot be made
// faster than the limit. Each limit is a budget of attempts that refills
// at a steady rate (a token bucket, kept as the time at which it would be
// full: GCRA).
const (
	loginsPerSource = 10              // a burst of 10 from one address,
	sourceRefill    = 6 * time.Second // then one every 6 s: 10 a minute
	loginsInAll     = 60              // a burst of 60 on the instance,
	allRefill       = time.Second     // then one a second: 60 a minute
)

// LimitError is a login refused for the rate of logins.
type LimitError struct {
	// Source is the address (an IPv6 /64) whose budget is spent; "" when
	// it is the instance's.
	Source string
	// Retry is how long until an attempt is allowed again.
	Retry time.Duration
}

func (e *LimitError) Error() string {
	wait := e.Retry.Round(time.Second)
	if wait < time.Second {
		wait = time.Second
	}
	if e.Source != "" {
		return fmt.Sprintf("too many login attempts from %s (at most %d a minute from one address): try again in %s",
			e.Source, int(time.Minute/sourceRefill), wait)
	}
	return fmt.Sprintf("too many login attempts on this instance (at most %d a minute from all addresses): try again in %s",
		int(time.Minute/allRefill), wait)
}

// loginLimit keeps the budgets. A source's entry is dropped once its
// budget is full again, so the map holds at most the sources admitted in
// the last minute, which the instance's budget bounds.
type loginLimit struct {
	mu       sync.Mutex
	all      time.Time            // when the instance's budget is full
	bySource map[string]time.Time // when each source's budget is full
}

func newLoginLimit() *loginLimit { return &loginLimit{bySource: map[string]time.Time{}} }

// spend returns when a budget that is full at full would be full after
// one more attempt at now, and how long to wait if that attempt is over
// the budget of burst attempts refilled one every refill.
func spend(full, now time.Time, burst int, refill time.Duration) (time.Time, time.Duration) {
	if full.Before(now) {
		full = now
	}
	next := full.Add(refill)
	if over := next.Sub(now) - time.Duration(burst)*refill; over > 0 {
		return full, over
	}
	return next, 0
}

// allow takes one attempt from the budgets of remote (a RemoteAddr) and
// of the instance, or neither, returning a *LimitError.
func (l *loginLimit) allow(remote string, now time.Time) error {
	src := sourceOf(remote)
	l.mu.Lock()
	defer l.mu.Unlock()
	for s, full := range l.bySource {
		if !full.After(now) {
			delete(l.bySource, s)
		}
	}
	bySource, waitSource := spend(l.bySource[src], now, loginsPerSource, sourceRefill)
	if waitSource > 0 {
		return &LimitError{Source: src, Retry: waitSource}
	}
	all, waitAll := spend(l.all, now, loginsInAll, allRefill)
	if waitAll > 0 {
		return &LimitError{Retry: waitAll}
	}
	l.bySource[src], l.all = bySource, all
	return nil
}

// sourceOf is the address a request's budget belongs to: its IP, or for
// IPv6 its /64 (one host commonly has a whole /64).
func sourceOf(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	a = a.WithZone("").Unmap()
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}
