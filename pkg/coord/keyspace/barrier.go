package keyspace

import (
	"fmt"
	"slices"
	"time"
)

// FireKey names the fire a record is a run of: its FireKey, set by the
// claim of a manual run (ManualFireKey: a manual fire, even a re-run of a
// past fire, is not the scheduled one) and kept by its re-runs; else
// "t<unix nanoseconds>" (19 digits) of its scheduled fire, which its
// re-runs, failover or not, share.
func FireKey(rec *ItemRecord) string {
	if rec.FireKey != "" {
		return rec.FireKey
	}
	return fmt.Sprintf("t%019d", rec.Fire.UnixNano())
}

// ManualFireKey is the FireKey of the runs of a manual (or upstream)
// trigger: "m", the time it was asked for (19 digits of Unix nanoseconds:
// barriers sort by it, and old ones are removed by range) and its
// revision (its identity).
func ManualFireKey(tr Trigger) string {
	return fmt.Sprintf("m%019d-%d", tr.Fire.UnixNano(), tr.Rev)
}

// FireAsked is when fire (a FireKey) happened, for the children index's
// Since: a manual (or upstream) fire when it was asked for, the time its
// key carries, whatever fire it runs (a re-run of a past fire is asked for
// now); a scheduled one its scheduled time, sched.
func FireAsked(fire string, sched time.Time) time.Time {
	var nanos, rev int64
	if n, err := fmt.Sscanf(fire, "m%019d-%d", &nanos, &rev); err == nil && n == 2 {
		return time.Unix(0, nanos).UTC()
	}
	return sched
}

// Barrier is how the items of one fire ended.
type Barrier struct {
	Total   int   `json:"total"`
	Done    []int `json:"done,omitempty"`
	Failed  []int `json:"failed,omitempty"`
	Skipped []int `json:"skipped,omitempty"`
	// Stopped are the items KILLED for another reason than a failure of
	// their work (an operator's kill, overlap replace, a run lost with its
	// instance and not re-run): the fire did not succeed, but its work did
	// not fail either (pauseAfterFailures does not count it). Barriers
	// written before it put them in Failed.
	Stopped []int `json:"stopped,omitempty"`
	// Completed is when the last item's outcome was noted (zero: items
	// are still to end), CompletedBy that note's instance and run (instance:item/fence): a note
	// retried after a lost reply knows it completed the barrier.
	Completed   time.Time `json:"completed,omitzero"`
	CompletedBy string    `json:"completedBy,omitempty"`
	// Paused is set when the note that completed the fire paused the job
	// (pauseAfterFailures): its streak of failed fires reached the bound.
	Paused bool `json:"paused,omitempty"`
}

// PauseStreak is a job's count of failed fires in a row, for
// pauseAfterFailures (jobs/<job>/pause): the note that completes a fire's
// barrier updates it in the same Txn, so every fire counts once, in the
// order the fires complete. A fire failed when an item of it failed
// (ItemRecord.Failed: FAILED, or KILLED by its timeout); any other fire an
// item of which ran (done, or stopped: Barrier.Stopped) ends the streak; a
// fire whose items were all skipped leaves it as it is.
type PauseStreak struct {
	FailedInARow int `json:"failedInARow"`
	// Reasons say why the fires of the streak failed, the newest last (at
	// most MaxPauseReasons).
	Reasons []string `json:"reasons,omitempty"`
	// PausedAt is when the streak paused the job (disabled/job put in the
	// same Txn); zero while it has not.
	PausedAt time.Time `json:"pausedAt,omitzero"`
}

// MaxPauseReasons bounds a PauseStreak's Reasons.
const MaxPauseReasons = 5

// PausedBy is the actor of the audit entry of a job paused by its own
// failures.
func PausedBy(job string) string { return "job:" + job }

// Complete reports whether every item has ended: items 0 to Total-1.
func (b *Barrier) Complete() bool {
	for item := range b.Total {
		if !b.Ended(item) {
			return false
		}
	}
	return true
}

// Succeeded reports whether every item ended DONE.
func (b *Barrier) Succeeded() bool {
	return b.Complete() && len(b.Failed)+len(b.Skipped)+len(b.Stopped) == 0
}

// Ended reports whether item's outcome is noted.
func (b *Barrier) Ended(item int) bool {
	return slices.Contains(b.Done, item) || slices.Contains(b.Failed, item) || slices.Contains(b.Skipped, item) || slices.Contains(b.Stopped, item)
}
