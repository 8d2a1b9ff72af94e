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
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/coord/admin"
)

// Filters of the job list.
var jobFilters = []string{"", "ok", "running", "failed-last-hour", "failing", "disabled", "troubled"}

type jobsData struct {
	Query, Filter string
	Filters       []string
	Rows          []jobListRow
	Matched       int
	Page, Pages   int
	PrevURL       string
	NextURL       string
}

type jobListRow struct {
	jobRow
	Schedule schedule
}

func (c *console) jobs(r *http.Request, v *view) (string, error) {
	snap, err := c.snapshot(r, v, "Jobs", "jobs")
	if err != nil {
		return "", err
	}
	q := r.URL.Query()
	d := jobsData{Query: strings.TrimSpace(q.Get("q")), Filter: q.Get("filter"), Filters: jobFilters, Page: 1}
	if !slices.Contains(jobFilters, d.Filter) {
		d.Filter = ""
	}
	if p, err := strconv.Atoi(q.Get("page")); err == nil && p > 1 {
		d.Page = p
	}
	needle := strings.ToLower(d.Query)
	var match []jobRow
	for _, row := range snap.rows {
		if needle != "" && !strings.Contains(strings.ToLower(row.Name), needle) {
			continue
		}
		ok := true
		switch d.Filter {
		case "ok":
			ok = row.Status == admin.StatusOK
		case "running":
			ok = row.Running > 0
		case "failed-last-hour":
			ok = row.FailedAt.After(v.Now.Add(-time.Hour))
		case "failing":
			ok = row.Failing > 0
		case "disabled":
			ok = row.Status == admin.StatusDisabled
		case "troubled":
			ok = row.Status != admin.StatusOK && row.Status != admin.StatusDisabled
		}
		if ok {
			match = append(match, row)
		}
	}
	d.Matched = len(match)
	d.Pages = max(1, (len(match)+PageSize-1)/PageSize)
	d.Page = min(d.Page, d.Pages)
	from := (d.Page - 1) * PageSize
	for _, row := range match[from:min(from+PageSize, len(match))] {
		d.Rows = append(d.Rows, jobListRow{jobRow: row, Schedule: scheduleOf(definition(row.def, row.Name), v.Now, 1)})
	}
	link := func(page int) string {
		u := url.Values{}
		if d.Query != "" {
			u.Set("q", d.Query)
		}
		if d.Filter != "" {
			u.Set("filter", d.Filter)
		}
		u.Set("page", strconv.Itoa(page))
		return "/jobs?" + u.Encode()
	}
	if d.Page > 1 {
		d.PrevURL = link(d.Page - 1)
	}
	if d.Page < d.Pages {
		d.NextURL = link(d.Page + 1)
	}
	v.Data = d
	return "jobs", nil
}

// ---- job
