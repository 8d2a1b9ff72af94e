// Package console is shardd's web console: server-rendered pages, served
// by every instance at / on its --listen address, over the same data as
// the API and acting through the API's own endpoints.
//
// # Pages
//
//	/                  overview: cluster health, job counts, recent failures
//	/jobs              jobs, searched and filtered server-side, 50 a page
//	/jobs/{job}        one job: items, instances, history, a run's log, actions
//	/instances         live instances: version, start, jobs, items, leaderships
//	/audit             who did what (the audit log)
//	/login, /logout    a token pasted once becomes a session cookie
//
// # Reading
//
// The overview, the job list and the instances page read a snapshot of the
// cluster (coord.ReadStatus and coord.ReadJobRuns) kept for a few seconds:
// with 10,000 jobs one read takes seconds, a page must not. A page served
// from a snapshot older than Options.MaxAge starts one refresh in the
// background (never two) and shows the age of what it shows; a snapshot
// older than 15 s is not shown: the page waits for the refresh (at most
// PageWait, then it shows what it has, with a warning). While pages are
// asked for, the snapshot is refreshed in the background (Options.Warm),
// so pages in use do not wait. A write through this instance's API
// (Invalidate) makes the next page wait for a read begun after the write:
// a read already in progress saw the cluster before it, however late it
// ends. The job page reads its job fresh (one job's keys, its items and
// history).
//
// # Acting
//
// Actions are forms that the page's script sends to the API
// (/api/v1/jobs/{job}/trigger, kill, disable, enable) with the session's
// cookie and its key in a header, after a confirmation; the API checks,
// does and records them in the audit log exactly as for any other caller.
// The console itself changes nothing: one mechanism, one audit.
//
// # Who
//
// api.Auth decides: when some token has the read role, every page needs a
// login; otherwise pages are open and a login is needed only to act. A
// read-role login sees everything and no action. Login and logout refuse
// cross-origin posts; logins are rate-limited (429).
//
// A session is two halves (see api.Auth): an HttpOnly, SameSite=Strict
// cookie (Secure over TLS), which the browser sends to every port of the
// host, so to other local users' servers too, and a key, which only this
// origin's script has. The login answers with a page that gives the key to
// the script, which keeps it in the origin's localStorage and sends it in
// api.KeyHeader with every request it makes. A navigation sends only the
// cookie: a page asked for with the cookie of a live session and no key
// is answered with a bootstrap page that holds no data, whose script asks
// for the same URL with the key and shows that page in its place. So the
// cookie alone gets nothing but the bootstrap; and the key replaces a CSRF
// token (no page of another origin can know or send it). Logout takes the
// key from its form (the script fills it in); without it, it only clears
// the caller's cookie.
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
	for _, rec := range runs.Records {
		if rec.State == keyspace.StateRunning || rec.End.IsZero() || begun(rec) {
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

// begun reports whether a record only begins an item's record (coord's
// Begin): the item has not run yet.
func begun(rec keyspace.ItemRecord) bool {
	return rec.State == keyspace.StateSkipped && rec.Skipped == 0 && rec.Reason == "" && rec.Fence == 0
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
	Next     []time.Time
	// After are the job's parents (dependsOn): it also runs after their fires.
	After []string
}

func scheduleOf(j *config.Job, now time.Time, n int) schedule {
	if j == nil {
		return schedule{}
	}
	s := schedule{Cron: j.Cron, TimeZone: j.TimeZone, After: j.DependsOn}
	if j.Schedule == nil {
		return s
	}
	t := now
	for range n {
		t = j.Schedule.Next(t)
		if t.IsZero() {
			break
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
