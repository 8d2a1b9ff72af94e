package engine

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
)

// A NUL in a failed run's output does not stop onFailure.
func TestNulOutputOnFailure(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := `jobs:
  - name: nul
    cron: "@every 1s"
    script: "printf 'x\\000y\\n'; exit 3"
    onFailure:
      command: ` + etcdtest.YAMLQuote(`echo "notified $SHARDD_EXIT_CODE" >> `+filepath.Join(dir, "failures")) + `
`
	instance(t, srv, "a", yaml)
	etcdtest.Eventually(t, 20*time.Second, "onFailure to run", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "failures"))
		return strings.Contains(string(b), "notified 3")
	})
}

// A run that fails before it starts (a hook whose CA file is missing) is
// counted, recorded and notified like any failure.
func TestUnrunnableIsCounted(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	yaml := `jobs:
  - name: badtls
    cron: "@every 1s"
    http:
      url: https://127.0.0.1:1/
      tls: {ca: /nonexistent/ca.pem}
    onFailure:
      command: ` + etcdtest.YAMLQuote(`echo "notified" >> `+filepath.Join(dir, "failures")) + `
`
	var mu sync.Mutex
	var failed int
	node := instance(t, srv, "a", yaml, func(o *Options) {
		o.Observe = func(r Run) {
			mu.Lock()
			if !r.Result.OK {
				failed++
			}
			mu.Unlock()
		}
	})
	etcdtest.Eventually(t, 20*time.Second, "a counted, notified failure", func() bool {
		mu.Lock()
		n := failed
		mu.Unlock()
		b, _ := os.ReadFile(filepath.Join(dir, "failures"))
		return n > 0 && strings.Contains(string(b), "notified")
	})
	recs, err := node.History(t.Context(), "badtls")
	if err != nil || len(recs) == 0 || recs[0].State != "FAILED" || !strings.Contains(recs[0].Error, "ca") {
		t.Errorf("history %+v %v", recs, err)
	}
}
