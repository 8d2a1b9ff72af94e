package console

import (
	"net/http"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// jobRow is a job as the job list shows it.
type jobRow struct {
	job     *admin.JobStatus
	Name    string
	Status  string
	Leader  string
	Total   int
	Running int
	// Last is the latest ended run's result over the job's items, LastEnd
	// when it ended; Failing counts items whose latest run failed.
	Last    string
	LastEnd time.Time
	Failing int
	// FailedAt is the end of the job's latest failed run (any item, not
	// only latest runs: coord keeps it), zero when none.
	FailedAt time.Time
	cron     string
	def      []byte
}

func newJobRow(j *admin.JobStatus, runs admin.JobRuns) jobRow {
	row := jobRow{job: j, Name: j.Name, Status: j.Status, Leader: j.Leader, Total: j.Total, Running: len(runs.Running)}
	if j.Paused != nil {
		row.Status = admin.StatusPaused // disabled by its own failed fires
	}
	for _, rec := range runs.Records {
		if rec.State == keyspace.StateRunning || rec.End.IsZero() || rec.Begins() {
			continue
		}
		if rec.End.After(row.LastEnd) {
			row.Last, row.LastEnd = result(rec), rec.End
		}
		if failed(rec) {
			row.Failing++
		}
	}
	if f := runs.LastFailure; f != nil {
		row.FailedAt = f.End
	}
	if j.Definition != nil {
		row.def = j.Definition.Job
	}
	return row
}

// failed reports whether a run's record is a failure an operator should see.
func failed(rec keyspace.ItemRecord) bool { return rec.Failed() }

// result is a record's state with its reason (KILLED/operator).
func result(rec keyspace.ItemRecord) string {
	if rec.Reason != "" {
		return rec.State + "/" + rec.Reason
	}
	return rec.State
}

// definition parses a job's registered definition; nil when it cannot.
func definition(raw []byte, name string) *config.Job {
	if len(raw) == 0 {
		return nil
	}
	j, err := config.ParseJobJSON("registered definition of "+name, raw)
	if err != nil {
		return nil
	}
	return j
}

// schedule describes a job's cron and its next fires.
type schedule struct {
	Cron     string
	TimeZone string
	// FixedDelay is the job's fixedDelay, when it has one instead of a cron.
	FixedDelay string
	Next       []time.Time
	// After are the job's parents (dependsOn): it also runs after their fires.
	After []string
}

func scheduleOf(j *config.Job, now time.Time, n int) schedule {
	if j == nil {
		return schedule{}
	}
	s := schedule{Cron: j.Cron.String(), TimeZone: j.TimeZone, After: j.DependsOn}
	if j.FixedDelay > 0 {
		s.FixedDelay = j.FixedDelay.String()
	}
	if j.Schedule == nil {
		return s
	}
	t := now
	for tries := 0; len(s.Next) < n && tries < 1000; tries++ {
		t = j.Schedule.Next(t)
		if t.IsZero() {
			break
		}
		if j.Exclusion.Excludes(t) {
			continue // a calendar's: not a fire that runs
		}
		loc := j.Location
		if loc == nil {
			loc = time.UTC
		}
		s.Next = append(s.Next, t.In(loc))
	}
	return s
}

// snapshot returns the cluster's snapshot for a page that shows it,
// setting the page's title, navigation, age and warning.
func (c *console) snapshot(r *http.Request, v *view, title, nav string) (*snapshot, error) {
	ctx, cancel := c.ctx(r)
	defer cancel()
	snap, warning, err := c.snap.get(ctx)
	if err != nil {
		return nil, err
	}
	v.Title, v.Nav, v.Age, v.Warning = title, nav, v.Now.Sub(snap.at), warning
	return snap, nil
}

// ---- overview
