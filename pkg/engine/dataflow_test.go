package engine

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// drainScript processes a queue file of records, three an iteration: it
// appends each to done with its fence and iteration, keeps its cursor in a
// file, and exits 100 (more) until the queue is empty, then 0.
func drainScript(dir string, sleep string) string {
	return `q=` + dir + `/queue; c=` + dir + `/cursor; d=` + dir + `/done
n=$(cat $c 2>/dev/null || echo 0); total=$(wc -l < $q)
end=$((n+3)); [ $end -gt $total ] && end=$total
sed -n "$((n+1)),${end}p" $q | while read r; do echo "$r $SHARDD_FENCE $SHARDD_ITERATION" >> $d; done
echo $end > $c
sleep ` + sleep + `
[ $end -lt $total ] && exit 100
exit 0`
}

// A streaming run drains a queue in batches under one claim (one fence):
// it repeats while the script exits 100 and stops when the queue is empty;
// every record is processed once, and the record counts the iterations.
func TestStreamingRunDrainsAQueue(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	var queue strings.Builder
	for i := range 10 {
		queue.WriteString("record-" + strconv.Itoa(i) + "\n")
	}
	os.WriteFile(filepath.Join(dir, "queue"), []byte(queue.String()), 0o644)
	node := instance(t, srv, "a", "jobs:\n  - name: drain\n    dataflow: {streaming: true}\n    script: "+etcdtest.YAMLQuote(drainScript(dir, "0"))+"\n")
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 10*time.Second, "the instance's map", func() bool {
		v, _ := node.View("drain")
		return v.Map != nil && len(v.Map.ItemsOf("a")) == 1
	})
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "drain"}); err != nil {
		t.Fatal(err)
	}
	var rec *keyspace.ItemRecord
	etcdtest.Eventually(t, 20*time.Second, "the streaming run to end", func() bool {
		st, err := node.ReadItem(ctx, "drain", 0)
		rec = st.Record
		return err == nil && rec != nil && rec.State == keyspace.StateDone
	})
	if rec.Iterations != 4 {
		t.Errorf("the run's record counts %d iterations, want 4 (10 records, 3 an iteration)", rec.Iterations)
	}
	done := lines(filepath.Join(dir, "done"))
	if len(done) != 10 {
		t.Fatalf("processed %d records, want each of the 10 once: %v", len(done), done)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "done"))
	fence := ""
	for i, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if f[0] != "record-"+strconv.Itoa(i) || f[2] != strconv.Itoa(i/3+1) {
			t.Errorf("line %d: %q, want record-%d in iteration %d", i, l, i, i/3+1)
		}
		if fence != "" && f[1] != fence {
			t.Errorf("line %d: fence %s, want the run's one fence %s", i, f[1], fence)
		}
		fence = f[1]
	}
}

// An instance that joins while a run streams takes the item in the new
// map (it sorts first: AVG_ALLOCATION gives it item 0): the run stops
// between two iterations (DONE, with the iterations it made), and the next
// run, on the new owner, goes on from the work's own cursor: no record is
// processed twice.
func TestStreamingStopsWhenTheMapChanges(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	var queue strings.Builder
	for i := range 30 {
		queue.WriteString("record-" + strconv.Itoa(i) + "\n")
	}
	os.WriteFile(filepath.Join(dir, "queue"), []byte(queue.String()), 0o644)
	yaml := "jobs:\n  - name: drain\n    dataflow: {streaming: true}\n    script: " + etcdtest.YAMLQuote(drainScript(dir, "0.4")) + "\n"
	node := instance(t, srv, "b", yaml)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 10*time.Second, "b's map", func() bool {
		v, _ := node.View("drain")
		return v.Map != nil && len(v.Map.ItemsOf("b")) == 1
	})
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "drain"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "two iterations", func() bool { return len(lines(filepath.Join(dir, "done"))) >= 6 })
	instance(t, srv, "a", yaml) // joins: the new map gives it item 0
	var first *keyspace.ItemRecord
	etcdtest.Eventually(t, 20*time.Second, "the streaming run to stop", func() bool {
		st, err := node.ReadItem(ctx, "drain", 0)
		first = st.Record
		return err == nil && first != nil && first.State == keyspace.StateDone
	})
	if first.Iterations >= 10 || first.Iterations < 2 {
		t.Errorf("the run made %d iterations; want it stopped by the map change (2 to 9 of the 10 the queue needs)", first.Iterations)
	}
	// Runs go on until the queue is drained, from the cursor.
	for range 10 {
		if len(lines(filepath.Join(dir, "done"))) >= 30 {
			break
		}
		if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "drain"}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "done"))
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		r := strings.Fields(l)[0]
		if seen[r] {
			t.Errorf("%s processed twice", r)
		}
		seen[r] = true
	}
	if len(seen) != 30 {
		t.Errorf("%d of the 30 records processed", len(seen))
	}
}

// A shutdown stops a streaming run between two iterations: the iteration
// under way finishes, no other starts, and the run is DONE (its next run
// goes on from the cursor), not KILLED at the end of the grace.
func TestStreamingStopsAtShutdown(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	var queue strings.Builder
	for i := range 60 {
		queue.WriteString("record-" + strconv.Itoa(i) + "\n")
	}
	os.WriteFile(filepath.Join(dir, "queue"), []byte(queue.String()), 0o644)
	c, err := config.Parse("jobs.yaml", []byte("jobs:\n  - name: drain\n    dataflow: {streaming: true}\n    script: "+etcdtest.YAMLQuote(drainScript(dir, "0.5"))+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	node, err := coord.New(coord.Options{Client: srv.Client(), ID: "a", TTL: 2 * time.Second, Logger: log}, c.Jobs)
	if err != nil {
		t.Fatal(err)
	}
	eng := New(Options{Node: node, Logger: log, TTL: 2 * time.Second, ShutdownGrace: 20 * time.Second, Sweep: -1})
	nctx, ncancel := context.WithCancel(context.Background())
	ectx, ecancel := context.WithCancel(nctx)
	nodeDone, engDone := make(chan struct{}), make(chan struct{})
	go func() { defer close(nodeDone); node.Run(nctx) }()
	go func() { defer close(engDone); eng.Run(ectx) }()
	defer func() { ecancel(); <-engDone; ncancel(); <-nodeDone }()

	ctx := context.Background()
	etcdtest.Eventually(t, 10*time.Second, "the instance's map", func() bool {
		v, _ := node.View("drain")
		return v.Map != nil && len(v.Map.ItemsOf("a")) == 1
	})
	if _, err := admin.New(srv.Client(), keyspace.NewKeys("")).Trigger(ctx, admin.TriggerRequest{Job: "drain"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 20*time.Second, "the second iteration", func() bool { return len(lines(filepath.Join(dir, "done"))) > 3 })
	stopped := time.Now()
	ecancel()
	select {
	case <-engDone:
	case <-time.After(15 * time.Second):
		t.Fatal("the engine did not stop within 15 s of its shutdown: the stream went on")
	}
	t.Logf("engine stopped %s after its shutdown began", time.Since(stopped).Round(time.Millisecond))
	st, err := node.ReadItem(ctx, "drain", 0)
	if err != nil || st.Record == nil {
		t.Fatalf("read item: %v %+v", err, st)
	}
	if st.Record.State != keyspace.StateDone || st.Record.Iterations >= 20 {
		t.Errorf("record %s after %d iterations, want DONE before the queue's 20 iterations", st.Record.State, st.Record.Iterations)
	}
	if n := len(lines(filepath.Join(dir, "done"))); n >= 60 {
		t.Errorf("the stream processed all %d records: it did not stop at shutdown", n)
	}
}
