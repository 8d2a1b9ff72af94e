package engine

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Tests of the wakes of doc.go's "What wakes a job" that no other test
// shows: each job here has no schedule, and the engine's tests run with no
// safety net (sweep.go), so that the one event under test is all that can
// make the run happen.

// A concurrency slot given back wakes the jobs that wanted one: under
// --max-concurrency 1, a trigger of job b while job a runs waits, and runs
// when a's run ends (b's own events are long past).
func TestSlotGivenBackWakesAnotherJob(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	line := etcdtest.YAMLQuote(strings.ReplaceAll(ledgerTo(path), "$1", "start"))
	yaml := "jobs:\n  - name: a\n    script: " + etcdtest.YAMLQuote(strings.ReplaceAll(ledgerTo(path), "$1", "start")+"; sleep 2") + "\n  - name: b\n    script: " + line + "\n"
	node := instance(t, srv, "a", yaml, func(o *Options) { o.MaxConcurrency = 1 })
	etcdtest.Eventually(t, 10*time.Second, "the maps", func() bool {
		a, _ := node.View("a")
		b, _ := node.View("b")
		return a.Map != nil && b.Map != nil
	})
	adm, ctx := admin.New(srv.Client(), keyspace.NewKeys("")), context.Background()
	if _, err := adm.Trigger(ctx, admin.TriggerRequest{Job: "a", By: "test"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 5*time.Second, "a's run", func() bool { return len(events(t, path)) == 1 })
	if _, err := adm.Trigger(ctx, admin.TriggerRequest{Job: "b", By: "test"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 6*time.Second, "b's run, once a's ends", func() bool { return len(events(t, path)) == 2 })
	if evs := events(t, path); evs[1].Job != "b" || evs[1].At.Sub(evs[0].At) < 2*time.Second {
		t.Errorf("runs %+v: want b's run after a's 2 s", evs)
	}
}
