package coord

import (
	"testing"
	"time"
)

func TestRepeatsSaysOncePerWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	now := t0
	r := newRepeats(30*time.Second, func() time.Time { return now })
	type step struct {
		at   time.Duration
		msg  string
		ok   bool
		held int
	}
	for i, s := range []step{
		{0, "watch ended", true, 0},
		{time.Second, "watch ended", false, 0},
		{2 * time.Second, "watch ended", false, 0},
		{2 * time.Second, "cannot reach etcd", true, 0}, // another message has its own window
		{29 * time.Second, "watch ended", false, 0},
		{30 * time.Second, "watch ended", true, 3},
		{31 * time.Second, "watch ended", false, 0},
		{90 * time.Second, "watch ended", true, 1},
		{200 * time.Second, "watch ended", true, 0},
	} {
		now = t0.Add(s.at)
		ok, held := r.say(s.msg)
		if ok != s.ok || held != s.held {
			t.Errorf("step %d (%q at %v): say = %v, %d; want %v, %d", i, s.msg, s.at, ok, held, s.ok, s.held)
		}
	}
}
