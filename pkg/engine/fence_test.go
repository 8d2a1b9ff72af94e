package engine

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/faultproxy"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// An instance cut off from etcd for ~5s fences; a fire comes while it has
// no session. When it is back with the same items the map does not change,
// but the new session wakes the reconcile, which catches the fire up.
func TestFireDuringFenceIsCaughtUp(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	p, err := faultproxy.Start(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	path := filepath.Join(t.TempDir(), "ledger")
	script := `sh -c '` + strings.ReplaceAll(ledgerTo(path), "$1", "start") + `'`
	yaml := "jobs:\n  - name: j\n    cron: \"@every 5s\"\n    script: " + etcdtest.YAMLQuote(script) + "\n"
	node := instanceWith(t, srv.Client("http://"+p.Addr()), "a", yaml)
	etcdtest.Eventually(t, 30*time.Second, "a first run", func() bool { return len(events(t, path)) >= 1 })
	first := events(t, path)[0].Fire
	// Wait until 0.5s after that fire, then cut a off for 4.5s: the next fire lands in the gap.
	time.Sleep(time.Until(first.Add(500 * time.Millisecond)))
	p.Blackhole()
	etcdtest.Eventually(t, 5*time.Second, "a to fence", func() bool { return !node.Up() })
	time.Sleep(time.Until(first.Add(5 * time.Second)))
	time.Sleep(time.Until(first.Add(5500 * time.Millisecond)))
	p.Restore()
	etcdtest.Eventually(t, 10*time.Second, "a up again", func() bool { return node.Up() })
	etcdtest.Eventually(t, 30*time.Second, "a later run", func() bool {
		for _, ev := range events(t, path) {
			if ev.Fire.After(first.Add(6 * time.Second)) {
				return true
			}
		}
		return false
	})
	time.Sleep(time.Second)
	missed := first.Add(5 * time.Second)
	ran := false
	for _, ev := range events(t, path) {
		t.Logf("run: fire %s source %s start %s", ev.Fire.UTC().Format("15:04:05.000"), ev.Source, ev.At.UTC().Format("15:04:05.000"))
		if ev.Fire.Equal(missed) {
			ran = true
		}
	}
	recs, _ := admin.New(srv.Client(), keyspace.NewKeys("")).Records(context.Background(), "j")
	for _, r := range recs {
		t.Logf("history: fire %s %s %s skipped %d", r.Fire.UTC().Format("15:04:05"), r.State, r.Source, r.Skipped)
	}
	if !ran {
		t.Errorf("fire %s (during a ~5s partition) never ran", missed.UTC().Format("15:04:05"))
	}
}
