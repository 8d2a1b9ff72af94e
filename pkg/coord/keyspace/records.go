package keyspace

import (
	"encoding/json"
	"slices"
	"time"
)

// Item states in an ItemRecord.
const (
	StateRunning = "RUNNING" // claimed, not completed
	StateDone    = "DONE"    // completed successfully
	StateFailed  = "FAILED"  // completed, failed (after its retries)
	StateSkipped = "SKIPPED" // fires up to Fire were skipped by policy, not run
	StateKilled  = "KILLED"  // stopped before it ended; Reason says why
)

// Reasons of a KILLED record.
const (
	// ReasonShutdown: shardd stopped and its shutdown grace ran out.
	ReasonShutdown = "shutdown"
	// ReasonFence: the instance's session fenced itself (etcd unreachable
	// or the process paused); the run could no longer own its item.
	ReasonFence = "fence"
	// ReasonTimeout: the job's timeout ran out.
	ReasonTimeout = "timeout"
	// ReasonOperator: an operator stopped the run.
	ReasonOperator = "operator"
	// ReasonReplaced: overlap replace stopped the run for a newer fire of
	// its item (KilledBy names that fire).
	ReasonReplaced = "replaced"
	// ReasonLost: the run's instance died or was cut off mid-run and the
	// job says failover: false; the item's next owner recorded it so and
	// did not run it again (ElasticJob's at-most-once without failover).
	ReasonLost = "lost"
	// ReasonNotStarted: the claim was won but the work never started (the
	// session fenced or shardd stopped first). Such a fire is run again
	// whatever the failover policy: it never ran.
	ReasonNotStarted = "not-started"
)

// Reasons of a SKIPPED record.
const (
	// SkipDisabled: the item or its job was disabled.
	SkipDisabled = "disabled"
	// SkipTooOld: the latest missed fire was older than the catch-up window.
	SkipTooOld = "too-old"
	// SkipBusy: the fires came while the item ran, and misfire is off.
	SkipBusy = "busy"
	// SkipUpstreamFailed: the parent fire that triggered this run of a
	// job with dependsOn did not succeed (an item of it failed or was
	// skipped); Error says which.
	SkipUpstreamFailed = "upstream-failed"
	// SkipCalendar: the fires fell on days a calendar of the job's
	// excludeCalendars excludes (counted in Excluded).
	SkipCalendar = "calendar"
	// SkipBufferFull: overlap bufferAll had more pending fires than its
	// bufferLimit; the oldest were not run.
	SkipBufferFull = "buffer-full"
)

// CutByFailure reports whether a record is a run that a failure cut short:
// RUNNING with no running marker (its instance died or was cut off), or
// KILLED at a shutdown or fence. With failover: true such a run is re-run.
func (r *ItemRecord) CutByFailure() bool {
	return r.State == StateRunning || (r.State == StateKilled && (r.Reason == ReasonShutdown || r.Reason == ReasonFence))
}

// Failed reports whether the record is a run that failed: FAILED, or
// KILLED by its timeout.
func (r *ItemRecord) Failed() bool {
	return r.State == StateFailed || (r.State == StateKilled && r.Reason == ReasonTimeout)
}

// NeverStarted reports whether the record is a claim whose work never
// started: its fire is still to run.
func (r *ItemRecord) NeverStarted() bool {
	return r.State == StateKilled && r.Reason == ReasonNotStarted
}

// Begins reports whether the record only begins an item's record (coord's
// Begin): the item has not run yet, and its fires are due from Fire on.
func (r *ItemRecord) Begins() bool {
	return r.State == StateSkipped && r.Skipped == 0 && r.Excluded == 0 && r.Reason == "" && r.Fence == 0
}

// Watermark is the latest scheduled fire the record accounts for: every
// scheduled fire up to it was run or recorded as skipped. Manual runs do not
// move it.
func (r *ItemRecord) Watermark() time.Time {
	if !r.Sched.IsZero() {
		return r.Sched
	}
	return r.Fire // written before Sched existed
}

// Execution sources.
const (
	SourceNormal   = "NORMAL"
	SourceMisfire  = "MISFIRE"
	SourceFailover = "FAILOVER"
	SourceManual   = "MANUAL"
	// SourceUpstream: a run of a job with dependsOn, triggered by a
	// completed fire of its parent (Upstream).
	SourceUpstream = "UPSTREAM"
)

// OffSchedule reports whether source is a run by request (an operator's
// or a parent fire's), not of the job's schedule: any member may serve
// it, at once, and it does not move the item's watermark.
func OffSchedule(source string) bool { return source == SourceManual || source == SourceUpstream }

// HistoryPerItem is how many past executions of each item etcd keeps.
const HistoryPerItem = 10

// ItemRecord is the value of jobs/<job>/items/<n>: the item's last claimed
// fire and how it went. It is also the value of history entries and of a
// job's lastfailure key. A claim (coord's claimTxn) writes it RUNNING with
// what is known before the run; the outcome (coord's Grant.Final, written
// by finishTxn) adds how it ended and copies it to the history. The CLI's
// history table (cmd/shardd, writeHistory) and the console show its
// fields; the API serves it as it is. A field added here is kept by older
// versions' readers (they ignore what they do not know).
type ItemRecord struct {
	Job      string    `json:"job"`
	Item     int       `json:"item"`
	Fire     time.Time `json:"fire"`
	State    string    `json:"state"`
	Instance string    `json:"instance"`
	Attempt  int       `json:"attempt"`
	Source   string    `json:"source"`
	// Seq counts the item's records; history keeps the last HistoryPerItem.
	Seq int64 `json:"seq"`
	// Fence is the etcd revision of the claim, in the records written after
	// it (an outcome, a settled cut run). A RUNNING record, which the claim
	// itself writes before its revision is known, stores 0: its fence is
	// its ModRevision (RunFence). SKIPPED records have none.
	Fence int64     `json:"fence"`
	Start time.Time `json:"start,omitzero"`
	End   time.Time `json:"end,omitzero"`
	// ExitCode of a script; -1 when there is none (a hook, a kill, a skip).
	ExitCode int `json:"exitCode"`
	// HTTPStatus of a hook's response; absent for scripts.
	HTTPStatus int    `json:"httpStatus,omitempty"`
	Error      string `json:"error,omitempty"`
	Output     string `json:"output,omitempty"`
	// LastLine is the last line the run wrote on stderr, else on stdout
	// (at most 512 bytes): what says most about a failure.
	LastLine string `json:"lastLine,omitempty"`
	// Skipped counts the fires before Fire that were not run (misfire policy).
	Skipped int `json:"skipped,omitempty"`
	// Excluded counts the fires up to Fire that the job's calendars
	// excluded (docs/policies.md): before Fire in a run, Fire itself too
	// in a SKIPPED record, reason calendar. Each fire the record accounts
	// for is in one of Fire, Skipped and Excluded.
	Excluded int `json:"excluded,omitempty"`
	// Reason is why a KILLED run was stopped (Reason* constants) or why
	// SKIPPED fires were not run (Skip* constants).
	Reason string `json:"reason,omitempty"`
	// Sched is the record's watermark (see Watermark): for scheduled runs
	// and skips it is Fire; a manual run carries the previous one over.
	Sched time.Time `json:"sched,omitzero"`
	// Trigger is the etcd revision of the last manual trigger this item
	// ran; a trigger at or below it has been served.
	Trigger int64 `json:"trigger,omitempty"`
	// Param is the operator's one-off parameter of a MANUAL run (kept by
	// its failover re-runs).
	Param string `json:"param,omitempty"`
	// KilledBy names who stopped a run KILLED with reason operator.
	KilledBy string `json:"killedBy,omitempty"`
	// By names who triggered a MANUAL run (kept by its re-runs).
	By string `json:"by,omitempty"`
	// Iterations counts a streaming (dataflow) run's iterations.
	Iterations int `json:"iterations,omitempty"`
	// FireKey names a manual run's fire (ManualFireKey), kept by its
	// re-runs; "" for a scheduled fire (see FireKey).
	FireKey string `json:"fireKey,omitempty"`
	// Upstream is the parent fire an UPSTREAM run serves (kept by its
	// re-runs); NoPropagate is set on a manual run whose outcome does not
	// trigger the job's children.
	Upstream    *Upstream `json:"upstream,omitempty"`
	NoPropagate bool      `json:"noPropagate,omitempty"`
	// Total is the job's item count when the run was claimed: its fire's
	// barrier waits for that many items (0 in records older than it).
	Total int `json:"total,omitempty"`
	// Slot is the cluster-wide slot the run holds (clusterConcurrency),
	// plus one: 0 for none. Its key, under the claim's lease, goes with the
	// run's outcome.
	Slot int `json:"slot,omitempty"`
}

// ItemState is what etcd says about one item at one revision.
type ItemState struct {
	// Record is nil when the item was never claimed. It may be shared
	// with the item cache: read it; copy it to change it.
	Record *ItemRecord
	// Rev is the ModRevision of the record, 0 when there is none.
	Rev int64
	// RunningBy is the instance holding the running marker, "" when none.
	RunningBy string
	// RunningMine is set when the marker is under this node's current
	// session lease: this session claimed the item.
	RunningMine bool
	// Disabled is set when an operator disabled the item.
	Disabled bool
}

// JobItems is a snapshot of a job's items.
type JobItems struct {
	Rev   int64
	Items map[int]ItemState
}

// ParseHistory decodes the values of a job's history keys, oldest first
// (SortHistory); a value that does not decode is left out.
func ParseHistory(values [][]byte) []ItemRecord {
	out := make([]ItemRecord, 0, len(values))
	for _, v := range values {
		var rec ItemRecord
		if json.Unmarshal(v, &rec) == nil {
			out = append(out, rec)
		}
	}
	SortHistory(out)
	return out
}

// SortHistory sorts history records oldest first: by start, then item,
// then sequence.
func SortHistory(recs []ItemRecord) {
	slices.SortStableFunc(recs, func(a, b ItemRecord) int {
		if c := a.Start.Compare(b.Start); c != 0 {
			return c
		}
		if a.Item != b.Item {
			return a.Item - b.Item
		}
		return int(a.Seq - b.Seq)
	})
}
