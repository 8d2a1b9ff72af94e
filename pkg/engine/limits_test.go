package engine

import (
	"slices"
	"testing"
	"time"
)

// The lead of a fire grows with the runs due at it, from the slowest
// recent time a run due with others took to be ready per run due; a run
// due alone keeps a lone run's lead.
func TestLeadGrowsWithTheRunsDue(t *testing.T) {
	t.Parallel()
	with := func(samples ...[2]int) *readyLatency { // (ms, due) pairs
		var r readyLatency
		for _, s := range samples {
			r.observe(time.Duration(s[0])*time.Millisecond, s[1])
		}
		return &r
	}
	ms := func(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }
	for _, tc := range []struct {
		name string
		r    *readyLatency
		due  int
		want time.Duration
	}{
		{"nothing measured, one run", with(), 1, defaultLead},
		{"nothing measured, no run due counts as one", with(), 0, defaultLead},
		{"nothing measured, two runs", with(), 2, defaultLead + defaultLead},
		{"nothing measured, a storm: the bound", with(), 1000, maxStormLead},
		{"one run of 30 ms", with([2]int{30, 1}), 1, 2*ms(30) + margin},
		{"the floor", with([2]int{1, 1}), 1, minLead},
		{"one run: at most maxLead", with([2]int{1000, 1}), 1, maxLead},
		{"a storm measured: 0.9 ms a run", with([2]int{3, 1}, [2]int{900, 1000}), 1000, 2*ms(3) + margin + 999*2*ms(0.9)},
		{"a lone run after a storm keeps its own lead", with([2]int{30, 1}, [2]int{900, 1000}), 1, 2*ms(30) + margin},
		{"a storm after lone runs only: each run as slow as one alone", with([2]int{3, 1}), 100, 2*ms(3) + margin + 99*2*ms(3)},
		{"at most maxLead a run", with([2]int{200, 1}, [2]int{1000, 2}), 2, 2 * maxLead},
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
