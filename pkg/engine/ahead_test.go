package engine

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
)

// runLog collects the engine's "run" log records: whether each was
// claimed ahead of its fire.
type runLog struct {
	mu     sync.Mutex
	ahead  int
	onTime int
}

func (l *runLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *runLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *runLog) WithGroup(string) slog.Handler            { return l }
func (l *runLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "run" {
		return nil
	}
	ahead := false
	r.Attrs(func(a slog.Attr) bool {
		ahead = ahead || a.Key == "starts_in"
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	if ahead {
		l.ahead++
	} else {
		l.onTime++
	}
	return nil
}

// Runs are claimed ahead of their fire and start at it, never before.
func TestClaimsAheadOfTheFire(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	logs := &runLog{}
	yaml := `jobs:
  - name: tick
    cron: "* * * * * ?"
    shardingTotalCount: 2
    script: 'echo "$(date +%s%N) $SHARDD_FIRE_TIME" >> ` + dir + `/began-$SHARDD_ITEM'
`
	instance(t, srv, "a", yaml, func(o *Options) { o.Logger = slog.New(logs) })
	etcdtest.Eventually(t, 30*time.Second, "8 runs, one claimed ahead", func() bool {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		return logs.ahead > 0 && logs.ahead+logs.onTime >= 8
	})
	runs := 0
	for item := range 2 {
		b, _ := os.ReadFile(filepath.Join(dir, "began-"+strconv.Itoa(item)))
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			f := strings.Fields(line)
			if len(f) != 2 {
				continue
			}
			ns, _ := strconv.ParseInt(f[0], 10, 64)
			fire, err := time.Parse(time.RFC3339, f[1])
			if err != nil {
				t.Fatal(err)
			}
			runs++
			t.Logf("item %d: fire %s began %s after it", item, fire.Format(time.TimeOnly), time.Unix(0, ns).Sub(fire))
			if began := time.Unix(0, ns); began.Before(fire) {
				t.Errorf("item %d: the fire of %s began at %s, before it", item, fire.Format(time.TimeOnly), began.Format("15:04:05.000000"))
			}
		}
	}
	if runs == 0 {
		t.Error("no run recorded its start")
	}
}
