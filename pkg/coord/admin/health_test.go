package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/schedule"
)

var h0 = time.Date(2026, 12, 4, 2, 0, 0, 0, time.UTC)

func everyMinute(t *testing.T) *config.Job {
	t.Helper()
	s, err := schedule.Parse("0 * * * * ?", time.UTC)
	if err != nil {
		t.Fatal(err)
	}
	return &config.Job{Name: "j", Cron: config.CronList{"0 * * * * ?"}, Schedule: s, ShardingTotalCount: 3}
}

func rec(item int, state string, fire time.Time) keyspace.ItemRecord {
	return keyspace.ItemRecord{Job: "j", Item: item, State: state, Fire: fire, Sched: fire, Start: fire, End: fire.Add(time.Second), Fence: int64(fire.Unix()%1000 + int64(item)), ExitCode: 0}
}

func TestJobHealth(t *testing.T) {
	def := everyMinute(t)
	now := h0.Add(30 * time.Second) // the fire of 02:00 is 30 s old, 01:59's 90 s
	timedOut := rec(1, keyspace.StateKilled, h0)
	timedOut.Reason = keyspace.ReasonTimeout
	operator := rec(1, keyspace.StateKilled, h0)
	operator.Reason = keyspace.ReasonOperator
	running := rec(2, keyspace.StateRunning, h0)
	cases := []struct {
		name       string
		jr         JobRuns
		def        *config.Job
		registered time.Time
		off        []int
		jobOff     bool
		want       string // State, failing items, late items, running items
	}{
		{"every item ran its last fire", JobRuns{Records: map[int]keyspace.ItemRecord{0: rec(0, "DONE", h0), 1: rec(1, "DONE", h0), 2: rec(2, "DONE", h0)}}, def, h0.Add(-time.Hour), nil, false,
			"OK failing[] late[] running[]"},
		{"one failed, one timed out", JobRuns{Records: map[int]keyspace.ItemRecord{0: rec(0, "FAILED", h0), 1: timedOut, 2: rec(2, "DONE", h0)}}, def, h0.Add(-time.Hour), nil, false,
			"FAILING failing[0 1] late[] running[]"},
		{"killed by an operator is not a failure", JobRuns{Records: map[int]keyspace.ItemRecord{0: rec(0, "DONE", h0), 1: operator, 2: rec(2, "DONE", h0)}}, def, h0.Add(-time.Hour), nil, false,
			"OK failing[] late[] running[]"},
		{"item 1 missed 01:59 (90 s ago)", JobRuns{Records: map[int]keyspace.ItemRecord{0: rec(0, "DONE", h0), 1: rec(1, "DONE", h0.Add(-2*time.Minute)), 2: rec(2, "DONE", h0)}}, def, h0.Add(-time.Hour), nil, false,
			"LATE failing[] late[1] running[]"},
		{"02:00 is only 30 s old: not late yet", JobRuns{Records: map[int]keyspace.ItemRecord{0: rec(0, "DONE", h0), 1: rec(1, "DONE", h0.Add(-time.Minute)), 2: rec(2, "DONE", h0)}}, def, h0.Add(-time.Hour), nil, false,
			"OK failing[] late[] running[]"},
		{"a running item is not late", JobRuns{Records: map[int]keyspace.ItemRecord{0: rec(0, "DONE", h0), 1: rec(1, "DONE", h0), 2: running}, Running: map[int]string{2: "b"}}, def, h0.Add(-time.Hour), nil, false,
			"OK failing[] late[] running[2]"},
		{"no record, registered an hour ago: late", JobRuns{Records: map[int]keyspace.ItemRecord{0: rec(0, "DONE", h0), 1: rec(1, "DONE", h0)}}, def, h0.Add(-time.Hour), nil, false,
			"LATE failing[] late[2] running[]"},
		{"no record, registered a moment ago", JobRuns{Records: map[int]keyspace.ItemRecord{0: rec(0, "DONE", h0), 1: rec(1, "DONE", h0)}}, def, h0.Add(20 * time.Second), nil, false,
			"OK failing[] late[] running[]"},
		{"a disabled item is not late", JobRuns{Records: map[int]keyspace.ItemRecord{0: rec(0, "DONE", h0), 1: rec(1, "DONE", h0)}}, def, h0.Add(-time.Hour), []int{2}, false,
			"OK failing[] late[] running[]"},
		{"a disabled job is not late", JobRuns{}, def, h0.Add(-time.Hour), nil, true,
			"OK failing[] late[] running[]"},
		{"no schedule (dependsOn only): never late", JobRuns{}, &config.Job{Name: "j", ShardingTotalCount: 3}, h0.Add(-time.Hour), nil, false,
			"OK failing[] late[] running[]"},
		{"failing wins over late", JobRuns{Records: map[int]keyspace.ItemRecord{0: rec(0, "FAILED", h0), 1: rec(1, "DONE", h0.Add(-5*time.Minute)), 2: rec(2, "DONE", h0)}}, def, h0.Add(-time.Hour), nil, false,
			"FAILING failing[0] late[1] running[]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := jobHealth(tc.jr, tc.def, tc.registered, tc.off, tc.jobOff, 3, now)
			var failing, late, run []int
			for _, f := range h.Failing {
				failing = append(failing, f.Item)
			}
			for _, l := range h.Late {
				late = append(late, l.Item)
			}
			for _, r := range h.Running {
				run = append(run, r.Item)
			}
			got := fmt.Sprintf("%s failing%v late%v running%v", h.State, ints(failing), ints(late), ints(run))
			if got != tc.want {
				t.Errorf("health %s, want %s", got, tc.want)
			}
		})
	}
}

func ints(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}

func TestStreaksCountTheFailuresInARow(t *testing.T) {
	h := &Health{State: HealthFailing, Failing: []FailingItem{{Item: 0, InARow: 1}, {Item: 1, InARow: 1}}}
	var hist []keyspace.ItemRecord // oldest first
	for i, s := range []string{"DONE", "FAILED", "DONE", "FAILED", "SKIPPED", "FAILED", "FAILED"} {
		hist = append(hist, rec(0, s, h0.Add(time.Duration(i)*time.Minute)))
	}
	hist = append(hist, rec(1, "FAILED", h0.Add(time.Minute)))
	addStreaks(h, hist)
	if f := h.Failing[0]; f.InARow != 3 || !f.Since.Equal(h0.Add(3*time.Minute)) {
		t.Errorf("item 0: %d in a row since %s, want 3 since 02:03 (a skip does not break a streak)", f.InARow, f.Since)
	}
	if f := h.Failing[1]; f.InARow != 1 {
		t.Errorf("item 1: %d in a row, want 1 (the only record)", f.InARow)
	}
	if !h.LastSuccess.Equal(h0.Add(2*time.Minute + time.Second)) {
		t.Errorf("last success %s, want 02:02:01", h.LastSuccess)
	}
}

// Status reads each job's health at its revision from a real etcd: the
// records, running markers and history the runtime writes.
func TestStatusReadsHealth(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	put := func(k string, v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if _, err := cli.Put(ctx, k, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	def := json.RawMessage(`{"name":"j","cron":"0/1 * * * * ?","shardingTotalCount":2,"script":{"command":"true"}}`)
	put(keys.Config("j"), keyspace.RegisteredConfig{Job: def, Hash: "h", Writer: "a", Written: now.Add(-time.Hour)})
	put(keys.Shards("j"), keyspace.ShardMap{Epoch: 1, Total: 2, Instances: []string{"a"}, Items: map[string][]int{"a": {0, 1}}})
	failed := rec(0, keyspace.StateFailed, now.Add(-time.Second))
	failed.ExitCode, failed.Error = 3, "exit status 3"
	put(keys.Item("j", 0), failed)
	for slot, s := range []string{"DONE", "FAILED", "FAILED"} {
		r := rec(0, s, now.Add(time.Duration(slot-3)*time.Second))
		r.Seq = int64(slot)
		put(keys.History("j", 0, int64(slot)), r)
	}
	runningRec := rec(1, keyspace.StateRunning, now)
	put(keys.Item("j", 1), runningRec)
	if _, err := cli.Put(ctx, keys.Running("j")+"1", "a"); err != nil {
		t.Fatal(err)
	}
	st, err := New(cli, keys).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Jobs) != 1 || st.Jobs[0].Health == nil {
		t.Fatalf("status %+v", st)
	}
	h := st.Jobs[0].Health
	if h.State != HealthFailing || len(h.Failing) != 1 || h.Failing[0].Item != 0 || h.Failing[0].InARow != 2 || h.Failing[0].Last.ExitCode != 3 {
		t.Errorf("failing: %+v", h)
	}
	if len(h.Running) != 1 || h.Running[0].Item != 1 || h.Running[0].Instance != "a" || h.Running[0].Fence == 0 {
		t.Errorf("running: %+v", h.Running)
	}
	if h.LastSuccess.IsZero() || len(h.Late) != 0 {
		t.Errorf("last success %s, late %v", h.LastSuccess, h.Late)
	}
	if got := h.Brief(2); got != "FAILING 1/2, running 1" {
		t.Errorf("brief %q", got)
	}
}

// When every run etcd keeps of an item failed, the streak is a lower
// bound: "10+".
func TestAStreakAsLongAsTheHistoryIsALowerBound(t *testing.T) {
	h := &Health{State: HealthFailing, Failing: []FailingItem{{Item: 0, InARow: 1}}}
	var hist []keyspace.ItemRecord
	for i := range keyspace.HistoryPerItem {
		hist = append(hist, rec(0, "FAILED", h0.Add(time.Duration(i)*time.Minute)))
	}
	addStreaks(h, hist)
	if f := h.Failing[0]; !f.AtLeast || f.Runs() != "10+" {
		t.Errorf("every kept run failed: %+v, %q; want 10+", f, f.Runs())
	}
	addStreaks(h, append([]keyspace.ItemRecord{rec(0, "DONE", h0.Add(-time.Minute))}, hist[1:]...))
	if f := h.Failing[0]; f.AtLeast || f.Runs() != "9" {
		t.Errorf("9 failures after a success: %+v, %q", f, f.Runs())
	}
}
