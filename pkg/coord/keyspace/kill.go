package keyspace

import (
	"fmt"
	"time"
)

// Kill is an operator's request to stop runs in progress.
type Kill struct {
	ID   string    `json:"id"`
	Runs []KillRun `json:"runs"`
	// By names who asked (see Trigger.By).
	By string    `json:"by,omitempty"`
	At time.Time `json:"at"`
	// Reason is what the runs are recorded KILLED with: "" (ReasonOperator)
	// or ReasonReplaced.
	Reason string `json:"reason,omitempty"`
}

// KillBy is who asked for a kill, and the reason its run is recorded with.
type KillBy struct {
	By, Reason string
}

// KillReason is the reason a run that kill k stopped is recorded with.
func (k Kill) KillReason() string {
	if k.Reason == "" {
		return ReasonOperator
	}
	return k.Reason
}

// ReplaceKillID is the kill request overlap replace puts for the run of
// item with fence: one per run, whoever decides it and however often.
func ReplaceKillID(item int, fence int64) string {
	return fmt.Sprintf("replace-%d-%d", item, fence)
}

// KillRun is one run a kill stops: the item's run with that fence, on
// that instance.
type KillRun struct {
	Item     int    `json:"item"`
	Fence    int64  `json:"fence"`
	Instance string `json:"instance"`
}

// KillTTL is how long a kill request stays in etcd.
const KillTTL = time.Minute

// KillKey names a run a kill asked to stop: its item and fence.
type KillKey struct {
	Item  int
	Fence int64
}

// RunFence is the fence of the run a record describes: its Fence, or, for
// a RUNNING record written before its fence was known (Fence 0), the
// record's revision rev, which is its claim's. (A RUNNING record that the
// rewind repair put back keeps its claim's revision as its Fence.)
func RunFence(rec *ItemRecord, rev int64) int64 {
	if rec.State == StateRunning && rec.Fence == 0 {
		return rev
	}
	return rec.Fence
}
