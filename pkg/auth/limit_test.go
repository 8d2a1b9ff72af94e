package auth

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

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
