package api

// GET /api/v1/jobs/{job}/runs/{run}/log serves a run's log (see the
// package doc), from this instance's run logs, or through the API of the
// instance that ran it.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runlog"
	"github.com/shardd/shardd/pkg/trust"
)

// Headers of the run log endpoint.
const (
	// ServedByHeader names the instance that answered: the one whose run
	// log it is, when the answer went through a proxy.
	ServedByHeader = "X-Shardd-Served-By"
	// HopHeader marks a request one instance proxied to another (its value:
	// the proxying instance): it is never proxied again, so that instances
	// whose records disagree cannot bounce a request between them.
	HopHeader = "X-Shardd-Hop"
	// WritingHeader says whether the run's log was being written when the
	// answer began ("true": the run goes on; follow=1 streams the rest).
	WritingHeader = "X-Shardd-Log-Writing"
	// RunHeader names the run served, FENCE-ITEM.
	RunHeader = "X-Shardd-Run"
	// StoppedHeader says why the log stopped early, when it ran out of
	// space and the record saying so is not in its file (runlog
	// Reader.Stopped): while the run goes on, and after it while its
	// closing records wait in the instance's memory for room. A header
	// when that is known as the answer begins; otherwise, of an answer that
	// follows the log (follow=1), a trailer.
	StoppedHeader = "X-Shardd-Log-Stopped"
)

// RunLogs serve run logs.
type RunLogs struct {
	// Store is this instance's run logs; nil when it keeps none.
	Store *runlog.Store
	// Runs finds which instance ran a run, and that instance's API, for
	// a log that is not here; nil: only this instance's logs are served.
	Runs RunFinder
	// Transport reaches the other instances' APIs; nil: one with the
	// system's roots and no client certificate. An API over TLS needs its
	// certificate's CA among the roots (shardd run --api-ca).
	Transport http.RoundTripper
	// WaitForLog bounds how long a request for a run this instance has
	// just claimed waits for its log to be created; default 3s.
	WaitForLog time.Duration
	// Host is this instance's host name (as registered): an instance of
	// another host whose API listens on loopback cannot be reached from
	// here. Empty: not checked.
	Host string
}

// RunFinder finds runs in the cluster; *admin.Client implements it.
type RunFinder interface {
	FindRuns(ctx context.Context, job string, item int, fence int64) ([]keyspace.ItemRecord, error)
	Instance(ctx context.Context, id string) (keyspace.InstanceInfo, bool, error)
}

// defaultProxy is the transport of RunLogs without one.
var defaultProxy = func() http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.ResponseHeaderTimeout = 10 * time.Second
	return t
}()

// answerWriteTimeout bounds each write of a log's answer: a client that
// stops reading is dropped after it, however long a followed run lasts.
const answerWriteTimeout = 30 * time.Second

// logQuery is what a run log request asks for.
type logQuery struct {
	follow bool
	json   bool
	stream string // "", stdout or stderr
}

func parseLogQuery(w http.ResponseWriter, r *http.Request) (logQuery, bool) {
	var q logQuery
	v := r.URL.Query()
	if f := v.Get("follow"); f != "" {
		var err error
		if q.follow, err = strconv.ParseBool(f); err != nil {
			writeError(w, http.StatusBadRequest, "follow must be 1 or 0 (true or false), got %q", f)
			return q, false
		}
	}
	switch f := v.Get("format"); f {
	case "", "text":
	case "json":
		q.json = true
	default:
		writeError(w, http.StatusBadRequest, "format must be text (the records as stored) or json (one JSON object per record), got %q", f)
		return q, false
	}
	switch s := v.Get("stream"); s {
	case "", "stdout", "stderr":
		q.stream = s
	default:
		writeError(w, http.StatusBadRequest, "stream must be stdout or stderr (default: every record, shardd's own included), got %q", s)
		return q, false
	}
	return q, true
}

// runLog serves GET /api/v1/jobs/{job}/runs/{run}/log: from this
// instance's run logs when it has the run's log, else from the instance
// that etcd's history says ran it.
func (a *api) runLog(w http.ResponseWriter, r *http.Request) {
	self := a.o.Instance.ID()
	w.Header().Set(ServedByHeader, self)
	job, ok := jobName(w, r)
	if !ok {
		return
	}
	name := r.PathValue("run")
	fence, item, ok := runlog.ParseRun(name)
	if !ok {
		writeError(w, http.StatusBadRequest, "run %q: a run is FENCE-ITEM, or FENCE when one item ran under that fence (the FENCE and ITEM columns of `shardd history %s`)", name, job)
		return
	}
	q, ok := parseLogQuery(w, r)
	if !ok {
		return
	}
	rl := a.o.RunLogs
	if rl == nil {
		rl = &RunLogs{}
	}
	if a.serveLocalLog(w, r, rl, job, fence, item, q) {
		return
	}
	rec, ok := a.recordedRun(w, r, rl, job, name, fence, item)
	if !ok {
		return
	}
	a.serveRecordedLog(w, r, rl, job, rec, q)
}

// serveLocalLog serves the log of the run (fence, item; item < 0: the one
// item of fence) when this instance has it, and reports whether it
// answered.
func (a *api) serveLocalLog(w http.ResponseWriter, r *http.Request, rl *RunLogs, job string, fence int64, item int, q logQuery) bool {
	if rl.Store == nil {
		return false
	}
	if item >= 0 {
		return a.serveLog(w, r, rl, job, runlog.RunID{Fence: fence, Item: int32(item)}, q, false)
	}
	// FENCE alone: of which items is there a log here?
	ids, err := rl.Store.Runs(job, fence)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "%v", err)
		return true
	}
	switch {
	case len(ids) == 1:
		a.serveLog(w, r, rl, job, ids[0], q, true)
		return true
	case len(ids) > 1:
		items := make([]int, len(ids))
		for i, id := range ids {
			items[i] = int(id.Item)
		}
		sharedFence(w, job, fence, items)
		return true
	}
	return false
}

// recordedRun finds in etcd's history the run a request names, of a log
// this instance does not have; when it answered the request instead (no
// such run, a fence shared by items, nobody to ask), ok is false.
func (a *api) recordedRun(w http.ResponseWriter, r *http.Request, rl *RunLogs, job, name string, fence int64, item int) (rec keyspace.ItemRecord, ok bool) {
	self := a.o.Instance.ID()
	what := fmt.Sprintf("run %s of job %q", name, job)
	if from := r.Header.Get(HopHeader); from != "" {
		writeError(w, http.StatusNotFound, "%s has no log on instance %s (asked by instance %s, whose records say %s ran it; not asked further); `shardd history %s` lists the job's runs",
			what, self, from, self, job)
		return rec, false
	}
	if rl.Runs == nil {
		writeError(w, http.StatusNotFound, "%s has no log on instance %s, which does not look for it elsewhere; `shardd history %s` names the instance that ran it", what, self, job)
		return rec, false
	}
	ctx, cancel := a.ctx(r)
	recs, err := rl.Runs.FindRuns(ctx, job, item, fence)
	cancel()
	if err != nil {
		writeError(w, opStatus(err), "%v", err)
		return rec, false
	}
	if len(recs) == 0 {
		writeError(w, http.StatusNotFound, "job %q has no run %s: no log of it on instance %s, and etcd's history (the last %d runs of each item) does not have it; `shardd history %s` lists the job's recent runs (columns FENCE and ITEM), and an older run's log stays on the instance that ran it",
			job, name, self, keyspace.HistoryPerItem, job)
		return rec, false
	}
	if item < 0 {
		var items []int
		for _, rec := range recs {
			if !slices.Contains(items, rec.Item) {
				items = append(items, rec.Item)
			}
		}
		if len(items) > 1 {
			slices.Sort(items)
			sharedFence(w, job, fence, items)
			return rec, false
		}
	}
	return recs[0], true
}

// serveRecordedLog serves the log of the run rec records: this instance's
// own (being created, or gone), or the log the instance that ran it
// serves, proxied once; or says where the log is when no API here can
// reach it.
func (a *api) serveRecordedLog(w http.ResponseWriter, r *http.Request, rl *RunLogs, job string, rec keyspace.ItemRecord, q logQuery) {
	self := a.o.Instance.ID()
	id := runlog.RunID{Fence: rec.Fence, Item: int32(rec.Item)}
	if rec.Instance == self {
		// Claimed here a moment ago: its log is being created.
		if rl.Store != nil && rec.State == keyspace.StateRunning && a.waitForLog(r.Context(), rl, job, id) {
			a.serveLog(w, r, rl, job, id, q, true)
			return
		}
		where := "run logs are off here (--run-log-dir none)"
		if rl.Store != nil {
			where = "not in " + rl.Store.Dir() + ": removed by retention (the job's logRetention), not created (this instance's log says why), or run logs were off or elsewhere (--run-log-dir) when it ran"
		}
		writeError(w, http.StatusNotFound, "run %s of job %q ran on this instance (%s), but its log is gone: %s", id, job, self, where)
		return
	}
	ctx, cancel := a.ctx(r)
	info, live, err := rl.Runs.Instance(ctx, rec.Instance)
	cancel()
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "run %s of job %q ran on instance %s: %v", id, job, rec.Instance, err)
		return
	}
	file := fmt.Sprintf("%s/%s.log in the run log directory of instance %s (by default runs/%s in its --data-dir)", job, id, rec.Instance, rec.Instance)
	if !live {
		writeError(w, http.StatusNotFound, "run %s of job %q ran on instance %s, which is not live now (not registered in etcd), so no API serves its log: it is on that instance's host (an instance's id is its host name unless --name chose another), %s",
			id, job, rec.Instance, file)
		return
	}
	if info.API == "" {
		writeError(w, http.StatusBadGateway, "run %s of job %q ran on instance %s (host %s), which serves no API (--listen \"\"): its log is on host %s, %s",
			id, job, info.ID, info.Host, info.Host, file)
		return
	}
	if LoopbackOfAnotherHost(info, rl.Host) {
		writeError(w, http.StatusBadGateway, "run %s of job %q ran on instance %s (host %s), whose API listens on %s, a loopback address that only host %s reaches: its log is on host %s, %s (ask that host's API, or give instance %s a --listen address beyond loopback, with --tls-cert)",
			id, job, info.ID, info.Host, info.API, info.Host, info.Host, file, info.ID)
		return
	}
	a.proxyLog(w, r, rl, info, fmt.Sprintf("run %s of job %q", id, job), file)
}

// LoopbackOfAnotherHost reports whether an instance's API listens on a
// loopback address of a host other than host (the asker's): then the asker
// cannot reach it. An empty host is not checked.
func LoopbackOfAnotherHost(info keyspace.InstanceInfo, host string) bool {
	h, _, err := net.SplitHostPort(info.API)
	if err != nil || host == "" || info.Host == "" || strings.EqualFold(info.Host, host) {
		return false
	}
	ip := net.ParseIP(h)
	return strings.EqualFold(h, "localhost") || (ip != nil && ip.IsLoopback())
}

// APIHost is where an instance's API is reached (host:port): its
// registered address, with its host name for an unspecified address
// (0.0.0.0, [::]).
func APIHost(info keyspace.InstanceInfo) string { return apiHost(info) }

// sharedFence answers a request for FENCE that names several runs.
func sharedFence(w http.ResponseWriter, job string, fence int64, items []int) {
	names := make([]string, len(items))
	for i, it := range items {
		names[i] = fmt.Sprintf("%d-%d", fence, it)
	}
	writeError(w, http.StatusBadRequest, "fence %d of job %q is the claim of items %s together: ask for one run, %s",
		fence, job, itemList(items), strings.Join(names, ", "))
}

func itemList(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

// waitForLog waits, for at most rl.WaitForLog, for the log of run id to
// be created here.
func (a *api) waitForLog(ctx context.Context, rl *RunLogs, job string, id runlog.RunID) bool {
	wait := rl.WaitForLog
	if wait <= 0 {
		wait = 3 * time.Second
	}
	deadline := time.Now().Add(wait)
	for {
		if rl.Store.Has(job, id) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// recordOut is a record in format=json.
type recordOut struct {
	Time   time.Time `json:"time"`
	Tag    string    `json:"tag"`
	Stream string    `json:"stream"`
	Text   string    `json:"text"`
}

// serveLog answers with this instance's log of run id, and reports
// whether it answered: when this instance has no such log, only if seen
// (the log was seen a moment ago: then retention removed it). Only a log
// the store vouches for is served (runlog Store.Open: reached without
// following a link, this user's, beginning with that run's header); a file
// it refuses is not, and the answer says why.
func (a *api) serveLog(w http.ResponseWriter, r *http.Request, rl *RunLogs, job string, id runlog.RunID, q logQuery, seen bool) bool {
	rd, err := rl.Store.Open(job, id)
	switch {
	case errors.Is(err, runlog.ErrNoLog) && !seen:
		return false
	case errors.Is(err, runlog.ErrNoLog):
		writeError(w, http.StatusNotFound, "run %s of job %q: its log was removed a moment ago (retention)", id, job)
		return true
	case errors.Is(err, trust.ErrNotTrusted):
		a.o.Logger.Warn("run log refused", "job", job, "run", id.String(), "err", err)
		writeError(w, http.StatusInternalServerError, "run %s of job %q: its log on instance %s is not served: %v", id, job, a.o.Instance.ID(), err)
		return true
	case err != nil:
		writeError(w, http.StatusInternalServerError, "%v", err)
		return true
	}
	defer rd.Close()
	h := w.Header()
	h.Set(RunHeader, id.String())
	h.Set(WritingHeader, strconv.FormatBool(rd.Writing()))
	stopped := rd.Stopped()
	if stopped != "" {
		h.Set(StoppedHeader, stopped)
	} else if q.follow {
		h.Set("Trailer", StoppedHeader)
	}
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	if q.json {
		h.Set("Content-Type", "application/x-ndjson")
	} else {
		h.Set("Content-Type", "text/plain; charset=utf-8")
	}
	rc := http.NewResponseController(w)
	next := rd.Next
	if q.follow {
		next = func() ([]byte, error) { return rd.Follow(r.Context()) }
	}
	// The server's write timeout would cut the answer of a run followed
	// (or a log sent) for longer: each write has answerWriteTimeout instead.
	rc.SetWriteDeadline(time.Now().Add(answerWriteTimeout))
	w.WriteHeader(http.StatusOK)
	rc.Flush() // a follower sees the answer begin before the next record
	bw := bufio.NewWriterSize(w, 32<<10)
	enc := json.NewEncoder(bw)
	flush := func() bool {
		rc.SetWriteDeadline(time.Now().Add(answerWriteTimeout))
		if bw.Flush() != nil {
			return false
		}
		return rc.Flush() == nil || !q.follow
	}
	for {
		if q.follow && !rd.Buffered() && bw.Buffered() > 0 && !flush() {
			return true // Follow may wait: what is read goes out first
		}
		line, err := next()
		if err != nil { // io.EOF: the end; else the client left, or a read failed mid-answer
			break
		}
		rec, perr := runlog.ParseRecord(line)
		if q.stream != "" && (perr != nil || runlog.Stream(rec.Tag) != q.stream) {
			continue
		}
		if bw.Available() < len(line)+1 {
			rc.SetWriteDeadline(time.Now().Add(answerWriteTimeout))
		}
		switch {
		case !q.json:
			bw.Write(line)
			bw.WriteByte('\n')
		case perr != nil:
			enc.Encode(map[string]string{"line": string(line), "error": perr.Error()})
		default:
			enc.Encode(recordOut{Time: rec.Time, Tag: rec.Tag, Stream: runlog.Stream(rec.Tag), Text: string(rec.Text)})
		}
	}
	flush()
	if why := rd.Stopped(); stopped == "" && q.follow && why != "" {
		h.Set(StoppedHeader, why) // the trailer
	}
	return true
}

// proxyLog answers with the answer of the instance that ran the run.
func (a *api) proxyLog(w http.ResponseWriter, r *http.Request, rl *RunLogs, info keyspace.InstanceInfo, what, file string) {
	scheme := "http"
	if info.APITLS {
		scheme = "https"
	}
	host := apiHost(info)
	target := &url.URL{Scheme: scheme, Host: host}
	transport := rl.Transport
	if transport == nil {
		transport = defaultProxy
	}
	self := a.o.Instance.ID()
	rc := http.NewResponseController(w) // each write its own deadline, as serveLog's
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target) // the Host header too: the other API may answer only to its own
			pr.Out.Header.Set(HopHeader, self)
			// A read token for the caller (authenticated here), never its
			// own header: a write token must not travel for a read. The
			// session's cookie and key are this instance's own.
			pr.Out.Header.Del("Cookie")
			pr.Out.Header.Del(auth.KeyHeader)
			pr.Out.Header.Del("Authorization")
			if secret := a.auth.ReadSecret(auth.CallerOf(pr.In.Context())); secret != "" {
				pr.Out.Header.Set("Authorization", "Bearer "+secret)
			}
		},
		Transport:     transport,
		FlushInterval: -1, // a followed run's records go on at once
		ModifyResponse: func(resp *http.Response) error {
			if resp.Header.Get(ServedByHeader) == "" {
				resp.Header.Set(ServedByHeader, info.ID)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				return // the client left
			}
			w.Header().Set(ServedByHeader, self)
			writeError(w, http.StatusBadGateway, "%s ran on instance %s (host %s), whose API at %s://%s did not answer: %v; its log is on host %s, %s",
				what, info.ID, info.Host, scheme, host, err, info.Host, file)
		},
	}
	w.Header().Del(ServedByHeader) // the other instance's answer says who served it
	rp.ServeHTTP(&deadlineWriter{ResponseWriter: w, rc: rc}, r)
}

// apiHost is where an instance's API is reached: its registered address,
// with its host name for an unspecified address (0.0.0.0, [::]).
func apiHost(info keyspace.InstanceInfo) string {
	h, port, err := net.SplitHostPort(info.API)
	if err != nil {
		return info.API
	}
	if ip := net.ParseIP(h); (h == "" || (ip != nil && ip.IsUnspecified())) && info.Host != "" {
		return net.JoinHostPort(info.Host, port)
	}
	return info.API
}

// deadlineWriter gives each write of a proxied answer answerWriteTimeout.
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	d.rc.SetWriteDeadline(time.Now().Add(answerWriteTimeout))
	return d.ResponseWriter.Write(p)
}

func (d *deadlineWriter) WriteHeader(code int) {
	d.rc.SetWriteDeadline(time.Now().Add(answerWriteTimeout))
	d.ResponseWriter.WriteHeader(code)
}

func (d *deadlineWriter) FlushError() error { return d.rc.Flush() }

func (d *deadlineWriter) Unwrap() http.ResponseWriter { return d.ResponseWriter }
