package console

import (
	"net/http"
	"slices"
	"time"

	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

type overviewData struct {
	Endpoints  []string
	Prefix     string
	Revision   int64
	Instances  int
	Jobs       int
	OK         int
	Running    int
	FailedHour int
	Disabled   int
	Troubled   int
	Failures   []keyspace.ItemRecord
	// Etcd are what keeps etcd from taking writes, and its history going back.
	Etcd []string
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
		switch row.Status {
		case admin.StatusOK:
			d.OK++
		case admin.StatusDisabled:
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
	v.Data = d
	return "overview", nil
}

// ---- jobs
