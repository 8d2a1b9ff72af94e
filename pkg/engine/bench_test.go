package engine

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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

// storms collects, by fire time, the fire-to-start delays of the runs of a
// storm: every job due at the same second.
type storms struct {
	mu       sync.Mutex
	delays   map[int64][]time.Duration // by fire, Unix seconds
	prepared map[int64][]time.Duration
}

func (s *storms) observe(run Run) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.delays == nil {
		s.delays = map[int64][]time.Duration{}
	}
	d := time.Duration(-1) // ran, but never started (a failure): counted, not timed
	if !run.Started.IsZero() {
		d = run.Started.Sub(run.Fire)
	}
	s.delays[run.Fire.Unix()] = append(s.delays[run.Fire.Unix()], d)
	if os.Getenv("SHARDD_BENCH_STORM_DEBUG") != "" {
		if s.prepared == nil {
			s.prepared = map[int64][]time.Duration{}
		}
		s.prepared[run.Fire.Unix()] = append(s.prepared[run.Fire.Unix()], run.Result.Prepared.Sub(run.Fire))
	}
}

func (s *storms) of(fire time.Time) []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.delays[fire.Unix()]...)
}

// stormPeriod is how often a storm's jobs are all due: at :00, :20, :40.
const stormPeriod = 20 * time.Second

// BenchmarkStorm: jobs jobs due at the same second (every stormPeriod), on
// one or three instances; each iteration is one storm. It reports the
// fire-to-start delays and, for scripts, the floor: as many shells
// started at a whole second by a plain loop of this process, no shardd
// (p99-floor-ms, and p99/floor).
func BenchmarkStorm(b *testing.B) {
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer hook.Close()
	// No idle connections kept: 10,000 jobs each keep their own (a
	// runner per job), twice in this process (client and server), which
	// outgrows the open files a test may have here.
	hook.Config.SetKeepAlivesEnabled(false)
	for _, tc := range []struct {
		name            string
		jobs, instances int
		work            string
		floor           bool
	}{
		{"1000jobs-script-1instance", 1000, 1, "script: 'true'", true},
		{"10000jobs-http-3instances", 10000, 3, "http: {url: '" + hook.URL + "'}", false},
		{"2000jobs-http-3instances", 2000, 3, "http: {url: '" + hook.URL + "'}", false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			// make bench-scale runs them: SHARDD_BENCH_SCALE=1, or =short
			// for its short form (CI), with the smaller HTTP storm.
			scale := os.Getenv("SHARDD_BENCH_SCALE")
			if scale == "" || (tc.jobs == 10000 && scale == "short") || (tc.jobs == 2000 && scale != "short") {
				b.Skip("make bench-scale runs it (SHARDD_BENCH_SCALE=1, or short)")
			}
			raiseFileLimit(b, uint64(8*tc.jobs+4096))
			var st storms
			srv := etcdtest.Start(b)
			var yaml strings.Builder
			yaml.WriteString("jobs:\n")
			for i := range tc.jobs {
				fmt.Fprintf(&yaml, "  - name: storm-%05d\n    cron: '0/%d * * * * ?'\n    %s\n", i, int(stormPeriod.Seconds()), tc.work)
			}
			for _, id := range []string{"a", "b", "c"}[:tc.instances] {
				// The daemon's default TTL: at the tests' 2 s, a loaded 2-core
				// machine's sessions fence themselves mid-storm.
				startEngineTTL(b, srv.Client(), id, yaml.String(), 10*time.Second, func(o *Options) {
					o.Observe = st.observe
					if n, err := strconv.Atoi(os.Getenv("SHARDD_BENCH_MAX_STARTS")); err == nil {
						o.MaxStarts = n // to measure the bound (limits.go)
					}
				})
			}
			waitMaps(b, srv.Client(), tc.jobs, 5*time.Minute)
			var all, floors []time.Duration
			missed := 0
			b.ResetTimer()
			for range b.N {
				// The next storm at least 3 s away (the maps settled).
				fire := time.Now().Add(3 * time.Second).Truncate(stormPeriod).Add(stormPeriod)
				time.Sleep(time.Until(fire))
				// Runs are observed once their outcome is recorded:
				// waited for until just before the next storm.
				ds := waitStorm(&st, fire, tc.jobs, stormPeriod-2*time.Second)
				if prev := fire.Add(-stormPeriod); len(st.of(prev)) > 0 {
					b.Logf("the storm before, at %s: %d runs observed by now", prev.Format(time.TimeOnly), len(st.of(prev)))
				}
				missed += tc.jobs - len(ds)
				if len(ds) > 0 {
					sorted := slices.Sorted(slices.Values(ds))
					b.Logf("storm at %s: %d runs, p50 %s, p99 %s, max %s", fire.Format(time.TimeOnly), len(ds),
						sorted[len(sorted)/2], sorted[len(sorted)*99/100], sorted[len(sorted)-1])
					st.mu.Lock()
					if p := slices.Sorted(slices.Values(st.prepared[fire.Unix()])); len(p) > 0 {
						b.Logf("  prepared (from the fire): min %s p50 %s p99 %s max %s", p[0], p[len(p)/2], p[len(p)*99/100], p[len(p)-1])
					}
					st.mu.Unlock()
				}
				all = append(all, ds...)
				if tc.floor {
					floors = append(floors, shellFloor(b, tc.jobs)...)
				}
			}
			b.StopTimer()
			report(b, all)
			b.ReportMetric(float64(missed), "missed-fires")
			if len(floors) > 0 {
				slices.Sort(floors)
				slices.Sort(all)
				p99 := func(ds []time.Duration) float64 { return float64(ds[min(len(ds)-1, len(ds)*99/100)]) / 1e6 }
				b.ReportMetric(p99(floors), "p99-floor-ms")
				if len(all) > 0 {
					b.ReportMetric(p99(all)/p99(floors), "p99/floor")
				}
			}
		})
	}
}

// waitMaps waits until jobs jobs have a shard map.
func waitMaps(b *testing.B, cli *clientv3.Client, jobs int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := cli.Get(context.Background(), "/shardd/jobs/", clientv3WithPrefixKeysOnly()...)
		n := 0
		if err == nil {
			for _, kv := range resp.Kvs {
				if strings.HasSuffix(string(kv.Key), "/shards") {
					n++
				}
			}
		}
		if n >= jobs {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d jobs have a map after %s", n, jobs, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitStorm waits, at most timeout after fire, until jobs runs of fire
// were observed, and returns their delays (those that never started
// count as the timeout: a fire that ran late past it is as bad).
func waitStorm(st *storms, fire time.Time, jobs int, timeout time.Duration) []time.Duration {
	for time.Since(fire) < timeout && len(st.of(fire)) < jobs {
		time.Sleep(50 * time.Millisecond)
	}
	ds := st.of(fire)
	for i, d := range ds {
		if d < 0 {
			ds[i] = timeout
		}
	}
	return ds
}

// shellFloor starts n shells (/bin/sh -c true) at the next whole second by
// a plain loop and returns each one's delay from that second to its
// start: what this machine needs to start a storm's processes, no shardd.
func shellFloor(b *testing.B, n int) []time.Duration {
	at := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(at))
	ds := make([]time.Duration, 0, n)
	cmds := make([]*exec.Cmd, 0, n)
	for range n {
		cmd := exec.Command("/bin/sh", "-c", "true")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(at))
		cmds = append(cmds, cmd)
	}
	for _, cmd := range cmds {
		cmd.Wait()
	}
	return ds
}

// raiseFileLimit raises this process's open-file limit to at least n, if
// it may: a storm's instances, its etcd and the hook it calls share this
// process, so a storm of 10,000 hooks holds two descriptors per request
// here (the daemon's unit allows 65,536 for its own side alone).
func raiseFileLimit(b *testing.B, n uint64) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil || l.Cur >= n {
		return
	}
	want := syscall.Rlimit{Cur: n, Max: max(l.Max, n)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		want = syscall.Rlimit{Cur: l.Max, Max: l.Max}
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want)
		b.Logf("open files limited to %d (want %d): %v", l.Max, n, err)
	}
}
