package api

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runlog"
)

// fakeRuns is the cluster's records of runs and instances.
type fakeRuns struct {
	mu        sync.Mutex
	runs      []keyspace.ItemRecord
	instances map[string]keyspace.InstanceInfo
}

func (f *fakeRuns) FindRuns(ctx context.Context, job string, item int, fence int64) ([]keyspace.ItemRecord, error) {
	switch {
	case job == "order":
		return nil, fmt.Errorf("%w: no job %q in the cluster at prefix /shardd (did you mean orders?)", admin.ErrUnknownJob, job)
	case job != "orders":
		return nil, fmt.Errorf("%w: no job %q in the cluster at prefix /shardd (jobs: orders)", admin.ErrUnknownJob, job)
	case item > 3:
		return nil, fmt.Errorf("%w: job %q has items 0-3; there is no item %d", admin.ErrBadTarget, job, item)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []keyspace.ItemRecord
	for _, r := range f.runs {
		if (item < 0 || r.Item == item) && (fence <= 0 || r.Fence == fence) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (f *fakeRuns) Instance(ctx context.Context, id string) (keyspace.InstanceInfo, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	info, ok := f.instances[id]
	return info, ok, nil
}

// named is a fake cluster with another instance id.
type named struct {
	*fakeCluster
	id string
}

func (n named) ID() string { return n.id }

// instance is one API with its run logs.
type instance struct {
	id    string
	store *runlog.Store
	h     http.Handler
}

func newInstance(t *testing.T, id string, runs *fakeRuns, o Options) *instance {
	t.Helper()
	s, err := runlog.New(filepath.Join(t.TempDir(), "runs"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	f := named{&fakeCluster{up: true}, id}
	o.Instance, o.Admin = f, f
	if o.RunLogs == nil {
		o.RunLogs = &RunLogs{}
	}
	o.RunLogs.Store = s
	if runs != nil {
		o.RunLogs.Runs = runs
	}
	return &instance{id: id, store: s, h: Handler(o)}
}

// run writes a finished run's log: its header, out and err lines, and the end.
func (in *instance) run(t *testing.T, fence int64, item int, out, errOut []string) {
	t.Helper()
	l := in.open(t, fence, item)
	for _, s := range out {
		fmt.Fprintln(l.Stdout(), s)
	}
	for _, s := range errOut {
		fmt.Fprintln(l.Stderr(), s)
	}
	l.Close("end state=DONE exit=0")
}

func (in *instance) open(t *testing.T, fence int64, item int) *runlog.Log {
	t.Helper()
	l, err := in.store.Create(runlog.Header{Job: "orders", Item: item, Fence: fence, Instance: in.id}, runlog.Retention{})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// get asks h for path and returns the answer.
func get(t *testing.T, h http.Handler, path, token string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest("GET", path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// tagsAndTexts are a text answer's records as "tag text".
func tagsAndTexts(t *testing.T, body string) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
		if line == "" {
			continue
		}
		rec, err := runlog.ParseRecord([]byte(line))
		if err != nil {
			t.Fatalf("answer line %q: %v", line, err)
		}
		out = append(out, rec.Tag+" "+string(rec.Text))
	}
	return out
}

func TestRunLogOfThisInstance(t *testing.T) {
	a := newInstance(t, "a", &fakeRuns{}, Options{})
	a.run(t, 10, 0, []string{"hello", "world"}, []string{"oops"})
	header := "shardd run job=orders item=0 fence=10 fire=0001-01-01T00:00:00Z attempt=0 source= instance=a"
	for _, tc := range []struct {
		path string
		want []string
	}{
		{"/api/v1/jobs/orders/runs/10-0/log", []string{header, "out hello", "out world", "err oops", "shardd end state=DONE exit=0"}},
		{"/api/v1/jobs/orders/runs/10/log", []string{header, "out hello", "out world", "err oops", "shardd end state=DONE exit=0"}},
		{"/api/v1/jobs/orders/runs/10-0/log?stream=stdout", []string{"out hello", "out world"}},
		{"/api/v1/jobs/orders/runs/10-0/log?stream=stderr&follow=1", []string{"err oops"}},
	} {
		rec := get(t, a.h, tc.path, "")
		if rec.Code != 200 || rec.Header().Get(ServedByHeader) != "a" || rec.Header().Get(WritingHeader) != "false" ||
			rec.Header().Get(RunHeader) != "10-0" || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain") {
			t.Errorf("%s: %d %v %s", tc.path, rec.Code, rec.Header(), rec.Body)
			continue
		}
		if got := tagsAndTexts(t, rec.Body.String()); !slices.Equal(got, tc.want) {
			t.Errorf("%s:\n%q\nwant\n%q", tc.path, got, tc.want)
		}
	}
	rec := get(t, a.h, "/api/v1/jobs/orders/runs/10-0/log?format=json&stream=stdout", "")
	var got []recordOut
	dec := json.NewDecoder(rec.Body)
	for dec.More() {
		var r recordOut
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if rec.Header().Get("Content-Type") != "application/x-ndjson" || len(got) != 2 || got[1].Text != "world" || got[1].Tag != "out" || got[1].Stream != "stdout" || got[1].Time.IsZero() {
		t.Errorf("format=json: %s %+v", rec.Header().Get("Content-Type"), got)
	}
	// A run still writing its log says so.
	l := a.open(t, 12, 1)
	defer l.Close("")
	fmt.Fprintln(l.Stdout(), "so far")
	rec = get(t, a.h, "/api/v1/jobs/orders/runs/12-1/log", "")
	if rec.Code != 200 || rec.Header().Get(WritingHeader) != "true" || !strings.Contains(rec.Body.String(), " out so far\n") {
		t.Errorf("a log being written: %d %v %q", rec.Code, rec.Header(), rec.Body)
	}
}

// Every error is JSON, names what was not found, and says how to find
// runs.
func TestRunLogErrors(t *testing.T) {
	runs := &fakeRuns{
		runs: []keyspace.ItemRecord{
			{Job: "orders", Item: 0, Fence: 30, Instance: "gone", State: keyspace.StateDone},
			{Job: "orders", Item: 1, Fence: 31, Instance: "quiet", State: keyspace.StateDone},
			{Job: "orders", Item: 0, Fence: 32, Instance: "a", State: keyspace.StateDone},
			{Job: "orders", Item: 2, Fence: 33, Instance: "b", State: keyspace.StateDone},
			{Job: "orders", Item: 3, Fence: 33, Instance: "b", State: keyspace.StateDone},
			{Job: "orders", Item: 0, Fence: 34, Instance: "far", State: keyspace.StateDone},
		},
		instances: map[string]keyspace.InstanceInfo{"quiet": {ID: "quiet", Host: "host-q"}, "far": {ID: "far", Host: "host-f", API: "127.0.0.1:9741"}},
	}
	a := newInstance(t, "a", runs, Options{RunLogs: &RunLogs{Host: "host-a"}})
	a.run(t, 20, 0, nil, nil)
	a.run(t, 20, 1, nil, nil)
	for _, tc := range []struct {
		name, path string
		code       int
		want       []string
	}{
		{"not a run", "/api/v1/jobs/orders/runs/latest/log", 400, []string{`run "latest"`, "FENCE-ITEM", "shardd history orders"}},
		{"bad follow", "/api/v1/jobs/orders/runs/20-0/log?follow=maybe", 400, []string{"follow must be"}},
		{"bad format", "/api/v1/jobs/orders/runs/20-0/log?format=xml", 400, []string{"format must be"}},
		{"bad stream", "/api/v1/jobs/orders/runs/20-0/log?stream=both", 400, []string{"stream must be"}},
		{"a fence of several items here", "/api/v1/jobs/orders/runs/20/log", 400, []string{"items 0, 1", "20-0, 20-1"}},
		{"a fence of several items elsewhere", "/api/v1/jobs/orders/runs/33/log", 400, []string{"items 2, 3", "33-2, 33-3"}},
		{"unknown job", "/api/v1/jobs/order/runs/20-0/log", 404, []string{`no job "order"`, "did you mean orders?"}},
		{"bad job name", "/api/v1/jobs/a%20b/runs/1/log", 400, []string{"job name"}},
		{"item out of range", "/api/v1/jobs/orders/runs/20-7/log", 400, []string{"no item 7"}},
		{"unknown run", "/api/v1/jobs/orders/runs/99-0/log", 404, []string{`job "orders" has no run 99-0`, "shardd history orders", "last 10 runs of each item"}},
		{"ran here, log gone", "/api/v1/jobs/orders/runs/32-0/log", 404, []string{"run 32-0", "ran on this instance (a)", "retention"}},
		{"instance not live", "/api/v1/jobs/orders/runs/30/log", 404, []string{"run 30-0", "instance gone", "not live", "orders/30-0.log", "runs/gone in its --data-dir"}},
		{"instance without an API", "/api/v1/jobs/orders/runs/31-1/log", 502, []string{"instance quiet (host host-q)", "serves no API", "on host host-q"}},
		{"an API on another host's loopback", "/api/v1/jobs/orders/runs/34/log", 502, []string{"instance far (host host-f)", "127.0.0.1:9741", "loopback", "only host host-f reaches"}},
	} {
		rec := get(t, a.h, tc.path, "")
		var e apiError
		if rec.Code != tc.code || json.Unmarshal(rec.Body.Bytes(), &e) != nil {
			t.Errorf("%s: %d %s, want %d and a JSON error", tc.name, rec.Code, rec.Body, tc.code)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(e.Error, w) {
				t.Errorf("%s: %q does not say %q", tc.name, e.Error, w)
			}
		}
	}

	// The read guard of the other read endpoints.
	guarded := newInstance(t, "a", runs, Options{Tokens: toks("", "read-token-0123456789")})
	guarded.run(t, 20, 0, nil, nil)
	if rec := get(t, guarded.h, "/api/v1/jobs/orders/runs/20-0/log", ""); rec.Code != 401 {
		t.Errorf("without the read token: %d", rec.Code)
	}
	if rec := get(t, guarded.h, "/api/v1/jobs/orders/runs/20-0/log", "read-token-0123456789"); rec.Code != 200 {
		t.Errorf("with the read token: %d %s", rec.Code, rec.Body)
	}
	// Without run logs, or without the cluster's records.
	none := Handler(Options{Instance: &fakeCluster{up: true}, Admin: &fakeCluster{up: true}})
	if rec := get(t, none, "/api/v1/jobs/orders/runs/20-0/log", ""); rec.Code != 404 || !strings.Contains(rec.Body.String(), "shardd history orders") {
		t.Errorf("an instance without run logs: %d %s", rec.Code, rec.Body)
	}
}

// serve runs h on a real server with short timeouts: a followed run must
// outlive them.
func serve(t *testing.T, h http.Handler, tlsOn bool) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ReadTimeout = 500 * time.Millisecond
	srv.Config.WriteTimeout = 500 * time.Millisecond
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the untrusting client's handshake
	if tlsOn {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv
}

// follow GETs url and returns its answer, and its lines on a channel
// closed at the end of the answer.
func follow(t *testing.T, c *http.Client, url, token string) (*http.Response, <-chan string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() }) // before its server's Close
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	return resp, lines
}

func expectLine(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatalf("the answer ended, want %q", want)
		}
		if got := tagsAndTexts(t, l); len(got) != 1 || got[0] != want {
			t.Fatalf("line %q, want %q", l, want)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("no line after 3s, want %q", want)
	}
}

func expectEnd(t *testing.T, lines <-chan string) {
	t.Helper()
	select {
	case l, ok := <-lines:
		if ok {
			t.Fatalf("line %q after the end", l)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the answer did not end 3s after the log closed")
	}
}

// follow=1 streams the records as they are written, beyond the server's
// read and write timeouts, and ends when the log is closed.
func TestRunLogFollow(t *testing.T) {
	a := newInstance(t, "a", &fakeRuns{}, Options{})
	srv := serve(t, a.h, false)
	l := a.open(t, 40, 0)
	resp, lines := follow(t, srv.Client(), srv.URL+"/api/v1/jobs/orders/runs/40-0/log?follow=1", "")
	if resp.StatusCode != 200 || resp.Header.Get(WritingHeader) != "true" {
		t.Fatalf("follow: %s %v", resp.Status, resp.Header)
	}
	expectLine(t, lines, "shardd run job=orders item=0 fence=40 fire=0001-01-01T00:00:00Z attempt=0 source= instance=a")
	fmt.Fprintln(l.Stdout(), "first")
	expectLine(t, lines, "out first")
	time.Sleep(1200 * time.Millisecond) // past both timeouts
	fmt.Fprintln(l.Stderr(), "second")
	expectLine(t, lines, "err second")
	l.Close("end state=DONE exit=0")
	expectLine(t, lines, "shardd end state=DONE exit=0")
	expectEnd(t, lines)
}

// A run's log on another instance comes through that instance's API, the
// token passed on; a follow streams through it; the records of two
// instances that disagree do not bounce a request between them; an
// instance that does not answer is a 502 that names it.
func TestRunLogProxy(t *testing.T) {
	const token = "cluster-read-token-0123"
	runs := &fakeRuns{
		runs: []keyspace.ItemRecord{
			{Job: "orders", Item: 1, Fence: 50, Instance: "b", State: keyspace.StateDone},
			{Job: "orders", Item: 2, Fence: 51, Instance: "b", State: keyspace.StateRunning},
			{Job: "orders", Item: 3, Fence: 52, Instance: "b", State: keyspace.StateDone}, // b has no log of it
			{Job: "orders", Item: 0, Fence: 53, Instance: "down", State: keyspace.StateDone},
		},
		instances: map[string]keyspace.InstanceInfo{},
	}
	authA := auth.New(toks("", token), 0, false)
	a := newInstance(t, "a", runs, Options{Auth: authA})
	b := newInstance(t, "b", &fakeRuns{runs: []keyspace.ItemRecord{{Job: "orders", Item: 3, Fence: 52, Instance: "a", State: keyspace.StateDone}}}, Options{Tokens: toks("", token)})
	srvA, srvB := serve(t, a.h, false), serve(t, b.h, false)
	runs.instances["b"] = keyspace.InstanceInfo{ID: "b", Host: "host-b", API: srvB.Listener.Addr().String()}
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	runs.instances["down"] = keyspace.InstanceInfo{ID: "down", Host: "host-d", API: dead.Listener.Addr().String()}
	b.run(t, 50, 1, []string{"from b"}, nil)

	rec := get(t, a.h, "/api/v1/jobs/orders/runs/50/log", token)
	if rec.Code != 200 || rec.Header().Get(ServedByHeader) != "b" || !strings.Contains(rec.Body.String(), " out from b\n") {
		t.Errorf("proxied: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	if rec := get(t, a.h, "/api/v1/jobs/orders/runs/50-1/log", ""); rec.Code != 401 {
		t.Errorf("without the token: %d %s", rec.Code, rec.Body)
	}
	// A console session of a: b knows the session's token, not the session.
	ck, key := loginOf(t, authA, token)
	req := httptest.NewRequest("GET", "/api/v1/jobs/orders/runs/50-1/log", nil)
	req.AddCookie(ck)
	req.Header.Set(auth.KeyHeader, key)
	rec = httptest.NewRecorder()
	a.h.ServeHTTP(rec, req)
	if rec.Code != 200 || rec.Header().Get(ServedByHeader) != "b" || !strings.Contains(rec.Body.String(), " out from b\n") {
		t.Errorf("proxied for a console session: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}

	// Follow through the proxy.
	l := b.open(t, 51, 2)
	resp, lines := follow(t, srvA.Client(), srvA.URL+"/api/v1/jobs/orders/runs/51-2/log?follow=1&stream=stdout", token)
	if resp.StatusCode != 200 || resp.Header.Get(ServedByHeader) != "b" {
		t.Fatalf("proxied follow: %s %v", resp.Status, resp.Header)
	}
	fmt.Fprintln(l.Stdout(), "live")
	expectLine(t, lines, "out live")
	time.Sleep(1200 * time.Millisecond) // past both servers' timeouts
	fmt.Fprintln(l.Stdout(), "still")
	expectLine(t, lines, "out still")
	l.Close("end state=DONE exit=0")
	expectEnd(t, lines)

	// a's records say b ran 52-3, b's say a did: b does not ask a again.
	rec = get(t, a.h, "/api/v1/jobs/orders/runs/52-3/log", token)
	if rec.Code != 404 || rec.Header().Get(ServedByHeader) != "b" || !strings.Contains(rec.Body.String(), "asked by instance a") {
		t.Errorf("disagreeing records: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	rec = get(t, a.h, "/api/v1/jobs/orders/runs/53-0/log", token)
	if rec.Code != 502 || !strings.Contains(rec.Body.String(), "instance down (host host-d)") || !strings.Contains(rec.Body.String(), "did not answer") {
		t.Errorf("an instance that does not answer: %d %s", rec.Code, rec.Body)
	}
}

// A proxy reaches an API over TLS when it trusts its certificate, and
// says why not when it does not.
func TestRunLogProxyOverTLS(t *testing.T) {
	runs := &fakeRuns{runs: []keyspace.ItemRecord{{Job: "orders", Item: 1, Fence: 60, Instance: "b", State: keyspace.StateDone}}, instances: map[string]keyspace.InstanceInfo{}}
	b := newInstance(t, "b", nil, Options{})
	srvB := serve(t, b.h, true)
	runs.instances["b"] = keyspace.InstanceInfo{ID: "b", Host: "host-b", API: srvB.Listener.Addr().String(), APITLS: true}
	b.run(t, 60, 1, []string{"over tls"}, nil)

	trusting := newInstance(t, "a", runs, Options{RunLogs: &RunLogs{Transport: srvB.Client().Transport}})
	if rec := get(t, trusting.h, "/api/v1/jobs/orders/runs/60-1/log", ""); rec.Code != 200 || rec.Header().Get(ServedByHeader) != "b" || !strings.Contains(rec.Body.String(), " out over tls\n") {
		t.Errorf("over TLS: %d %s", rec.Code, rec.Body)
	}
	other := &http.Transport{TLSClientConfig: &tls.Config{}} // the system's roots: not b's test CA
	distrusting := newInstance(t, "a", runs, Options{RunLogs: &RunLogs{Transport: other}})
	if rec := get(t, distrusting.h, "/api/v1/jobs/orders/runs/60-1/log", ""); rec.Code != 502 || !strings.Contains(rec.Body.String(), "certificate") || !strings.Contains(rec.Body.String(), "https://") {
		t.Errorf("an untrusted certificate: %d %s", rec.Code, rec.Body)
	}
}

func TestAPIHost(t *testing.T) {
	for _, tc := range []struct {
		api, host, want   string
		loopbackElsewhere bool
	}{
		{"10.0.0.5:9741", "h1", "10.0.0.5:9741", false},
		{"0.0.0.0:9741", "h1", "h1:9741", false},
		{"[::]:9741", "h1", "h1:9741", false},
		{"127.0.0.1:9741", "h1", "127.0.0.1:9741", true},
		{"[::1]:9741", "h1", "[::1]:9741", true},
		{"localhost:9741", "h1", "localhost:9741", true},
		{"127.0.0.1:9741", "here", "127.0.0.1:9741", false}, // this host's
	} {
		info := keyspace.InstanceInfo{API: tc.api, Host: tc.host}
		if got := APIHost(info); got != tc.want {
			t.Errorf("APIHost(%s on %s) = %s, want %s", tc.api, tc.host, got, tc.want)
		}
		if got := LoopbackOfAnotherHost(info, "here"); got != tc.loopbackElsewhere {
			t.Errorf("LoopbackOfAnotherHost(%s on %s) = %v", tc.api, tc.host, got)
		}
	}
}

// Retention removes a job's oldest finished logs; the API then says the
// log is gone and why, and still serves the newer ones.
func TestRunLogRemovedByRetention(t *testing.T) {
	runs := &fakeRuns{}
	in := newInstance(t, "a", runs, Options{})
	line := strings.Repeat("x", 1000)
	out := make([]string, 10) // ~10 KB of output a run
	for i := range out {
		out[i] = line
	}
	ret := runlog.Retention{MaxBytesPerRun: 16 << 10, MaxTotalBytes: 16 << 10}
	for fence := int64(100); fence < 104; fence++ {
		l, err := in.store.Create(runlog.Header{Job: "orders", Item: 0, Fence: fence, Instance: "a"}, ret)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range out {
			fmt.Fprintln(l.Stdout(), s)
		}
		l.Close("end state=DONE exit=0")
		runs.runs = append(runs.runs, keyspace.ItemRecord{Job: "orders", Item: 0, Fence: fence, Instance: "a"})
	}
	if rec := get(t, in.h, "/api/v1/jobs/orders/runs/103-0/log", ""); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), line) {
		t.Errorf("the newest run's log: %d", rec.Code)
	}
	rec := get(t, in.h, "/api/v1/jobs/orders/runs/100-0/log", "")
	if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "removed by retention") {
		t.Errorf("the oldest run's log, beyond maxTotalBytes: %d %s", rec.Code, rec.Body)
	}
}

// Files planted under a log's name in the run log directory (by another
// user who could write there before it was checked) are not served, to
// anyone: a link to the token file, a hard link to the client key, a copy
// of a secret (this user's file, but no log of a run: it does not begin
// with that run's header, and etcd records no such run).
func TestRunLogServesNoFilePlantedUnderALogsName(t *testing.T) {
	in := newInstance(t, "a", &fakeRuns{}, Options{Logger: slog.New(slog.DiscardHandler)})
	const secret = "deploy write cluster-WRITE-token-0123\n"
	dir := t.TempDir()
	token := filepath.Join(dir, "api-tokens")
	key := filepath.Join(dir, "client.key")
	os.WriteFile(token, []byte(secret), 0o600)
	os.WriteFile(key, []byte(secret), 0o600)
	jobDir := filepath.Join(in.store.Dir(), "orders")
	os.Mkdir(jobDir, 0o700)
	os.Symlink(token, filepath.Join(jobDir, "40-0.log"))
	os.Link(key, filepath.Join(jobDir, "41-0.log"))
	os.WriteFile(filepath.Join(jobDir, "42-0.log"), []byte(secret), 0o600)
	for _, run := range []string{"40-0", "40", "41-0", "41", "42-0", "42"} {
		rec := get(t, in.h, "/api/v1/jobs/orders/runs/"+run+"/log", "")
		if rec.Code == http.StatusOK || strings.Contains(rec.Body.String(), "WRITE-token") {
			t.Errorf("run %s: %d %s", run, rec.Code, rec.Body)
		}
		if strings.HasSuffix(run, "-0") && (rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), "not served")) {
			t.Errorf("run %s: %d %s, want 500 saying the log is not served", run, rec.Code, rec.Body)
		}
	}
}

// A proxied read carries a read-role secret, or none when reads are open:
// never the write secret of the caller, whether it came as a bearer token
// or through a console session, nor the session's cookie or key.
func TestRunLogProxyNeverSendsAWriteSecret(t *testing.T) {
	const writeSecret, readSecret = "cluster-WRITE-token-0123", "cluster-READ-token-01234"
	var mu sync.Mutex
	var got []string
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("Authorization"))
		if r.Header.Get("Cookie") != "" || r.Header.Get(auth.KeyHeader) != "" {
			got = append(got, "a session's cookie or key")
		}
		mu.Unlock()
		w.Write([]byte("2026-01-01T00:00:00.000000Z out hi\n"))
	}))
	defer b.Close()
	for _, tc := range []struct {
		name   string
		tokens []auth.Token
		want   string
	}{
		{"reads open", toks(writeSecret, ""), ""},
		{"reads need a token", toks(writeSecret, readSecret), "Bearer " + readSecret},
	} {
		got = nil
		runs := &fakeRuns{
			runs:      []keyspace.ItemRecord{{Job: "orders", Item: 1, Fence: 50, Instance: "b", State: keyspace.StateDone}},
			instances: map[string]keyspace.InstanceInfo{"b": {ID: "b", Host: "host-b", API: strings.TrimPrefix(b.URL, "http://")}},
		}
		au := auth.New(tc.tokens, 0, false)
		a := newInstance(t, "a", runs, Options{Auth: au})
		ck, key := loginOf(t, au, writeSecret)
		bySession := httptest.NewRequest("GET", "/api/v1/jobs/orders/runs/50-1/log", nil)
		bySession.AddCookie(ck)
		bySession.Header.Set(auth.KeyHeader, key)
		byBearer := httptest.NewRequest("GET", "/api/v1/jobs/orders/runs/50-1/log", nil)
		byBearer.Header.Set("Authorization", "Bearer "+writeSecret)
		for _, req := range []*http.Request{bySession, byBearer} {
			rec := httptest.NewRecorder()
			a.h.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK {
				t.Errorf("%s: proxied read %d %s", tc.name, rec.Code, rec.Body)
			}
		}
		mu.Lock()
		if len(got) != 2 || got[0] != tc.want || got[1] != tc.want {
			t.Errorf("%s: instance b received Authorization %q, want %q twice", tc.name, got, tc.want)
		}
		mu.Unlock()
	}
}

// A log that ran out of space with nothing to remove, so that the record
// saying so found no room in its file: the answer says why it stopped, in
// a header while the run goes on and while its closing records wait in the
// instance's memory, or in a trailer when a followed log stops after the
// answer began. Needs root, for a file system small enough to fill.
func TestRunLogStoppedForLackOfSpace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root")
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount: %v: %s", err, out)
		}
	})
	s, err := runlog.New(filepath.Join(mnt, "runs"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // before the unmount
	h := Handler(Options{Instance: named{&fakeCluster{up: true}, "a"}, Admin: named{&fakeCluster{up: true}, "a"}, RunLogs: &RunLogs{Store: s}})
	srv := serve(t, h, false)
	l, err := s.Create(runlog.Header{Job: "orders", Fence: 50, Instance: "a"}, runlog.Retention{})
	if err != nil {
		t.Fatal(err)
	}
	// A line that ends the log's file at a page's end: once the disk is
	// full, its next record needs a page the file system does not have.
	fi, err := os.Stat(s.Path("orders", runlog.RunID{Fence: 50}))
	if err != nil {
		t.Fatal(err)
	}
	const stamped = len("2006-01-02T15:04:05.000000Z out \n")
	fmt.Fprintln(l.Stdout(), strings.Repeat("k", 4096-int(fi.Size())-stamped))
	if fi, err := os.Stat(s.Path("orders", runlog.RunID{Fence: 50})); err != nil || fi.Size() != 4096 {
		t.Fatalf("the log is not one page: %v, %v", fi, err)
	}
	// The answer begins (its headers come) before the log stops.
	resp, err := srv.Client().Get(srv.URL + "/api/v1/jobs/orders/runs/50-0/log?follow=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get(WritingHeader) != "true" || resp.Header.Get(StoppedHeader) != "" {
		t.Fatalf("follow: %s %v", resp.Status, resp.Header)
	}
	filler, err := os.Create(filepath.Join(mnt, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := filler.Write(make([]byte, 4096)); err != nil {
			break // full
		}
	}
	filler.Close()
	fmt.Fprintln(l.Stdout(), "not kept")
	const why = "run log stopped: no space left on device"
	rec := get(t, h, "/api/v1/jobs/orders/runs/50-0/log", "")
	if rec.Code != 200 || rec.Header().Get(WritingHeader) != "true" || rec.Header().Get(StoppedHeader) != why {
		t.Errorf("read while the run goes on: %d %v", rec.Code, rec.Header())
	}
	l.Close("end state=DONE exit=0")
	body, err := io.ReadAll(resp.Body) // the trailer comes after the body
	if err != nil || resp.Trailer.Get(StoppedHeader) != why || strings.Contains(string(body), "end state") {
		t.Errorf("followed: %v, trailer %v, body %q", err, resp.Trailer, body)
	}
	rec = get(t, h, "/api/v1/jobs/orders/runs/50-0/log", "")
	if rec.Code != 200 || rec.Header().Get(WritingHeader) != "false" || rec.Header().Get(StoppedHeader) != why {
		t.Errorf("read after the run: %d %v", rec.Code, rec.Header())
	}
	// Room again: the records go to the file, which says it all itself.
	os.Remove(filepath.Join(mnt, "filler"))
	s.Sweep(func(string) (runlog.Retention, bool) { return runlog.Retention{}, false })
	rec = get(t, h, "/api/v1/jobs/orders/runs/50-0/log", "")
	if rec.Code != 200 || rec.Header().Get(StoppedHeader) != "" || !strings.Contains(rec.Body.String(), " shardd "+why+"\n") ||
		!strings.Contains(rec.Body.String(), " shardd end state=DONE exit=0\n") {
		t.Errorf("read once there is room: %d %v %q", rec.Code, rec.Header(), rec.Body)
	}
}
