package admin

// Review tests (breaker): health that says OK of a failing job, or
// FAILING of a healthy one.

import (
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// A job whose runs overrun their schedule and fail (a timeout, misfire:
// false): when such a run ends, the fires that came meanwhile are recorded
// at once as SKIPPED (engine decide: whyBusy), and that SKIPPED record is
// the item's record until its next run claims it. jobHealth only looks at
// the item's record, so the item is never FAILING: a job whose every run
// times out shows OK (or "running"), though its last run failed and
// jr.LastFailure says so.
func TestReviewAFailureFollowedByASkipIsStillFailing(t *testing.T) {
	def := everyMinute(t)
	now := h0.Add(30 * time.Second)
	timedOut := rec(0, keyspace.StateKilled, h0.Add(-5*time.Minute))
	timedOut.Reason = keyspace.ReasonTimeout
	timedOut.End = h0.Add(10 * time.Second)
	skip := keyspace.ItemRecord{Job: "j", Item: 0, State: keyspace.StateSkipped, Reason: keyspace.SkipBusy, Fire: h0, Sched: h0, Start: timedOut.End, End: timedOut.End, Skipped: 5, ExitCode: -1}
	jr := JobRuns{Records: map[int]keyspace.ItemRecord{0: skip, 1: rec(1, "DONE", h0), 2: rec(2, "DONE", h0)}, LastFailure: &timedOut}
	h := jobHealth(jr, def, h0.Add(-time.Hour), nil, false, 3, now)
	addStreaks(h, []keyspace.ItemRecord{timedOut, skip})
	if h.State != HealthFailing {
		t.Errorf("health %s (failing %v), want FAILING: item 0's last run timed out; only the fires it overran were skipped since", h.State, h.Failing)
	}
}

// Item records of items a job no longer has (shardingTotalCount lowered
// from 4 to 2) stay in etcd; jobHealth walks every record, whatever the
// total, so the job is FAILING for good because of item 3, which no
// longer exists and will never run again ("FAILING 1/2").
func TestReviewARemovedItemsOldFailureIsNotFailing(t *testing.T) {
	def := everyMinute(t)
	def.ShardingTotalCount = 2
	now := h0.Add(30 * time.Second)
	jr := JobRuns{Records: map[int]keyspace.ItemRecord{0: rec(0, "DONE", h0), 1: rec(1, "DONE", h0), 3: rec(3, "FAILED", h0.Add(-24*time.Hour))}}
	h := jobHealth(jr, def, h0.Add(-48*time.Hour), nil, false, 2, now)
	if h.State != HealthOK {
		t.Errorf("health %s %s (failing %+v), want OK: item 3 is not an item of the job any more", h.State, h.Brief(2), h.Failing)
	}
}
