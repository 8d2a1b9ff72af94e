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
	"bytes"
	"html/template"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// parsePages parses each page with the layout; a bad template is a bug
// the tests catch, so it panics.
func parsePages() map[string]*template.Template {
	funcs := template.FuncMap{
		"when": func(t time.Time) string {
			if t.IsZero() {
				return "-"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
		"whenIn": func(t time.Time) string { return t.Format("2006-01-02 15:04:05 MST") },
		"took": func(a, b time.Time) string {
			if a.IsZero() || b.IsZero() {
				return "-"
			}
			return b.Sub(a).Round(time.Millisecond).String()
		},
		"age":    func(d time.Duration) string { return d.Round(100 * time.Millisecond).String() },
		"join":   strings.Join,
		"jobURL": func(job string) string { return "/jobs/" + url.PathEscape(job) },
		"apiURL": func(job, action string) string { return "/api/v1/jobs/" + url.PathEscape(job) + "/" + action },
		"logURL": func(job, run string) string {
			return "/jobs/" + url.PathEscape(job) + "?run=" + url.QueryEscape(run) + "#log"
		},
		"runID":  func(r keyspace.ItemRecord) string { return strconv.FormatInt(r.Fence, 10) + "-" + strconv.Itoa(r.Item) },
		"result": result,
		"failed": failed,
		"lower":  strings.ToLower,
		"code":   code,
		"tail":   tail,
		"deref":  func(r *keyspace.ItemRecord) keyspace.ItemRecord { return *r },
	}
	layout := template.Must(template.New("layout").Funcs(funcs).ParseFS(templateFS, "templates/layout.html"))
	pages := map[string]*template.Template{}
	for _, name := range []string{"overview", "jobs", "job", "instances", "audit", "login", "welcome", "error"} {
		pages[name] = template.Must(template.Must(layout.Clone()).ParseFS(templateFS, "templates/"+name+".html"))
	}
	return pages
}

// bootPage is the page a navigation with a session's cookie and without
// its key gets (see console.boot): always the same, with no data.
var bootPage = func() []byte {
	var b bytes.Buffer
	template.Must(template.ParseFS(templateFS, "templates/boot.html")).ExecuteTemplate(&b, "boot", nil)
	return b.Bytes()
}()

// code is a record's exit code or HTTP status ("exit 1", "http 503").
func code(r keyspace.ItemRecord) string {
	switch {
	case r.HTTPStatus > 0:
		return "http " + strconv.Itoa(r.HTTPStatus)
	case r.ExitCode >= 0:
		return "exit " + strconv.Itoa(r.ExitCode)
	}
	return "-"
}

// tail is what says most about how a run ended: a failed run's last line
// of output (its own words, "upstream timeout"), else its error (a kill's
// "killed by ..."), else its output's last line; cut.
func tail(r keyspace.ItemRecord) string {
	out := strings.TrimSpace(r.Output)
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = out[i+1:]
	}
	if r.Error != "" && (out == "" || r.State != keyspace.StateFailed) {
		out = r.Error
	}
	if len(out) > 120 {
		out = strings.ToValidUTF8(out[:117], "") + "..."
	}
	return out
}
