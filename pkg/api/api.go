// Package api serves shardd's HTTP endpoints: health, readiness, metrics and
// the JSON API over the cluster's jobs and instances.
//
//	GET  /healthz                          the process is alive
//	GET  /readyz                           the instance holds an etcd session; a failed reload counted, not quoted
//	GET  /metrics                          Prometheus metrics
//	GET  /api/v1/jobs                      every job: status, leader, epoch, items
//	GET  /api/v1/jobs/{job}                one job, with this instance's view of it
//	GET  /api/v1/jobs/{job}/history        etcd's recent records of the job's runs (?item=N for one item)
//	GET  /api/v1/jobs/{job}/runs           the merged history, paged: etcd's records and every instance's run logs (see history.go)
//	GET  /api/v1/instances                 live instances
//	GET  /api/v1/stats/hours               runs and failures per hour over the last day, summed over the instances
//	GET  /api/v1/config/problems           the last reload's problems, if it was rejected
//	GET  /api/v1/jobs/{job}/runs/{run}/log a run's log (see Run logs below)
//	POST /api/v1/jobs/{job}/trigger        run now (?item=N for one item)
//	POST /api/v1/jobs/{job}/disable        disable the job (?item=N or ?instance=ID for one; &force=true for an instance not yet running it)
//	POST /api/v1/jobs/{job}/enable         undo disable
//	DELETE /api/v1/jobs/{job}              delete the keys of a job no live instance defines
//
// Errors are JSON {"error": "..."}: 404 for an unknown job or endpoint, 400
// for a bad item or instance, 409 when the command is refused (a disabled
// job, no instance to run it, a job still defined), 405 for a known path
// with another method, 503 when etcd cannot be reached.
//
// Write endpoints need the write token (Authorization: Bearer ...). Without
// a write token they are refused, on every address: any local user reaches
// a loopback port, and there is no default token (XXL-JOB's led to
// CVE-2022-36157). The CLI does not need them: it changes the cluster
// through etcd. A read token, if set, guards the read endpoints of /api
// (either token reads). /healthz, /readyz and /metrics need no token, and
// quote nothing of the job files. The console's sessions stand for a token
// with two halves, the session cookie and the session's key in
// X-Shardd-Key; the cookie alone is nothing (see package auth).
//
// # Run logs
//
// GET /api/v1/jobs/{job}/runs/{run}/log answers with a run's whole log
// (see package runlog), {run} being FENCE-ITEM, or FENCE when one item ran
// under that fence (else 400, naming the items that share it): by default
// text/plain, the records as stored (<time> <tag> <text>); format=json
// gives one JSON object per record ({time, tag, stream, text}; text with
// invalid UTF-8 replaced); stream=stdout or stream=stderr keeps that
// stream's records; follow=1 streams the records as the run writes them
// and ends when its log is closed. The header X-Shardd-Log-Writing says
// whether the run was still writing it, X-Shardd-Served-By which instance
// answered, X-Shardd-Log-Stopped (a header, or a trailer of a followed log
// that stops meanwhile) why the log stopped for lack of space when the
// record saying so is not in its file. A log that is not on this instance is looked up in etcd (the
// run's history record names the instance that ran it, the registry that
// instance's API) and the request is proxied there with the caller's
// token (a console session's too), at most once (X-Shardd-Hop): the
// instances must share their tokens, and an API over TLS must be trusted
// (shardd run --api-ca). 404 for an unknown job or run (the message says
// how to find runs: shardd history JOB) and for a run whose instance is
// not live (the message names it and where its log is); 502 when that
// instance serves no API, listens on another host's loopback, or does not
// answer. A log here is served only when this instance's store vouches
// for it (runlog Store.Open: reached without following a link, a file of
// shardd's user that nobody else can write, beginning with the header of
// that run), from the path the store builds of the job and the run; a
// file there that fails those checks is not served (500, saying why, and
// a warning in the instance's log).
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/history"
)

// Instance is the instance serving the API: whether it can work, and its
// view of a job; *coord.Node implements it.
type Instance interface {
	ID() string
	Up() bool
	// Impaired says why the instance can start no run or record no outcome
	// although it may hold a session (etcd went back in time, etcd's NOSPACE
	// alarm); nil when nothing does.
	Impaired() error
	View(job string) (coord.JobView, bool)
}

// Admin is what the API reads of the cluster and the commands it sends;
// *admin.Client implements it.
type Admin interface {
	Status(ctx context.Context) (*admin.ClusterStatus, error)
	History(ctx context.Context, job string, item int) ([]keyspace.ItemRecord, error)
	Instances(ctx context.Context) ([]keyspace.InstanceInfo, error)
	RecentRuns(ctx context.Context, job string, item int) ([]keyspace.ItemRecord, error)
	Trigger(ctx context.Context, r admin.TriggerRequest) (admin.Triggered, error)
	Kill(ctx context.Context, r admin.KillRequest) (admin.Killing, error)
	WaitKill(ctx context.Context, job string, k keyspace.Kill) ([]admin.KillResult, error)
	SetDisabled(ctx context.Context, t admin.Target, on, force bool) (admin.Disabling, error)
	Remove(ctx context.Context, job string) (int64, error)
	Audit(ctx context.Context, f admin.AuditFilter) ([]keyspace.AuditEntry, error)
	RecordAudit(ctx context.Context, e keyspace.AuditEntry) (keyspace.AuditEntry, error)
	Definition(ctx context.Context, job string) (*admin.Definition, error)
	Apply(ctx context.Context, jobs []*config.Job, o admin.ApplyOptions) ([]admin.ApplyResult, error)
	DeleteApplied(ctx context.Context, job, by string, wait time.Duration) (bool, error)
	Versions(ctx context.Context, job string) ([]admin.Version, error)
	Rollback(ctx context.Context, job string, to int64, by string) (admin.ApplyResult, error)
}

// Options configure the handler.
type Options struct {
	Instance Instance
	Admin    Admin
	// Metrics serves /metrics (nil: 404).
	Metrics http.Handler
	// ConfigError returns the last configuration reload's error, nil if it succeeded.
	ConfigError func() error
	// Auth knows the named bearer tokens and console sessions (auth.New);
	// without a write token the write endpoints are refused. Nil: Tokens.
	Auth *auth.Authority
	// Tokens, when Auth is nil, are the bearer tokens (see auth.ParseTokens).
	Tokens []auth.Token
	// UI, if set, serves every path the API does not (the console).
	UI http.Handler
	// Logger receives every audit entry the API records (and the error
	// when etcd did not take it), and what the API refuses that the audit
	// log does not keep; default slog.Default().
	Logger *slog.Logger
	// OnWrite, if set, is called after every write that changed the
	// cluster (the console then shows it fresh).
	OnWrite func()
	// Loopback says the server listens on loopback addresses only: then a
	// request whose Host is not a loopback address or localhost is refused,
	// so that a web page cannot reach the API by rebinding its own name to
	// 127.0.0.1 (DNS rebinding).
	Loopback bool
	// Timeout bounds the etcd reads and writes of one request; default 5s.
	Timeout time.Duration
	// RunLogs serves run logs (nil: none here, none looked for elsewhere).
	RunLogs *RunLogs
	// Hours counts this instance's runs per hour (nil: none counted).
	Hours *history.Hours
}

// Handler returns the HTTP handler.
func Handler(o Options) http.Handler {
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Auth == nil {
		o.Auth = auth.New(o.Tokens, 0, false)
	}
	a := &api{o: o, auth: o.Auth}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", a.readyz)
	if o.Metrics != nil {
		mux.Handle("GET /metrics", o.Metrics)
	}
	// paths knows every /api path without its method, to tell a wrong
	// method (405) from an unknown path (404).
	paths := http.NewServeMux()
	allowed := map[string][]string{}
	for _, rt := range []struct {
		method, path string
		h            http.HandlerFunc
	}{
		{"GET", "/api/v1/jobs", a.read(a.jobs)},
		{"GET", "/api/v1/jobs/{job}", a.read(a.job)},
		{"DELETE", "/api/v1/jobs/{job}", a.write(a.remove)},
		{"GET", "/api/v1/jobs/{job}/history", a.read(a.history)},
		{"GET", "/api/v1/instances", a.read(a.instances)},
		{"GET", "/api/v1/jobs/{job}/runs", a.read(a.runs)},
		{"GET", "/api/v1/jobs/{job}/runs/{run}/log", a.read(a.runLog)},
		{"POST", "/api/v1/jobs/{job}/trigger", a.write(a.trigger)},
		{"POST", "/api/v1/jobs/{job}/kill", a.write(a.kill)},
		{"GET", "/api/v1/audit", a.read(a.audit)},
		{"GET", "/api/v1/stats/hours", a.read(a.hours)},
		{"GET", "/api/v1/config/problems", a.read(a.problems)},
		{"POST", "/api/v1/jobs/{job}/disable", a.write(a.disable(true))},
		{"POST", "/api/v1/jobs/{job}/enable", a.write(a.disable(false))},
		{"GET", "/api/v1/definitions/{job}", a.read(a.definition)},
		{"PUT", "/api/v1/definitions/{job}", a.define(a.putDefinition)},
		{"DELETE", "/api/v1/definitions/{job}", a.define(a.deleteDefinition)},
		{"GET", "/api/v1/definitions/{job}/versions", a.read(a.versions)},
		{"POST", "/api/v1/definitions/{job}/rollback", a.define(a.rollback)},
	} {
		mux.HandleFunc(rt.method+" "+rt.path, rt.h)
		if allowed[rt.path] == nil {
			paths.HandleFunc(rt.path, func(http.ResponseWriter, *http.Request) {})
		}
		allowed[rt.path] = append(allowed[rt.path], rt.method)
	}
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		if _, p := paths.Handler(r); p != "" {
			w.Header().Set("Allow", strings.Join(allowed[p], ", "))
			writeError(w, http.StatusMethodNotAllowed, "%s %s: method not allowed (allowed: %s)", r.Method, r.URL.Path, strings.Join(allowed[p], ", "))
			return
		}
		writeError(w, http.StatusNotFound, "no such endpoint: %s %s", r.Method, r.URL.Path)
	})
	if o.UI != nil {
		mux.Handle("/", o.UI)
	}
	if !o.Loopback {
		return mux
	}
	return CheckHost(mux, LoopbackHosts)
}

// A HostCheck is the DNS-rebinding check of a server: a web page that
// rebinds its own name to the server's address sends that name in its
// requests' Host header, which the check refuses.
type HostCheck struct {
	OK   func(host string) bool // whether the server answers to the Host header host
	Want string                 // what OK accepts, said in a refusal
}

var (
	// LoopbackHosts accepts a loopback address or localhost: the check of
	// a server that listens on loopback addresses only.
	LoopbackHosts = HostCheck{loopbackHost, "this server answers only to a loopback address or localhost"}
	// AddressHosts accepts an IP address or localhost, never another name.
	AddressHosts = HostCheck{addressHost, "this server answers only to an IP address or localhost, not to a name"}
)

// CheckHost serves h to the requests whose Host header c accepts, and
// refuses the others (421 Misdirected Request).
func CheckHost(h http.Handler, c HostCheck) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !c.OK(r.Host) {
			writeError(w, http.StatusMisdirectedRequest, "host %q: %s", r.Host, c.Want)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// loopbackHost reports whether a Host header names this host's loopback.
func loopbackHost(host string) bool {
	ip, name := hostOf(host)
	if ip != nil {
		return ip.IsLoopback()
	}
	return strings.EqualFold(name, "localhost")
}

// addressHost reports whether a Host header is an IP address or
// localhost: no name a DNS answer could point elsewhere.
func addressHost(host string) bool {
	ip, name := hostOf(host)
	return ip != nil || strings.EqualFold(name, "localhost")
}

// hostOf splits a Host header's host from its port: its IP address, or
// else its name.
func hostOf(host string) (net.IP, string) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	return net.ParseIP(host), host
}

// opStatus is the HTTP status of an error of the coord operator commands.
func opStatus(err error) int {
	switch {
	case errors.Is(err, admin.ErrUnknownJob):
		return http.StatusNotFound
	case errors.Is(err, admin.ErrBadTarget):
		return http.StatusBadRequest
	case errors.Is(err, admin.ErrRefused):
		return http.StatusConflict
	}
	return http.StatusServiceUnavailable
}

type api struct {
	o    Options
	auth *auth.Authority
}

type apiError struct {
	Error string `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, apiError{Error: fmt.Sprintf(format, args...)})
}

// read guards a read endpoint: open unless some token has the read role,
// then any token (or console session) reads.
func (a *api) read(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		c, err := a.auth.Identify(r)
		switch {
		case err != nil:
			writeError(w, http.StatusUnauthorized, "%v", err)
			return
		case c == nil && !a.auth.ReadsOpen():
			writeError(w, http.StatusUnauthorized, "a bearer token is required%s", cookieOnly(r))
			return
		}
		h(w, r.WithContext(auth.WithCaller(r.Context(), c)))
	}
}

// cookieOnly explains a refusal of a request that came with a console
// session cookie: the cookie is half of the session.
func cookieOnly(r *http.Request) string {
	if _, err := r.Cookie(auth.SessionCookie); err != nil {
		return ""
	}
	return " (a console session's cookie is not enough: the console's script sends the session's key in " + auth.KeyHeader + "; log in again if it has none)"
}

// write guards a write endpoint: a token of the write role, from a page of
// no other origin. A console session is a caller only with its key, in a
// header that a page of another origin can neither know nor send: that
// is the proof that the write comes from the console's own script.
func (a *api) write(h http.HandlerFunc) http.HandlerFunc { return a.guard(auth.RoleWrite, h) }

// define guards a definition endpoint (docs/applied.md) as write guards a
// write endpoint, with the define role: a write token cannot define jobs,
// and a define token cannot trigger, kill, disable or remove.
func (a *api) define(h http.HandlerFunc) http.HandlerFunc { return a.guard(auth.RoleDefine, h) }

func (a *api) guard(role string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if auth.CrossOrigin(r) {
			writeError(w, http.StatusForbidden, "cross-origin request refused: a web page of %s may not change this cluster", r.Header.Get("Origin"))
			return
		}
		switch {
		case role == auth.RoleWrite && !a.auth.Writable():
			writeError(w, http.StatusForbidden, "write endpoints are disabled: this instance has no write token (--api-token-file); the CLI (shardd trigger, kill, disable, enable, remove) works through etcd")
			return
		case role == auth.RoleDefine && !a.auth.Definable():
			writeError(w, http.StatusForbidden, "definition endpoints are disabled: this instance has no define token (--api-token-file); the CLI (shardd apply, delete, rollback) works through etcd")
			return
		}
		c, err := a.auth.Identify(r)
		switch {
		case err != nil:
			writeError(w, http.StatusUnauthorized, "%v", err)
		case c == nil:
			writeError(w, http.StatusUnauthorized, "a bearer token is required%s", cookieOnly(r))
		case c.Token.Role == auth.RoleRead:
			// Said in this instance's log, not in the audit log in etcd:
			// a reader must not be able to flush that log with refusals.
			a.o.Logger.Warn("write refused: the token has the read role", "token", c.Token.Name, "action", actionOf(r),
				"path", oneLine(r.URL.Path, 300), "remote", r.RemoteAddr)
			writeError(w, http.StatusForbidden, "token %q has the read role: it cannot change anything", c.Token.Name)
		case c.Token.Role != role:
			// A token with the other right tried this one: audited (its
			// holder can write to the audit log anyway), and refused.
			msg := fmt.Sprintf("token %q has the %s role: %s", c.Token.Name, c.Token.Role, map[string]string{
				auth.RoleDefine: "defining, deleting or rolling back jobs needs the define role",
				auth.RoleWrite:  "trigger, kill, disable, enable and remove need the write role",
			}[role])
			rc := r.WithContext(auth.WithCaller(r.Context(), c))
			a.record(rc, keyspace.AuditEntry{Action: actionOf(r), Job: r.PathValue("job"), Target: "job " + r.PathValue("job")}, admin.Refusal(msg))
			writeError(w, http.StatusForbidden, "%s", msg)
		default:
			h(w, r.WithContext(auth.WithCaller(r.Context(), c)))
		}
	}
}

// oneLine makes s one printable line of at most n bytes, for a log.
func oneLine(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return '?'
		}
		return r
	}, s)
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "") + "..."
	}
	return s
}

// actionOf names the write action of r for the audit log: the last
// segment of its path (trigger, kill, disable, enable), or remove.
func actionOf(r *http.Request) string {
	definition := strings.HasPrefix(r.URL.Path, "/api/v1/definitions/")
	switch {
	case definition && r.Method == http.MethodDelete:
		return "delete"
	case definition && r.Method == http.MethodPut:
		return "apply"
	case r.Method == http.MethodDelete:
		return "remove"
	}
	return r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
}

// record appends a write action to the audit log (and the instance's
// log) with its outcome.
func (a *api) record(r *http.Request, e keyspace.AuditEntry, err error) {
	e.Actor, e.Outcome = auth.CallerOf(r.Context()).Actor(), admin.AuditOutcome(err)
	if err != nil {
		e.Message = err.Error()
	} else if a.o.OnWrite != nil {
		a.o.OnWrite()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), a.o.Timeout)
	defer cancel()
	e, err = a.o.Admin.RecordAudit(ctx, e)
	attrs := []any{"actor", e.Actor, "action", e.Action, "target", e.Target, "detail", e.Detail, "outcome", e.Outcome, "message", e.Message}
	if err != nil {
		a.o.Logger.Error("audit entry not recorded in etcd", append(attrs, "err", err)...)
		return
	}
	a.o.Logger.Info("audit", attrs...)
}

// readyz says whether the instance can work: 200 while it holds an etcd
// session and etcd takes its writes, 503 otherwise (etcd went back in time,
// its NOSPACE alarm). A failed reload does not make it unready (the last
// good configuration keeps running) but is always said, whatever the
// status. It is open to anyone, so it quotes nothing of the configuration: a problem's message quotes the
// field's value (a webhook URL and its secret path, a wrong-typed value),
// and file names say where the jobs are. It counts the problems of a
// failed reload and names the jobs they are in; /api/v1/config/problems,
// a read endpoint, lists them.
func (a *api) readyz(w http.ResponseWriter, r *http.Request) {
	var reload error
	if a.o.ConfigError != nil {
		reload = a.o.ConfigError()
	}
	note := ""
	if reload != nil {
		note = "; degraded: the last configuration reload was rejected, the previous configuration runs: " + ProblemCount(reload) + "; GET /api/v1/config/problems lists them"
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := a.o.Instance.Impaired(); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: %v%s\n", err, note)
		return
	}
	if !a.o.Instance.Up() {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: no etcd session%s\n", note)
		return
	}
	fmt.Fprintf(w, "ok%s\n", note)
}

// ProblemCount says how many problems err holds and how many are in each
// job, naming a job only by a valid name (an invalid one is text of the
// file like any other): "3 problems (job billing: 2; 1 elsewhere)".
func ProblemCount(err error) string {
	all := config.Errors(err)
	byJob := map[string]int{}
	var jobs []string
	elsewhere := 0
	for _, p := range all {
		var ce *config.Error
		name := ""
		if errors.As(p, &ce) {
			name, _ = strconv.Unquote(ce.Job) // "#2" (no name yet) fails: elsewhere
		}
		if name == "" || config.CheckName(name) != nil {
			elsewhere++
			continue
		}
		if byJob[name] == 0 {
			jobs = append(jobs, name)
		}
		byJob[name]++
	}
	var parts []string
	for _, j := range jobs {
		parts = append(parts, fmt.Sprintf("job %s: %d", j, byJob[j]))
	}
	if elsewhere > 0 {
		if len(jobs) == 0 {
			parts = append(parts, fmt.Sprintf("%d outside any named job", elsewhere))
		} else {
			parts = append(parts, fmt.Sprintf("%d elsewhere", elsewhere))
		}
	}
	s := "1 problem"
	if len(all) != 1 {
		s = fmt.Sprintf("%d problems", len(all))
	}
	return s + " (" + strings.Join(parts, "; ") + ")"
}

// configProblems is what /api/v1/config/problems answers.
type configProblems struct {
	// ReloadFailed says the last reload was rejected: the previous
	// configuration runs.
	ReloadFailed bool            `json:"reloadFailed"`
	Problems     []configProblem `json:"problems"`
}

// configProblem is one problem of a rejected configuration: File, Line and
// Job when it has them (a job without a name yet is "#N", its place in the
// file's list), and Message, the problem itself (Error of the whole, for
// a problem that is not one of a file's).
type configProblem struct {
	File    string `json:"file,omitempty"`
	Line    int    `json:"line,omitempty"`
	Job     string `json:"job,omitempty"`
	Message string `json:"message"`
}

// problems lists the last reload's problems, as the log does.
func (a *api) problems(w http.ResponseWriter, r *http.Request) {
	var reload error
	if a.o.ConfigError != nil {
		reload = a.o.ConfigError()
	}
	out := configProblems{ReloadFailed: reload != nil, Problems: []configProblem{}}
	for _, p := range config.Errors(reload) {
		var ce *config.Error
		if !errors.As(p, &ce) {
			out.Problems = append(out.Problems, configProblem{Message: p.Error()})
			continue
		}
		job := ce.Job
		if name, err := strconv.Unquote(job); err == nil {
			job = name
		}
		out.Problems = append(out.Problems, configProblem{File: ce.File, Line: ce.Line, Job: job, Message: ce.Msg})
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), a.o.Timeout)
}

func (a *api) status(w http.ResponseWriter, r *http.Request) (*admin.ClusterStatus, bool) {
	ctx, cancel := a.ctx(r)
	defer cancel()
	st, err := a.o.Admin.Status(ctx)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "read cluster state from etcd: %v", err)
		return nil, false
	}
	return st, true
}

// jobOut is a job as the API shows it.
type jobOut struct {
	admin.JobStatus
	// Local is this instance's view, when it defines the job.
	Local *localView `json:"local,omitempty"`
}

type localView struct {
	Instance string `json:"instance"`
	Items    []int  `json:"items"`
	Leading  bool   `json:"leading"`
	Epoch    int64  `json:"epoch"`
	// Conflict: this instance's definition differs from the registered one.
	Conflict bool `json:"conflict"`
}

func (a *api) local(job string) *localView {
	v, ok := a.o.Instance.View(job)
	if !ok {
		return nil
	}
	lv := &localView{Instance: a.o.Instance.ID(), Items: []int{}, Leading: v.Leading, Conflict: v.Conflict}
	if v.Map != nil {
		lv.Epoch = v.Map.Epoch
		if items := v.Map.ItemsOf(a.o.Instance.ID()); items != nil {
			lv.Items = items
		}
	}
	return lv
}

func (a *api) jobs(w http.ResponseWriter, r *http.Request) {
	st, ok := a.status(w, r)
	if !ok {
		return
	}
	out := make([]jobOut, 0, len(st.Jobs))
	for _, j := range st.Jobs {
		out = append(out, jobOut{JobStatus: j, Local: a.local(j.Name)})
	}
	writeJSON(w, http.StatusOK, out)
}

// jobName returns the {job} path value, or writes an error.
func jobName(w http.ResponseWriter, r *http.Request) (string, bool) {
	job := r.PathValue("job")
	if err := config.CheckName(job); err != nil {
		writeError(w, http.StatusBadRequest, "job name %v", err)
		return "", false
	}
	return job, true
}

func (a *api) job(w http.ResponseWriter, r *http.Request) {
	name, ok := jobName(w, r)
	if !ok {
		return
	}
	st, ok := a.status(w, r)
	if !ok {
		return
	}
	for _, j := range st.Jobs {
		if j.Name == name {
			writeJSON(w, http.StatusOK, jobOut{JobStatus: j, Local: a.local(name)})
			return
		}
	}
	writeError(w, http.StatusNotFound, "no job %q in the cluster", name)
}

func (a *api) history(w http.ResponseWriter, r *http.Request) {
	name, item, ok := jobAndItem(w, r)
	if !ok {
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	recs, err := a.o.Admin.History(ctx, name, item)
	if err != nil {
		writeError(w, opStatus(err), "%v", err)
		return
	}
	if recs == nil {
		recs = []keyspace.ItemRecord{}
	}
	writeJSON(w, http.StatusOK, recs)
}

func (a *api) instances(w http.ResponseWriter, r *http.Request) {
	if st, ok := a.status(w, r); ok {
		writeJSON(w, http.StatusOK, st.Instances)
	}
}

// itemParam reads ?item=N; -1 when absent.
func itemParam(w http.ResponseWriter, r *http.Request) (int, bool) {
	s := r.URL.Query().Get("item")
	if s == "" {
		return -1, true
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		writeError(w, http.StatusBadRequest, "item must be a non-negative integer, got %q", s)
		return 0, false
	}
	return n, true
}

// jobAndItem reads the job of the path and the optional ?item= of a write
// endpoint (item -1 when absent); on a bad value it has written the error.
func jobAndItem(w http.ResponseWriter, r *http.Request) (string, int, bool) {
	name, ok := jobName(w, r)
	if !ok {
		return "", 0, false
	}
	item, ok := itemParam(w, r)
	return name, item, ok
}

// triggerBody is a trigger's optional JSON body; the query's item, param
// and fire work too.
type triggerBody struct {
	Item      *int   `json:"item"`
	Param     string `json:"param"`
	Fire      string `json:"fire"`
	Propagate *bool  `json:"propagate"`
}

func (a *api) trigger(w http.ResponseWriter, r *http.Request) {
	name, item, ok := jobAndItem(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	req := admin.TriggerRequest{Job: name, Param: q.Get("param"), Fire: q.Get("fire"), By: auth.CallerOf(r.Context()).Actor()}
	switch q.Get("propagate") {
	case "", "true", "1":
	case "false", "0":
		req.NoPropagate = true
	default:
		writeError(w, http.StatusBadRequest, "propagate must be true or false, got %q", q.Get("propagate"))
		return
	}
	if strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
		var b triggerBody
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 2*admin.MaxTriggerParam))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&b); err != nil {
			writeError(w, http.StatusBadRequest, "trigger body: %v (want {\"item\": N, \"param\": \"...\", \"fire\": \"RFC 3339\", \"propagate\": false}, every field optional)", err)
			return
		}
		if b.Item != nil {
			if *b.Item < 0 {
				writeError(w, http.StatusBadRequest, "item must be a non-negative integer, got %d", *b.Item)
				return
			}
			item = *b.Item
		}
		if b.Param != "" {
			req.Param = b.Param
		}
		if b.Fire != "" {
			req.Fire = b.Fire
		}
		if b.Propagate != nil {
			req.NoPropagate = !*b.Propagate
		}
	}
	if item >= 0 {
		req.Items = []int{item}
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	tr, err := a.o.Admin.Trigger(ctx, req)
	a.record(r, keyspace.AuditEntry{Action: "trigger", Job: name, Target: admin.Target{Job: name, Item: item}.String(), Detail: req.Detail()}, err)
	if err != nil {
		writeError(w, opStatus(err), "%v", err)
		return
	}
	writeJSON(w, http.StatusAccepted, tr)
}

// maxKillWait bounds a kill's wait: the answer must be written within the
// server's 30 s write timeout.
const maxKillWait = 20 * time.Second

// killOut is a kill's answer: what was asked to stop and, when the
// request waited, how each run ended.
type killOut struct {
	admin.Killing
	Results []admin.KillResult `json:"results,omitempty"`
	Message string             `json:"message"`
}

func (a *api) kill(w http.ResponseWriter, r *http.Request) {
	name, item, ok := jobAndItem(w, r)
	if !ok {
		return
	}
	var wait time.Duration
	if s := r.URL.Query().Get("wait"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 || d > maxKillWait {
			writeError(w, http.StatusBadRequest, "wait must be a duration from 0 to %s, got %q", maxKillWait, s)
			return
		}
		wait = d
	}
	q := r.URL.Query()
	req := admin.KillRequest{Job: name, Instance: q.Get("instance"), By: auth.CallerOf(r.Context()).Actor()}
	if item >= 0 {
		req.Items = []int{item}
	}
	if s := q.Get("fence"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			writeError(w, http.StatusBadRequest, "fence must be a positive integer (the fence of the run to kill), got %q", s)
			return
		}
		req.Fence = n
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	k, err := a.o.Admin.Kill(ctx, req)
	target := admin.Target{Job: name, Item: item}.String()
	var detail string
	if req.Fence != 0 {
		detail = fmt.Sprintf("fence %d", req.Fence)
		if req.Instance != "" {
			detail += " on " + req.Instance
		}
	}
	if err != nil {
		a.record(r, keyspace.AuditEntry{Action: "kill", Job: name, Target: target, Detail: detail}, err)
		writeError(w, opStatus(err), "%v", err)
		return
	}
	runs := make([]string, len(k.Runs))
	for i, run := range k.Runs {
		runs[i] = fmt.Sprintf("item %d (fence %d on %s)", run.Item, run.Fence, run.Instance)
	}
	out := killOut{Killing: k, Message: "asked to kill " + strings.Join(runs, ", ") + " of job " + name}
	a.record(r, keyspace.AuditEntry{Action: "kill", Job: name, Target: target, Detail: detail, Message: out.Message}, nil)
	if wait > 0 {
		wctx, wcancel := context.WithTimeout(r.Context(), wait)
		out.Results, _ = a.o.Admin.WaitKill(wctx, name, k.Kill)
		wcancel()
	}
	writeJSON(w, http.StatusAccepted, out)
}

func (a *api) audit(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := admin.AuditFilter{Job: q.Get("job"), Actor: q.Get("actor"), Limit: 100}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			writeError(w, http.StatusBadRequest, "limit must be a positive integer, got %q", s)
			return
		}
		f.Limit = n
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	entries, err := a.o.Admin.Audit(ctx, f)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, entries)
}

func (a *api) remove(w http.ResponseWriter, r *http.Request) {
	name, ok := jobName(w, r)
	if !ok {
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	n, err := a.o.Admin.Remove(ctx, name)
	a.record(r, keyspace.AuditEntry{Action: "remove", Job: name, Target: "job " + name}, err)
	if err != nil {
		writeError(w, opStatus(err), "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"job": name, "removed": true, "keysDeleted": n})
}

func (a *api) disable(on bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		name, item, ok := jobAndItem(w, r)
		if !ok {
			return
		}
		instance := r.URL.Query().Get("instance")
		var force bool
		if f := r.URL.Query().Get("force"); f != "" {
			var err error
			if force, err = strconv.ParseBool(f); err != nil {
				writeError(w, http.StatusBadRequest, "force must be true or false, got %q", f)
				return
			}
		}
		ctx, cancel := a.ctx(r)
		defer cancel()
		t := admin.Target{Job: name, Item: item, Instance: instance}
		res, err := a.o.Admin.SetDisabled(ctx, t, on, force)
		action := "enable"
		if on {
			action = "disable"
		}
		detail := ""
		if force {
			detail = "force"
		}
		a.record(r, keyspace.AuditEntry{Action: action, Job: name, Target: t.String(), Detail: detail, Message: res.Message}, err)
		if err != nil {
			writeError(w, opStatus(err), "%v", err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"job": name, "item": item, "instance": instance, "disabled": res.Disabled, "changed": res.Changed, "message": res.Message})
	}
}
