package engine

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/shardd/shardd/internal/etcdtest"
)

// Execution benchmarks: three instances in this process on a real embedded
// etcd, scripts run through the guard as the daemon runs them. Each
// iteration is one second of firing; run them with a fixed count
// (make bench: -benchtime 20x).

// rpcCounter counts the etcd requests of the clients it is installed in:
// unary calls and opened streams (watches, keepalives). With
// SHARDD_BENCH_RPC_SITES=1 it also counts them by method and by the
// innermost shardd function that made them, and the benchmark logs the
// counts of its timed part (where an execution's requests go).
type rpcCounter struct {
	n atomic.Int64
	// keepalives are the lease keepalives among n: a session's, every
	// TTL/3 whatever runs (KeepAliveOnce opens a stream each).
	keepalives atomic.Int64

	mu    sync.Mutex
	sites map[string]int64 // nil unless SHARDD_BENCH_RPC_SITES is set
}

func (c *rpcCounter) dialOptions() []grpc.DialOption {
	if os.Getenv("SHARDD_BENCH_RPC_SITES") != "" {
		c.sites = map[string]int64{}
	}
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.count(method)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			c.count(method)
			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}

func (c *rpcCounter) count(method string) {
	c.n.Add(1)
	if strings.HasSuffix(method, "/LeaseKeepAlive") {
		c.keepalives.Add(1)
	}
	if c.sites == nil {
		return
	}
	site := "?"
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	for {
		f, more := frames.Next()
		if strings.Contains(f.Function, "github.com/shardd/shardd/pkg/") {
			site = strings.TrimPrefix(f.Function, "github.com/shardd/shardd/pkg/")
			break
		}
		if !more {
			break
		}
	}
	c.mu.Lock()
	c.sites[method[strings.LastIndex(method, "/")+1:]+" "+site]++
	c.mu.Unlock()
}

// snapshotSites returns the counts by method and call site so far.
func (c *rpcCounter) snapshotSites() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.sites)
}

// runs collects observed runs.
type runs struct {
	mu     sync.Mutex
	delays []time.Duration
	done   int
}

func (r *runs) observe(run Run) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done++
	if !run.Started.IsZero() {
		r.delays = append(r.delays, run.Started.Sub(run.Fire))
	}
}

func (r *runs) snapshot() (int, []time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done, append([]time.Duration(nil), r.delays...)
}

func report(b *testing.B, ds []time.Duration) {
	if len(ds) == 0 {
		// Overloaded past the point where any run starts within the window:
		// that is a result (zero runs), not a benchmark failure.
		b.ReportMetric(0, "runs")
		b.ReportMetric(0, "ns/op")
		return
	}
	slices.Sort(ds)
	at := func(p float64) time.Duration { return ds[min(len(ds)-1, int(p*float64(len(ds))))] }
	b.ReportMetric(float64(at(0.50))/1e6, "p50-ms")
	b.ReportMetric(float64(at(0.99))/1e6, "p99-ms")
	b.ReportMetric(float64(ds[len(ds)-1])/1e6, "max-ms")
	b.ReportMetric(float64(len(ds)), "runs")
	b.ReportMetric(0, "ns/op")
}

// cluster starts three instances of yaml and waits until every job has a
// map. It reports false when they did not within two minutes: the box is
// overloaded past the point of converging, a result (see report), not a
// benchmark failure.
func cluster(b *testing.B, yaml string, jobs int, r *runs, cnt *rpcCounter) bool {
	srv := etcdtest.Start(b)
	for _, id := range []string{"a", "b", "c"} {
		instanceWith(b, srv.ClientWith(cnt.dialOptions()), id, yaml, func(o *Options) { o.Observe = r.observe })
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		n := 0
		resp, err := srv.Client().Get(context.Background(), "/shardd/jobs/", clientv3WithPrefixKeysOnly()...)
		if err == nil {
			for _, kv := range resp.Kvs {
				if strings.HasSuffix(string(kv.Key), "/shards") {
					n++
				}
			}
			if n == jobs {
				break
			}
		}
		if time.Now().After(deadline) {
			b.Logf("overloaded: %d of %d jobs have a map after 2 minutes", n, jobs)
			b.ReportMetric(float64(n)/float64(jobs), "maps-fraction")
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // let the first fires and the leader handovers settle
	return true
}

// measure runs b.N one-second windows and reports the fire-to-start delay
// of the runs started in them.
func measure(b *testing.B, r *runs, cnt *rpcCounter) {
	doneBefore, before := r.snapshot()
	reqBefore, kaBefore, sitesBefore := cnt.n.Load(), cnt.keepalives.Load(), cnt.snapshotSites()
	start := time.Now()
	b.ResetTimer()
	time.Sleep(time.Duration(b.N) * time.Second)
	b.StopTimer()
	doneAfter, after := r.snapshot()
	executions := doneAfter - doneBefore
	report(b, after[len(before):])
	b.ReportMetric(float64(executions)/time.Since(start).Seconds(), "exec/s")
	if executions > 0 {
		b.ReportMetric(float64(cnt.n.Load()-reqBefore)/float64(executions), "etcd-req/exec")
		b.ReportMetric(float64(cnt.keepalives.Load()-kaBefore)/float64(executions), "keepalive-req/exec")
	}
	if sites := cnt.snapshotSites(); sites != nil && executions > 0 {
		var lines []string
		for site, n := range sites {
			if d := n - sitesBefore[site]; d > 0 {
				lines = append(lines, fmt.Sprintf("%8.3f  %s", float64(d)/float64(executions), site))
			}
		}
		slices.Sort(lines)
		slices.Reverse(lines)
		b.Logf("etcd requests per execution, by method and call site:\n%s", strings.Join(lines, "\n"))
	}
}

func jobsYAML(n, items int, work string) string {
	var b strings.Builder
	b.WriteString("jobs:\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "  - name: job-%04d\n    cron: \"@every 1s\"\n    shardingTotalCount: %d\n    %s\n", i, items, work)
	}
	return b.String()
}

// BenchmarkFireDelay: scheduled fire to child process start (or request
// sent), for one 6-item job and for 1,000 jobs, every second, 3 instances.
func BenchmarkFireDelay(b *testing.B) {
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer hook.Close()
	for _, tc := range []struct {
		name        string
		jobs, items int
		work        string
	}{
		{"1job-script", 1, 6, "script: [/bin/true]"},
		{"100jobs-script", 100, 1, "script: [/bin/true]"},
		{"1000jobs-script", 1000, 1, "script: [/bin/true]"},
		{"1000jobs-http", 1000, 1, "http: {url: '" + hook.URL + "'}"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r, cnt := &runs{}, &rpcCounter{}
			if !cluster(b, jobsYAML(tc.jobs, tc.items, tc.work), tc.jobs, r, cnt) {
				report(b, nil)
				return
			}
			measure(b, r, cnt)
		})
	}
}

// BenchmarkThroughput: the executions per second three instances sustain
// with a trivial HTTP hook, one job of 3,000 items firing every second.
func BenchmarkThroughput(b *testing.B) {
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer hook.Close()
	r, cnt := &runs{}, &rpcCounter{}
	if !cluster(b, jobsYAML(1, 3000, "http: {url: '"+hook.URL+"'}"), 1, r, cnt) {
		report(b, nil)
		return
	}
	measure(b, r, cnt)
}

func clientv3WithPrefixKeysOnly() []clientv3.OpOption {
	return []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithKeysOnly()}
}
