package coord

import (
	"sync"
	"time"
)

// repeats rate-limits a warning that a fault repeats: during a quorum loss
// the jobs watch ends about once a second, and each end is the same news.
// The first of a message is said at once; the same message again within
// window is counted, not said; the first after the window is said with the
// count of those held back.
type repeats struct {
	window time.Duration
	now    func() time.Time

	mu   sync.Mutex
	msgs map[string]*repeatedMsg
}

type repeatedMsg struct {
	said time.Time // when it was last said
	held int       // how many times since, not said
}

func newRepeats(window time.Duration, now func() time.Time) *repeats {
	return &repeats{window: window, now: now, msgs: map[string]*repeatedMsg{}}
}

// say reports whether msg is to be said now and, if so, how many times it
// came since it was last said and was held back.
func (r *repeats) say(msg string) (ok bool, held int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	m := r.msgs[msg]
	if m == nil {
		r.msgs[msg] = &repeatedMsg{said: now}
		return true, 0
	}
	if now.Sub(m.said) < r.window {
		m.held++
		return false, 0
	}
	held = m.held
	m.said, m.held = now, 0
	return true, held
}
