package engine

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/runlog"
)

// A run's whole output, stdout and stderr apart, and its retries are in its
// run log, which ends with how the run ended; the history keeps the tail.
func TestRunLogHasTheWholeRun(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	store, err := runlog.New(filepath.Join(t.TempDir(), "runs"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	var mu sync.Mutex
	var runs []Run
	yaml := `jobs:
  - name: noisy
    cron: "@every 10s"
    retries: 1
    retryBackoff: 100ms
    script: "seq 1 20000; echo warn >&2; [ \"$SHARDD_RETRY\" = 1 ] || exit 4"
`
	instance(t, srv, "a", yaml, func(o *Options) {
		o.RunLogs = store
		o.Observe = func(r Run) { mu.Lock(); runs = append(runs, r); mu.Unlock() }
	})
	etcdtest.Eventually(t, 30*time.Second, "a run", func() bool { mu.Lock(); defer mu.Unlock(); return len(runs) > 0 })
	entries, err := os.ReadDir(filepath.Join(store.Dir(), "noisy"))
	if err != nil || len(entries) != 1 {
		t.Fatalf("run logs of noisy: %v (%v), want one", entries, err)
	}
	f, err := os.Open(filepath.Join(store.Dir(), "noisy", entries[0].Name()))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := runlog.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	out, errb := runlog.Streams(recs)
	var want strings.Builder
	for try := 0; try < 2; try++ {
		for i := 1; i <= 20000; i++ {
			want.WriteString(strconv.Itoa(i) + "\n")
		}
	}
	if string(out) != want.String() {
		t.Errorf("stdout in the run log: %d bytes, want both tries' %d", len(out), want.Len())
	}
	if string(errb) != "warn\nwarn\n" {
		t.Errorf("stderr in the run log: %q", errb)
	}
	var notes []string
	for _, r := range recs {
		if r.Tag == "shardd" {
			notes = append(notes, string(r.Text))
		}
	}
	if len(notes) != 3 || !strings.HasPrefix(notes[0], "run job=noisy item=0 fence=") ||
		!strings.HasPrefix(notes[1], "retry 1 in 100ms, after: exit status 4") || !strings.HasPrefix(notes[2], "end state=DONE exit=0 start=") || !strings.Contains(notes[2], ` tries=`) || !strings.Contains(notes[2], ` last="warn"`) {
		t.Errorf("shardd records:\n%s", strings.Join(notes, "\n"))
	}
	mu.Lock()
	tail := runs[0].Result.Output
	mu.Unlock()
	if len(tail) > 4200 || !strings.Contains(tail, "20000\n") {
		t.Errorf("history tail: %d bytes, ending %q", len(tail), tail[max(0, len(tail)-20):])
	}
}
