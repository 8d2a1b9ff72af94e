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
	"net/http"
	"net/url"
	"time"

	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/history"
)

// maxRunsAnswer bounds the answer of one instance read by the merge.
const maxRunsAnswer = 64 << 20

func (a *api) runs(w http.ResponseWriter, r *http.Request) {
	self := a.o.Instance.ID()
	w.Header().Set(ServedByHeader, self)
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
	if local == "1" || r.Header.Get(HopHeader) != "" {
		rows, err := a.localRuns(job, q)
		if err != nil {
			writeError(w, http.StatusInternalServerError, "%v", err)
			return
		}
		writeJSON(w, http.StatusOK, rows)
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	recs, err := a.o.Admin.History(ctx, job, q.Item)
	if err != nil {
		writeError(w, opStatus(err), "%v", err)
		return
	}
	peers, err := a.o.Admin.Instances(ctx)
	if err != nil {
		writeError(w, opStatus(err), "%v", err)
		return
	}
	secret := a.auth.ReadSecret(auth.CallerOf(r.Context()))
	fetch := func(ctx context.Context, in keyspace.InstanceInfo, q history.Query) ([]history.Run, error) {
		if in.ID == self {
			return a.localRuns(job, q)
		}
		host := ""
		if a.o.RunLogs != nil {
			host = a.o.RunLogs.Host
		}
		return FetchRuns(ctx, a.peerClient(), in, secret, host, self, job, q)
	}
	writeJSON(w, http.StatusOK, history.Gather(r.Context(), recs, peers, fetch, q))
}

// localRuns is this instance's rows of job for q, from its run logs (none
// when it keeps none).
func (a *api) localRuns(job string, q history.Query) ([]history.Run, error) {
	rows := []history.Run{}
	if a.o.RunLogs == nil || a.o.RunLogs.Store == nil {
		return rows, nil
	}
	got, err := history.Local(a.o.RunLogs.Store, job, q)
	if len(got) > 0 {
		rows = got
	}
	if err != nil && len(got) == 0 {
		return nil, err
	}
	if err != nil {
		a.o.Logger.Warn("history: some run logs could not be read", "job", job, "err", err)
	}
	return rows, nil
}

// peerClient reaches the other instances' APIs.
func (a *api) peerClient() *http.Client {
	t := http.RoundTripper(defaultProxy)
	if a.o.RunLogs != nil && a.o.RunLogs.Transport != nil {
		t = a.o.RunLogs.Transport
	}
	return &http.Client{Transport: t, Timeout: a.o.Timeout}
}

// FetchRuns asks instance in's API for its own rows of job's history for
// q (local=1), with the read token secret ("" for none), from host here
// (an API on another host's loopback is not asked: it would be this
// host's); from, when set, names the asking instance (X-Shardd-Hop).
func FetchRuns(ctx context.Context, client *http.Client, in keyspace.InstanceInfo, secret, here, from, job string, q history.Query) ([]history.Run, error) {
	if in.API == "" {
		return nil, fmt.Errorf("it serves no API (shardd run --listen \"\")")
	}
	if LoopbackOfAnotherHost(in, here) {
		return nil, fmt.Errorf("its API listens on %s, a loopback address of host %s, which only that host reaches", in.API, in.Host)
	}
	scheme := "http"
	if in.APITLS {
		scheme = "https"
	}
	v := q.Values()
	v.Set("local", "1")
	u := url.URL{Scheme: scheme, Host: APIHost(in), Path: "/api/v1/jobs/" + job + "/runs", RawQuery: v.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	if secret != "" {
		req.Header.Set("Authorization", "Bearer "+secret)
	}
	if from != "" {
		req.Header.Set(HopHeader, from)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("its API at %s did not answer: %w", scheme+"://"+u.Host, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var ae struct {
			Error string `json:"error"`
		}
		json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&ae)
		return nil, fmt.Errorf("its API at %s answered %s: %s", scheme+"://"+u.Host, resp.Status, ae.Error)
	}
	var rows []history.Run
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxRunsAnswer)).Decode(&rows); err != nil {
		return nil, fmt.Errorf("its API at %s: a malformed answer: %w", scheme+"://"+u.Host, err)
	}
	return rows, nil
}
