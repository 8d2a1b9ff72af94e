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
	"errors"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/api"
)

type loginData struct {
	Next     string
	Problem  string
	Note     string
	Writable bool
}

func (c *console) loginPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := loginData{Next: safeNext(q.Get("next")), Writable: c.o.Auth.Writable()}
	switch {
	case q.Get("expired") != "":
		d.Note = "Your session has expired, or this instance has restarted since you logged in (sessions live in the instance's memory): log in again."
	case q.Get("bye") != "":
		d.Note = "You are logged out."
	}
	v := &view{Title: "Log in", Instance: c.o.Instance, Version: c.o.Version, Now: c.o.Now(), Status: http.StatusOK, Data: d}
	v.Caller, _ = c.o.Auth.Identify(r)
	c.render(w, "login", v)
}

// welcomeData is the page that answers a login: it gives the session's
// key to the page's script (view.Key), which goes on to Next.
type welcomeData struct {
	Name, Role, Next string
}

func (c *console) login(w http.ResponseWriter, r *http.Request) {
	if crossOrigin(r) {
		http.Error(w, "cross-origin login refused", http.StatusForbidden)
		return
	}
	next := safeNext(r.PostFormValue("next"))
	refused := func(status int, problem string) {
		v := &view{Title: "Log in", Instance: c.o.Instance, Version: c.o.Version, Now: c.o.Now(), Status: status,
			Data: loginData{Next: next, Problem: problem, Writable: c.o.Auth.Writable()}}
		c.render(w, "login", v)
	}
	caller, key, err := c.o.Auth.Login(w, r, r.PostFormValue("token"))
	var limited *api.LimitError
	switch {
	case errors.As(err, &limited):
		// Not a warning each: a flood of attempts would flood the log.
		c.o.Logger.Debug("console login refused: rate limit", "remote", r.RemoteAddr, "err", err)
		w.Header().Set("Retry-After", strconv.Itoa(int((limited.Retry+time.Second-1)/time.Second)))
		refused(http.StatusTooManyRequests, "Not tried: "+err.Error()+".")
		return
	case err != nil:
		c.o.Logger.Warn("console login refused: no token has that secret", "remote", r.RemoteAddr)
		refused(http.StatusUnauthorized, "That is not the secret of any of this instance's tokens (--api-token-file): paste the secret (the third field of a NAME ROLE SECRET line), not the token's name.")
		return
	}
	c.o.Logger.Info("console login", "token", caller.Token.Name, "role", caller.Token.Role, "remote", r.RemoteAddr)
	c.render(w, "welcome", &view{Title: "Logged in", Caller: caller, Key: key, Instance: c.o.Instance, Version: c.o.Version, Now: c.o.Now(),
		Status: http.StatusOK, Data: welcomeData{Name: caller.Token.Name, Role: caller.Token.Role, Next: next}})
}

// logout clears the caller's cookie, and ends its session when the form
// carries the session's key (the page's script puts it there): whoever
// received the cookie alone cannot log its owner out.
func (c *console) logout(w http.ResponseWriter, r *http.Request) {
	if crossOrigin(r) {
		http.Error(w, "logout refused: not from this console's page", http.StatusForbidden)
		return
	}
	c.o.Auth.Logout(w, r, r.PostFormValue("key"))
	http.Redirect(w, r, "/login?bye=1", http.StatusSeeOther)
}

// safeNext keeps a post-login redirect on this site: a path of this site
// with printable characters and no backslash (browsers read "\\" as "/",
// and drop tabs and newlines, so "/\\host" and "/<TAB>/host" are "//host"),
// that is still such a path once cleaned as http.Redirect cleans it.
func safeNext(next string) string {
	bad := func(p string) bool {
		return !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.ContainsFunc(p, func(r rune) bool {
			return r == '\\' || r < 0x20 || r == 0x7f
		})
	}
	if bad(next) || bad(path.Clean(strings.SplitN(next, "?", 2)[0])) {
		return "/"
	}
	return next
}

// crossOrigin reports whether r comes from a page of another origin.
func crossOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	return err != nil || !strings.EqualFold(u.Host, r.Host)
}
