package engine

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/schedule"
)

func mustSchedule(t *testing.T, spec string) schedule.Schedule {
	t.Helper()
	s, err := schedule.Parse(spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDecide(t *testing.T) {
	t.Parallel()
	base := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return base.Add(time.Duration(s * float64(time.Second))) }
	every10 := mustSchedule(t, "@every 10s")
	hourly := mustSchedule(t, "@hourly")
	on := policy{schedule: every10, failover: true, misfire: true, window: time.Minute, baseline: at(-100)}
	off := policy{schedule: every10, window: time.Minute, baseline: at(-100)}
	hourlyOn := policy{schedule: hourly, failover: true, misfire: true, window: time.Minute, baseline: at(-7200)}
	done := func(fire, end float64) keyspace.ItemState {
		return keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: at(fire), Sched: at(fire), State: keyspace.StateDone, Attempt: 1, Source: keyspace.SourceNormal, End: at(end)}, Rev: 7}
	}
	with := func(st keyspace.ItemState, f func(*keyspace.ItemState)) keyspace.ItemState {
		r := *st.Record
		st.Record = &r
		f(&st)
		return st
	}
	running := func(fire float64) keyspace.ItemState {
		return with(done(fire, 0), func(s *keyspace.ItemState) { s.Record.State, s.Record.End = keyspace.StateRunning, time.Time{} })
	}
	tests := []struct {
		name  string
		st    keyspace.ItemState
		local bool
		p     policy
		now   time.Time
		want  action
	}{
		{"never claimed, first fire on time", keyspace.ItemState{}, false, policy{schedule: every10, misfire: true, window: time.Minute, baseline: at(-5)}, at(0.2),
			action{kind: run, fire: at(0), attempt: 1, source: "NORMAL", sched: at(0)}},
		{"never claimed, fires before the baseline are not due: the record begins", keyspace.ItemState{}, false, policy{schedule: every10, misfire: true, window: time.Minute, baseline: at(5)}, at(9),
			action{kind: begin, fire: at(9)}},
		{"a begun record: fires after it are due", keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: at(9), Sched: at(9), State: keyspace.StateSkipped}, Rev: 2}, false, on, at(10.2),
			action{kind: run, fire: at(10), attempt: 1, source: "NORMAL", sched: at(10)}},
		{"the fire is claimed already", done(0, 1), false, on, at(5), action{}},
		{"next fire on time", done(0, 1), false, on, at(10.1),
			action{kind: run, fire: at(10), attempt: 1, source: "NORMAL", sched: at(10)}},
		{"next fire late (the owner died): that fire runs, late", done(0, 1), false, on, at(13),
			action{kind: run, fire: at(10), attempt: 1, source: "NORMAL", sched: at(10)}},
		{"several missed: the latest runs, the rest are counted", done(0, 1), false, on, at(31),
			action{kind: run, fire: at(30), attempt: 1, source: "MISFIRE", skipped: 2, sched: at(30), oldest: at(10)}},
		{"never claimed: fires since the baseline were missed", keyspace.ItemState{}, false, on, at(0.2),
			action{kind: run, fire: at(0), attempt: 1, source: "MISFIRE", skipped: 9, sched: at(0), oldest: at(-90)}},
		{"missed fires older than the window are recorded skipped", done(-7200, -7190), false, hourlyOn, at(120),
			action{kind: skip, fire: at(0), skipped: 2, why: whyTooOld}},
		{"misfire off: a fire missed while the item was idle still runs", done(0, 1), false, off, at(12),
			action{kind: run, fire: at(10), attempt: 1, source: "NORMAL", sched: at(10)}},
		{"misfire on: a fire that came while the item ran runs after it", done(0, 15), false, on, at(15.1),
			action{kind: run, fire: at(10), attempt: 1, source: "MISFIRE", sched: at(10)}},
		{"misfire off: a fire that came while the item ran is skipped", done(0, 15), false, off, at(15.1),
			action{kind: skip, fire: at(10), skipped: 1, why: whyBusy}},
		{"a run of it in progress here", done(0, 1), true, on, at(10), action{}},
		{"disabled, nothing due", with(done(0, 1), func(s *keyspace.ItemState) { s.Disabled = true }), false, on, at(9), action{}},
		{"disabled: due fires are recorded skipped, not caught up later", with(done(0, 1), func(s *keyspace.ItemState) { s.Disabled = true }), false, on, at(21),
			action{kind: skip, fire: at(20), skipped: 2, why: whyDisabled}},
		{"disabled while it runs elsewhere: wait", with(running(0), func(s *keyspace.ItemState) { s.Disabled, s.RunningBy = true, "b" }), false, on, at(21), action{}},
		{"running elsewhere: wait for the marker", with(running(0), func(s *keyspace.ItemState) { s.RunningBy = "b" }), false, on, at(10), action{}},
		{"running under an old session of this instance: wait", with(running(0), func(s *keyspace.ItemState) { s.RunningBy = "a" }), false, on, at(10), action{}},
		{"a claim of this session no run knows: adopt it", with(running(0), func(s *keyspace.ItemState) { s.RunningBy, s.RunningMine = "a", true }), false, on, at(10),
			action{kind: adopt, fire: at(0), attempt: 1, source: "NORMAL", sched: at(0)}},
		{"cut run, failover on: re-run at once, attempt+1", running(0), false, on, at(3),
			action{kind: run, fire: at(0), attempt: 2, source: "FAILOVER", sched: at(0)}},
		{"killed at a fence, failover on: re-run", with(done(0, 2), func(s *keyspace.ItemState) {
			s.Record.State, s.Record.Reason = keyspace.StateKilled, keyspace.ReasonFence
		}), false, on, at(3),
			action{kind: run, fire: at(0), attempt: 2, source: "FAILOVER", sched: at(0)}},
		{"killed at shutdown, failover on: re-run", with(done(0, 2), func(s *keyspace.ItemState) {
			s.Record.State, s.Record.Reason = keyspace.StateKilled, keyspace.ReasonShutdown
		}), false, on, at(3),
			action{kind: run, fire: at(0), attempt: 2, source: "FAILOVER", sched: at(0)}},
		{"killed at its timeout: a failure, not re-run", with(done(0, 2), func(s *keyspace.ItemState) {
			s.Record.State, s.Record.Reason = keyspace.StateKilled, keyspace.ReasonTimeout
		}), false, on, at(3),
			action{}},
		{"a won claim whose work never started runs, even with failover off", with(done(0, 2), func(s *keyspace.ItemState) {
			s.Record.State, s.Record.Reason = keyspace.StateKilled, keyspace.ReasonNotStarted
		}), false, off, at(3),
			action{kind: run, fire: at(0), attempt: 2, source: "NORMAL", sched: at(0)}},
		{"failed runs never fail over", with(done(0, 2), func(s *keyspace.ItemState) { s.Record.State = keyspace.StateFailed }), false, on, at(3), action{}},
		{"cut run, failover off: recorded, not re-run", running(0), false, off, at(10.5),
			action{kind: settle, fire: at(0)}},
		{"cut run recorded (failover off): the fire after it runs", with(running(0), func(s *keyspace.ItemState) {
			s.Record.State, s.Record.Reason = keyspace.StateKilled, keyspace.ReasonLost
		}), false, off, at(10.5),
			action{kind: run, fire: at(10), attempt: 1, source: "NORMAL", sched: at(10)}},
		{"a failover carries the fires its cut run coalesced", with(running(0), func(s *keyspace.ItemState) { s.Record.Skipped = 3 }), false, on, at(3),
			action{kind: run, fire: at(0), attempt: 2, source: "FAILOVER", sched: at(0), skipped: 3}},
		{"hourly, owner killed 1s before the fire: the new owner runs it late", done(-3600, -3590), false, hourlyOn, at(4),
			action{kind: run, fire: at(0), attempt: 1, source: "NORMAL", sched: at(0)}},
		{"a manual run does not move the watermark", with(done(-3600, -3590), func(s *keyspace.ItemState) {
			s.Record.Source, s.Record.Fire, s.Record.Trigger = keyspace.SourceManual, at(60), 42 // its host's clock ran fast
		}), false, hourlyOn, at(0.5),
			action{kind: run, fire: at(0), attempt: 1, source: "NORMAL", sched: at(0)}},
		{"a skipped record's fires are accounted for", keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: at(10), Sched: at(10), State: keyspace.StateSkipped}, Rev: 3}, false, off, at(15), action{}},
		{"a host with a fast clock claimed a fire ahead of ours", done(10, 10.5), false, on, at(9.9), action{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := decide(tc.st, tc.local, tc.p, tc.now)
			if got != tc.want {
				t.Errorf("decide =\n  %+v\nwant\n  %+v", got, tc.want)
			}
		})
	}
}

// Every fire is accounted for: walking the clock fire by fire while the
// item runs longer than the period, each fire either runs or is counted
// as skipped, exactly once.
func TestDecideAccountsForEveryFire(t *testing.T) {
	t.Parallel()
	every := mustSchedule(t, "@every 10s")
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, misfire := range []bool{true, false} {
		p := policy{schedule: every, failover: true, misfire: misfire, window: time.Minute, baseline: base.Add(-time.Second)}
		var st keyspace.ItemState
		accounted := 0
		now := base
		for step := 0; step < 200; step++ {
			a := decide(st, false, p, now)
			switch a.kind {
			case run:
				accounted += 1 + a.skipped
				end := now.Add(25 * time.Second) // runs outlast two periods
				st = keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: a.fire, Sched: a.sched, State: keyspace.StateDone, End: end}, Rev: st.Rev + 1}
				now = end
				continue
			case skip:
				accounted += a.skipped
				st = keyspace.ItemState{Record: &keyspace.ItemRecord{Fire: a.fire, Sched: a.fire, State: keyspace.StateSkipped}, Rev: st.Rev + 1}
			}
			now = now.Add(time.Second)
		}
		due := int(now.Sub(base)/(10*time.Second)) + 1
		if accounted < due-3 || accounted > due {
			t.Errorf("misfire %v: %d fires accounted for, %d due by %s", misfire, accounted, due, now)
		}
	}
}

// A MANUAL record written before Sched existed (an upgrade): its watermark
// is the zero time, so decide counts fires from year 1, 100000 at a time.
func TestRegressionLegacyManualRecordWatermark(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 30, 0, time.UTC)
	for _, spec := range []string{"@hourly", "0 * * * * ?", "@every 1m"} {
		sched := mustSchedule(t, spec)
		st := keyspace.ItemState{Rev: 5, Record: &keyspace.ItemRecord{Fire: now.Add(-20 * time.Minute), State: keyspace.StateDone, Source: keyspace.SourceManual, Attempt: 1, End: now.Add(-19 * time.Minute)}}
		p := policy{schedule: sched, failover: true, misfire: true, window: time.Minute, baseline: now.Add(-time.Hour)}
		start := time.Now()
		a := decide(st, false, p, now)
		t.Logf("%s: %s fire %s skipped %d (decide took %s)", spec, a.kind, a.fire, a.skipped, time.Since(start))
		if a.kind == skip && a.fire.Year() < 2000 {
			t.Errorf("%s: skips through %s: the item catches up from year 1, %d fires per reconcile", spec, a.fire, a.skipped)
		}
	}
}

// BROADCAST: one item per instance. The reconcile loops over
// job.ShardingTotalCount (forced to 1 for BROADCAST) instead of the map's
// Total, so the instance holding item 1 never runs anything.
func TestRegressionBroadcastRunsEveryItem(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	script := `sh -c '` + strings.ReplaceAll(ledgerTo(path), "$1", "start") + `'`
	yaml := "jobs:\n  - name: j\n    cron: \"@every 1s\"\n    strategy: BROADCAST\n    script: " + etcdtest.YAMLQuote(script) + "\n"
	a := instance(t, srv, "a", yaml)
	instance(t, srv, "b", yaml)
	etcdtest.Eventually(t, 20*time.Second, "a map with two instances", func() bool {
		v, ok := a.View("j")
		return ok && v.Map != nil && len(v.Map.Instances) == 2
	})
	byItem := map[int]int{}
	ran := func() bool {
		clear(byItem)
		for _, ev := range events(t, path) {
			byItem[ev.Item]++
		}
		return byItem[0] > 0 && byItem[1] > 0
	}
	// Every second fires both items: 10 s is ten chances for each.
	etcdtest.Eventually(t, 10*time.Second, "a run of each item of a BROADCAST job on 2 instances", ran)
	t.Logf("runs by item: %v", byItem)
}
