package engine

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runner"
)

// stoppable is instanceWith, but returns a graceful stop in cmd/shardd's order.
func stoppable(t *testing.T, cli *clientv3.Client, id, yaml string) (*coord.Node, func()) {
	c, err := config.Parse("jobs.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	node, err := coord.New(coord.Options{Client: cli, ID: id, TTL: 2 * time.Second, Logger: log}, c.Jobs)
	if err != nil {
		t.Fatal(err)
	}
	wd, err := runner.StartWatchdog(os.Args[0], log)
	if err != nil {
		t.Fatal(err)
	}
	eng := New(Options{Node: node, Logger: log, TTL: 2 * time.Second, Watchdog: wd, Sweep: -1})
	nctx, ncancel := context.WithCancel(context.Background())
	ectx, ecancel := context.WithCancel(context.Background())
	engDone, nodeDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(engDone); eng.Run(ectx) }()
	go func() { defer close(nodeDone); node.Run(nctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ecancel()
			lctx, lcancel := context.WithTimeout(context.Background(), 2*time.Second)
			node.Leave(lctx)
			lcancel()
			<-engDone
			ncancel()
			<-nodeDone
			wd.Close()
		})
	}
	t.Cleanup(stop)
	return node, stop
}

// A run whose completion write failed a few times, then a graceful stop of
// its instance: the completion must have landed, so the new owner never
// fails over a run that completed.
func TestCompletedRunDoesNotFailOver(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	script := `sh -c '` + strings.ReplaceAll(ledgerTo(path), "$1", "start") + `'`
	yaml := "jobs:\n  - name: j\n    cron: \"@every 1s\"\n    failover: true\n    script: " + etcdtest.YAMLQuote(script) + "\n"
	_, stopA := stoppable(t, srv.ClientWith([]grpc.DialOption{failCompletions(3)}), "a", yaml)
	etcdtest.Eventually(t, 15*time.Second, "a's first run", func() bool { return starts(path) >= 1 })
	instance(t, srv, "b", yaml)
	time.Sleep(3 * time.Second)
	stopA()
	time.Sleep(5 * time.Second)
	ran := map[time.Time]bool{}
	for _, ev := range events(t, path) {
		t.Logf("run: fire %s on %s attempt %d source %s", ev.Fire.UTC().Format("15:04:05"), ev.Instance, ev.Attempt, ev.Source)
		if ran[ev.Fire] {
			t.Errorf("fire %s ran twice (attempt %d, %s on %s)", ev.Fire.UTC(), ev.Attempt, ev.Source, ev.Instance)
		}
		ran[ev.Fire] = true
	}
	if len(ran) < 5 {
		t.Errorf("%d fires ran in ~8s of an every-second job", len(ran))
	}
	recs, _ := admin.New(srv.Client(), keyspace.NewKeys("")).Records(context.Background(), "j")
	for _, r := range recs {
		t.Logf("history: fire %s %s %s attempt %d on %s", r.Fire.UTC().Format("15:04:05"), r.State, r.Source, r.Attempt, r.Instance)
	}
}
