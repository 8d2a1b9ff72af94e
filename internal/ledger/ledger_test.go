package ledger

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// line renders one ledger line; at is milliseconds after t0, fire seconds after t0.
func line(kind string, item, fire, attempt int, fence int64, inst, source string, atMS int) string {
	return fmt.Sprintf("%s orders %d %s %d %d %s %s %d\n", kind, item, t0.Add(time.Duration(fire)*time.Second).Format(time.RFC3339), attempt, fence, inst, source, t0.Add(time.Duration(atMS)*time.Millisecond).UnixNano())
}

// healthy is one item firing every second from 1s to 10s, 200 ms per run.
func healthy() string {
	var b strings.Builder
	for s := 1; s <= 10; s++ {
		b.WriteString(line("start", 0, s, 1, int64(s*10), "a", "NORMAL", s*1000+5))
		b.WriteString(line("end", 0, s, 1, int64(s*10), "a", "NORMAL", s*1000+205))
	}
	return b.String()
}

var opts = Options{Items: map[string]int{"orders": 1}, Period: time.Second, Bound: 3 * time.Second, From: t0, To: t0.Add(11 * time.Second)}

func check(t *testing.T, ledger string) Report {
	t.Helper()
	ev, err := Parse(strings.NewReader(ledger))
	if err != nil {
		t.Fatal(err)
	}
	return Check(ev, opts)
}

func TestHealthyLedger(t *testing.T) {
	r := check(t, healthy())
	if !r.OK() || r.Starts != 10 || r.Ends != 10 || r.FiresChecked == 0 {
		t.Fatalf("healthy ledger: %s %v", r, r.Violations)
	}
}

func TestPlantedViolations(t *testing.T) {
	tests := []struct {
		name  string
		extra string
		drop  int // drop the runs of 4 fires from this second on, 0 = none
		field func(Report) int
	}{
		{"overlap by time", line("start", 0, 11, 1, 200, "b", "NORMAL", 10100) + line("end", 0, 11, 1, 200, "b", "NORMAL", 10300), 0, func(r Report) int { return r.Overlaps }},
		{"overlap seen by the lock", line("overlap", 0, 5, 1, 51, "b", "NORMAL", 5100), 0, func(r Report) int { return r.Overlaps }},
		{"duplicate", line("start", 0, 5, 1, 55, "b", "NORMAL", 5500) + line("end", 0, 5, 1, 55, "b", "NORMAL", 5600), 0, func(r Report) int { return r.Duplicates }},
		{"same attempt twice", line("start", 0, 7, 1, 75, "b", "FAILOVER", 7500) + line("end", 0, 7, 1, 75, "b", "FAILOVER", 7600), 0, func(r Report) int { return r.Duplicates }},
		{"miss", "", 5, func(r Report) int { return r.Misses }},
		{"fence inversion", line("start", 0, 11, 1, 3, "b", "NORMAL", 11005) + line("end", 0, 11, 1, 3, "b", "NORMAL", 11205), 0, func(r Report) int { return r.FenceInversions }},
	}
	for _, tt := range tests {
		var kept []string
		for _, l := range strings.SplitAfter(healthy(), "\n") {
			drop := false
			for s := tt.drop; tt.drop != 0 && s <= tt.drop+3; s++ { // a gap of 4 fires
				drop = drop || strings.Contains(l, t0.Add(time.Duration(s)*time.Second).Format(time.RFC3339))
			}
			if !drop {
				kept = append(kept, l)
			}
		}
		r := check(t, strings.Join(kept, "")+tt.extra)
		if tt.field(r) == 0 || r.OK() {
			t.Errorf("%s: not reported: %s", tt.name, r)
		}
	}
}

func TestFailoverOfADeadRunIsNoDuplicate(t *testing.T) {
	// Attempt 1 of fire 5 never ended (its instance died); attempt 2 is a failover.
	var kept []string
	for _, l := range strings.SplitAfter(healthy(), "\n") {
		if !(strings.HasPrefix(l, "end") && strings.Contains(l, t0.Add(5*time.Second).Format(time.RFC3339))) {
			kept = append(kept, l)
		}
	}
	ledger := strings.Join(kept, "") + line("start", 0, 5, 2, 56, "b", "FAILOVER", 5600) + line("end", 0, 5, 2, 56, "b", "FAILOVER", 5800)
	r := check(t, ledger)
	if r.Duplicates != 0 || r.Failovers != 1 {
		t.Errorf("%s %v", r, r.Violations)
	}
}

func TestParseRejectsTornLines(t *testing.T) {
	if _, err := Parse(strings.NewReader("start orders 0\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("err = %v", err)
	}
}

// A fault window stretches the deadline of the fires due inside it to the
// window's end; it does not forgive a fire that has not started by then.
func TestFaultWindowsStretchTheDeadline(t *testing.T) {
	var kept []string // fires 5..8 never run; the run of fire 9 starts at 9.005s
	for _, l := range strings.SplitAfter(healthy(), "\n") {
		drop := false
		for s := 5; s <= 8; s++ {
			drop = drop || strings.Contains(l, t0.Add(time.Duration(s)*time.Second).Format(time.RFC3339))
		}
		if !drop {
			kept = append(kept, l)
		}
	}
	ev, _ := Parse(strings.NewReader(strings.Join(kept, "")))
	o := opts
	if r := Check(ev, o); r.Misses == 0 {
		t.Fatalf("the gap is a miss without a fault window: %s", r)
	}
	o.Faults = []Window{{From: t0.Add(4 * time.Second), To: t0.Add(9500 * time.Millisecond)}}
	if r := Check(ev, o); r.Misses != 0 || r.FiresInFaults == 0 {
		t.Errorf("a run started before the window's end: %s", r)
	}
	o.Faults = []Window{{From: t0.Add(4 * time.Second), To: t0.Add(7 * time.Second)}}
	if r := Check(ev, o); r.Misses == 0 {
		t.Errorf("no run started by the window's end, yet no miss: %s", r)
	}
}
