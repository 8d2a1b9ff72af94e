// Package api serves shardd's HTTP endpoints: health, readiness, metrics and
// the JSON API over the cluster's jobs and instances.
//
//	GET  /healthz                          the process is alive
//	GET  /readyz                           the instance holds an etcd session and a valid config
//	GET  /metrics                          Prometheus metrics
//	GET  /api/v1/jobs                      every job: status, leader, epoch, items
//	GET  /api/v1/jobs/{job}                one job, with this instance's view of it
//	GET  /api/v1/jobs/{job}/history        recent executions (?item=N for one item)
//	GET  /api/v1/instances                 live instances
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
// (either token reads). /healthz, /readyz and /metrics need no token.
package api

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
)

// Cluster is what the API reads and changes; *coord.Node implements it.
type Cluster interface {
	ID() string
	Up() bool
	View(job string) (coord.JobView, bool)
	Status(ctx context.Context) (*coord.ClusterStatus, error)
	JobHistory(ctx context.Context, job string, item int) ([]coord.ItemRecord, error)
	Trigger(ctx context.Context, job string, items []int) (coord.Triggered, error)
	SetDisabled(ctx context.Context, t coord.Target, on, force bool) (coord.Disabling, error)
	Remove(ctx context.Context, job string) (int64, error)
}

// Options configure the handler.
type Options struct {
	Cluster Cluster
	// Metrics serves /metrics (nil: 404).
	Metrics http.Handler
	// ConfigError returns the last configuration reload's error, nil if it succeeded.
	ConfigError func() error
	// WriteToken and ReadToken are the bearer tokens; empty means none.
	WriteToken, ReadToken string
	// Loopback says the server listens on loopback addresses only: then a
	// request whose Host is not a loopback address or localhost is refused,
	// so that a web page cannot reach the API by rebinding its own name to
	// 127.0.0.1 (DNS rebinding).
	Loopback bool
	// Timeout bounds the etcd reads and writes of one request; default 5s.
	Timeout time.Duration
}

// Handler returns the HTTP handler.
func Handler(o Options) http.Handler {
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	a := &api{o: o}
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
		{"POST", "/api/v1/jobs/{job}/trigger", a.write(a.trigger)},
		{"POST", "/api/v1/jobs/{job}/disable", a.write(a.disable(true))},
		{"POST", "/api/v1/jobs/{job}/enable", a.write(a.disable(false))},
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
	if !o.Loopback {
		return mux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host) {
			writeError(w, http.StatusMisdirectedRequest, "host %q: this server answers only to a loopback address or localhost", r.Host)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// loopbackHost reports whether a Host header names this host's loopback.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if ip := net.ParseIP(host); ip != nil {
		return ip.IsLoopback()
	}
	return strings.EqualFold(host, "localhost")
}

// crossOrigin reports whether r comes from a web page of another origin
// than the API's own: browsers send Origin on such requests.
func crossOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	return err != nil || !strings.EqualFold(u.Host, r.Host)
}

// opStatus is the HTTP status of an error of the coord operator commands.
func opStatus(err error) int {
	switch {
	case errors.Is(err, coord.ErrUnknownJob):
		return http.StatusNotFound
	case errors.Is(err, coord.ErrBadTarget):
		return http.StatusBadRequest
	case errors.Is(err, coord.ErrRefused):
		return http.StatusConflict
	}
	return http.StatusServiceUnavailable
}

type api struct{ o Options }

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

// bearer returns the request's bearer token, "" if none.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if t, ok := strings.CutPrefix(h, "Bearer "); ok {
		return strings.TrimSpace(t)
	}
	return ""
}

func tokenIs(got, want string) bool {
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// read guards a read endpoint.
func (a *api) read(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.o.ReadToken != "" {
			t := bearer(r)
			if t == "" {
				writeError(w, http.StatusUnauthorized, "a bearer token is required")
				return
			}
			if !tokenIs(t, a.o.ReadToken) && !tokenIs(t, a.o.WriteToken) {
				writeError(w, http.StatusUnauthorized, "invalid token")
				return
			}
		}
		h(w, r)
	}
}

// write guards a write endpoint.
func (a *api) write(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if crossOrigin(r) {
			writeError(w, http.StatusForbidden, "cross-origin request refused: a web page of %s may not change this cluster", r.Header.Get("Origin"))
			return
		}
		if a.o.WriteToken == "" {
			writeError(w, http.StatusForbidden, "write endpoints are disabled: this instance has no write token (--api-token-file); the CLI (shardd trigger, disable, enable, remove) works through etcd")
			return
		}
		t := bearer(r)
		switch {
		case t == "":
			writeError(w, http.StatusUnauthorized, "a bearer token is required")
		case tokenIs(t, a.o.WriteToken):
			h(w, r)
		case tokenIs(t, a.o.ReadToken):
			writeError(w, http.StatusForbidden, "the read-only token cannot change anything")
		default:
			writeError(w, http.StatusUnauthorized, "invalid token")
		}
	}
}

// readyz is 200 while the instance holds an etcd session, 503 otherwise.
// A failed reload does not make it unready (the last good configuration
// keeps running) but is always said, whatever the status.
func (a *api) readyz(w http.ResponseWriter, r *http.Request) {
	var reload error
	if a.o.ConfigError != nil {
		reload = a.o.ConfigError()
	}
	note := ""
	if reload != nil {
		note = fmt.Sprintf("; the last configuration reload failed, the previous configuration runs: %v", reload)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !a.o.Cluster.Up() {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: no etcd session%s\n", note)
		return
	}
	fmt.Fprintf(w, "ok%s\n", note)
}

func (a *api) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), a.o.Timeout)
}

func (a *api) status(w http.ResponseWriter, r *http.Request) (*coord.ClusterStatus, bool) {
	ctx, cancel := a.ctx(r)
	defer cancel()
	st, err := a.o.Cluster.Status(ctx)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "read cluster state from etcd: %v", err)
		return nil, false
	}
	return st, true
}

// jobOut is a job as the API shows it.
type jobOut struct {
	coord.JobStatus
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
	v, ok := a.o.Cluster.View(job)
	if !ok {
		return nil
	}
	lv := &localView{Instance: a.o.Cluster.ID(), Items: []int{}, Leading: v.Leading, Conflict: v.Conflict}
	if v.Map != nil {
		lv.Epoch = v.Map.Epoch
		if items := v.Map.ItemsOf(a.o.Cluster.ID()); items != nil {
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
	recs, err := a.o.Cluster.JobHistory(ctx, name, item)
	if err != nil {
		writeError(w, opStatus(err), "%v", err)
		return
	}
	if recs == nil {
		recs = []coord.ItemRecord{}
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

func (a *api) trigger(w http.ResponseWriter, r *http.Request) {
	name, item, ok := jobAndItem(w, r)
	if !ok {
		return
	}
	var items []int
	if item >= 0 {
		items = []int{item}
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	tr, err := a.o.Cluster.Trigger(ctx, name, items)
	if err != nil {
		writeError(w, opStatus(err), "%v", err)
		return
	}
	writeJSON(w, http.StatusAccepted, tr)
}

func (a *api) remove(w http.ResponseWriter, r *http.Request) {
	name, ok := jobName(w, r)
	if !ok {
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	n, err := a.o.Cluster.Remove(ctx, name)
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
		res, err := a.o.Cluster.SetDisabled(ctx, coord.Target{Job: name, Item: item, Instance: instance}, on, force)
		if err != nil {
			writeError(w, opStatus(err), "%v", err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"job": name, "item": item, "instance": instance, "disabled": res.Disabled, "changed": res.Changed, "message": res.Message})
	}
}
