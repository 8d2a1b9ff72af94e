package engine

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/schedule"
)

// decide under the scheduling policies of docs/policies.md: overlap
// bufferAll, a job's catch-up window, calendars, an active window, and
// catching up a year in one step. The clock is the now of each case.
func TestDecidePolicies(t *testing.T) {
	t.Parallel()
	base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC) // a Friday
	at := func(s float64) time.Time { return base.Add(time.Duration(s * float64(time.Second))) }
	day := func(d int, hms string) time.Time {
		c, _ := time.Parse("15:04:05", hms)
		return time.Date(2027, 1, 1+d, c.Hour(), c.Minute(), c.Second(), 0, time.UTC)
	}
	every10 := mustSchedule(t, "@every 10s")
	hourly := mustSchedule(t, "0 0 * * * ?")
	daily9 := mustSchedule(t, "0 0 9 * * ?")
	everySecond := mustSchedule(t, "* * * * * ?")
	weekends := schedule.Exclusion{{Name: "weekends", Loc: time.UTC, Weekdays: 1<<time.Saturday | 1<<time.Sunday}}

	done := func(fire, end time.Time) keyspace.ItemState {
		return keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: fire, Sched: fire, State: keyspace.StateDone, Attempt: 1, Source: keyspace.SourceNormal, End: end}, Rev: 7}
	}
	bufferAll := policy{schedule: every10, failover: true, overlap: config.OverlapBufferAll, window: time.Hour}
	tests := []struct {
		name string
		st   keyspace.ItemState
		p    policy
		now  time.Time
		want action
	}{
		// catchUpWindow
		{"catch-up window: the latest missed fire is younger than it: it runs for the others",
			done(at(-7200), at(-7190)), policy{schedule: hourly, misfire: true, window: 30 * time.Minute}, at(600),
			action{kind: run, fire: at(0), attempt: 1, source: "MISFIRE", skipped: 1, sched: at(0), oldest: at(-3600)}},
		{"catch-up window: the latest missed fire is older than it: all are skipped, too-old",
			done(at(-7200), at(-7190)), policy{schedule: hourly, misfire: true, window: 30 * time.Minute}, at(2400),
			action{kind: skip, fire: at(0), skipped: 2, why: keyspace.SkipTooOld}},
		{"a year of every second, down: the latest runs, 31,535,999 counted (no bound of 100,000)",
			done(at(-365*86400), at(-365*86400+1)), policy{schedule: everySecond, misfire: true, window: time.Minute}, at(0.5),
			action{kind: run, fire: at(0), attempt: 1, source: "MISFIRE", skipped: 365*86400 - 1, sched: at(0), oldest: at(-365*86400 + 1)}},

		// calendars
		{"calendar: Saturday's fire is excluded: recorded skipped, reason calendar",
			done(day(0, "09:00:00"), day(0, "09:00:05")), policy{schedule: daily9, misfire: true, window: time.Hour, exclusion: weekends}, day(1, "09:00:01"),
			action{kind: skip, fire: day(1, "09:00:00"), excluded: 1, why: keyspace.SkipCalendar}},
		{"calendar: down over the weekend: Monday runs, accounting for the weekend's two excluded fires",
			done(day(0, "09:00:00"), day(0, "09:00:05")), policy{schedule: daily9, misfire: true, window: time.Hour, exclusion: weekends}, day(3, "09:00:01"),
			action{kind: run, fire: day(3, "09:00:00"), attempt: 1, source: "NORMAL", excluded: 2, sched: day(3, "09:00:00"), oldest: day(1, "09:00:00")}},
		{"calendar: the latest due fire is excluded, an earlier one is not: that one runs first",
			done(day(-1, "09:00:00"), day(-1, "09:00:05")), policy{schedule: daily9, misfire: true, window: 48 * time.Hour, exclusion: weekends}, day(1, "09:00:30"),
			action{kind: run, fire: day(0, "09:00:00"), attempt: 1, source: "NORMAL", sched: day(0, "09:00:00")}},
		{"calendar: a disabled item's excluded fires are recorded disabled (nothing would have run)",
			keyspace.ItemState{Record: done(day(0, "09:00:00"), day(0, "09:00:05")).Record, Disabled: true}, policy{schedule: daily9, misfire: true, window: time.Hour, exclusion: weekends}, day(1, "09:00:01"),
			action{kind: skip, fire: day(1, "09:00:00"), skipped: 1, why: keyspace.SkipDisabled}},

		// overlap bufferAll
		{"bufferAll: fires that came while it ran run one by one, the oldest first",
			done(at(0), at(35)), bufferAll, at(35.1),
			action{kind: run, fire: at(10), attempt: 1, source: "MISFIRE", sched: at(10)}},
		{"bufferAll: the last of the queue, on time, is NORMAL",
			done(at(20), at(25)), bufferAll, at(30.1),
			action{kind: run, fire: at(30), attempt: 1, source: "NORMAL", sched: at(30)}},
		{"bufferAll: more pending than bufferLimit: the oldest are skipped, buffer-full",
			done(at(0), at(55)), policy{schedule: every10, overlap: config.OverlapBufferAll, bufferLimit: 2, window: time.Hour}, at(55.1),
			action{kind: skip, fire: at(30), skipped: 3, why: keyspace.SkipBufferFull}},
		{"bufferAll: fires older than the catch-up window are skipped, too-old, then the rest run",
			done(at(0), at(1)), policy{schedule: every10, overlap: config.OverlapBufferAll, window: time.Minute}, at(200),
			action{kind: skip, fire: at(130), skipped: 13, why: keyspace.SkipTooOld}},
		{"bufferAll: a calendar's fires at the head of the queue are recorded together, calendar",
			done(day(0, "09:00:00"), day(0, "09:00:05")), policy{schedule: daily9, overlap: config.OverlapBufferAll, window: 96 * time.Hour, exclusion: weekends}, day(3, "09:00:01"),
			action{kind: skip, fire: day(2, "09:00:00"), excluded: 2, why: keyspace.SkipCalendar}},
		{"bufferAll: after the calendar's record, Monday runs",
			keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: day(2, "09:00:00"), Sched: day(2, "09:00:00"), State: keyspace.StateSkipped, Reason: keyspace.SkipCalendar, Excluded: 2}, Rev: 9},
			policy{schedule: daily9, overlap: config.OverlapBufferAll, window: 96 * time.Hour, exclusion: weekends}, day(3, "09:00:01"),
			action{kind: run, fire: day(3, "09:00:00"), attempt: 1, source: "NORMAL", sched: day(3, "09:00:00")}},

		// active window
		{"activeUntil passed: no fire is due after it",
			done(at(-3600), at(-3590)), policy{schedule: schedule.Window{S: hourly, Until: at(-1)}, misfire: true, window: time.Hour}, at(7200),
			action{}},
		{"activeFrom ahead: nothing is due before it, the record begins",
			keyspace.ItemState{}, policy{schedule: schedule.Window{S: hourly, From: at(3600)}, misfire: true, window: time.Hour, baseline: at(-7200)}, at(10),
			action{kind: begin, fire: at(10)}},
	}
	for _, tt := range tests {
		if got := decide(tt.st, false, tt.p, tt.now); got != tt.want {
			t.Errorf("%s:\n got  %+v\n want %+v", tt.name, got, tt.want)
		}
	}
}

// bufferAll's queue drains to the end in order: replaying decide over its
// own records, every due fire is run or skipped exactly once.
func TestBufferAllDrainsInOrder(t *testing.T) {
	t.Parallel()
	base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	p := policy{schedule: mustSchedule(t, "@every 10s"), overlap: config.OverlapBufferAll, bufferLimit: 4, window: time.Hour}
	// The item ran from fire 0 until 95 s: fires 10..90 came meanwhile.
	st := keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: base, Sched: base, State: keyspace.StateDone, End: base.Add(95 * time.Second)}}
	now := base.Add(95 * time.Second)
	var ran []int
	accounted := 0
	for range 20 {
		a := decide(st, false, p, now)
		switch a.kind {
		case run:
			ran = append(ran, int(a.fire.Sub(base)/time.Second))
			accounted += 1 + a.skipped + a.excluded
			now = now.Add(time.Second) // each run takes a second
			st.Record = &keyspace.ItemRecord{Fire: a.fire, Sched: a.sched, State: keyspace.StateDone, End: now}
		case skip:
			accounted += a.skipped + a.excluded
			st.Record = &keyspace.ItemRecord{Fire: a.fire, Sched: a.fire, State: keyspace.StateSkipped, Reason: a.why, Skipped: a.skipped}
		case none:
			if want := int(now.Sub(base) / (10 * time.Second)); accounted != want {
				t.Fatalf("accounted for %d fires, %d were due", accounted, want)
			}
			if len(ran) < 4 || ran[0] != 60 {
				t.Fatalf("ran %v: want the 4 newest pending fires (60, 70, 80, 90) first, then each one due", ran)
			}
			for i := 1; i < len(ran); i++ {
				if ran[i] != ran[i-1]+10 {
					t.Fatalf("ran %v: not in order, or a fire left out", ran)
				}
			}
			return
		}
	}
	t.Fatalf("the queue did not drain: ran %v", ran)
}

// overlap replace: a newer fire of a running item asks its run to stop
// (the run's fence, its instance); the new fire runs once the run has
// ended, KILLED/replaced, standing for what came meanwhile.
func TestDecideReplace(t *testing.T) {
	t.Parallel()
	base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return base.Add(time.Duration(s * float64(time.Second))) }
	every10 := mustSchedule(t, "@every 10s")
	p := policy{schedule: every10, failover: true, overlap: config.OverlapReplace, window: time.Minute}
	running := func(by string, mine bool) keyspace.ItemState {
		return keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: at(0), Sched: at(0), State: keyspace.StateRunning, Attempt: 1, Source: "NORMAL"}, Rev: 41, RunningBy: by, RunningMine: mine}
	}
	replaced := keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: at(0), Sched: at(0), State: keyspace.StateKilled, Reason: keyspace.ReasonReplaced, Fence: 41, Attempt: 1, Source: "NORMAL", End: at(10.2)}, Rev: 50}
	weekdays := schedule.Exclusion{{Name: "all", Loc: time.UTC, Weekdays: 0x7f}}
	tests := []struct {
		name  string
		st    keyspace.ItemState
		local bool
		p     policy
		now   time.Time
		want  action
	}{
		{"no newer fire yet: the run goes on", running("b", false), false, p, at(9), action{}},
		{"a newer fire: the run elsewhere is asked to stop", running("b", false), false, p, at(10.1),
			action{kind: replace, fire: at(10), fence: 41, by: "b"}},
		{"the run is here: asked too (the request reaches this instance's own watch)", running("a", true), true, p, at(10.1),
			action{kind: replace, fire: at(10), fence: 41, by: "a"}},
		{"a claim of this session no run here knows: adopted, not replaced", running("a", true), false, p, at(10.1),
			action{kind: adopt, fire: at(0), attempt: 1, source: "NORMAL", sched: at(0)}},
		{"the newer fire is older than the catch-up window: no replace", running("b", false), false,
			policy{schedule: schedule.Window{S: every10, Until: at(10)}, overlap: config.OverlapReplace, window: time.Minute}, at(75), action{}},
		{"the newer fire falls on an excluded day: no replace", running("b", false), false, policy{schedule: every10, overlap: config.OverlapReplace, window: time.Minute, exclusion: weekdays}, at(10.1), action{}},
		{"disabled: not replaced", keyspace.ItemState{Record: running("b", false).Record, Rev: 41, RunningBy: "b", Disabled: true}, false, p, at(10.1), action{}},
		{"replaced: the new fire runs, on time: NORMAL", replaced, false, p, at(10.3),
			action{kind: run, fire: at(10), attempt: 1, source: "NORMAL", sched: at(10)}},
		{"bufferOne does not replace", running("b", false), false, policy{schedule: every10, misfire: true, window: time.Minute}, at(10.1), action{}},
	}
	for _, tt := range tests {
		if got := decide(tt.st, tt.local, tt.p, tt.now); got != tt.want {
			t.Errorf("%s:\n got  %+v\n want %+v", tt.name, got, tt.want)
		}
	}
	if replaced.Record.CutByFailure() {
		t.Error("a replaced run counts as cut by a failure: it would be failed over")
	}
}

// A re-run (failover, or a claim whose work never started) keeps the
// fires its record accounted for, the calendar's too (review of #30).
func TestRerunKeepsExcluded(t *testing.T) {
	t.Parallel()
	s := mustSchedule(t, "0 0 9 * * ?")
	weekends := schedule.Exclusion{{Name: "weekends", Loc: time.UTC, Weekdays: 1<<time.Saturday | 1<<time.Sunday}}
	p := policy{schedule: s, failover: true, misfire: true, window: time.Hour, exclusion: weekends}
	mon := time.Date(2027, 1, 4, 9, 0, 0, 0, time.UTC)
	now := mon.Add(time.Minute)
	first := decide(keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: mon.AddDate(0, 0, -3), Sched: mon.AddDate(0, 0, -3), State: keyspace.StateDone}}, false, p, now)
	if first.kind != run || first.excluded != 2 {
		t.Fatalf("Monday after a weekend: %+v, want a run accounting for 2 excluded fires", first)
	}
	cut := &keyspace.ItemRecord{Fire: mon, Sched: mon, Attempt: 1, Source: first.source, Excluded: first.excluded, State: keyspace.StateRunning}
	never := *cut
	never.State, never.Reason = keyspace.StateKilled, keyspace.ReasonNotStarted
	for _, st := range []keyspace.ItemState{{Record: cut}, {Record: &never}, {Record: cut, RunningBy: "a", RunningMine: true}} {
		if a := decide(st, false, p, now); a.excluded != 2 {
			t.Errorf("%s of a record with excluded 2 carries excluded %d", a.kind, a.excluded)
		}
	}
}

// fixedDelay: each item's next fire is its record's end plus the delay,
// rounded up to a second; the first, the second after its record begins.
func TestDecideFixedDelay(t *testing.T) {
	t.Parallel()
	base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return base.Add(time.Duration(s * float64(time.Second))) }
	p := policy{failover: true, misfire: true, fixedDelay: 10 * time.Second, window: time.Minute, baseline: at(-5)}
	done := func(fire, end float64) keyspace.ItemState {
		return keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: at(fire), Sched: at(fire), State: keyspace.StateDone, Attempt: 1, Fence: 9, Source: "NORMAL", Start: at(fire), End: at(end)}, Rev: 7}
	}
	begun := keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: at(0.3), Sched: at(0.3), State: keyspace.StateSkipped}, Rev: 3}
	tests := []struct {
		name string
		st   keyspace.ItemState
		now  time.Time
		want action
	}{
		{"never claimed: the record begins", keyspace.ItemState{}, at(0.3), action{kind: begin, fire: at(0.3)}},
		{"begun: the first fire is the next second", begun, at(0.5), action{fire: at(1)}},
		{"begun, that second has come: it runs", begun, at(1.01), action{kind: run, fire: at(1), attempt: 1, source: "NORMAL", sched: at(1)}},
		{"ran until 4.2 s: the next fire is at 15 s (14.2 rounded up)", done(1, 4.2), at(5), action{fire: at(15)}},
		{"its time came", done(1, 4.2), at(15.001), action{kind: run, fire: at(15), attempt: 1, source: "NORMAL", sched: at(15)}},
		{"its owner was down for an hour: the fire runs late, nothing skipped", done(1, 4.2), at(3600), action{kind: run, fire: at(15), attempt: 1, source: "NORMAL", sched: at(15)}},
		{"a run cut by a failure is re-run first", keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: at(15), Sched: at(15), State: keyspace.StateRunning, Attempt: 1, Source: "NORMAL"}, Rev: 12}, at(20),
			action{kind: run, fire: at(15), attempt: 2, source: "FAILOVER", sched: at(15)}},
		{"running elsewhere: wait", keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: at(15), Sched: at(15), State: keyspace.StateRunning}, Rev: 12, RunningBy: "b"}, at(40), action{}},
	}
	for _, tt := range tests {
		if got := decide(tt.st, false, p, tt.now); got != tt.want {
			t.Errorf("%s:\n got  %+v\n want %+v", tt.name, got, tt.want)
		}
	}
}

// clusterConcurrency: the free slots go to the runs that waited longest,
// counting the items waiting on other instances; an adoption keeps its
// slot.
func TestAssignClusterSlots(t *testing.T) {
	t.Parallel()
	base := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC)
	st := func(item int, since float64, kind actionKind) start {
		return start{item: item, a: action{kind: kind, fire: base.Add(time.Duration(since) * time.Second)}}
	}
	tests := []struct {
		name        string
		starts      []start
		limit       int
		held        []int
		waiting     map[int]float64
		wantGranted map[int]int // item -> slot+1
		wantWaiting []int
	}{
		{"slots free for all", []start{st(0, 0, run), st(1, 0, run)}, 3, nil, nil, map[int]int{0: 1, 1: 2}, nil},
		{"one slot: the older fire gets it", []start{st(0, 10, run), st(1, 5, run)}, 2, []int{0}, nil, map[int]int{1: 2}, []int{0}},
		{"an item waiting elsewhere since earlier goes first", []start{st(0, 10, run)}, 2, []int{1}, map[int]float64{7: 3}, map[int]int{}, []int{0}},
		{"waiting elsewhere but later: ours goes first", []start{st(0, 10, run)}, 2, []int{1}, map[int]float64{7: 20}, map[int]int{0: 1}, nil},
		{"our own waiting key does not count against us", []start{st(0, 10, run)}, 1, nil, map[int]float64{0: 10}, map[int]int{0: 1}, nil},
		{"every slot held: all wait", []start{st(0, 0, run), st(1, 0, run)}, 2, []int{0, 1}, nil, map[int]int{}, []int{0, 1}},
		{"an adoption keeps its claim's slot", []start{st(0, 0, adopt), st(1, 0, run)}, 1, []int{0}, nil, map[int]int{0: 0}, []int{1}},
		{"ties by item", []start{st(3, 0, run), st(2, 0, run)}, 1, nil, nil, map[int]int{2: 1}, []int{3}},
	}
	for _, tt := range tests {
		cs := coord.ClusterSlots{Held: map[int]bool{}, Waiting: map[int]time.Time{}}
		for _, k := range tt.held {
			cs.Held[k] = true
		}
		for item, s := range tt.waiting {
			cs.Waiting[item] = base.Add(time.Duration(s) * time.Second)
		}
		granted, waiting := assignClusterSlots(tt.starts, tt.limit, cs)
		got := map[int]int{}
		for _, s := range granted {
			got[s.item] = s.a.slot
		}
		var gotWaiting []int
		for _, s := range waiting {
			gotWaiting = append(gotWaiting, s.item)
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.wantGranted) || fmt.Sprint(gotWaiting) != fmt.Sprint(tt.wantWaiting) {
			t.Errorf("%s: granted %v waiting %v, want %v and %v", tt.name, got, gotWaiting, tt.wantGranted, tt.wantWaiting)
		}
	}
}

// An item's due fires give the same answers listed (a few, walked) and
// counted (many, schedule.Count and friends): decide takes either.
func TestDueListedAndCountedAgree(t *testing.T) {
	t.Parallel()
	weekends := schedule.Exclusion{{Name: "weekends", Loc: time.UTC, Weekdays: 1<<time.Saturday | 1<<time.Sunday}}
	base := time.Date(2027, 1, 1, 8, 0, 0, 0, time.UTC) // a Friday
	for _, spec := range []string{"0 0 9 * * ?", "0 0 9,21 * * ?", "@every 7h"} {
		s := mustSchedule(t, spec)
		for _, x := range []schedule.Exclusion{nil, weekends} {
			for days := 0; days < 6; days++ {
				now := base.Add(time.Duration(days)*24*time.Hour + 90*time.Minute)
				listed := dueOf(s, x, base, now)
				if !listed.listed {
					continue
				}
				counted := due{s: s, x: x, base: base, now: now}
				for _, upTo := range []time.Time{now, now.Add(-13 * time.Hour), base.Add(time.Hour)} {
					li, le := listed.counts(upTo)
					ci, ce := counted.counts(upTo)
					if li != ci || le != ce || !listed.latest(upTo).Equal(counted.latest(upTo)) || !listed.latestIncluded(upTo).Equal(counted.latestIncluded(upTo)) {
						t.Errorf("%s %v to %s, up to %s: listed %d/%d %s %s, counted %d/%d %s %s", spec, x != nil, now, upTo,
							li, le, listed.latest(upTo), listed.latestIncluded(upTo), ci, ce, counted.latest(upTo), counted.latestIncluded(upTo))
					}
				}
				for k := 1; k <= 3; k++ {
					if !listed.nthIncluded(k).Equal(counted.nthIncluded(k)) {
						t.Errorf("%s %v to %s: nthIncluded(%d) listed %s, counted %s", spec, x != nil, now, k, listed.nthIncluded(k), counted.nthIncluded(k))
					}
				}
				if !listed.first().Equal(counted.first()) || !listed.nextIncluded().Equal(counted.nextIncluded()) {
					t.Errorf("%s %v to %s: first/nextIncluded differ", spec, x != nil, now)
				}
			}
		}
	}
}

// BenchmarkDecideDue measures decide's cost for an item with one fire due
// (every reconcile of every item) and with a year of fires due (a long
// outage): the first walks, the second counts.
func BenchmarkDecideDue(b *testing.B) {
	berlin, _ := time.LoadLocation("Europe/Berlin")
	hourly, _ := schedule.Parse("0 0 * * * ?", berlin)
	seconds, _ := schedule.Parse("* * * * * ?", berlin)
	now := time.Date(2027, 3, 1, 12, 0, 0, 500, time.UTC)
	for _, c := range []struct {
		name string
		s    schedule.Schedule
		from time.Time
	}{{"one-due", hourly, now.Add(-time.Hour)}, {"year-of-seconds", seconds, now.AddDate(-1, 0, 0)}} {
		st := keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: c.from, Sched: c.from, State: keyspace.StateDone, End: c.from.Add(time.Second)}, Rev: 3}
		p := policy{schedule: c.s, misfire: true, window: time.Hour}
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if a := decide(st, false, p, now); a.kind != run {
					b.Fatalf("%+v", a)
				}
			}
		})
	}
}

// slotsNode is a fakeNode with cluster slots in memory.
type slotsNode struct {
	*fakeNode
	cs       coord.ClusterSlots
	unwaited []int
}

func (s *slotsNode) ReadClusterSlots(context.Context, string) (coord.ClusterSlots, error) {
	return coord.ClusterSlots{Held: maps.Clone(s.cs.Held), Waiting: maps.Clone(s.cs.Waiting), WaitingKeys: maps.Clone(s.cs.WaitingKeys)}, nil
}

func (s *slotsNode) Wait(_ context.Context, _ string, item int, since time.Time) error {
	s.cs.Waiting[item] = since
	s.cs.WaitingKeys[item] = coord.WaitingKey{Instance: s.id, Rev: s.cs.WaitingKeys[item].Rev + 1}
	return nil
}

func (s *slotsNode) Unwait(_ context.Context, _ string, item int, rev int64) error {
	if s.cs.WaitingKeys[item].Rev == rev {
		s.unwaited = append(s.unwaited, item)
		delete(s.cs.Waiting, item)
		delete(s.cs.WaitingKeys, item)
	}
	return nil
}

// Which waiting keys (clusterConcurrency) an instance deletes as stale:
// its own for an item it does not wait for now, an item no longer in the
// job, a key of an instance the job's map no longer has; never a key of
// another instance of the map, which may wait for what this one cannot
// see (a trigger, an upstream fire: review of #30, where such a key was
// deleted and this instance's newer run took the only slot).
func TestDropStaleWaiting(t *testing.T) {
	t.Parallel()
	now := time.Date(2027, 3, 1, 12, 0, 0, 0, time.UTC)
	wm := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	rec := func(item int) keyspace.ItemState {
		return keyspace.ItemState{Record: &keyspace.ItemRecord{Job: "j", Item: item, Fire: wm, Sched: wm, State: keyspace.StateDone, End: wm.Add(time.Second)}, Rev: 50 + int64(item)}
	}
	manual := func(item int) start {
		return start{item: item, st: rec(item), a: action{kind: run, fire: now, attempt: 1, source: keyspace.SourceManual}}
	}
	tests := []struct {
		name         string
		keys         map[int]string // item -> the instance that put its key
		starts       []start        // a's runs this pass
		wantUnwaited []int
		wantGranted  []int
	}{
		{"b's item waits for a trigger since earlier: kept, and it goes first", map[int]string{1: "b"}, []start{manual(0)}, nil, nil},
		{"a key of an instance no longer in the map: deleted", map[int]string{1: "gone"}, []start{manual(0)}, []int{1}, []int{0}},
		{"a's own key for an item it no longer waits for: deleted", map[int]string{2: "a"}, nil, []int{2}, nil},
		{"a's own key for an item that still waits: kept (its run takes the slot)", map[int]string{0: "a"}, []start{manual(0)}, nil, []int{0}},
		{"an item no longer in the job: deleted", map[int]string{7: "b"}, []start{manual(0)}, []int{7}, []int{0}},
		{"nothing to start, no key of its own: the slots are not read", map[int]string{7: "b", 1: "gone"}, nil, nil, nil},
		{"a loop's first pass reads them: a's key put before a reload, for an item it no longer waits for, is deleted", map[int]string{2: "a"}, nil, []int{2}, nil},
	}
	for _, tt := range tests {
		fn := newFakeNode(t, `jobs:
  - name: j
    cron: "0 0 0 1 1 ?"
    shardingTotalCount: 3
    clusterConcurrency: 1
    script: ["/bin/true"]
`, map[string][]int{"a": {0, 2}, "b": {1}})
		sn := &slotsNode{fakeNode: fn, cs: coord.ClusterSlots{Held: map[int]bool{}, Waiting: map[int]time.Time{}, WaitingKeys: map[int]coord.WaitingKey{}}}
		for item, id := range tt.keys {
			sn.cs.Waiting[item] = now.Add(-10 * time.Second)
			sn.cs.WaitingKeys[item] = coord.WaitingKey{Instance: id, Rev: 40}
		}
		e := &Engine{opts: Options{Node: sn, Now: func() time.Time { return now }}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
		j := &jobLoop{e: e, name: "j", log: e.log, baseline: wm, seen: map[int]time.Time{}}
		first := strings.HasPrefix(tt.name, "a loop's first pass")
		j.slotsRead = !first
		if tt.keys[2] == "a" && !first {
			j.waitKeys = map[int]bool{2: true} // it put that key
		}
		v, _ := fn.View("j")
		r := &pass{v: v, now: now, total: 3, policy: policyOf(v.Job, time.Minute, wm),
			items: keyspace.JobItems{Items: map[int]keyspace.ItemState{0: rec(0), 1: rec(1), 2: rec(2)}}, starts: tt.starts}
		j.takeClusterSlots(context.Background(), r)
		var granted []int
		for _, s := range r.starts {
			granted = append(granted, s.item)
		}
		slices.Sort(sn.unwaited)
		if fmt.Sprint(sn.unwaited) != fmt.Sprint(tt.wantUnwaited) || fmt.Sprint(granted) != fmt.Sprint(tt.wantGranted) {
			t.Errorf("%s: deleted the waiting keys of %v and granted %v, want %v and %v", tt.name, sn.unwaited, granted, tt.wantUnwaited, tt.wantGranted)
		}
		if len(j.waitKeys) != 0 && !slices.ContainsFunc(tt.starts, func(s start) bool { return j.waitKeys[s.item] }) {
			t.Errorf("%s: still looks after the keys of %v", tt.name, j.waitKeys)
		}
	}
}

// A jittered fire's lateness counts from its start (the fire plus the
// item's offset for it), not from the fire plus the whole jitter: with
// catchUpWindow 1m and jitter 50m, a fire whose offset is small is too old
// 40 minutes after its start (review of #30: it ran), and one whose offset
// is large still runs a few seconds after its start, an hour after the
// fire. Under bufferOne and bufferAll alike.
func TestDecideJitterCountsLatenessFromTheStart(t *testing.T) {
	t.Parallel()
	hourly := mustSchedule(t, "0 0 * * * ?")
	const jitter = 50 * time.Minute
	// fireWith finds a fire whose offset for item 2 satisfies ok.
	fireWith := func(ok func(time.Duration) bool) (time.Time, time.Duration) {
		fire := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
		for !ok(schedule.JitterOffset("j", 2, fire, jitter)) {
			fire = fire.Add(time.Hour)
		}
		return fire, schedule.JitterOffset("j", 2, fire, jitter)
	}
	small, smallOff := fireWith(func(d time.Duration) bool { return d < 5*time.Minute })
	large, largeOff := fireWith(func(d time.Duration) bool { return d > 45*time.Minute })
	done := func(fire time.Time) keyspace.ItemState {
		prev := fire.Add(-time.Hour)
		return keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: prev, Sched: prev, State: keyspace.StateDone, Attempt: 1, End: prev.Add(time.Second)}, Rev: 7}
	}
	for _, overlap := range []string{config.OverlapBufferOne, config.OverlapBufferAll} {
		p := policy{schedule: hourly, overlap: overlap, window: time.Minute, jitter: jitter, job: "j"}.forItem(2)
		tests := []struct {
			name     string
			fire     time.Time
			now      time.Time
			wantKind actionKind
		}{
			{"small offset, 40 minutes after its start: too old", small, small.Add(smallOff + 40*time.Minute), skip},
			{"small offset, 30 s after its start: runs", small, small.Add(smallOff + 30*time.Second), run},
			{"large offset, 30 s after its start, 46 minutes or more after its fire: runs", large, large.Add(largeOff + 30*time.Second), run},
			{"large offset, 2 minutes after its start: too old", large, large.Add(largeOff + 2*time.Minute), skip},
		}
		for _, tt := range tests {
			a := decide(done(tt.fire), false, p, tt.now)
			if a.kind != tt.wantKind || !a.fire.Equal(tt.fire) || (a.kind == skip && a.why != whyTooOld) {
				t.Errorf("%s, %s: %v of %s (%s), want %v of %s", overlap, tt.name, a.kind, a.fire.Format(time.RFC3339), a.why, tt.wantKind, tt.fire.Format(time.RFC3339))
			}
		}
	}
}

// A skip that leaves later fires due makes the loop look again at once,
// not at the next fire: bufferAll, jitter 9m, catchUpWindow 5m, every 10
// minutes; the instance comes back 30 s after f2's start, with f1 too old
// by its own offset. The pass records f1 skipped; the next must come
// before f2 is too old too (review of #30: it came at the next fire, and
// f2 was recorded too-old though it could have run for 4.5 minutes).
func TestSkipLeavingDueFiresLooksAgainSoon(t *testing.T) {
	t.Parallel()
	const yaml = "jobs:\n  - name: j\n    cron: \"0 */10 * * * ?\"\n    overlap: bufferAll\n    jitter: 9m\n    catchUpWindow: 5m\n    script: \"true\"\n"
	const jit = 9 * time.Minute
	f1 := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	for schedule.JitterOffset("j", 0, f1.Add(10*time.Minute), jit) >= 3*time.Minute ||
		schedule.JitterOffset("j", 0, f1, jit) >= 4*time.Minute {
		f1 = f1.Add(10 * time.Minute)
	}
	f0, f2 := f1.Add(-10*time.Minute), f1.Add(10*time.Minute)
	off2 := schedule.JitterOffset("j", 0, f2, jit)
	now := f2.Add(off2 + 30*time.Second)
	f := newFakeNode(t, yaml, map[string][]int{"a": {0}})
	f.set(0, keyspace.ItemState{Record: &keyspace.ItemRecord{Job: "j", Fire: f0, Sched: f0, State: keyspace.StateDone, Attempt: 1, End: f0.Add(time.Second)}, Rev: 7})
	clock := &fakeClock{now: now}
	j, wait := reviewLoop(f, "j", clock)
	next := j.reconcile(context.Background())
	wait()
	record := func() keyspace.ItemRecord {
		f.mu.Lock()
		defer f.mu.Unlock()
		return *f.items[0].Record
	}
	if rec := record(); rec.State != keyspace.StateSkipped || !rec.Fire.Equal(f1) || rec.Reason != keyspace.SkipTooOld {
		t.Fatalf("the first pass recorded %s fire %s (%s), want f1 %s skipped too-old", rec.State, rec.Fire.Format("15:04"), rec.Reason, f1.Format("15:04"))
	}
	if deadline := f2.Add(off2 + 5*time.Minute); next.After(deadline) {
		t.Fatalf("after recording f1 skipped, the loop looks again at %s, after f2's catch-up window ends (%s)", next.Format("15:04:05"), deadline.Format("15:04:05"))
	}
	clock.set(next)
	j.reconcile(context.Background())
	wait()
	if rec := record(); !rec.Fire.Equal(f2) || rec.State == keyspace.StateSkipped {
		t.Errorf("the next pass: %s fire %s (%s), want f2 %s run", rec.State, rec.Fire.Format("15:04"), rec.Reason, f2.Format("15:04"))
	}
}
