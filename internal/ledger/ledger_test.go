package ledger

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/schedule"
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

var everySecond, _ = schedule.Parse("@every 1s", nil)

var opts = Options{Jobs: map[string]Job{"orders": {Items: 1, Schedule: everySecond, Failover: true}}, Bound: 3 * time.Second, From: t0, To: t0.Add(11 * time.Second)}

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
		{"one fence started twice at once", line("start", 0, 5, 1, 50, "a", "NORMAL", 5100) + line("end", 0, 5, 1, 50, "a", "NORMAL", 5300), 0, func(r Report) int { return r.Overlaps }},
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

// dropFires removes the runs of fires from..to (seconds after t0).
func dropFires(ledger string, from, to int) string {
	var kept []string
	for _, l := range strings.SplitAfter(ledger, "\n") {
		drop := false
		for s := from; s <= to; s++ {
			drop = drop || strings.Contains(l, t0.Add(time.Duration(s)*time.Second).Format(time.RFC3339))
		}
		if !drop {
			kept = append(kept, l)
		}
	}
	return strings.Join(kept, "")
}

// A fault window stretches the deadline of the fires due inside it to the
// window's end; it forgives no fire that has not started by then, and a run
// of a later fire never stands in for a lost one.
func TestFaultWindowsStretchTheDeadline(t *testing.T) {
	// fire 5 never runs; fire 6 runs late, at 9.5s
	l := dropFires(healthy(), 5, 6) + line("start", 0, 6, 1, 95, "b", "MISFIRE", 9500) + line("end", 0, 6, 1, 95, "b", "MISFIRE", 9600)
	ev, _ := Parse(strings.NewReader(l))
	o := opts
	if r := Check(ev, o); r.Misses != 2 {
		t.Fatalf("fire 5 lost and fire 6 late, no fault window: %d misses, want 2: %s %v", r.Misses, r, r.Violations)
	}
	o.Faults = []Window{{From: t0.Add(4 * time.Second), To: t0.Add(10 * time.Second)}}
	r := Check(ev, o)
	if r.Misses != 1 || r.FiresInFaults == 0 || !strings.Contains(r.Violations[0], "fire 2026-01-01T00:00:05Z") {
		t.Errorf("in a fault window fire 6's late run counts, fire 5 is still lost: %s %v", r, r.Violations)
	}
}

// Per fire: a run of a later fire accounts for an earlier one only if it
// says it coalesced it, and only within the earlier fire's bound.
func TestCoalescedFires(t *testing.T) {
	l := dropFires(healthy(), 5, 7)
	coalescing := func(skipped, atMS int) string {
		return strings.TrimSuffix(line("start", 0, 7, 1, 75, "a", "MISFIRE", atMS), "\n") + fmt.Sprintf(" %d\n", skipped) + line("end", 0, 7, 1, 75, "a", "MISFIRE", atMS+100)
	}
	tests := []struct {
		name   string
		ledger string
		misses int
	}{
		{"a later run that skipped nothing", l + line("start", 0, 7, 1, 75, "a", "NORMAL", 7005) + line("end", 0, 7, 1, 75, "a", "NORMAL", 7100), 2},
		{"coalesced both", l + coalescing(2, 7005), 0},
		{"coalesced one of two", l + coalescing(1, 7005), 1},
		{"coalesced too late for fire 5", l + coalescing(2, 8500), 1},
	}
	for _, tc := range tests {
		ev, err := Parse(strings.NewReader(tc.ledger))
		if err != nil {
			t.Fatal(err)
		}
		if r := Check(ev, opts); r.Misses != tc.misses {
			t.Errorf("%s: %d misses, want %d: %s %v", tc.name, r.Misses, tc.misses, r, r.Violations)
		}
	}
}

// A fire shardd recorded as not run by an explicit policy, within the
// fire's bound, is accounted for; one recorded too late is not.
func TestRecordedFires(t *testing.T) {
	l := dropFires(healthy(), 5, 6)
	ev, _ := Parse(strings.NewReader(l))
	o := opts
	o.Records = []Record{{Job: "orders", Item: 0, Through: t0.Add(6 * time.Second), Count: 2, At: t0.Add(6500 * time.Millisecond)}}
	if r := Check(ev, o); r.Misses != 0 || r.FiresRecorded != 2 {
		t.Errorf("recorded in time: %s %v", r, r.Violations)
	}
	o.Records = []Record{{Job: "orders", Item: 0, Through: t0.Add(6 * time.Second), Count: 1, At: t0.Add(6500 * time.Millisecond)}}
	if r := Check(ev, o); r.Misses != 1 || r.FiresRecorded != 1 {
		t.Errorf("one of two recorded: %s %v", r, r.Violations)
	}
	o.Records = []Record{{Job: "orders", Item: 0, Through: t0.Add(6 * time.Second), Count: 2, At: t0.Add(8500 * time.Millisecond)}}
	if r := Check(ev, o); r.Misses != 1 {
		t.Errorf("fire 5 recorded after its bound: %s %v", r, r.Violations)
	}
	// A run killed by a failure is the record of its fire only where
	// failover is off; with failover on the fire must run again.
	o.Records = []Record{{Job: "orders", Item: 0, Through: t0.Add(5 * time.Second), Count: 1, At: t0.Add(5200 * time.Millisecond), Why: WhyKilled},
		{Job: "orders", Item: 0, Through: t0.Add(6 * time.Second), Count: 1, At: t0.Add(6200 * time.Millisecond), Why: WhyKilled}}
	if r := Check(ev, o); r.Misses != 2 {
		t.Errorf("killed runs of a failover job stood for their fires: %s %v", r, r.Violations)
	}
	o.Jobs = map[string]Job{"orders": {Items: 1, Schedule: everySecond}}
	if r := Check(ev, o); r.Misses != 0 || r.FiresRecorded != 2 {
		t.Errorf("killed runs of a job without failover: %s %v", r, r.Violations)
	}
}

// A run cut by a failure must be re-run within the bound of the failure,
// not merely followed by the next fire.
func TestCutRunsMustBeRerun(t *testing.T) {
	var kept []string // fire 5's run never ends: its instance died at 5.1s
	for _, l := range strings.SplitAfter(healthy(), "\n") {
		if !(strings.HasPrefix(l, "end") && strings.Contains(l, t0.Add(5*time.Second).Format(time.RFC3339))) {
			kept = append(kept, l)
		}
	}
	cut := strings.Join(kept, "")
	o := opts
	// An etcd member's crash (every instance) came first, and one of b; the
	// run on a was cut by a's failure.
	o.Failures = []Failure{{At: t0.Add(5030 * time.Millisecond)}, {At: t0.Add(5050 * time.Millisecond), Instance: "b"}, {At: t0.Add(5100 * time.Millisecond), Instance: "a"}}
	for _, tc := range []struct {
		name   string
		extra  string
		misses int
	}{
		{"not re-run", "", 1},
		{"re-run in time", line("start", 0, 5, 2, 56, "b", "FAILOVER", 7000) + line("end", 0, 5, 2, 56, "b", "FAILOVER", 7100), 0},
		{"re-run too late", line("start", 0, 5, 2, 56, "b", "FAILOVER", 9000) + line("end", 0, 5, 2, 56, "b", "FAILOVER", 9100), 1},
	} {
		ev, _ := Parse(strings.NewReader(cut + tc.extra))
		r := Check(ev, o)
		if r.Misses != tc.misses || r.CutRuns != 1 {
			t.Errorf("%s: %d misses (want %d), %d cut runs judged: %s %v", tc.name, r.Misses, tc.misses, r.CutRuns, r, r.Violations)
		}
		if tc.misses == 0 && (len(r.FailoverLatencies) != 1 || r.FailoverLatencies[0] != 1900*time.Millisecond) {
			t.Errorf("%s: failover latencies %v, want [1.9s]", tc.name, r.FailoverLatencies)
		}
	}
	// A graceful stop that began after the run started cannot have cut it.
	o.Failures = []Failure{{At: t0.Add(5100 * time.Millisecond), Instance: "a", StartedBefore: t0.Add(4 * time.Second)}}
	ev, _ := Parse(strings.NewReader(cut))
	if r := Check(ev, o); r.CutRuns != 0 || r.CutRunsUnattributed != 1 {
		t.Errorf("a stop begun before the run started was blamed: %s %v", r, r.Violations)
	}
}

// A fire that comes while its item still runs (a run longer than the
// period, a failover re-run) starts when that run ends, within the bound.
func TestFireDuringALongRun(t *testing.T) {
	every10, _ := schedule.Parse("@every 10s", nil)
	o := Options{Jobs: map[string]Job{"orders": {Items: 1, Schedule: every10}}, Bound: 3 * time.Second, From: t0, To: t0.Add(41 * time.Second)}
	var b strings.Builder
	b.WriteString(line("start", 0, 10, 1, 10, "a", "NORMAL", 10005))
	b.WriteString(line("end", 0, 10, 1, 10, "a", "NORMAL", 25000)) // a 15s run: fire 20 comes meanwhile
	b.WriteString(line("start", 0, 20, 1, 20, "a", "MISFIRE", 25100))
	b.WriteString(line("end", 0, 20, 1, 20, "a", "MISFIRE", 26000))
	b.WriteString(line("start", 0, 30, 1, 30, "a", "NORMAL", 34500)) // 4.5s late: a miss
	b.WriteString(line("end", 0, 30, 1, 30, "a", "NORMAL", 35000))
	b.WriteString(line("start", 0, 40, 1, 40, "a", "NORMAL", 40005))
	b.WriteString(line("end", 0, 40, 1, 40, "a", "NORMAL", 45000))
	ev, _ := Parse(strings.NewReader(b.String()))
	r := Check(ev, o)
	if r.Misses != 1 || !strings.Contains(r.Violations[0], "00:00:30Z") {
		t.Errorf("%s %v", r, r.Violations)
	}
}

// A fire that comes while a run is cut and re-run (its failover, the same
// fire, attempt + 1, and again) waits for the re-runs: G1 forbids starting
// it beside them. Its bound counts from the end of the chain; a later
// fire's run does not extend the chain, and a fire lost after it is seen.
func TestFireDuringAFailoverChain(t *testing.T) {
	every10, _ := schedule.Parse("@every 10s", nil)
	o := Options{Jobs: map[string]Job{"orders": {Items: 1, Schedule: every10, Failover: true}}, Bound: 3 * time.Second, From: t0, To: t0.Add(61 * time.Second),
		Failures: []Failure{{At: t0.Add(21 * time.Second), Instance: "a"}, {At: t0.Add(25 * time.Second), Instance: "b"}}}
	base := line("start", 0, 10, 1, 10, "a", "NORMAL", 10005) + // a long run: fire 20 comes meanwhile; cut at 21s
		line("start", 0, 10, 2, 11, "b", "FAILOVER", 21500) + // cut at 25s by b's failure
		line("start", 0, 10, 3, 12, "c", "FAILOVER", 25500) +
		line("end", 0, 10, 3, 12, "c", "FAILOVER", 33000) // fire 30 comes during the chain too
	tail := line("start", 0, 30, 1, 30, "c", "MISFIRE", 33600) + line("end", 0, 30, 1, 30, "c", "MISFIRE", 34000) +
		line("start", 0, 40, 1, 40, "c", "NORMAL", 40005) + line("end", 0, 40, 1, 40, "c", "NORMAL", 41000) +
		line("start", 0, 50, 1, 50, "c", "NORMAL", 50005) + line("end", 0, 50, 1, 50, "c", "NORMAL", 51000)
	for _, tc := range []struct {
		name, runs string
		misses     int
	}{
		{"fire 20 after the chain", line("start", 0, 20, 1, 20, "c", "MISFIRE", 33100) + line("end", 0, 20, 1, 20, "c", "MISFIRE", 33500), 0},
		{"fire 20 late after the chain", line("start", 0, 20, 1, 20, "c", "MISFIRE", 36500) + line("end", 0, 20, 1, 20, "c", "MISFIRE", 36800), 1},
		{"fire 20 lost", "", 1},
	} {
		ev, err := Parse(strings.NewReader(base + tc.runs + tail))
		if err != nil {
			t.Fatal(err)
		}
		r := Check(ev, o)
		if r.Misses != tc.misses || r.CutRuns != 2 {
			t.Errorf("%s: %d misses (want %d), %d cut runs: %s %v", tc.name, r.Misses, tc.misses, r.CutRuns, r, r.Violations)
		}
	}
}

// A run that ended but whose instance was cut off before recording it is
// re-run (failover, attempt + 1: G2's exception); a fire due during the
// first run waits for the re-run too. A re-run that came long after the end
// is not part of the run, and does not excuse the later fire.
func TestFireDuringTheRerunOfAnEndedRun(t *testing.T) {
	every10, _ := schedule.Parse("@every 10s", nil)
	o := Options{Jobs: map[string]Job{"orders": {Items: 1, Schedule: every10, Failover: true}}, Bound: 3 * time.Second, From: t0, To: t0.Add(41 * time.Second),
		Failures: []Failure{{At: t0.Add(19 * time.Second), Instance: "a"}}}
	tail := line("start", 0, 30, 1, 30, "b", "NORMAL", 30005) + line("end", 0, 30, 1, 30, "b", "NORMAL", 31000) +
		line("start", 0, 40, 1, 40, "b", "NORMAL", 40005) + line("end", 0, 40, 1, 40, "b", "NORMAL", 41000)
	for _, tc := range []struct {
		name    string
		rerunAt int // ms
		endAt   int // ms
		misses  int
	}{
		{"re-run at once after the unrecorded end", 22000, 20030, 0}, // the end at 20.03s went unrecorded
		{"re-run long after", 24500, 20030, 1},
		// The run ended before the fire, unrecorded (its instance failed
		// at 19s), and its re-run began after the fire: the item was held
		// throughout (the marker, then the re-run).
		{"ended before the fire, re-run after it", 22000, 19900, 0},
	} {
		runs := line("start", 0, 10, 1, 10, "a", "NORMAL", 10005) + line("end", 0, 10, 1, 10, "a", "NORMAL", tc.endAt) +
			line("start", 0, 10, 2, 11, "b", "FAILOVER", tc.rerunAt) + line("end", 0, 10, 2, 11, "b", "FAILOVER", tc.rerunAt+4000) +
			line("start", 0, 20, 1, 20, "b", "MISFIRE", tc.rerunAt+4050) + line("end", 0, 20, 1, 20, "b", "MISFIRE", tc.rerunAt+4500)
		ev, err := Parse(strings.NewReader(runs + tail))
		if err != nil {
			t.Fatal(err)
		}
		if r := Check(ev, o); r.Misses != tc.misses {
			t.Errorf("%s: %d misses, want %d: %s %v", tc.name, r.Misses, tc.misses, r, r.Violations)
		}
	}
}

// A run that ended before a fire, whose instance did not fail, and a
// "re-run" of it after the fire: nothing held the item at the fire, so the
// fire's bound counts from its due time (a miss).
func TestEndedRunWithoutFailureDoesNotExcuse(t *testing.T) {
	every10, _ := schedule.Parse("@every 10s", nil)
	o := Options{Jobs: map[string]Job{"orders": {Items: 1, Schedule: every10, Failover: true}}, Bound: 3 * time.Second, From: t0, To: t0.Add(41 * time.Second)}
	runs := line("start", 0, 10, 1, 10, "a", "NORMAL", 10005) + line("end", 0, 10, 1, 10, "a", "NORMAL", 19900) +
		line("start", 0, 10, 2, 11, "b", "FAILOVER", 22000) + line("end", 0, 10, 2, 11, "b", "FAILOVER", 26000) +
		line("start", 0, 20, 1, 20, "b", "MISFIRE", 26050) + line("end", 0, 20, 1, 20, "b", "MISFIRE", 26500) +
		line("start", 0, 30, 1, 30, "b", "NORMAL", 30005) + line("end", 0, 30, 1, 30, "b", "NORMAL", 31000) +
		line("start", 0, 40, 1, 40, "b", "NORMAL", 40005) + line("end", 0, 40, 1, 40, "b", "NORMAL", 41000)
	ev, err := Parse(strings.NewReader(runs))
	if err != nil {
		t.Fatal(err)
	}
	if r := Check(ev, o); r.Misses != 1 {
		t.Errorf("%d misses, want 1 (the fire of 20s): %s %v", r.Misses, r, r.Violations)
	}
}

// Jobs whose period is longer than the bound: a lost fire is seen although
// the next fire's run comes (an every-second checker could not see it).
func TestLongPeriodFireLost(t *testing.T) {
	every10, _ := schedule.Parse("@every 10s", nil)
	o := Options{Jobs: map[string]Job{"orders": {Items: 1, Schedule: every10}}, Bound: 3 * time.Second, From: t0, To: t0.Add(41 * time.Second)}
	var b strings.Builder
	for _, s := range []int{10, 30, 40} { // fire 20 lost
		b.WriteString(line("start", 0, s, 1, int64(s), "a", "NORMAL", s*1000+5))
		b.WriteString(line("end", 0, s, 1, int64(s), "a", "NORMAL", s*1000+2000))
	}
	b.WriteString(line("start", 0, 41, 1, 99, "a", "MANUAL", 45000)) // the ledger goes on past the last deadline
	ev, _ := Parse(strings.NewReader(b.String()))
	r := Check(ev, o)
	if r.Misses != 1 || r.FiresChecked != 3 || !strings.Contains(r.Violations[0], "00:00:20Z") {
		t.Errorf("%s %v", r, r.Violations)
	}
}

// The checker's due fires are the schedule's, so G3 follows the DST rule
// of pkg/schedule: in Berlin, a daily 02:15 is due at 03:00 CEST on the
// night the clocks jump over it (the old reading of the cron had no fire
// that day), and once, at 02:15 CEST, on the night they go back.
func TestDueFiresFollowTheDSTRule(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	nightly, err := schedule.Parse("0 15 2 * * ?", berlin)
	if err != nil {
		t.Fatal(err)
	}
	run := func(fire string, fence int) string {
		f, err := time.Parse(time.RFC3339, fire)
		if err != nil {
			t.Fatal(err)
		}
		at := f.Add(50 * time.Millisecond).UnixNano()
		return fmt.Sprintf("start nightly 0 %s 1 %d a NORMAL %d\nend nightly 0 %[1]s 1 %[2]d a NORMAL %d\n", f.UTC().Format(time.RFC3339), fence, at, at+int64(time.Second))
	}
	tests := []struct {
		name     string
		from, to string
		fires    []string
		misses   int
	}{
		{"spring forward, run at the jump", "2026-03-28T00:00:00+01:00", "2026-03-31T00:00:00+02:00",
			[]string{"2026-03-28T02:15:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:15:00+02:00"}, 0},
		{"spring forward, the jump's fire missing", "2026-03-28T00:00:00+01:00", "2026-03-31T00:00:00+02:00",
			[]string{"2026-03-28T02:15:00+01:00", "2026-03-30T02:15:00+02:00"}, 1},
		{"fall back, once", "2026-10-24T00:00:00+02:00", "2026-10-27T00:00:00+01:00",
			[]string{"2026-10-24T02:15:00+02:00", "2026-10-25T02:15:00+02:00", "2026-10-26T02:15:00+01:00"}, 0},
	}
	for _, tt := range tests {
		var b strings.Builder
		for i, f := range tt.fires {
			b.WriteString(run(f, 10*(i+1)))
		}
		b.WriteString(run("2026-12-01T02:15:00+01:00", 1000)) // the ledger goes on past every deadline
		ev, err := Parse(strings.NewReader(b.String()))
		if err != nil {
			t.Fatal(err)
		}
		from, _ := time.Parse(time.RFC3339, tt.from)
		to, _ := time.Parse(time.RFC3339, tt.to)
		r := Check(ev, Options{Jobs: map[string]Job{"nightly": {Items: 1, Schedule: nightly}}, Bound: 3 * time.Second, From: from, To: to})
		if r.Misses != tt.misses || r.FiresChecked != 3 {
			t.Errorf("%s: %d fires checked, %d misses (want 3, %d): %v", tt.name, r.FiresChecked, r.Misses, tt.misses, r.Violations)
		}
	}
}
