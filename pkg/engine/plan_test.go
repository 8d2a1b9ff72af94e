package engine

import (
	"slices"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/schedule"
)

func TestPlan(t *testing.T) {
	every, _ := schedule.Parse("@every 1s", nil)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return base.Add(time.Duration(s) * time.Second) }
	rec := func(fire int, state string) coord.ItemState {
		return coord.ItemState{Record: &coord.ItemRecord{Fire: at(fire), State: state, Attempt: 1}, Rev: 7}
	}
	on := policy{schedule: every, failover: true, misfire: true, window: time.Minute}
	off := policy{schedule: every}
	hourly, _ := schedule.Parse("@hourly", nil)
	hourlyOn := policy{schedule: hourly, failover: true, misfire: true, window: time.Minute}
	tests := []struct {
		name string
		st   coord.ItemState
		p    policy
		due  time.Time
		now  time.Time
		want decision
	}{
		{"first run", coord.ItemState{}, on, at(10), at(10), decision{run: at(10), source: "NORMAL"}},
		{"next fire", rec(9, "DONE"), on, at(10), at(10), decision{run: at(10), source: "NORMAL"}},
		{"already claimed", rec(10, "DONE"), on, at(10), at(10), decision{}},
		{"older fire than claimed", rec(11, "DONE"), on, at(10), at(11), decision{}},
		{"missed fires are counted at a regular fire", rec(5, "DONE"), on, at(10), at(10), decision{run: at(10), source: "NORMAL", skipped: 4}},
		{"running elsewhere", coord.ItemState{Record: &coord.ItemRecord{Fire: at(9), State: "RUNNING"}, RunningBy: "b"}, on, at(10), at(10), decision{wait: true}},
		{"died mid-run, failover on", rec(9, "RUNNING"), on, at(10), at(10), decision{failover: true}},
		{"died mid-run, failover on, acquiring", rec(9, "RUNNING"), on, time.Time{}, at(10), decision{failover: true}},
		{"died mid-run, failover off", rec(9, "RUNNING"), off, at(10), at(10), decision{run: at(10), source: "NORMAL"}},
		{"completed items never fail over", rec(9, "FAILED"), on, time.Time{}, at(9).Add(500 * time.Millisecond), decision{}},
		{"acquired after misses: one MISFIRE run of the latest", rec(5, "DONE"), on, time.Time{}, at(9).Add(300 * time.Millisecond), decision{run: at(9), source: "MISFIRE", skipped: 3}},
		{"acquired after misses, misfire off: skipped", rec(5, "DONE"), off, time.Time{}, at(9).Add(300 * time.Millisecond), decision{skipped: 4, skipTo: at(9)}},
		{"acquired, misses older than the window: skipped", rec(0, "DONE"), hourlyOn, time.Time{}, at(9000), decision{skipped: 2, skipTo: at(7200)}},
		{"acquired, nothing missed", rec(9, "DONE"), on, time.Time{}, at(9).Add(999 * time.Millisecond), decision{}},
		{"manual job never misses", rec(5, "DONE"), policy{failover: true, misfire: true}, time.Time{}, at(100), decision{}},
	}
	for _, tt := range tests {
		got := plan(tt.st, tt.p, tt.due, tt.now)
		if got != tt.want {
			t.Errorf("%s: plan = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestRouteOrder(t *testing.T) {
	at := func(s int) time.Time { return time.Date(2026, 1, 1, 0, 0, s, 0, time.UTC) }
	hist := []coord.ItemRecord{
		{Instance: "a", Start: at(1), State: "DONE"},
		{Instance: "a", Start: at(4), State: "DONE"},
		{Instance: "c", Start: at(3), State: "FAILED"},
		{Instance: "b", Start: at(9), State: "SKIPPED"}, // not an execution
	}
	ids := []string{"a", "b", "c"}
	for _, tt := range []struct {
		route string
		want  []string
	}{
		{"FAILOVER", []string{"a", "b", "c"}},
		{"BUSYOVER", []string{"a", "b", "c"}},
		{"LFU", []string{"b", "c", "a"}}, // 0, 1, 2 executions
		{"LRU", []string{"b", "c", "a"}}, // never, 3s, 4s
	} {
		if got := routeOrder(tt.route, ids, hist); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %v, want %v", tt.route, got, tt.want)
		}
	}
}
