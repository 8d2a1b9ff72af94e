package coord

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// pauseAfterFailures: the note that completes a fire counts it in the
// job's streak; a success ends the streak; the note that makes it the
// bound disables the job, with an audit entry by the job, once; enabling
// the job starts the streak again.
func TestPauseAfterFailures(t *testing.T) {
	t.Parallel()
	n := startNode(t, etcdtest.Shared(t), "a", jobs(t, "jobs:\n"+job("flaky", 2, "    pauseAfterFailures: 2\n")))
	etcdtest.Eventually(t, 10*time.Second, "the definition registered", func() bool { return n.pauseOf("flaky").after == 2 })
	ctx := context.Background()
	cli := n.opts.Client
	fire := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	fence := int64(1000)
	// fireWith notes the outcomes of one fire, item 0 then item 1; it
	// returns the completing note's barrier.
	fireWith := func(states ...string) keyspace.Barrier {
		t.Helper()
		fire = fire.Add(time.Minute)
		var b keyspace.Barrier
		for item, st := range states {
			fence++
			state, reason, _ := strings.Cut(st, "/")
			var err error
			b, _, err = n.NoteOutcome(ctx, "flaky", 2, keyspace.ItemRecord{Job: "flaky", Item: item, Fire: fire, State: state, Reason: reason, Fence: fence, Error: "exit status 3"}, nil)
			if err != nil {
				t.Fatal(err)
			}
		}
		return b
	}
	streak := func() keyspace.PauseStreak {
		t.Helper()
		resp, err := cli.Get(ctx, n.keys.Pause("flaky"))
		if err != nil {
			t.Fatal(err)
		}
		var st keyspace.PauseStreak
		if len(resp.Kvs) == 1 {
			json.Unmarshal(resp.Kvs[0].Value, &st)
		}
		return st
	}
	disabled := func() bool {
		resp, err := cli.Get(ctx, n.keys.DisabledJob("flaky"))
		if err != nil {
			t.Fatal(err)
		}
		return len(resp.Kvs) == 1
	}

	if b := fireWith(keyspace.StateFailed, keyspace.StateDone); b.Paused || streak().FailedInARow != 1 || disabled() {
		t.Fatalf("one failed fire: paused %v, streak %+v, disabled %v", b.Paused, streak(), disabled())
	}
	// A fire none of whose items ran (busy behind a failing run, a
	// calendar's day) neither fails nor succeeds: a job whose failing
	// runs outlast its period under overlap: skip must still pause.
	if fireWith(keyspace.StateSkipped+"/"+keyspace.SkipBusy, keyspace.StateSkipped+"/"+keyspace.SkipCalendar); streak().FailedInARow != 1 {
		t.Fatalf("a fire whose items were all skipped must leave the streak as it was (1): %+v", streak())
	}
	if fireWith(keyspace.StateDone, keyspace.StateSkipped); streak().FailedInARow != 0 {
		t.Fatalf("a fire without a failure must end the streak: %+v", streak())
	}
	// Killed by overlap replace or an operator: stopped, not failed.
	if fireWith(keyspace.StateFailed, keyspace.StateDone); streak().FailedInARow != 1 {
		t.Fatalf("streak %+v", streak())
	}
	if fireWith(keyspace.StateKilled+"/"+keyspace.ReasonReplaced, keyspace.StateKilled+"/"+keyspace.ReasonOperator); streak().FailedInARow != 0 {
		t.Fatalf("replaced and killed runs counted as failures: %+v", streak())
	}
	fireWith(keyspace.StateDone, keyspace.StateKilled+"/"+keyspace.ReasonTimeout) // a timeout is a failure
	if b := fireWith(keyspace.StateFailed, keyspace.StateFailed); !b.Paused || !disabled() {
		t.Fatalf("two failed fires in a row with pauseAfterFailures 2: paused %v, disabled %v", b.Paused, disabled())
	}
	st := streak()
	if st.FailedInARow != 2 || st.PausedAt.IsZero() || len(st.Reasons) != 2 || !strings.Contains(st.Reasons[1], "T00:") || !strings.Contains(st.Reasons[1], "item(s) [0 1] failed") {
		t.Fatalf("the streak that paused: %+v", st)
	}
	c := adminOf(n)
	entries, err := c.Audit(ctx, admin.AuditFilter{Job: "flaky"})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Actor != "job:flaky" || entries[0].Action != "disable" || !strings.Contains(entries[0].Message, "failed") {
		t.Fatalf("audit entries %+v: want one disable by job:flaky with the reasons", entries)
	}
	cs, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range cs.Jobs {
		if j.Name == "flaky" && (j.Paused == nil || j.Paused.FailedInARow != 2) {
			t.Fatalf("status of a paused job: %+v", j.Paused)
		}
	}
	// A trigger of the paused job is refused, saying it paused itself
	// (not that an operator disabled it).
	if _, err := c.Trigger(ctx, admin.TriggerRequest{Job: "flaky"}); err == nil || !strings.Contains(err.Error(), "paused itself after 2 failed fires in a row") {
		t.Errorf("trigger of a paused job: %v; want it refused as paused by pauseAfterFailures", err)
	}
	// A fire completing while the job is paused (a run that had started)
	// counts, but pauses nothing again.
	if b := fireWith(keyspace.StateFailed, keyspace.StateDone); b.Paused {
		t.Fatal("a paused job paused again")
	}
	if fireWith(keyspace.StateDone, keyspace.StateDone); streak().PausedAt.IsZero() {
		t.Fatal("a fire that succeeded while the job was paused (a run that had started) ended the pause's record: status would no longer say PAUSED")
	}
	if d, err := c.SetDisabled(ctx, admin.Target{Job: "flaky", Item: -1}, false, false); err != nil || !strings.Contains(d.Message, "paused by pauseAfterFailures after 2 failed fires") {
		t.Fatalf("enable: %+v, %v; want it to say the pause ended", d, err)
	}
	if disabled() || streak().FailedInARow != 0 {
		t.Fatalf("enabled: disabled %v, streak %+v; want the streak to start again", disabled(), streak())
	}
	if b := fireWith(keyspace.StateFailed, keyspace.StateDone); b.Paused || streak().FailedInARow != 1 {
		t.Fatalf("after enable, one failure: paused %v, streak %+v", b.Paused, streak())
	}
}

// The note that completes a fire is this instance's: another instance
// noting the same record (a per-fire strategy's members, the map's owner
// of a record another wrote) is not told it completed the fire, so the
// pause is told once (review of #30).
func TestOnlyTheCompletingInstanceIsTold(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	defs := jobs(t, "jobs:\n"+job("flaky1", 1, "    pauseAfterFailures: 1\n"))
	a, b := startNode(t, srv, "a", defs), startNode(t, srv, "b", defs)
	for _, n := range []*testNode{a, b} {
		etcdtest.Eventually(t, 10*time.Second, "the definition", func() bool { return n.pauseOf("flaky1").after == 1 })
	}
	rec := keyspace.ItemRecord{Job: "flaky1", Item: 0, Fire: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), State: keyspace.StateFailed, Fence: 3000}
	told := 0
	for _, n := range []*testNode{a, b, a} {
		bar, completed, err := n.NoteOutcome(context.Background(), "flaky1", 1, rec, nil)
		if err != nil {
			t.Fatal(err)
		}
		if completed && bar.Paused {
			told++
		}
	}
	if told != 2 { // a, and a again (its reply "lost"); never b
		t.Fatalf("told %d times, want a's two notes only", told)
	}
}
