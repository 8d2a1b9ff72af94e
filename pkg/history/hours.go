package history

// Hours counts an instance's runs and failures per hour over the last day,
// for the console's chart: live from each run that ends (Add), and, for
// the hours before the process started, from its run logs (Seed). The
// cluster's chart is the sum of every live instance's (GET
// /api/v1/stats/hours).

import (
	"slices"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runlog"
)

// Day is how many hours Hours keeps.
const Day = 24

// Hour is one hour's runs.
type Hour struct {
	Start    time.Time `json:"start"`
	Runs     int       `json:"runs"`
	Failures int       `json:"failures"`
}

// HoursAnswer is the runs and failures per hour over the last day: of one
// instance, or summed over the live instances.
type HoursAnswer struct {
	Hours []Hour `json:"hours"`
	// Complete says every instance counted its hours from before it
	// started (its run logs) in full.
	Complete bool `json:"complete"`
	// Unreachable names the instances not counted, and why.
	Unreachable map[string]string `json:"unreachable,omitempty"`
}

// Hours is a day of hourly counts. Safe for concurrent use.
type Hours struct {
	mu      sync.Mutex
	buckets map[int64]*Hour // by the hour's Unix time
	// seeded says that the logs older than the process were counted;
	// seedCap is how many logs Seed reads at most.
	seeded  bool
	partial bool
}

// NewHours returns an empty day.
func NewHours() *Hours { return &Hours{buckets: map[int64]*Hour{}} }

// Add counts a run that ended at end, failed (FAILED, or KILLED by its
// timeout) or not.
func (h *Hours) Add(end time.Time, failed bool) {
	hour := end.UTC().Truncate(time.Hour)
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.buckets[hour.Unix()]
	if b == nil {
		b = &Hour{Start: hour}
		h.buckets[hour.Unix()] = b
		h.dropOld(hour)
	}
	b.Runs++
	if failed {
		b.Failures++
	}
}

// dropOld forgets the hours a day before newest. h.mu is held.
func (h *Hours) dropOld(newest time.Time) {
	for k := range h.buckets {
		if k <= newest.Add(-Day*time.Hour).Unix() {
			delete(h.buckets, k)
		}
	}
}

// Day returns the Day hours up to now's, oldest first, with whether the
// counts before the process started are known (Seed done and whole).
func (h *Hours) Day(now time.Time) (hours []Hour, complete bool) {
	last := now.UTC().Truncate(time.Hour)
	h.mu.Lock()
	defer h.mu.Unlock()
	for i := Day - 1; i >= 0; i-- {
		at := last.Add(-time.Duration(i) * time.Hour)
		hr := Hour{Start: at}
		if b := h.buckets[at.Unix()]; b != nil {
			hr = *b
		}
		hours = append(hours, hr)
	}
	return hours, h.seeded && !h.partial
}

// seedCap bounds the logs Seed reads.
const seedCap = 200_000

// Seed counts the runs of store's logs that ended in the last day before
// before (when the process started: later ones are Added as they end),
// reading at most seedCap logs, newest first.
func (h *Hours) Seed(store *runlog.Store, before time.Time) error {
	jobs, err := store.Jobs()
	if err != nil {
		return err
	}
	since := before.Add(-Day * time.Hour)
	read := 0
	for _, job := range jobs {
		err := store.Scan(job, -1, func(s runlog.Summary) bool {
			if s.Writing || !s.Modified.Before(before) {
				return true // counted by Add when it ends
			}
			if s.Modified.Before(since) || read >= seedCap {
				return false
			}
			read++
			end, failed := s.Modified, false
			if s.Ended {
				if !s.End.Finish.IsZero() {
					end = s.End.Finish
				}
				rec := keyspace.ItemRecord{State: s.End.State, Reason: s.End.Reason}
				failed = rec.Failed()
			}
			h.Add(end, failed)
			return true
		})
		if err != nil && read == 0 {
			continue // a job directory refused: its logs are not counted
		}
	}
	h.mu.Lock()
	h.seeded, h.partial = true, read >= seedCap
	h.mu.Unlock()
	return nil
}

// SumHours adds days of hours (each oldest first), hour by hour, and
// returns the last Day hours of the sum, oldest first (instances asked a
// moment apart may straddle an hour's start).
func SumHours(days ...[]Hour) []Hour {
	by := map[int64]*Hour{}
	for _, d := range days {
		for _, hr := range d {
			b := by[hr.Start.Unix()]
			if b == nil {
				b = &Hour{Start: hr.Start}
				by[hr.Start.Unix()] = b
			}
			b.Runs += hr.Runs
			b.Failures += hr.Failures
		}
	}
	out := make([]Hour, 0, len(by))
	for _, b := range by {
		out = append(out, *b)
	}
	slices.SortFunc(out, func(a, b Hour) int { return a.Start.Compare(b.Start) })
	if len(out) > Day {
		out = out[len(out)-Day:]
	}
	return out
}
