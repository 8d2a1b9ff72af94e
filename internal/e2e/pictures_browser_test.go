package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/shardd/shardd/internal/browsertest"
	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/ledger"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// The console's pictures in a real browser: a 2-item job with failover on
// two instances; the instance running item 1 is killed -9 mid-run. The
// job's timeline shows that run cut (a jagged end: KILLED/lost, the record
// the failover claim wrote of it) and its failover re-run on the survivor
// (dashed), on item 1's row; the overview's chart
// counts this hour's runs and failures, and lists the failing job.
// ledgerSoFar reads dir's ledger while its jobs write it: nil when a line
// is being written (read again).
func ledgerSoFar(dir string) []ledger.Event {
	f, err := os.Open(filepath.Join(dir, "ledger"))
	if err != nil {
		return nil
	}
	defer f.Close()
	evs, _ := ledger.Parse(f)
	return evs
}

// waitFor polls cond every 100 ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

func TestTimelineAndChartInABrowser(t *testing.T) {
	faultTest(t)
	dir := t.TempDir()
	e := startEtcd(t)
	cfg := filepath.Join(dir, "jobs.yaml")
	os.WriteFile(cfg, []byte(`jobs:
  - name: work
    cron: "@every 5s"
    shardingTotalCount: 2
    failover: true
    script:
      command: `+etcdtest.YAMLQuote(ledgerScript)+`
      env: {LEDGER_DIR: `+etcdtest.YAMLQuote(dir)+`, LEDGER_SLEEP: "3"}
  - name: flaky
    cron: "@every 2s"
    script: 'echo "upstream 504" >&2; exit 1'
`), 0o644)
	tokens := tokenFile(t)
	api := etcdtest.FreeAddr(t)
	a := startShardd(t, e, "a", cfg, "--listen", api, "--api-token-file", tokens)
	b := startShardd(t, e, "b", cfg, "--listen", etcdtest.FreeAddr(t), "--api-token-file", tokens)
	etcdtest.Eventually(t, 20*time.Second, "the map", func() bool {
		return agreed(t, e.client(), "work", map[string][]int{"a": {0}, "b": {1}}, a, b)
	})
	// Two fires run whole, then b dies one second into item 1's run.
	time.Sleep(11 * time.Second)
	// A run of item 1 on b that began less than a second ago: it has two
	// seconds more to go when b dies.
	etcdtest.Eventually(t, 15*time.Second, "item 1 starting on b", func() bool {
		evs := ledgerSoFar(dir)
		for i := len(evs) - 1; i >= 0; i-- {
			if ev := evs[i]; ev.Job == "work" && ev.Item == 1 {
				return ev.Kind == "start" && ev.Instance == "b" && time.Since(ev.At) < time.Second
			}
		}
		return false
	})
	time.Sleep(time.Second)
	b.stop(syscall.SIGKILL)
	killed := time.Now()
	var rerun string
	waitFor(ttl+10*time.Second, func() bool {
		for _, ev := range ledgerSoFar(dir) {
			if ev.Kind == "end" && ev.Job == "work" && ev.Item == 1 && ev.Source == keyspace.SourceFailover && ev.Instance == "a" {
				rerun = fmt.Sprintf("%d-1", ev.Fence)
				return true
			}
		}
		return false
	})
	t.Logf("killed b at %s; failover re-run %s", killed.Format(time.RFC3339Nano), rerun)
	if rerun == "" {
		b, _ := os.ReadFile(filepath.Join(dir, "ledger"))
		t.Fatalf("ledger:\n%s", b)
	}

	base := "http://" + api
	ctx := browsertest.New(t, browsertest.WithTimeout(2*time.Minute), browsertest.WithWindowSize(1280, 900))
	browsertest.Do(t, ctx,
		chromedp.Navigate(base+"/jobs/work"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), bobSecret),
		chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#timeline")),
	)
	cutItems := browsertest.Run(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#timeline polygon.run.cut')].map(e => e.getAttribute('data-item'))`))
	failover := browsertest.Run(t, ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#timeline .run.failover')].map(e => e.getAttribute('data-run'))`))
	if len(cutItems) != 1 || cutItems[0] != "1" {
		t.Errorf("the timeline's cut runs are of items %v, want one of item 1", cutItems)
	}
	found := false
	for _, r := range failover {
		found = found || r == rerun
	}
	if !found {
		t.Errorf("the timeline's failover runs %v lack the re-run %s", failover, rerun)
	}
	// The cut run's tooltip says how it ended.
	title := browsertest.Run(t, ctx, chromedp.Evaluate[string](`document.querySelector('#timeline polygon.run.cut title').textContent`))
	if !strings.Contains(title, "on b, attempt 1") || !strings.Contains(title, "KILLED/lost") || !strings.Contains(title, "run again as attempt 2 (FAILOVER)") {
		t.Errorf("the cut run's title: %q", title)
	}
	browsertest.Do(t, ctx, chromedp.ScrollIntoView(chromedp.CSS("#hist-h")))
	browsertest.Screenshot(t, ctx, "console-timeline")

	// The overview: this hour's runs and failures, and flaky among the
	// jobs that fail. b ran flaky until it was killed, and its runs are
	// not counted (it is gone): the bar counts a's, which begin once a
	// takes flaky over, so the page is read again until a has failed it
	// three times (under the race detector that can take a few seconds
	// more than the failover above).
	hour := time.Now().UTC().Truncate(time.Hour).Format(time.RFC3339)
	var runs, failures, ledgerRuns int
	waitFor(30*time.Second, func() bool {
		// The ledger is read before the page: every run it holds ended
		// before the page was made, so the bar counts it.
		ledgerRuns = 0
		for _, ev := range ledgerSoFar(dir) {
			if ev.Kind == "end" && ev.Instance == "a" && ev.At.UTC().Truncate(time.Hour).Format(time.RFC3339) == hour {
				ledgerRuns++
			}
		}
		browsertest.Do(t, ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#hours")))
		counts := browsertest.Run(t, ctx, chromedp.Evaluate[[]string](`(() => { const g = document.querySelector('#hours g.hour[data-hour="`+hour+`"]'); return g ? [g.dataset.runs, g.dataset.failures] : [] })()`))
		runs, failures = 0, 0
		if len(counts) == 2 {
			fmt.Sscan(counts[0], &runs)
			fmt.Sscan(counts[1], &failures)
		}
		return failures >= 3
	})
	// a's work runs and flaky's failures are all counted.
	if failures < 3 || runs < ledgerRuns+failures {
		t.Errorf("this hour's bar: %d runs, %d failed; a ran %d of work's (ledger) and flaky failed every 2 s", runs, failures, ledgerRuns)
	}
	if u := text(t, ctx, "#unhealthy"); !strings.Contains(u, "flaky") || !strings.Contains(u, "FAILING") {
		t.Errorf("the jobs failing: %q", u)
	}
	browsertest.Screenshot(t, ctx, "console-overview")
	browsertest.NoConsoleErrors(t, ctx)
}
