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
// cluster (admin.Client.Status and JobRuns) kept for a few seconds:
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
// auth.Authority decides: when some token has the read role, every page needs a
// login; otherwise pages are open and a login is needed only to act. A
// read-role login sees everything and no action. Login and logout refuse
// cross-origin posts; logins are rate-limited (429).
//
// A session is two halves (see package auth): an HttpOnly, SameSite=Strict
// cookie (Secure over TLS), which the browser sends to every port of the
// host, so to other local users' servers too, and a key, which only this
// origin's script has. The login answers with a page that gives the key to
// the script, which keeps it in the origin's localStorage and sends it in
// auth.KeyHeader with every request it makes. A navigation sends only the
// cookie: a page asked for with the cookie of a live session and no key
// is answered with a bootstrap page that holds no data, whose script asks
// for the same URL with the key and shows that page in its place. So the
// cookie alone gets nothing but the bootstrap; and the key replaces a CSRF
// token (no page of another origin can know or send it). Logout takes the
// key from its form (the script fills it in); without it, it only clears
// the caller's cookie.
package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/history"
)

// Admin is what the console reads of the cluster; *admin.Client
// implements it.
type Admin interface {
	Status(ctx context.Context) (*admin.ClusterStatus, error)
	JobStatus(ctx context.Context, job string) (*admin.ClusterStatus, error)
	JobRuns(ctx context.Context, jobs []string) (map[string]admin.JobRuns, error)
	History(ctx context.Context, job string, item int) ([]keyspace.ItemRecord, error)
	Audit(ctx context.Context, f admin.AuditFilter) ([]keyspace.AuditEntry, error)
	Definition(ctx context.Context, job string) (*admin.Definition, error)
	Versions(ctx context.Context, job string) ([]admin.Version, error)
}

// Options configure the console.
type Options struct {
	// Instance is the id of the instance serving the console.
	Instance string
	Admin    Admin
	Auth     *auth.Authority
	// History answers a page of a job's history merged over the cluster
	// (api.Histories.Merged), asking the other instances with the read
	// token secret; nil: etcd's records alone (Admin.History).
	History func(ctx context.Context, job string, q history.Query, secret string) (history.Answer, error)
	// Hours answers the runs and failures per hour over the last day,
	// summed over the instances (api.Histories.MergedHours); nil: no chart.
	Hours func(ctx context.Context, secret string) (history.HoursAnswer, error)
	// Endpoints are the etcd endpoints this instance uses; Version its
	// version.
	Endpoints []string
	Version   string
	Logger    *slog.Logger
	// MaxAge is how old a snapshot may be before a page refreshes it in
	// the background; default 5s. Timeout bounds one read of the cluster;
	// default 30s. PageWait is how long a page waits for etcd before it
	// shows what it has (an older snapshot, with a warning) or says etcd
	// does not answer; default 5s.
	MaxAge, Timeout, PageWait time.Duration
	// Warm is how long after a page the snapshot is kept fresh in the
	// background, so that pages do not wait for reads while the console is
	// in use; default 2m, negative: never.
	Warm time.Duration
	Now  func() time.Time
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// PageSize is how many jobs a page of the job list shows.
const PageSize = 50

type console struct {
	o     Options
	pages map[string]*template.Template
	snap  snapshots
	h     http.Handler
}

func (c *console) ServeHTTP(w http.ResponseWriter, r *http.Request) { c.h.ServeHTTP(w, r) }

// New returns the console's handler.
func New(o Options) http.Handler {
	if o.MaxAge <= 0 {
		o.MaxAge = 5 * time.Second
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.PageWait <= 0 {
		o.PageWait = 5 * time.Second
	}
	if o.Warm == 0 {
		o.Warm = 2 * time.Minute
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	c := &console{o: o, pages: parsePages()}
	c.snap.c = c
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static/", cacheFor(time.Hour, http.FileServerFS(static))))
	mux.HandleFunc("GET /login", c.loginPage)
	mux.HandleFunc("POST /login", c.login)
	mux.HandleFunc("POST /logout", c.logout)
	mux.HandleFunc("GET /{$}", c.page(c.overview))
	mux.HandleFunc("GET /jobs", c.page(c.jobs))
	mux.HandleFunc("GET /jobs/{job}", c.page(c.job))
	mux.HandleFunc("GET /jobs/{job}/definition", c.page(c.definition))
	mux.HandleFunc("GET /definitions/new", c.page(c.newDefinition))
	mux.HandleFunc("GET /instances", c.page(c.instances))
	mux.HandleFunc("GET /audit", c.page(c.audit))
	mux.HandleFunc("/", c.page(func(r *http.Request, v *view) (string, error) {
		v.Status = http.StatusNotFound
		v.Error = "no page " + r.URL.Path + " here"
		return "error", nil
	}))
	c.h = secureHeaders(mux)
	return c
}

func cacheFor(d time.Duration, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "private, max-age="+strconv.Itoa(int(d/time.Second)))
		h.ServeHTTP(w, r)
	})
}

// secureHeaders: no framing, no inline or foreign script, no sniffing.
func secureHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("Referrer-Policy", "same-origin")
		h.ServeHTTP(w, r)
	})
}

// view is what every page's template gets.
type view struct {
	Title    string
	Nav      string
	Caller   *auth.Caller
	CanWrite bool
	// CanDefine: a define session, which may edit definitions.
	CanDefine bool
	// Key is the new session's key, on the page that answers a login:
	// the page's script keeps it (see the package doc).
	Key      string
	Instance string
	Version  string
	Now      time.Time
	Status   int
	Error    string
	// Warning is said above the page: what it shows may be out of date.
	Warning string
	// Age is how old the snapshot shown is; zero when read fresh.
	Age  time.Duration
	Data any
}

// page wraps a page's handler: who is asking, the login when reads need
// one, the layout, and errors shown as a page.
func (c *console) page(h func(r *http.Request, v *view) (string, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		caller, err := c.o.Auth.Identify(r)
		if err != nil {
			caller = nil
		}
		if caller == nil && c.o.Auth.KeyMissing(r) {
			c.boot(w)
			return
		}
		if caller == nil && !c.o.Auth.ReadsOpen() {
			to := "/login?next=" + url.QueryEscape(r.URL.RequestURI())
			if _, err := r.Cookie(auth.SessionCookie); err == nil {
				to += "&expired=1" // a cookie this instance does not know
			}
			http.Redirect(w, r, to, http.StatusSeeOther)
			return
		}
		v := &view{Caller: caller, Instance: c.o.Instance, Version: c.o.Version, Now: c.o.Now(), Status: http.StatusOK}
		if caller != nil {
			v.CanWrite = caller.Token.Role == auth.RoleWrite && caller.Session
			v.CanDefine = canDefine(caller)
		}
		name, err := h(r, v)
		if err != nil {
			v.Status, v.Error, name = http.StatusServiceUnavailable, err.Error(), "error"
			if errors.Is(err, context.DeadlineExceeded) {
				v.Error = fmt.Sprintf("etcd at %s did not answer within %s (%v). The overview shows the cluster as last read, if this instance read it before.",
					strings.Join(c.o.Endpoints, ", "), c.o.PageWait, err)
			}
		}
		c.render(w, name, v)
	}
}

func (c *console) render(w http.ResponseWriter, name string, v *view) {
	t := c.pages[name]
	var b strings.Builder
	if err := t.ExecuteTemplate(&b, "layout", v); err != nil {
		c.o.Logger.Error("console page", "page", name, "err", err)
		http.Error(w, "the page could not be rendered: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(v.Status)
	w.Write([]byte(b.String()))
}

// boot answers a navigation that came with a session's cookie and without
// its key: a page with no data, whose script asks for the same URL again
// with the key (see the package doc).
func (c *console) boot(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Write(bootPage)
}

func (c *console) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), c.o.PageWait)
}

// Invalidate tells the console that the cluster changed (a write through
// this instance's API): the next page shows a fresh snapshot.
func Invalidate(h http.Handler) {
	if c, ok := h.(*console); ok {
		c.snap.invalidate()
	}
}

// ---- login
