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
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/api"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runlog"
	sched "github.com/shardd/shardd/pkg/schedule"
)

// Admin is what the console reads of the cluster; *admin.Client
// implements it.
type Admin interface {
	Status(ctx context.Context) (*admin.ClusterStatus, error)
	JobStatus(ctx context.Context, job string) (*admin.ClusterStatus, error)
	JobRuns(ctx context.Context, jobs []string) (map[string]admin.JobRuns, error)
	History(ctx context.Context, job string, item int) ([]keyspace.ItemRecord, error)
	Audit(ctx context.Context, f admin.AuditFilter) ([]keyspace.AuditEntry, error)
}

// Options configure the console.
type Options struct {
	// Instance is the id of the instance serving the console.
	Instance string
	Admin    Admin
	Auth     *api.Auth
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
	Caller   *api.Caller
	CanWrite bool
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
			if _, err := r.Cookie(api.SessionCookie); err == nil {
				to += "&expired=1" // a cookie this instance does not know
			}
			http.Redirect(w, r, to, http.StatusSeeOther)
			return
		}
		v := &view{Caller: caller, Instance: c.o.Instance, Version: c.o.Version, Now: c.o.Now(), Status: http.StatusOK}
		if caller != nil {
			v.CanWrite = caller.Token.Role == api.RoleWrite && caller.Session
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

// current returns the current snapshot, nil if none, without reading.
func (s *snapshots) current() *snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// ---- snapshots

// snapshot is the cluster as read at one time.
type snapshot struct {
	at time.Time
	// gen is the generation of the snapshots (see snapshots.gen) when
	// its read began: it shows every write invalidated before that.
	gen  uint64
	st   *admin.ClusterStatus
	runs map[string]admin.JobRuns
	rows []jobRow // by name
}

// snapshots keeps the latest snapshot and refreshes it, one read at a time.
//
// A write through this instance's API (invalidate) bumps gen. A snapshot
// is current only if its read began at the current generation: a read in
// progress when a write is made saw the cluster before the write, however
// late it ends, so it does not count as fresh for the pages after the
// write; they wait for a read begun after it.
type snapshots struct {
	c          *console
	mu         sync.Mutex
	cur        *snapshot
	refreshing chan struct{} // closed when the read in progress ends; nil if none
	err        error         // the last read's
	gen        uint64        // bumped by every invalidate
	lastUse    time.Time     // of a page (real time)
	warming    bool          // a refresh is scheduled (keepWarm)
}

// maxStale is the oldest snapshot a page shows without waiting for a
// fresh one: an operator coming back after a while sees the cluster as it
// is, not as it was.
const maxStale = 15 * time.Second

// get returns a snapshot, and a warning when it is older than it should
// be: the current one if younger than MaxAge; else, starting a refresh,
// the current one anyway if younger than maxStale and no write made it
// stale (invalidate); else a newer one whose read began after every
// write before the page, if it comes while ctx lasts (a read that began
// before such a write, in progress or just ended, is followed by another);
// else the current one, however old, with a warning that says why; else
// the error.
func (s *snapshots) get(ctx context.Context) (*snapshot, string, error) {
	s.mu.Lock()
	s.lastUse = time.Now()
	cur, want := s.cur, s.gen
	age := time.Duration(0)
	if cur != nil {
		age = s.c.o.Now().Sub(cur.at)
	}
	valid := cur != nil && cur.gen == want
	if valid && age < s.c.o.MaxAge {
		s.mu.Unlock()
		return cur, "", nil
	}
	done := s.refresh()
	s.mu.Unlock()
	if valid && age < maxStale {
		return cur, "", nil
	}
	for {
		select {
		case <-done:
		case <-ctx.Done():
		}
		s.mu.Lock()
		if fresh := s.cur; fresh != nil && fresh != cur && fresh.gen >= want {
			s.mu.Unlock()
			return fresh, "", nil
		}
		if s.err != nil || ctx.Err() != nil {
			break // s.mu held
		}
		// The read that ended began before a write the page must show.
		done = s.refresh()
		s.mu.Unlock()
	}
	defer s.mu.Unlock()
	switch {
	case s.cur != nil && s.err != nil:
		return s.cur, fmt.Sprintf("etcd did not answer (%v): this is the cluster as it was %s ago", s.err, s.c.o.Now().Sub(s.cur.at).Round(time.Second)), nil
	case s.cur != nil:
		return s.cur, fmt.Sprintf("etcd has not answered within %s: this is the cluster as it was %s ago", s.c.o.PageWait, s.c.o.Now().Sub(s.cur.at).Round(time.Second)), nil
	case s.err != nil:
		return nil, "", s.err
	}
	return nil, "", fmt.Errorf("etcd at %s has not answered within %s", strings.Join(s.c.o.Endpoints, ","), s.c.o.PageWait)
}

// invalidate makes the next page wait for a fresh snapshot: a write
// through this instance's API changed the cluster.
func (s *snapshots) invalidate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
}

// refresh starts a read unless one is in progress; s.mu is held.
func (s *snapshots) refresh() chan struct{} {
	if s.refreshing != nil {
		return s.refreshing
	}
	done := make(chan struct{})
	s.refreshing = done
	gen := s.gen
	go func() { // ends with the read, bounded by Timeout
		defer close(done)
		began := time.Now()
		snap, err := s.c.read()
		took := time.Since(began)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.refreshing, s.err = nil, err
		if err == nil {
			// Newer than cur, kept even when a write came meanwhile
			// (then it is not current: its gen is behind).
			snap.gen = gen
			s.cur = snap
		} else {
			s.c.o.Logger.Warn("console: read the cluster", "err", err)
		}
		s.keepWarm(took)
	}()
	return done
}

// keepWarm schedules the next refresh while pages are asked for (within
// Options.Warm of the last one), so that a page in use never waits for a
// read: every MaxAge, or five times as long as a read takes (a large
// cluster is not read back to back). s.mu is held.
func (s *snapshots) keepWarm(took time.Duration) {
	warm := s.c.o.Warm
	if warm <= 0 || s.warming || time.Since(s.lastUse) > warm {
		return
	}
	s.warming = true
	time.AfterFunc(max(s.c.o.MaxAge, 5*took), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.warming = false
		if time.Since(s.lastUse) <= warm {
			s.refresh()
		}
	})
}

// read reads a snapshot.
func (c *console) read() (*snapshot, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.o.Timeout)
	defer cancel()
	at := c.o.Now()
	st, err := c.o.Admin.Status(ctx)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(st.Jobs))
	for i, j := range st.Jobs {
		names[i] = j.Name
	}
	runs, err := c.o.Admin.JobRuns(ctx, names)
	if err != nil {
		return nil, err
	}
	snap := &snapshot{at: at, st: st, runs: runs, rows: make([]jobRow, len(st.Jobs))}
	for i := range st.Jobs {
		snap.rows[i] = newJobRow(&st.Jobs[i], runs[st.Jobs[i].Name])
	}
	return snap, nil
}

// ---- job rows

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

type jobData struct {
	Job       admin.JobStatus
	Schedule  schedule
	Failover  bool
	Items     []itemRow
	Instances []instanceFor
	History   []keyspace.ItemRecord
	// Filters of the history.
	Item, Result, Source, Since string
	Results, Sources            []string
	HistoryNote                 string
	// Run is the run whose log is shown ("FENCE-ITEM"), "" for none.
	Run string
	// Description and Definition (indented JSON) say what the job is;
	// PastFires are its latest fires, to re-run, in its time zone.
	Description string
	Definition  string
	PastFires   []string
}

// errorData is an error page's way on.
type errorData struct {
	Link, LinkText string
}

// pastFires returns the job's last n fires before now, newest first, as
// the re-run form takes them: in the job's time zone, with the offset
// where the clocks show that time twice (a schedule that follows the
// clock fires at both).
func pastFires(j *config.Job, now time.Time, n int) []string {
	if j.Schedule == nil {
		return nil
	}
	loc := j.Location
	if loc == nil {
		loc = time.UTC
	}
	var fires []time.Time
	for span := time.Hour; span <= 400*24*time.Hour && len(fires) < n; span *= 4 {
		fires = fires[:0]
		for t := j.Schedule.Next(now.Add(-span)); !t.IsZero() && !t.After(now); t = j.Schedule.Next(t) {
			fires = append(fires, t)
		}
	}
	var out []string
	for i := len(fires) - 1; i >= 0 && len(out) < n; i-- {
		f := fires[i].In(loc)
		if at, _ := sched.Instants(loc, f); len(at) > 1 {
			out = append(out, f.Format(time.RFC3339))
			continue
		}
		out = append(out, f.Format("2006-01-02 15:04:05"))
	}
	return out
}

type itemRow struct {
	admin.ItemStatus
	Disabled  bool
	RunningOn string
	// RunningFence is the fence of the run in progress: its Kill button
	// names it, so that a kill from this page never stops a later run.
	RunningFence int64
	Last         *keyspace.ItemRecord
	Result       string
	LogRun       string
}

type instanceFor struct {
	ID       string
	Eligible bool
	Disabled bool
}

func (c *console) job(r *http.Request, v *view) (string, error) {
	name := r.PathValue("job")
	ctx, cancel := c.ctx(r)
	defer cancel()
	st, err := c.o.Admin.JobStatus(ctx, name)
	if err != nil {
		return "", err
	}
	idx := slices.IndexFunc(st.Jobs, func(j admin.JobStatus) bool { return j.Name == name })
	if idx < 0 {
		v.Status, v.Error = http.StatusNotFound, "no job "+strconv.Quote(name)+" in the cluster"
		if snap := c.snap.current(); snap != nil {
			names := make([]string, len(snap.rows))
			for i, row := range snap.rows {
				names[i] = row.Name
			}
			if near, ok := config.Nearest(name, names); ok {
				v.Error += " (did you mean " + near + "?)"
				v.Data = errorData{Link: "/jobs/" + url.PathEscape(near), LinkText: near}
				return "error", nil
			}
		}
		v.Data = errorData{Link: "/jobs?q=" + url.QueryEscape(name), LinkText: "search the jobs for " + strconv.Quote(name)}
		return "error", nil
	}
	js := st.Jobs[idx]
	runs, err := c.o.Admin.JobRuns(ctx, []string{name})
	if err != nil {
		return "", err
	}
	q := r.URL.Query()
	d := jobData{Job: js, Item: q.Get("item"), Result: q.Get("result"), Source: q.Get("source"), Since: q.Get("since"),
		Results: []string{"", keyspace.StateDone, keyspace.StateFailed, keyspace.StateKilled, keyspace.StateSkipped, keyspace.StateRunning},
		Sources: []string{"", keyspace.SourceNormal, keyspace.SourceMisfire, keyspace.SourceFailover, keyspace.SourceManual, keyspace.SourceUpstream}}
	if run := q.Get("run"); run != "" {
		if _, _, ok := runlog.ParseRun(run); ok {
			d.Run = run
		} else {
			d.HistoryNote = "run " + strconv.Quote(run) + " is not a run (FENCE-ITEM, as the history's log links give it)"
		}
	}
	def := []byte(nil)
	if js.Definition != nil {
		def = js.Definition.Job
	}
	if j := definition(def, name); j != nil {
		d.Schedule, d.Failover, d.Description = scheduleOf(j, v.Now, 3), j.Failover, j.Description
		d.PastFires = pastFires(j, v.Now, 10)
	}
	if len(def) > 0 {
		var pretty bytes.Buffer
		if json.Indent(&pretty, def, "", "  ") == nil {
			d.Definition = pretty.String()
		}
	}
	off := map[int]bool{}
	for _, i := range js.DisabledItems {
		off[i] = true
	}
	jr := runs[name]
	for _, it := range js.Items {
		row := itemRow{ItemStatus: it, Disabled: off[it.Item], RunningOn: jr.Running[it.Item]}
		if rec, ok := jr.Records[it.Item]; ok && !begun(rec) {
			row.Last, row.Result = &rec, result(rec)
			if row.RunningOn != "" && rec.State == keyspace.StateRunning {
				row.RunningFence = rec.Fence
			}
			if rec.Fence > 0 {
				row.LogRun = strconv.FormatInt(rec.Fence, 10) + "-" + strconv.Itoa(it.Item)
			}
		}
		d.Items = append(d.Items, row)
	}
	ids := map[string]*instanceFor{}
	for _, id := range js.Eligible {
		ids[id] = &instanceFor{ID: id, Eligible: true}
	}
	for _, id := range js.DisabledInstances {
		if ids[id] == nil {
			ids[id] = &instanceFor{ID: id}
		}
		ids[id].Disabled = true
	}
	for _, in := range ids {
		d.Instances = append(d.Instances, *in)
	}
	slices.SortFunc(d.Instances, func(a, b instanceFor) int { return strings.Compare(a.ID, b.ID) })

	item := -1
	if d.Item != "" {
		if n, err := strconv.Atoi(d.Item); err == nil && n >= 0 {
			item = n
		} else {
			d.HistoryNote = "item must be a number; showing every item"
			d.Item = ""
		}
	}
	hist, err := c.o.Admin.History(ctx, name, item)
	if err != nil {
		d.HistoryNote = err.Error()
	}
	var since time.Time
	if d.Since != "" {
		if dur, err := time.ParseDuration(d.Since); err == nil && dur > 0 {
			since = v.Now.Add(-dur)
		} else {
			d.HistoryNote, d.Since = "since must be a duration like 1h or 30m; showing all", ""
		}
	}
	for _, rec := range jr.Records { // runs in progress: history has them when they end
		if rec.State == keyspace.StateRunning && (d.Item == "" || strconv.Itoa(rec.Item) == d.Item) {
			hist = append(hist, rec)
		}
	}
	for _, rec := range hist {
		if (d.Result != "" && rec.State != d.Result) || (d.Source != "" && rec.Source != d.Source) || (!since.IsZero() && rec.Fire.Before(since)) {
			continue
		}
		d.History = append(d.History, rec)
	}
	slices.SortStableFunc(d.History, func(a, b keyspace.ItemRecord) int {
		if c := b.Fire.Compare(a.Fire); c != 0 {
			return c
		}
		return a.Item - b.Item
	})
	v.Title, v.Nav, v.Data = name, "jobs", d
	return "job", nil
}

// ---- instances

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

type auditData struct {
	Job, Actor string
	Entries    []keyspace.AuditEntry
}

func (c *console) audit(r *http.Request, v *view) (string, error) {
	ctx, cancel := c.ctx(r)
	defer cancel()
	q := r.URL.Query()
	d := auditData{Job: strings.TrimSpace(q.Get("job")), Actor: strings.TrimSpace(q.Get("actor"))}
	entries, err := c.o.Admin.Audit(ctx, admin.AuditFilter{Job: d.Job, Actor: d.Actor, Limit: 200})
	if err != nil {
		return "", err
	}
	d.Entries = entries
	v.Title, v.Nav, v.Data = "Audit", "audit", d
	return "audit", nil
}

// ---- templates

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
