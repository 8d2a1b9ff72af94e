package coord

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Benchmarks run against a real embedded etcd with TTL 2s. Each iteration is
// one trial; they report percentiles of the trials in milliseconds. Run them
// with a fixed count, e.g. -benchtime 20x (make bench does).

// percentiles reports p50, p99 and max of ds.
func percentiles(b *testing.B, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	at := func(p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
	b.ReportMetric(float64(at(0.50))/1e6, "p50-ms")
	b.ReportMetric(float64(at(0.99))/1e6, "p99-ms")
	b.ReportMetric(float64(ds[len(ds)-1])/1e6, "max-ms")
	b.ReportMetric(0, "ns/op") // wall time per trial says nothing here
}

// BenchmarkConvergence measures how long a 3-instance cluster takes until
// every instance's view shows the new map after a join, a graceful leave
// and a crash (a black-holed connection, which etcd sees as a dead client).
func BenchmarkConvergence(b *testing.B) {
	for _, op := range []string{"join", "leave", "crash"} {
		b.Run(op, func(b *testing.B) {
			srv := etcdtest.Start(b)
			cli := srv.Client()
			js := jobs(b, "jobs:\n"+job("orders", 12))
			x := startNode(b, srv, "x", js)
			y := startNode(b, srv, "y", js)
			two := map[string][]int{"x": {0, 1, 2, 3, 4, 5}, "y": {6, 7, 8, 9, 10, 11}}
			three := map[string][]int{"x": {0, 1, 2, 3}, "y": {4, 5, 6, 7}, "z": {8, 9, 10, 11}}
			etcdtest.Eventually(b, 10*time.Second, "x and y", func() bool { return agreed(b, cli, "orders", two, x, y) })
			var trials []time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				switch op {
				case "join":
					start := time.Now()
					z := startNode(b, srv, "z", js)
					etcdtest.Eventually(b, 10*time.Second, "join", func() bool { return agreed(b, cli, "orders", three, x, y, z) })
					trials = append(trials, time.Since(start))
					z.stop(b)
					etcdtest.Eventually(b, 10*time.Second, "reset", func() bool { return agreed(b, cli, "orders", two, x, y) })
				case "leave":
					z := startNode(b, srv, "z", js)
					etcdtest.Eventually(b, 10*time.Second, "setup", func() bool { return agreed(b, cli, "orders", three, x, y, z) })
					start := time.Now()
					z.stop(b)
					etcdtest.Eventually(b, 10*time.Second, "leave", func() bool { return agreed(b, cli, "orders", two, x, y) })
					trials = append(trials, time.Since(start))
				case "crash":
					z := startNode(b, srv, "z", js)
					etcdtest.Eventually(b, 10*time.Second, "setup", func() bool { return agreed(b, cli, "orders", three, x, y, z) })
					start := time.Now()
					z.proxy.Blackhole()
					etcdtest.Eventually(b, 3*testTTL, "crash", func() bool { return agreed(b, cli, "orders", two, x, y) })
					trials = append(trials, time.Since(start))
					z.proxy.Restore()
					z.stop(b)
					etcdtest.Eventually(b, 10*time.Second, "reset", func() bool { return agreed(b, cli, "orders", two, x, y) })
				}
			}
			percentiles(b, trials)
		})
	}
}

// BenchmarkLargeMap measures writing a 10,000-item map and its propagation:
// from a join to every instance holding the new map.
func BenchmarkLargeMap(b *testing.B) {
	const total = 10000
	srv := etcdtest.Start(b)
	cli := srv.Client()
	js := jobs(b, "jobs:\n"+job("big", total))
	x := startNode(b, srv, "x", js)
	y := startNode(b, srv, "y", js)
	hasInstances := func(n int, nodes ...*testNode) bool {
		m := etcdtest.StoredMap(cli, "big")
		if m == nil || len(m.Instances) != n {
			return false
		}
		for _, node := range nodes {
			if v, _ := node.View("big"); v.Map == nil || v.Map.Epoch != m.Epoch {
				return false
			}
		}
		return true
	}
	etcdtest.Eventually(b, 20*time.Second, "setup", func() bool { return hasInstances(2, x, y) })
	var trials []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		start := time.Now()
		z := startNode(b, srv, fmt.Sprintf("z%d", i), js)
		etcdtest.Eventually(b, 20*time.Second, "propagation", func() bool { return hasInstances(3, x, y, z) })
		trials = append(trials, time.Since(start))
		z.stop(b)
		etcdtest.Eventually(b, 20*time.Second, "reset", func() bool { return hasInstances(2, x, y) })
	}
	percentiles(b, trials)
	resp, err := cli.Get(b.Context(), keyspace.NewKeys("").Shards("big"))
	if err == nil && len(resp.Kvs) > 0 {
		b.ReportMetric(float64(len(resp.Kvs[0].Value)), "map-bytes")
	}
}
