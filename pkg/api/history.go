package api

// GET /api/v1/jobs/{job}/runs answers with a page of the job's merged
// history (package history): etcd's records and the runs the logs of every
// live instance describe, newest first. Parameters: item, since (a time,
// or a duration back from now: 10m, 7d), result (DONE, FAILED, KILLED,
// SKIPPED, RUNNING, UNKNOWN), limit (default 100, at most 1000) and
// before (the previous page's next cursor). The answer is
// {"runs": [...], "next": CURSOR, "unreachable": {INSTANCE: WHY}}. With
// local=1, or asked by another instance (X-Shardd-Hop), it answers with
// this instance's rows alone, a JSON array: what the merge asks each
// instance for, with the caller's read token, as run logs are proxied.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/history"
	"github.com/shardd/shardd/pkg/runlog"
)

// maxRunsAnswer bounds the answer of one instance read by the merge.
const maxRunsAnswer = 64 << 20

func (a *api) runs(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(ServedByHeader, a.o.Instance.ID())
	job, ok := jobName(w, r)
	if !ok {
		return
	}
	q, err := history.ParseQuery(r.URL.Query(), time.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	local := r.URL.Query().Get("local")
	if local != "" && local != "1" && local != "0" {
		writeError(w, http.StatusBadRequest, "local must be 1 (this instance's runs alone) or 0, got %q", local)
		return
	}
	h := NewHistories(a.o)
	if local == "1" || r.Header.Get(HopHeader) != "" {
		rows, err := h.Local(job, q)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "%v", err)
			return
		}
		writeJSON(w, http.StatusOK, rows)
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	ans, err := h.Merged(ctx, job, q, a.auth.ReadSecret(auth.CallerOf(r.Context())))
	if err != nil {
		writeError(w, opStatus(err), "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, ans)
}

// Histories answers history queries (package history) on an instance:
// from its own run logs, and merged over the cluster.
type Histories struct {
	hours  *history.Hours
	admin  Admin
	self   string
	host   string
	store  *runlog.Store
	client *http.Client
	logger *slog.Logger
}

// NewHistories returns the histories of the API's instance, as o
// configures its API: its admin client, run logs and their transport.
func NewHistories(o Options) *Histories {
	h := &Histories{admin: o.Admin, self: o.Instance.ID(), logger: o.Logger, hours: o.Hours, client: &http.Client{Transport: defaultProxy, Timeout: o.Timeout}}
	if h.logger == nil {
		h.logger = slog.Default()
	}
	if h.client.Timeout == 0 {
		h.client.Timeout = 5 * time.Second
	}
	if rl := o.RunLogs; rl != nil {
		h.store, h.host = rl.Store, rl.Host
		if rl.Transport != nil {
			h.client.Transport = rl.Transport
		}
	}
	return h
}

// Local is this instance's rows of job for q, from its run logs (none
// when it keeps none).
func (h *Histories) Local(job string, q history.Query) ([]history.Run, error) {
	rows := []history.Run{}
	if h.store == nil {
		return rows, nil
	}
	got, err := history.Local(h.store, job, q)
	if err != nil && len(got) == 0 {
		return nil, err
	}
	if err != nil {
		h.logger.Warn("history: some run logs could not be read", "job", job, "err", err)
	}
	return append(rows, got...), nil
}

// Merged answers q over the cluster: etcd's records, this instance's rows
// and every other live instance's, asked with the read token secret.
func (h *Histories) Merged(ctx context.Context, job string, q history.Query, secret string) (history.Answer, error) {
	recs, err := h.admin.RecentRuns(ctx, job, q.Item)
	if err != nil {
		return history.Answer{}, err
	}
	peers, err := h.admin.Instances(ctx)
	if err != nil {
		return history.Answer{}, err
	}
	fetch := func(ctx context.Context, in keyspace.InstanceInfo, q history.Query) ([]history.Run, error) {
		if in.ID == h.self {
			return h.Local(job, q)
		}
		return FetchRuns(ctx, h.client, in, secret, h.host, h.self, job, q)
	}
	return history.Gather(ctx, recs, peers, fetch, q), nil
}

// FetchRuns asks instance in's API for its own rows of job's history for
// q (local=1), with the read token secret ("" for none), from host here
// (an API on another host's loopback is not asked: it would be this
// host's); from, when set, names the asking instance (X-Shardd-Hop).
func FetchRuns(ctx context.Context, client *http.Client, in keyspace.InstanceInfo, secret, here, from, job string, q history.Query) ([]history.Run, error) {
	v := q.Values()
	v.Set("local", "1")
	var rows []history.Run
	err := getPeer(ctx, client, in, secret, here, from, "/api/v1/jobs/"+job+"/runs", v, &rows)
	return rows, err
}

// getPeer GETs path?v of instance in's API into out (JSON), as FetchRuns
// describes.
func getPeer(ctx context.Context, client *http.Client, in keyspace.InstanceInfo, secret, here, from, path string, v url.Values, out any) error {
	if in.API == "" {
		return fmt.Errorf("it serves no API (shardd run --listen \"\")")
	}
	if LoopbackOfAnotherHost(in, here) {
		return fmt.Errorf("its API listens on %s, a loopback address of host %s, which only that host reaches", in.API, in.Host)
	}
	scheme := "http"
	if in.APITLS {
		scheme = "https"
	}
	u := url.URL{Scheme: scheme, Host: APIHost(in), Path: path, RawQuery: v.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	if from != "" {
		req.Header.Set(HopHeader, from)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("its API at %s did not answer: %w", scheme+"://"+u.Host, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var ae struct {
			Error string `json:"error"`
		}
		json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&ae)
		return fmt.Errorf("its API at %s answered %s: %s", scheme+"://"+u.Host, resp.Status, ae.Error)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxRunsAnswer)).Decode(out); err != nil {
		return fmt.Errorf("its API at %s: a malformed answer: %w", scheme+"://"+u.Host, err)
	}
	return nil
}

// hours serves GET /api/v1/stats/hours: the cluster's runs and failures
// per hour over the last day, or this instance's (local=1, or asked by
// another instance).
func (a *api) hours(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(ServedByHeader, a.o.Instance.ID())
	h := NewHistories(a.o)
	if r.URL.Query().Get("local") == "1" || r.Header.Get(HopHeader) != "" {
		writeJSON(w, http.StatusOK, h.LocalHours())
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	ans, err := h.MergedHours(ctx, a.auth.ReadSecret(auth.CallerOf(r.Context())))
	if err != nil {
		writeError(w, opStatus(err), "%v", err)
		return
	}
	writeJSON(w, http.StatusOK, ans)
}

// LocalHours is this instance's day of hours.
func (h *Histories) LocalHours() history.HoursAnswer {
	if h.hours == nil {
		return history.HoursAnswer{Hours: history.SumHours(), Complete: false}
	}
	day, complete := h.hours.Day(time.Now())
	return history.HoursAnswer{Hours: day, Complete: complete}
}

// MergedHours sums the day of hours of every live instance.
func (h *Histories) MergedHours(ctx context.Context, secret string) (history.HoursAnswer, error) {
	peers, err := h.admin.Instances(ctx)
	if err != nil {
		return history.HoursAnswer{}, err
	}
	answers := make([]history.HoursAnswer, len(peers))
	errs := make([]error, len(peers))
	var wg sync.WaitGroup
	for i, in := range peers {
		if in.ID == h.self {
			answers[i] = h.LocalHours()
			continue
		}
		wg.Go(func() {
			errs[i] = getPeer(ctx, h.client, in, secret, h.host, h.self, "/api/v1/stats/hours", url.Values{"local": {"1"}}, &answers[i])
		})
	}
	wg.Wait()
	out := history.HoursAnswer{Complete: true}
	var days [][]history.Hour
	for i, err := range errs {
		if err != nil {
			if out.Unreachable == nil {
				out.Unreachable = map[string]string{}
			}
			out.Unreachable[peers[i].ID], out.Complete = err.Error(), false
			continue
		}
		days = append(days, answers[i].Hours)
		out.Complete = out.Complete && answers[i].Complete
	}
	out.Hours = history.SumHours(days...)
	return out, nil
}
