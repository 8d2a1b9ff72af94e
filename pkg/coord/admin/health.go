package admin

// A job's health says how its runs go, beside its map's state (Status):
//
//   - running: the items that run now, where, since when, under which
//     fence (their running markers and records);
//   - failing: the items whose last run failed (FAILED, or KILLED by its
//     timeout), each with how many of its runs in a row failed and since
//     when (from its history), and the job's last success;
//   - late: the items whose next fire after the last one they account for
//     (their record's watermark) is more than LateAfter past, while they
//     run nothing and neither they nor the job are disabled: a fire that
//     should have run or been recorded skipped, and was not (no instance,
//     instances that cannot claim, a stuck leader).
//
// Its state is FAILING when an item is failing, else LATE when one is
// late, else OK. It is read with the status (the items' records, running
// markers and last failure at the status's revision, in the same Txns as
// the maps and definitions), and the history of the failing jobs only.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Health states.
const (
	HealthOK      = "OK"
	HealthFailing = "FAILING"
	HealthLate    = "LATE"
)

// LateAfter is how long past its time a due fire may go unrecorded before
// its item is late: more than a failover takes (a session's TTL, a new
// leader's map, a claim), so that a fire moving between instances is not
// called late.
const LateAfter = time.Minute

// Health is how a job's runs go.
type Health struct {
	State   string        `json:"state"`
	Running []RunningItem `json:"running,omitempty"`
	Failing []FailingItem `json:"failing,omitempty"`
	Late    []LateItem    `json:"late,omitempty"`
	// LastSuccess is when the job's latest successful run ended (zero:
	// none that etcd still records); LastRun when its latest run ended.
	LastSuccess time.Time `json:"lastSuccess,omitzero"`
	LastRun     time.Time `json:"lastRun,omitzero"`
	// maybe are the items whose record is a skip or a run in progress,
	// of a job that has failed: their last finished run is in the
	// history (addStreaks decides).
	maybe []int
}

// RunningItem is an item running now.
type RunningItem struct {
	Item     int       `json:"item"`
	Instance string    `json:"instance"`
	Since    time.Time `json:"since,omitzero"`
	Fence    int64     `json:"fence,omitempty"`
	Fire     time.Time `json:"fire,omitzero"`
}

// FailingItem is an item whose last run failed.
type FailingItem struct {
	Item int `json:"item"`
	// InARow counts its last runs that failed, up to the history etcd
	// keeps (keyspace.HistoryPerItem); Since is when the first of them
	// started.
	InARow int       `json:"inARow"`
	Since  time.Time `json:"since,omitzero"`
	// AtLeast says every run of the item etcd keeps failed: the streak
	// began before them (InARow is a lower bound; the run logs have more).
	AtLeast bool `json:"atLeast,omitempty"`
	// Last is how its last run ended: result, code, error.
	Last keyspace.ItemRecord `json:"last"`
}

// LateItem is an item whose due fire has gone unrecorded past LateAfter.
type LateItem struct {
	Item int       `json:"item"`
	Due  time.Time `json:"due"`
}

// jobHealth is the health of a job from its items' records and running
// markers (jr), its definition (def: nil when unreadable), when that was
// registered, which items are disabled, whether the job is, and how many
// items it has. The failing items' streaks and the last success of a
// failing job come later, from its history (addStreaks).
func jobHealth(jr JobRuns, def *config.Job, registered time.Time, disabledItems []int, jobOff bool, total int, now time.Time) *Health {
	h := &Health{State: HealthOK}
	for _, item := range slices.Sorted(mapsKeys(jr.Records, jr.Running)) {
		if total > 0 && item >= total {
			continue // the record of an item the job no longer has
		}
		rec, ok := jr.Records[item]
		if inst, running := jr.Running[item]; running {
			ri := RunningItem{Item: item, Instance: inst}
			if ok && rec.State == keyspace.StateRunning {
				ri.Since, ri.Fence, ri.Fire = rec.Start, rec.Fence, rec.Fire
			}
			h.Running = append(h.Running, ri)
		}
		switch {
		case !ok:
		case rec.State == keyspace.StateRunning || rec.State == keyspace.StateSkipped:
			// How the last run ended is in the history: look when the
			// job has failed at all.
			if jr.LastFailure != nil {
				h.maybe = append(h.maybe, item)
			}
		default:
			if rec.End.After(h.LastRun) {
				h.LastRun = rec.End
			}
			if rec.State == keyspace.StateDone && rec.End.After(h.LastSuccess) {
				h.LastSuccess = rec.End
			}
			if rec.Failed() {
				h.Failing = append(h.Failing, FailingItem{Item: item, InARow: 1, Since: rec.Start, Last: rec})
			}
		}
	}
	if def != nil && def.Schedule != nil && !jobOff && !def.Disabled {
		for item := range total {
			if _, running := jr.Running[item]; running || slices.Contains(disabledItems, item) {
				continue
			}
			from := registered // fires before the job was registered were not due
			if rec, ok := jr.Records[item]; ok && rec.Watermark().After(from) {
				from = rec.Watermark()
			}
			if next := def.Schedule.Next(from); !next.IsZero() && now.Sub(next) > LateAfter {
				h.Late = append(h.Late, LateItem{Item: item, Due: next})
			}
		}
	}
	h.judge()
	return h
}

// judge sets h's state from its failing and late items.
func (h *Health) judge() {
	switch {
	case len(h.Failing) > 0:
		h.State = HealthFailing
	case len(h.Late) > 0:
		h.State = HealthLate
	default:
		h.State = HealthOK
	}
}

// mapsKeys is the set of keys of two maps of items.
func mapsKeys[A, B any](a map[int]A, b map[int]B) func(yield func(int) bool) {
	return func(yield func(int) bool) {
		for k := range a {
			if !yield(k) {
				return
			}
		}
		for k := range b {
			if _, dup := a[k]; !dup && !yield(k) {
				return
			}
		}
	}
}

// addStreaks completes h from job's history (oldest first): whether the
// items whose record is a skip or a run in progress failed their last
// finished run, how many of each failing item's runs failed in a row and
// since when, and the job's last success.
func addStreaks(h *Health, hist []keyspace.ItemRecord) {
	finished := func(r keyspace.ItemRecord) bool {
		return r.State != keyspace.StateSkipped && r.State != keyspace.StateRunning
	}
	for _, rec := range hist {
		if rec.State == keyspace.StateDone && rec.End.After(h.LastSuccess) {
			h.LastSuccess = rec.End
		}
		if finished(rec) && rec.End.After(h.LastRun) {
			h.LastRun = rec.End
		}
	}
	for _, item := range h.maybe {
		for j := len(hist) - 1; j >= 0; j-- {
			if rec := hist[j]; rec.Item == item && finished(rec) {
				if rec.Failed() {
					h.Failing = append(h.Failing, FailingItem{Item: item, Last: rec})
				}
				break
			}
		}
	}
	h.maybe = nil
	slices.SortFunc(h.Failing, func(a, b FailingItem) int { return a.Item - b.Item })
	for i := range h.Failing {
		f := &h.Failing[i]
		f.InARow, f.Since, f.AtLeast = 0, time.Time{}, true
		for j := len(hist) - 1; j >= 0; j-- {
			rec := hist[j]
			if rec.Item != f.Item || !finished(rec) {
				continue
			}
			if !rec.Failed() {
				f.AtLeast = false
				break
			}
			f.InARow++
			f.Since = rec.Start
		}
		f.AtLeast = f.AtLeast && f.InARow >= keyspace.HistoryPerItem
		if f.InARow == 0 { // the record's history was not read yet: the record alone
			f.InARow, f.Since, f.AtLeast = 1, f.Last.Start, false
		}
	}
	h.judge()
}

// readStreaks reads the history of the failing jobs of cs at rev, many
// jobs per Txn, and completes their health (addStreaks).
func (c *Client) readStreaks(ctx context.Context, cs *ClusterStatus, rev int64) error {
	var failing []int
	for i, j := range cs.Jobs {
		if j.Health != nil && (len(j.Health.Failing) > 0 || len(j.Health.maybe) > 0) {
			failing = append(failing, i)
		}
	}
	// A job's history is up to HistoryPerItem records of 4 KiB and more
	// per item: a few jobs per Txn.
	const perTxn = 8
	for from := 0; from < len(failing); from += perTxn {
		chunk := failing[from:min(from+perTxn, len(failing))]
		ops := make([]clientv3.Op, len(chunk))
		for k, i := range chunk {
			ops[k] = clientv3.OpGet(c.keys.HistoryPrefix(cs.Jobs[i].Name), clientv3.WithPrefix(), clientv3.WithRev(rev))
		}
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("read the history of %d failing jobs: %w", len(chunk), err)
		}
		for k, i := range chunk {
			kvs := resp.Responses[k].GetResponseRange().Kvs
			values := make([][]byte, len(kvs))
			for n, kv := range kvs {
				values[n] = kv.Value
			}
			addStreaks(cs.Jobs[i].Health, keyspace.ParseHistory(values))
		}
	}
	return nil
}

// Runs says how many runs in a row failed: "3", or "10+" when every run
// etcd keeps failed.
func (f FailingItem) Runs() string {
	if f.AtLeast {
		return strconv.Itoa(f.InARow) + "+"
	}
	return strconv.Itoa(f.InARow)
}

// Brief says h in a few words: "OK", "FAILING 2/3", "LATE 1/3", with
// "running 1" when items run.
func (h *Health) Brief(total int) string {
	if h == nil {
		return "-"
	}
	s := h.State
	switch h.State {
	case HealthFailing:
		s += " " + strconv.Itoa(len(h.Failing)) + "/" + strconv.Itoa(total)
	case HealthLate:
		s += " " + strconv.Itoa(len(h.Late)) + "/" + strconv.Itoa(total)
	}
	if len(h.Running) > 0 {
		s += ", running " + strconv.Itoa(len(h.Running))
	}
	return s
}
