package engine

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/ledger"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runner"
)

// The test binary doubles as the script guard, as the shardd binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == runner.WatchdogCommand {
		os.Exit(runner.WatchdogMain())
	}
	os.Exit(etcdtest.Main(m))
}

// memberOnly runs a coord node without an engine: a member that never runs anything.
func memberOnly(t *testing.T, srv *etcdtest.Server, id, yaml string) {
	c, err := config.Parse("jobs.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	node, err := coord.New(coord.Options{Client: srv.Client(), ID: id, TTL: 2 * time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, c.Jobs)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); node.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// instance runs a coord node and an engine in this process on srv.
func instance(t testing.TB, srv *etcdtest.Server, id, yaml string, opts ...func(*Options)) *coord.Node {
	t.Helper()
	return instanceWith(t, srv.Client(), id, yaml, opts...)
}

func instanceWith(t testing.TB, cli *clientv3.Client, id, yaml string, opts ...func(*Options)) *coord.Node {
	t.Helper()
	node, _ := startInstance(t, cli, id, yaml, opts...)
	return node
}

// startInstance starts an instance and returns it with its stop (also
// called at the test's end).
func startInstance(t testing.TB, cli *clientv3.Client, id, yaml string, opts ...func(*Options)) (*coord.Node, func()) {
	t.Helper()
	node, _, stop := startEngine(t, cli, id, yaml, opts...)
	return node, stop
}

// startEngine is startInstance that also returns the engine.
func startEngine(t testing.TB, cli *clientv3.Client, id, yaml string, opts ...func(*Options)) (*coord.Node, *Engine, func()) {
	t.Helper()
	return startEngineTTL(t, cli, id, yaml, 2*time.Second, opts...)
}

// startEngineTTL is startEngine with a session TTL of ttl.
func startEngineTTL(t testing.TB, cli *clientv3.Client, id, yaml string, ttl time.Duration, opts ...func(*Options)) (*coord.Node, *Engine, func()) {
	t.Helper()
	c, err := config.Parse("jobs.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	node, err := coord.New(coord.Options{Client: cli, ID: id, TTL: ttl, Logger: log}, c.Jobs)
	if err != nil {
		t.Fatal(err)
	}
	wd, err := runner.StartWatchdog(os.Args[0], log)
	if err != nil {
		t.Fatal(err)
	}
	// No safety net: every test of the engine's package shows that the
	// events it is about wake the job by themselves (sweep.go).
	o := Options{Node: node, Logger: log, TTL: ttl, Watchdog: wd, Sweep: -1}
	for _, f := range opts {
		f(&o)
	}
	eng := New(o)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	ectx, ecancel := context.WithCancel(ctx)
	go func() { defer wg.Done(); eng.Run(ectx) }()
	go func() { defer wg.Done(); node.Run(ctx) }()
	stop := sync.OnceFunc(func() { ecancel(); cancel(); wg.Wait(); wd.Close() })
	t.Cleanup(stop)
	return node, eng, stop
}

const ledgerLine = `echo "$1 $SHARDD_JOB $SHARDD_ITEM $SHARDD_FIRE_TIME $SHARDD_ATTEMPT $SHARDD_FENCE $SHARDD_INSTANCE $SHARDD_SOURCE $(date +%s%N) $SHARDD_SKIPPED" >> "$LEDGER"`

// ledgerTo is ledgerLine appending to the ledger at path (no single quote
// in it: the line goes inside sh -c '...'), so that tests running in
// parallel each keep their own.
func ledgerTo(path string) string {
	return strings.ReplaceAll(ledgerLine, `"$LEDGER"`, `"`+path+`"`)
}

func events(t *testing.T, path string) []ledger.Event {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	evs, err := ledger.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// An item still running at its next fire is not started twice; one
// coalesced run follows when it finishes, and the coalesced fires are
// counted in the history.
func TestMisfireCoalesces(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	script := `sh -c '` + strings.ReplaceAll(ledgerTo(path), "$1", "start") + `; sleep 2.5; ` + strings.ReplaceAll(ledgerTo(path), "$1", "end") + `'`
	instance(t, srv, "a", "jobs:\n  - name: slow\n    cron: \"@every 1s\"\n    script: "+etcdtest.YAMLQuote(script)+"\n")
	etcdtest.Eventually(t, 20*time.Second, "three runs", func() bool {
		n := 0
		for _, ev := range events(t, path) {
			if ev.Kind == "end" {
				n++
			}
		}
		return n >= 3
	})
	evs := events(t, path)
	r := ledger.Check(evs, ledger.Options{})
	if r.Overlaps+r.Duplicates+r.FenceInversions > 0 {
		t.Fatalf("%s %v", r, r.Violations)
	}
	// Runs follow each other: each starts within a second of the previous end.
	var starts, ends []time.Time
	for _, ev := range evs {
		if ev.Kind == "start" {
			starts = append(starts, ev.At)
		} else if ev.Kind == "end" {
			ends = append(ends, ev.At)
		}
	}
	for i := 1; i < len(ends) && i < len(starts); i++ {
		if gap := starts[i].Sub(ends[i-1]); gap < 0 || gap > 1500*time.Millisecond {
			t.Errorf("run %d started %s after run %d ended", i, gap, i-1)
		}
	}
	recs, err := admin.New(srv.Client(), keyspace.NewKeys("")).Records(context.Background(), "slow")
	if err != nil {
		t.Fatal(err)
	}
	skipped := 0
	for _, r := range recs {
		skipped += r.Skipped
	}
	if skipped == 0 {
		t.Errorf("no coalesced fire counted in history: %+v", recs)
	}
}

// webhookRecorder serves a webhook that keeps the JSON bodies posted to it;
// posts returns them so far.
func webhookRecorder(t *testing.T) (hook *httptest.Server, posts func() []map[string]any) {
	var mu sync.Mutex
	var got []map[string]any
	hook = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		got = append(got, body)
		mu.Unlock()
	}))
	t.Cleanup(hook.Close)
	return hook, func() []map[string]any {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

func TestOnFailureAndListeners(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	hook, posts := webhookRecorder(t)
	yaml := `jobs:
  - name: flaky
    cron: "@every 1s"
    shardingTotalCount: 2
    script: "exit 7"
    onFailure:
      webhook: ` + hook.URL + `
      format: slack
      command: ` + etcdtest.YAMLQuote(`echo "$SHARDD_ITEM $SHARDD_EXIT_CODE $SHARDD_RESULT" >> `+filepath.Join(dir, "failures")) + `
    listeners:
      before: ` + etcdtest.YAMLQuote(`echo "before $SHARDD_ITEMS" >> `+filepath.Join(dir, "listeners")) + `
      after: ` + etcdtest.YAMLQuote(`echo "after $SHARDD_ITEMS" >> `+filepath.Join(dir, "listeners")) + `
`
	instance(t, srv, "a", yaml)
	etcdtest.Eventually(t, 15*time.Second, "a failure to be reported", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "failures"))
		return len(posts()) >= 2 && strings.Contains(string(b), "0 7 FAILED") && strings.Contains(string(b), "1 7 FAILED")
	})
	text, _ := posts()[0]["text"].(string)
	if !strings.Contains(text, "job flaky item") || !strings.Contains(text, "failed on a") {
		t.Errorf("slack text = %q", text)
	}
	etcdtest.Eventually(t, 5*time.Second, "listeners", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "listeners"))
		return strings.Contains(string(b), "before 0,1\n") && strings.Contains(string(b), "after 0,1\n")
	})
	b, _ := os.ReadFile(filepath.Join(dir, "listeners"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if !strings.HasPrefix(lines[0], "before") {
		t.Errorf("listener order: %q", lines)
	}
}

// onFailure of a run that timed out is told what history records:
// KILLED, reason timeout, not FAILED.
func TestOnFailureOfATimeout(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	hook, posts := webhookRecorder(t)
	yaml := `jobs:
  - name: slowpoke
    cron: "@every 2s"
    script: "sleep 10"
    timeout: 300ms
    onFailure:
      webhook: ` + hook.URL + `
      command: ` + etcdtest.YAMLQuote(`echo "$SHARDD_RESULT/$SHARDD_REASON $SHARDD_EXIT_CODE" >> `+filepath.Join(dir, "failures")) + `
`
	instance(t, srv, "a", yaml)
	etcdtest.Eventually(t, 15*time.Second, "the timeout to be reported", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "failures"))
		return len(posts()) >= 1 && len(b) > 0
	})
	b, _ := os.ReadFile(filepath.Join(dir, "failures"))
	if line := strings.SplitN(string(b), "\n", 2)[0]; line != "KILLED/timeout -1" {
		t.Errorf("onFailure command saw %q, want KILLED/timeout -1", line)
	}
	first := posts()[0]
	if first["result"] != "KILLED" || first["reason"] != "timeout" {
		t.Errorf("webhook body result %v, reason %v; want KILLED, timeout", first["result"], first["reason"])
	}
	if text, _ := first["text"].(string); !strings.Contains(text, "was KILLED (timeout) on a") {
		t.Errorf("webhook text = %q", text)
	}
}

// maxConcurrency 1: the job's items run one at a time on the instance.
func TestMaxConcurrency(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	script := `sh -c '` + strings.ReplaceAll(ledgerTo(path), "$1", "start") + `; sleep 0.2; ` + strings.ReplaceAll(ledgerTo(path), "$1", "end") + `'`
	instance(t, srv, "a", "jobs:\n  - name: one-at-a-time\n    cron: \"@every 2s\"\n    shardingTotalCount: 3\n    maxConcurrency: 1\n    script: "+etcdtest.YAMLQuote(script)+"\n")
	etcdtest.Eventually(t, 15*time.Second, "six runs", func() bool {
		n := 0
		for _, ev := range events(t, path) {
			if ev.Kind == "end" {
				n++
			}
		}
		return n >= 6
	})
	running, most := 0, 0
	for _, ev := range events(t, path) {
		switch ev.Kind {
		case "start":
			running++
		case "end":
			running--
		}
		most = max(most, running)
	}
	if most != 1 {
		t.Errorf("%d items ran at once, want 1", most)
	}
}

func TestClockSkewRefusesToFire(t *testing.T) {
	t.Parallel()
	job := &config.Job{Name: "j", MaxTimeDiffSeconds: 2}
	e := New(Options{Skew: func() (time.Duration, bool) { return 5 * time.Second, true }})
	if err := e.checkClock(job); err == nil || !strings.Contains(err.Error(), "off by 5s against etcd, more than maxTimeDiffSeconds 2") {
		t.Errorf("skew 5s, limit 2s: %v", err)
	}
	e.opts.Skew = func() (time.Duration, bool) { return -1500 * time.Millisecond, true }
	if err := e.checkClock(job); err != nil {
		t.Errorf("skew -1.5s, limit 2s: %v", err)
	}
	job.MaxTimeDiffSeconds = -1
	e.opts.Skew = func() (time.Duration, bool) { return time.Hour, true }
	if err := e.checkClock(job); err != nil {
		t.Errorf("check off (-1): %v", err)
	}
}

// A job the host's clock may not fire looks again by itself (clockRetry):
// a skew mends with no event, and the sweep is off here.
func TestClockSkewMendedFiresAgain(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	var skew atomic.Int64
	skew.Store(int64(10 * time.Second))
	yaml := "jobs:\n  - name: skewed\n    cron: \"@every 1s\"\n    maxTimeDiffSeconds: 2\n    script: " + etcdtest.YAMLQuote(strings.ReplaceAll(ledgerTo(path), "$1", "start")) + "\n"
	instance(t, srv, "a", yaml, func(o *Options) {
		o.Skew = func() (time.Duration, bool) { return time.Duration(skew.Load()), true }
	})
	time.Sleep(3 * time.Second)
	if evs := events(t, path); len(evs) > 0 {
		t.Fatalf("%d runs with the clock 10 s off, maxTimeDiffSeconds 2", len(evs))
	}
	skew.Store(0)
	etcdtest.Eventually(t, clockRetry+3*time.Second, "a run once the clock is right", func() bool { return len(events(t, path)) > 0 })
}

// Runtime routes: FAILOVER runs every fire on the first instance; LFU
// spreads the fires; neither runs a fire twice.
func TestRuntimeRoutes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		route  string
		spread bool
	}{{"FAILOVER", false}, {"LFU", true}} {
		t.Run(tc.route, func(t *testing.T) {
			srv := etcdtest.Shared(t)
			path := filepath.Join(t.TempDir(), "ledger")
			script := `sh -c '` + strings.ReplaceAll(ledgerTo(path), "$1", "start") + `'`
			yaml := "jobs:\n  - name: routed\n    cron: \"@every 1s\"\n    strategy: " + tc.route + "\n    script: " + etcdtest.YAMLQuote(script) + "\n"
			for _, id := range []string{"a", "b", "c"} {
				instance(t, srv, id, yaml)
			}
			if tc.route == "FAILOVER" {
				// "0" sorts first but never claims (as if stuck): its turn passes.
				memberOnly(t, srv, "0", yaml)
			}
			etcdtest.Eventually(t, 20*time.Second, "eight fires", func() bool { return len(events(t, path)) >= 8 })
			evs := events(t, path)
			fires := map[time.Time]int{}
			on := map[string]int{}
			for _, ev := range evs {
				fires[ev.Fire]++
				on[ev.Instance]++
			}
			for fire, n := range fires {
				if n > 1 {
					t.Errorf("fire %s ran %d times", fire, n)
				}
			}
			if tc.spread && len(on) < 3 {
				t.Errorf("LFU ran on %v, want all three", on)
			}
			if !tc.spread && (len(on) != 1 || on["a"] == 0) {
				t.Errorf("FAILOVER ran on %v, want only a", on)
			}
		})
	}
}

// A hook answering 5xx is retried with backoff up to retries; the run is
// recorded once, as done.
func TestHTTPRetries(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	var mu sync.Mutex
	calls := 0
	var retries []int // the retry number each call's context says
	var firstCall time.Time
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			firstCall = time.Now()
		}
		var rc runner.Context
		json.NewDecoder(r.Body).Decode(&rc)
		retries = append(retries, rc.Retry)
		if calls%3 != 0 { // two failures, then success
			http.Error(w, "try later", http.StatusBadGateway)
		}
	}))
	defer hook.Close()
	node := instance(t, srv, "a", "jobs:\n  - name: hooked\n    retries: 2\n    retryBackoff: 100ms\n    http: {url: '"+hook.URL+"'}\n")
	cli := srv.Client()
	etcdtest.Eventually(t, 10*time.Second, "the instance's map", func() bool {
		v, _ := node.View("hooked")
		return v.Map != nil && len(v.Map.ItemsOf("a")) == 1
	})
	if _, err := admin.New(cli, keyspace.NewKeys("")).Trigger(context.Background(), admin.TriggerRequest{Job: "hooked", By: "test"}); err != nil {
		t.Fatal(err)
	}
	var recs []keyspace.ItemRecord
	etcdtest.Eventually(t, 10*time.Second, "the run to be recorded", func() bool {
		recs, _ = admin.New(cli, keyspace.NewKeys("")).Records(context.Background(), "hooked")
		return len(recs) == 1
	})
	mu.Lock()
	defer mu.Unlock()
	if calls != 3 || recs[0].State != keyspace.StateDone || recs[0].HTTPStatus != 200 || recs[0].Source != keyspace.SourceManual {
		t.Errorf("%d calls, record %+v; want 3 calls and one DONE run", calls, recs[0])
	}
	if !slices.Equal(retries, []int{0, 1, 2}) {
		t.Errorf("the calls said retry %v, want [0 1 2]", retries)
	}
	// The record spans the tries: it starts with the first (before its
	// call) and lasts through both backoffs (100 ms, 200 ms).
	if r := recs[0]; r.Start.After(firstCall) || r.End.Sub(r.Start) < 300*time.Millisecond {
		t.Errorf("record from %s to %s; the first call at %s: want the record to start at the first try", r.Start, r.End, firstCall)
	}
}
