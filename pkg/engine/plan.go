// Package engine runs the items an instance owns, on schedule, once each.
//
// It ties the job's schedule, coord's shard maps and fenced claims, and the
// runner together. One goroutine per job owns the job's timer; it fires at
// the scheduled times (never time.Now: claims are keyed by the scheduled
// fire) and hands each owned item to that item's worker.
//
// # One item's life
//
// For every owned item the engine keeps a local state: idle, or busy with a
// pending fire (the latest fire that came while it was busy). A worker runs
// the decision of plan below, executes it, and loops while a fire is
// pending:
//
//	idle --fire T / acquired--> plan --run--> claim --won--> run --> complete --pending?--> plan
//	                              |             |lost: re-read, plan again
//	                              |wait: the item runs elsewhere --marker gone--> plan
//
// plan is a pure function of the item's record in etcd (last claimed fire,
// state, attempt), whether a running marker exists, the due fire, the time
// and the job's policies:
//
//   - a running marker exists (someone runs the item, maybe this instance
//     after a reshard): wait for it to go; the due fire stays pending
//     (misfire: true) or is skipped (misfire: false). No overlap (G1).
//   - the record says RUNNING but no marker exists: its instance died mid-run.
//     With failover: true the same fire runs again, attempt+1, source
//     FAILOVER. Completed items never fail over (ElasticJob #2090).
//   - fires between the record's fire and the due fire were missed (the
//     owner died, the item moved, the instance was busy). At a regular fire
//     they are skipped and counted; when items are acquired between fires,
//     misfire: true runs the latest missed fire once (source MISFIRE) if it
//     is inside the misfire window, and counts the rest as skipped.
//   - a fire at or before the record's fire was claimed already: nothing
//     (no duplicates, G2).
//
// Every run is a fenced claim (coord.Claim): it fails if anything the
// decision read has changed, and then the worker reads again and decides
// again. The claim's revision is the run's fence token (G4).
package engine

import (
	"time"

	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/schedule"
)

// policy is what plan needs of a job.
type policy struct {
	schedule schedule.Schedule // nil: manual job, nothing is ever missed
	failover bool
	misfire  bool
	window   time.Duration // how old a missed fire may be and still run
}

// decision is what to do for one item now.
type decision struct {
	// wait is set when another run holds the item: wait for its marker to go.
	wait bool
	// failover re-runs the record's fire with the next attempt.
	failover bool
	// run is the fire to run now (zero: none), as source.
	run    time.Time
	source string
	// skipped counts fires that will not run; skipTo is the latest of them.
	skipped int
	skipTo  time.Time
}

// maxCount bounds how many missed fires plan counts one by one.
const maxCount = 100000

// plan decides for one item. due is the fire being triggered (zero when the
// item was just acquired between fires); now is the current time.
func plan(st coord.ItemState, p policy, due, now time.Time) decision {
	if st.RunningBy != "" {
		return decision{wait: true}
	}
	rec := st.Record
	if rec != nil && rec.State == coord.StateRunning {
		if p.failover {
			return decision{failover: true}
		}
		// failover: false: the dead run is not repeated; fires go on.
	}
	if rec != nil && !due.IsZero() && !due.After(rec.Fire) {
		return decision{} // claimed already
	}

	// Missed fires: strictly after the last claimed fire, before the due
	// fire (or up to now when acquiring).
	var missed int
	var latest time.Time
	if rec != nil && p.schedule != nil {
		end := due
		if end.IsZero() {
			end = now.Add(time.Nanosecond) // fires at or before now
		}
		for f := p.schedule.Next(rec.Fire); !f.IsZero() && f.Before(end) && missed < maxCount; f = p.schedule.Next(f) {
			missed++
			latest = f
		}
	}

	if !due.IsZero() {
		d := decision{run: due, source: coord.SourceNormal, skipped: missed}
		return d
	}
	if missed == 0 {
		return decision{}
	}
	if p.misfire && now.Sub(latest) <= p.window {
		return decision{run: latest, source: coord.SourceMisfire, skipped: missed - 1}
	}
	return decision{skipped: missed, skipTo: latest}
}
