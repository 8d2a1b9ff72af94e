package console

import (
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"slices"
	"time"

	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

type overviewData struct {
	Endpoints []string
	Prefix    string
	Revision  int64
	Instances int
	Jobs      int
	// FailingOrLate counts the jobs failing or late (their health).
	FailingOrLate int
	OK            int
	Running       int
	FailedHour    int
	Disabled      int
	Troubled      int
	Failures      []keyspace.ItemRecord
	// Etcd are what keeps etcd from taking writes, and its history going back.
	Etcd []string
	// Degraded are the instances whose last reload was rejected.
	Degraded []admin.InstanceStatus
	// Chart is the runs and failures per hour over the last day (SVG),
	// ChartNote what it lacks (instances not reached, hours not counted).
	Chart     template.HTML
	ChartNote string
	// Unhealthy are the jobs whose health is not OK: failing or late.
	Unhealthy []admin.JobStatus
}

func (c *console) overview(r *http.Request, v *view) (string, error) {
	snap, err := c.snapshot(r, v, "Overview", "overview")
	if err != nil {
		return "", err
	}
	d := overviewData{Endpoints: c.o.Endpoints, Prefix: snap.st.Prefix, Revision: snap.st.Revision, Instances: len(snap.st.Instances), Jobs: len(snap.rows),
		Etcd: snap.st.EtcdProblems()}
	hourAgo := v.Now.Add(-time.Hour)
	for _, row := range snap.rows {
		healthy := row.job.Health == nil || row.job.Health.State == admin.HealthOK
		if !healthy {
			d.FailingOrLate++
		}
		switch row.Status {
		case admin.StatusOK:
			if healthy {
				d.OK++
			}
		case admin.StatusDisabled, admin.StatusPaused:
			d.Disabled++
		default:
			d.Troubled++
		}
		if row.Running > 0 {
			d.Running++
		}
		if row.FailedAt.After(hourAgo) {
			d.FailedHour++
		}
	}
	for _, runs := range snap.runs {
		if f := runs.LastFailure; f != nil && f.End.After(v.Now.Add(-24*time.Hour)) {
			d.Failures = append(d.Failures, *f)
		}
	}
	slices.SortFunc(d.Failures, func(a, b keyspace.ItemRecord) int { return b.End.Compare(a.End) })
	if len(d.Failures) > 20 {
		d.Failures = d.Failures[:20]
	}
	for _, in := range snap.st.Instances {
		if in.ReloadRejected != "" {
			d.Degraded = append(d.Degraded, in)
		}
	}
	for _, j := range snap.st.Jobs {
		if j.Health != nil && j.Health.State != admin.HealthOK && len(d.Unhealthy) < 50 {
			d.Unhealthy = append(d.Unhealthy, j)
		}
	}
	if c.o.Hours != nil {
		ctx, cancel := c.ctx(r)
		ans, err := c.o.Hours(ctx, c.o.Auth.ReadSecret(v.Caller))
		cancel()
		switch {
		case err != nil:
			d.ChartNote = "runs per hour: " + err.Error()
		default:
			d.Chart = hoursSVG(ans.Hours)
			for _, id := range slices.Sorted(maps.Keys(ans.Unreachable)) {
				d.ChartNote += fmt.Sprintf(" Instance %s is not counted: %s.", id, ans.Unreachable[id])
			}
			if !ans.Complete && len(ans.Unreachable) == 0 {
				d.ChartNote += " The hours before an instance started are counted from its run logs; some were not (yet)."
			}
		}
	}
	v.Data = d
	return "overview", nil
}

// ---- jobs
