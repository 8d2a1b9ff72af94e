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
	"slices"
	"strings"

	"github.com/shardd/shardd/pkg/coord/admin"
)

type instanceRow struct {
	admin.InstanceStatus
	Items   int
	Leading int
}

func (c *console) instances(r *http.Request, v *view) (string, error) {
	snap, err := c.snapshot(r, v, "Instances", "instances")
	if err != nil {
		return "", err
	}
	items, leading := map[string]int{}, map[string]int{}
	for _, j := range snap.st.Jobs {
		leading[j.Leader]++
		for _, it := range j.Items {
			items[it.Instance]++
		}
	}
	var rows []instanceRow
	for _, in := range snap.st.Instances {
		rows = append(rows, instanceRow{InstanceStatus: in, Items: items[in.ID], Leading: leading[in.ID]})
	}
	slices.SortFunc(rows, func(a, b instanceRow) int { return strings.Compare(a.ID, b.ID) })
	v.Data = rows
	return "instances", nil
}

// ---- audit
