package engine

import (
	"slices"
	"testing"
	"time"
)

// The lead of a fire grows with the runs due at it, from the slowest
// recent time a run took to be ready per run due at its own fire.
func TestLeadGrowsWithTheRunsDue(t *testing.T) {
	t.Parallel()
	var fresh readyLatency
	storm := readyLatency{}
	storm.observe(900*time.Millisecond, 1000) // the last of a storm of 1,000: 0.9 ms a run
	alone := readyLatency{}
	alone.observe(30*time.Millisecond, 1)
	for _, tc := range []struct {
		name string
		r    *readyLatency
		due  int
		want time.Duration
	}{
		{"nothing measured, one run", &fresh, 1, defaultLead + margin},
		{"nothing measured, a storm: the bound", &fresh, 1000, maxStormLead},
		{"one run of 30 ms", &alone, 1, 2*30*time.Millisecond + margin},
		{"no run due counts as one", &alone, 0, 2*30*time.Millisecond + margin},
		{"the floor", func() *readyLatency { var r readyLatency; r.observe(time.Millisecond, 1); return &r }(), 1, minLead},
		{"one run: at most maxLead", func() *readyLatency { var r readyLatency; r.observe(time.Second, 1); return &r }(), 1, maxLead},
		{"a storm of 1,000 after one: 2 x 0.9 ms x 1,000", &storm, 1000, 1800*time.Millisecond + margin},
		{"ten runs after a storm", &storm, 10, 18*time.Millisecond + margin},
	} {
		if got := tc.r.lead(tc.due); got != tc.want {
			t.Errorf("%s: lead(%d) = %s, want %s", tc.name, tc.due, got, tc.want)
		}
	}
}

// The calendar counts the runs due at each fire, replaces a loop's
// filing, forgets a stopped loop, and wakes the loops of a fire each time
// its count doubles.
func TestDueCalendar(t *testing.T) {
	t.Parallel()
	var c dueCalendar
	f := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	loops := make([]*jobLoop, 8)
	for i := range loops {
		loops[i] = &jobLoop{name: string(rune('a' + i))}
	}
	var woken []int // how many loops each filing woke
	for _, l := range loops {
		_, wake := c.file(l, f, 1)
		woken = append(woken, len(wake))
	}
	// Counts 1..8: doubled at 2 (wakes 1), 4 (wakes 3), 8 (wakes 7).
	if want := []int{0, 1, 0, 3, 0, 0, 0, 7}; !slices.Equal(woken, want) {
		t.Errorf("woken per filing %v, want %v", woken, want)
	}
	if got := c.count(f); got != 8 {
		t.Errorf("count %d, want 8", got)
	}
	// A loop that files again replaces its filing; one that owns nothing
	// any more files none; a stopped one is forgotten.
	if due, _ := c.file(loops[0], f, 3); due != 10 {
		t.Errorf("after a loop's 1 became 3: %d due, want 10", due)
	}
	if due, _ := c.file(loops[1], f.Add(time.Minute), 1); due != 1 || c.count(f) != 9 {
		t.Errorf("after a loop moved to the next minute: %d there, %d left at the fire; want 1 and 9", due, c.count(f))
	}
	c.file(loops[2], f, 0)
	c.forget(loops[3])
	if got := c.count(f); got != 7 {
		t.Errorf("count %d after one owns nothing and one stopped, want 7", got)
	}
	for _, l := range loops {
		c.forget(l)
	}
	if len(c.at) != 0 || len(c.filed) != 0 {
		t.Errorf("all forgotten, the calendar holds %d fires and %d loops", len(c.at), len(c.filed))
	}
}
