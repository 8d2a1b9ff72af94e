// Command benchreport runs shardd's benchmarks and measures its resource
// use, then writes bench/results.json and bench/results.md. `make bench`
// runs it.
//
// Methodology: the Go benchmarks of pkg/coord, pkg/engine and pkg/runlog run with a
// fixed count of trials (-benchtime Nx) and report percentiles of their
// trials; see their doc comments. Resource use is measured on separate
// processes built from this tree: one etcd (testetcd) and shardd instances
// whose jobs never fire during the measurement (a yearly schedule), so the
// numbers are the cost of membership, leadership and watches alone. After
// the maps converge and a warm-up, RSS is read from /proc/<pid>/status and
// CPU as the utime+stime delta over the window, per shardd process.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

type benchResult struct {
	Name    string             `json:"name"`
	Trials  int                `json:"trials"`
	Metrics map[string]float64 `json:"metrics"`
}

type resourceResult struct {
	Scenario      string  `json:"scenario"`
	Jobs          int     `json:"jobs"`
	Instances     int     `json:"instances"`
	ConvergeSecs  float64 `json:"convergeSeconds"`
	Error         string  `json:"error,omitempty"`
	RSSMiBPerInst float64 `json:"rssMiBPerInstance"`
	// StatusSecs is how long `shardd status` took once the maps converged.
	StatusSecs    float64 `json:"statusSeconds,omitempty"`
	StatusError   string  `json:"statusError,omitempty"`
	CPUPctPerInst float64 `json:"cpuPercentPerInstance"`
	WindowSecs    float64 `json:"windowSeconds"`
	// The CPU-seconds etcd and each shardd (on average) used from the start
	// to converged maps: a cold start on a saturated machine is their sum.
	StartEtcdCPUSecs  float64 `json:"startEtcdCpuSeconds,omitempty"`
	StartShardCPUSecs float64 `json:"startShardCpuSecondsPerInstance,omitempty"`
	// Items is each job's shardingTotalCount; EtcdDBMiB etcd's database
	// size once converged.
	Items     int     `json:"items,omitempty"`
	EtcdDBMiB float64 `json:"etcdDbMiB,omitempty"`
	// RestartSecs is, after a kill -9 of one instance and its start again,
	// how long until every item it owned of the probe jobs (firing every
	// second) ran again, on it or another instance.
	RestartSecs float64 `json:"restartSeconds,omitempty"`
}

// scenario is a resource measurement: jobs jobs of items items over n
// instances, idle (a yearly cron), measured over window once converged;
// with restart, probe jobs fire every second and one instance is killed
// and started again after the window.
type scenario struct {
	name             string
	jobs, items, n   int
	window, converge time.Duration
	restart          bool
}

type report struct {
	Date       string           `json:"date"`
	Machine    string           `json:"machine"`
	GoVersion  string           `json:"goVersion"`
	BenchTime  string           `json:"benchtime"`
	Benchmarks []benchResult    `json:"benchmarks"`
	Delays     []delayResult    `json:"delays"`
	Resources  []resourceResult `json:"resources"`
}

func main() {
	benchtime := flag.String("benchtime", "20x", "trials per benchmark")
	short := flag.Bool("short", false, "smaller resource scenarios (CI)")
	out := flag.String("out", "bench", "output directory")
	one := flag.String("resources", "", "measure only this resource scenario, `JOBSxINSTANCES` (e.g. 10000x3), print it and write nothing")
	items = flag.Int("items", 3, "with -resources: each job's shardingTotalCount")
	restart = flag.Bool("restart", false, "with -resources: add 30 probe jobs firing every second, and after the idle window kill -9 one instance, start it again and measure until its probe items ran again")
	scale := flag.Bool("scale", false, "the long benchmarks (make bench-scale): storms, 100,000 jobs, a restart at 10,000; with -short a short form (CI); writes scale.json and .md")
	delayOnly := flag.Int("delay", 0, "measure only the fire -> script start delay over this many `fires`, print it and write nothing")
	window = flag.Duration("window", 30*time.Second, "with -resources: the idle window over which CPU is measured (RSS and heap are read at its end)")
	flag.StringVar(&profileDir, "profiles", "", "with -resources: write Go profiles of the instances into this `directory` (CPU of the first 20 s and of the idle window, heap after it), for go tool pprof")
	flag.Parse()
	var err error
	switch {
	case *delayOnly > 0:
		err = runDelay(*delayOnly)
	case *one != "":
		err = runOne(*one)
	case *scale:
		err = runScale(*benchtime, *short, *out)
	default:
		err = run(*benchtime, *short, *out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

// runDelay measures the fire -> script start delay and prints it.
func runDelay(samples int) error {
	dir, err := buildBinaries()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	d, err := fireDelay(dir, samples)
	if err != nil {
		d.Error = err.Error()
	}
	b, _ := json.MarshalIndent(d, "", "  ")
	fmt.Println(string(b))
	return err
}

// runOne measures one resource scenario and prints it.
func runOne(spec string) error {
	var jobs, n int
	if _, err := fmt.Sscanf(spec, "%dx%d", &jobs, &n); err != nil || jobs < 1 || n < 1 {
		return fmt.Errorf("-resources %q: want JOBSxINSTANCES, e.g. 10000x3", spec)
	}
	dir, err := buildBinaries()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	r, err := measure(dir, scenario{name: spec, jobs: jobs, items: *items, n: n, window: *window, converge: 15 * time.Minute, restart: *restart})
	if err != nil {
		r.Error = err.Error()
	}
	b, _ := json.MarshalIndent(r, "", "  ")
	fmt.Println(string(b))
	return err
}

// buildBinaries builds shardd and testetcd from this tree into a new
// temporary directory.
func buildBinaries() (string, error) {
	dir, err := os.MkdirTemp("", "shardd-benchreport")
	if err != nil {
		return "", err
	}
	for bin, pkg := range map[string]string{"shardd": "./cmd/shardd", "testetcd": "./internal/etcdtest/testetcd"} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, bin), pkg).CombinedOutput(); err != nil {
			os.RemoveAll(dir)
			return "", fmt.Errorf("build %s: %v\n%s", pkg, err, out)
		}
	}
	return dir, nil
}

func run(benchtime string, short bool, out string) error {
	rep := report{Date: time.Now().UTC().Format(time.RFC3339), Machine: machine(), GoVersion: runtime.Version(), BenchTime: benchtime}
	benches, err := goBench(benchtime, ".", nil, "./pkg/coord", "./pkg/engine", "./pkg/runlog")
	if err != nil {
		return err
	}
	rep.Benchmarks = benches

	dir, err := buildBinaries()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	scenarios := []scenario{
		{"idle daemon, 100 jobs", 100, 3, 1, 30 * time.Second, 2 * time.Minute, false},
		{"10,000 jobs over 3 instances", 10000, 3, 3, 30 * time.Second, 5 * time.Minute, false},
	}
	if short {
		scenarios[0].window = 5 * time.Second
		scenarios[1].name, scenarios[1].jobs, scenarios[1].window = "1,000 jobs over 3 instances (short form)", 1000, 5*time.Second
	}
	samples := 60
	if short {
		samples = 15
	}
	fmt.Printf("== delay: fire -> script start, %d fires\n", samples)
	d, err := fireDelay(dir, samples)
	if err != nil {
		d.Error = err.Error()
		fmt.Printf("   %v\n", err)
	}
	fmt.Printf("   p50 %.2f ms, p99 %.2f ms, max %.2f ms (fork+exec+bash floor: p50 %.2f ms, p99 %.2f ms)\n", d.P50ms, d.P99ms, d.MaxMs, d.FloorP50ms, d.FloorP99ms)
	rep.Delays = append(rep.Delays, d)
	rep.Resources = measureAll(dir, scenarios)

	return writeReport(out, "results", rep, goals)
}

// runScale runs make bench-scale: the storms (BenchmarkStorm), then the
// resource scenarios of 100,000 jobs and of a restart.
func runScale(benchtime string, short bool, out string) error {
	rep := report{Date: time.Now().UTC().Format(time.RFC3339), Machine: machine(), GoVersion: runtime.Version(), BenchTime: benchtime}
	env := "SHARDD_BENCH_SCALE=1"
	if short {
		env = "SHARDD_BENCH_SCALE=short"
	}
	benches, err := goBench(benchtime, "Storm", []string{env}, "./pkg/engine")
	if err != nil {
		return err
	}
	rep.Benchmarks = benches
	dir, err := buildBinaries()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	scenarios := []scenario{
		{"100,000 one-item jobs over 3 instances", 100000, 1, 3, 30 * time.Second, 15 * time.Minute, false},
		{"10,000 jobs over 3 instances, one killed and started again", 10000, 3, 3, 10 * time.Second, 5 * time.Minute, true},
	}
	if short {
		scenarios[0].name, scenarios[0].jobs, scenarios[0].window = "10,000 one-item jobs over 3 instances (short form)", 10000, 5*time.Second
		scenarios[1].name, scenarios[1].jobs = "2,000 jobs over 3 instances, one killed and started again (short form)", 2000
	}
	rep.Resources = measureAll(dir, scenarios)
	return writeReport(out, "scale", rep, scaleGoals(short))
}

// measureAll measures each scenario in turn; a failed one is recorded in
// its result, not fatal: a scenario beyond this machine is a result too.
func measureAll(bin string, scenarios []scenario) []resourceResult {
	var out []resourceResult
	for _, sc := range scenarios {
		fmt.Printf("== resources: %s\n", sc.name)
		r, err := measure(bin, sc)
		if err != nil {
			r.Error = err.Error()
			fmt.Printf("   %v\n", err)
		}
		fmt.Printf("   converged in %.1fs; per instance: RSS %.1f MiB, CPU %.2f%%; restart %.1fs\n", r.ConvergeSecs, r.RSSMiBPerInst, r.CPUPctPerInst, r.RestartSecs)
		out = append(out, r)
	}
	return out
}

// writeReport writes rep as out/name.json and, with goals' table, as
// out/name.md, and prints the markdown.
func writeReport(out, name string, rep report, goals []goal) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	b, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(filepath.Join(out, name+".json"), b, 0o644); err != nil {
		return err
	}
	md := markdown(rep, goals)
	if err := os.WriteFile(filepath.Join(out, name+".md"), []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Println(md)
	fmt.Printf("wrote %s.json and %s.md\n", filepath.Join(out, name), filepath.Join(out, name))
	return nil
}

var (
	benchLine = regexp.MustCompile(`^(Benchmark\S+?)(-\d+)?\s+(\d+)\s+(.*)$`)
	benchName = regexp.MustCompile(`^(Benchmark\S+)`)
	countLine = regexp.MustCompile(`^\d+\s+\S`)
)

// goBench runs the benchmarks, streaming their output, and parses it.
func goBench(benchtime, pattern string, env []string, pkgs ...string) ([]benchResult, error) {
	cmd := exec.Command("go", append([]string{"test", "-run", "^$", "-bench", pattern, "-benchtime", benchtime, "-timeout", "2h"}, pkgs...)...)
	cmd.Env = append(os.Environ(), env...)
	var buf bytes.Buffer
	cmd.Stdout = io.MultiWriter(os.Stdout, &buf)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go test -bench: %w", err)
	}
	var out []benchResult
	s := bufio.NewScanner(&buf)
	pending := "" // a benchmark name whose numbers a log line pushed to a later line
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if n := benchName.FindStringSubmatch(line); n != nil && benchLine.FindStringSubmatch(line) == nil {
			pending = n[1]
			continue
		}
		if pending != "" && countLine.MatchString(line) {
			line, pending = pending+" "+line, ""
		}
		m := benchLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		trials, _ := strconv.Atoi(m[3])
		r := benchResult{Name: strings.TrimPrefix(m[1], "Benchmark"), Trials: trials, Metrics: map[string]float64{}}
		f := strings.Fields(m[4])
		for i := 0; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil && f[i+1] != "ns/op" {
				r.Metrics[f[i+1]] = v
			}
		}
		out = append(out, r)
	}
	return out, nil
}

// profileDir, when set, receives the instances' profiles (-profiles).
var profileDir string

// window is -resources' idle window (-window), items its jobs' items
// (-items), restart whether it measures a restart (-restart).
var (
	window  *time.Duration
	items   *int
	restart *bool
)

// fetchProfile saves the Go profile at url (a shardd's --pprof-listen) as
// file in profileDir, reporting a failure on stderr only: a profile is an
// aid to the measurement, not part of it.
func fetchProfile(url, file string) {
	resp, err := http.Get(url)
	if err == nil {
		defer resp.Body.Close()
		var f *os.File
		if f, err = os.Create(filepath.Join(profileDir, file)); err == nil {
			_, err = io.Copy(f, resp.Body)
			f.Close()
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchreport: profile %s: %v\n", file, err)
	}
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// measure runs n shardd instances with jobs idle jobs on a fresh etcd:
// the cold start to converged maps, shardd status, the idle window, and
// with sc.restart a kill -9 and restart of one instance.
func measure(bin string, sc scenario) (resourceResult, error) {
	r := resourceResult{Scenario: sc.name, Jobs: sc.jobs, Items: sc.items, Instances: sc.n, WindowSecs: sc.window.Seconds()}
	work, err := os.MkdirTemp("", "shardd-bench-res")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(work)
	etcd, client, err := startEtcd(bin, work)
	if err != nil {
		return r, err
	}
	defer func() { etcd.Process.Kill(); etcd.Wait() }()
	cfgPath, jobs, err := writeIdleJobs(work, sc)
	if err != nil {
		return r, err
	}
	cli, err := coord.NewClient(coord.ClientOptions{Endpoints: []string{client}})
	if err != nil {
		return r, err
	}
	defer cli.Close()

	start := time.Now()
	c := &cluster{bin: bin, cfgPath: cfgPath, client: client}
	defer c.stop()
	if err := c.start(sc.n); err != nil {
		return r, err
	}
	if err := awaitConverged(cli, jobs, sc.n, sc.converge-time.Since(start)); err != nil {
		r.RSSMiBPerInst = c.sum(rssMiB) / float64(sc.n)
		return r, fmt.Errorf("%w (RSS per instance then %.0f MiB, %.0f CPU-seconds used)", err, r.RSSMiBPerInst, c.sum(cpuSeconds)/float64(sc.n))
	}
	r.ConvergeSecs = time.Since(start).Seconds()
	r.StartEtcdCPUSecs = cpuSeconds(etcd.Process.Pid)
	r.StartShardCPUSecs = c.sum(cpuSeconds) / float64(sc.n)

	st := time.Now()
	status := exec.Command(filepath.Join(bin, "shardd"), "status", "--etcd", client)
	if out, err := status.CombinedOutput(); err != nil {
		// A result, not the end of the scenario: the rest is measured.
		r.StatusError = fmt.Sprintf("%v: %s", err, firstLine(out))
	}
	r.StatusSecs = time.Since(st).Seconds()

	r.RSSMiBPerInst, r.CPUPctPerInst = c.idle(sc.window)
	if st, err := cli.Status(context.Background(), strings.TrimPrefix(client, "http://")); err == nil {
		r.EtcdDBMiB = float64(st.DbSize) / (1 << 20)
	}
	if sc.restart {
		get := func(key string) ([]byte, bool) {
			resp, err := cli.Get(context.Background(), key)
			if err != nil || len(resp.Kvs) == 0 {
				return nil, false
			}
			return resp.Kvs[0].Value, true
		}
		if r.RestartSecs, err = c.restartLast(get); err != nil {
			return r, err
		}
	}
	return r, nil
}

// startEtcd starts the test etcd binary with its data in work and returns
// it with its client URL once it is ready.
func startEtcd(bin, work string) (*exec.Cmd, string, error) {
	client := "http://" + freeAddr()
	etcd := exec.Command(filepath.Join(bin, "testetcd"), "--data-dir", filepath.Join(work, "etcd"), "--client-url", client, "--peer-url", "http://"+freeAddr())
	etcdOut, _ := etcd.StdoutPipe()
	if err := etcd.Start(); err != nil {
		return nil, "", err
	}
	if line, _ := bufio.NewReader(etcdOut).ReadString('\n'); !strings.HasPrefix(line, "ready") {
		etcd.Process.Kill()
		etcd.Wait()
		return nil, "", fmt.Errorf("etcd did not start")
	}
	return etcd, client, nil
}

// writeIdleJobs writes the scenario's job file (sc.jobs jobs that never
// fire, and with sc.restart the probe jobs firing every second) and
// returns its path and the number of jobs whose maps must converge.
func writeIdleJobs(work string, sc scenario) (path string, jobs int, err error) {
	var cfg strings.Builder
	cfg.WriteString("jobs:\n")
	for i := 0; i < sc.jobs; i++ {
		fmt.Fprintf(&cfg, "  - name: job-%05d\n    cron: \"0 0 0 1 1 ?\"\n    shardingTotalCount: %d\n    script: [/bin/true]\n", i, sc.items)
	}
	jobs = sc.jobs
	if sc.restart {
		for i := range probeJobs {
			fmt.Fprintf(&cfg, "  - name: probe-%02d\n    cron: \"@every 1s\"\n    shardingTotalCount: 3\n    script: [/bin/true]\n", i)
		}
		jobs += probeJobs // converged: theirs too
	}
	path = filepath.Join(work, "jobs.yaml")
	return path, jobs, os.WriteFile(path, []byte(cfg.String()), 0o644)
}

// cluster is the scenario's shardd instances, i0 to i(n-1), with their
// profile servers when -profiles is set.
type cluster struct {
	bin, cfgPath, client string
	procs                []*exec.Cmd
	pprofs               []string
	profiling            sync.WaitGroup
}

func (c *cluster) args(i int) []string {
	return []string{"run", "--config", c.cfgPath, "--etcd", c.client, "--name", fmt.Sprintf("i%d", i),
		"--listen", "", "--log-level", "warn", "--data-dir", filepath.Join(filepath.Dir(c.cfgPath), fmt.Sprintf("data-i%d", i))}
}

// start starts n instances; with -profiles it profiles i0's first 20 s.
func (c *cluster) start(n int) error {
	for i := 0; i < n; i++ {
		args := c.args(i)
		if profileDir != "" {
			addr := freeAddr()
			c.pprofs = append(c.pprofs, "http://"+addr+"/debug/pprof/")
			args = append(args, "--pprof-listen", addr)
		}
		p := exec.Command(filepath.Join(c.bin, "shardd"), args...)
		p.Stderr = io.Discard
		if err := p.Start(); err != nil {
			return err
		}
		c.procs = append(c.procs, p)
	}
	if profileDir == "" {
		return nil
	}
	if err := os.MkdirAll(profileDir, 0o755); err != nil {
		return err
	}
	addr := strings.TrimSuffix(strings.TrimPrefix(c.pprofs[0], "http://"), "/debug/pprof/")
	c.profiling.Go(func() {
		for t0 := time.Now(); time.Since(t0) < 10*time.Second; time.Sleep(50 * time.Millisecond) {
			if conn, err := net.Dial("tcp", addr); err == nil {
				conn.Close() // listening
				break
			}
		}
		fetchProfile(c.pprofs[0]+"profile?seconds=20", "cpu-start-i0.pprof")
	})
	return nil
}

// sum adds f over the instances' processes.
func (c *cluster) sum(f func(pid int) float64) float64 {
	var s float64
	for _, p := range c.procs {
		s += f(p.Process.Pid)
	}
	return s
}

// idle lets leadership hand-overs settle, then measures window: the RSS
// per instance at its end and the CPU per instance over it (and, with
// -profiles, the window's CPU profile and the heaps and goroutines after it).
func (c *cluster) idle(window time.Duration) (rssMiBPer, cpuPctPer float64) {
	time.Sleep(5 * time.Second) // warm-up: leadership hand-overs settle
	cpu0 := c.sum(cpuSeconds)
	if profileDir != "" {
		c.profiling.Go(func() {
			fetchProfile(c.pprofs[0]+fmt.Sprintf("profile?seconds=%d", int(window.Seconds())), "cpu-idle-i0.pprof")
		})
	}
	time.Sleep(window)
	for i, url := range c.pprofs {
		fetchProfile(url+"heap?gc=1", fmt.Sprintf("heap-i%d.pprof", i))
		fetchProfile(url+"goroutine", fmt.Sprintf("goroutine-i%d.pprof", i))
	}
	n := float64(len(c.procs))
	return c.sum(rssMiB) / n, (c.sum(cpuSeconds) - cpu0) / window.Seconds() * 100 / n
}

// restartLast kills the last instance with -9, starts it again and
// returns the time until its items run again (restartTime).
func (c *cluster) restartLast(get func(key string) ([]byte, bool)) (float64, error) {
	last := len(c.procs) - 1
	restarted := exec.Command(filepath.Join(c.bin, "shardd"), c.args(last)...)
	restarted.Stderr = io.Discard
	secs, err := restartTime(get, fmt.Sprintf("i%d", last), c.procs[last], restarted)
	if restarted.Process != nil {
		c.procs[last] = restarted // stopped with the others
	}
	return secs, err
}

// stop interrupts every instance and waits for it and for the profiles.
func (c *cluster) stop() {
	for _, p := range c.procs {
		p.Process.Signal(os.Interrupt)
		p.Wait()
	}
	c.profiling.Wait()
}

// awaitConverged waits until every job's map lists all n instances,
// followed on a watch from before the start: a read of every map at each
// look (as this did before) loaded etcd with 20 MB a look at 10,000 jobs,
// and slowed the start it measured.
func awaitConverged(cli *coord.Client, jobs, n int, timeout time.Duration) error {
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	full := make(chan struct{})
	go func() {
		complete := map[string]bool{}
		admin.New(cli, keyspace.NewKeys("/shardd")).FollowMaps(wctx, 1, func(job string, m *keyspace.ShardMap) bool {
			if m != nil && len(m.Instances) == n {
				complete[job] = true
			} else {
				delete(complete, job)
			}
			if len(complete) == jobs {
				close(full)
				return false
			}
			return true
		})
	}()
	select {
	case <-full:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("maps did not converge within %s", timeout)
	}
}

// probeJobs are the jobs firing every second of a restart scenario.
const probeJobs = 30

// restartTime kills proc (instance id) with SIGKILL, starts again, and
// returns how long until every item of the probe jobs that id owned then
// has a run that started after the kill.
func restartTime(get func(key string) ([]byte, bool), id string, proc, again *exec.Cmd) (float64, error) {
	keys := keyspace.NewKeys("/shardd")
	type item struct {
		job  string
		item int
	}
	var owned []item
	for i := range probeJobs {
		job := fmt.Sprintf("probe-%02d", i)
		val, ok := get(keys.Shards(job))
		if !ok {
			return 0, fmt.Errorf("the map of %s: not read", job)
		}
		var m keyspace.ShardMap
		if err := json.Unmarshal(val, &m); err != nil {
			return 0, err
		}
		for _, it := range m.ItemsOf(id) {
			owned = append(owned, item{job, it})
		}
	}
	if len(owned) == 0 {
		return 0, fmt.Errorf("%s owns no probe item", id)
	}
	killed := time.Now()
	proc.Process.Kill()
	proc.Wait()
	if err := again.Start(); err != nil {
		return 0, err
	}
	for time.Since(killed) < 2*time.Minute {
		left := 0
		for _, it := range owned {
			val, ok := get(keys.Item(it.job, it.item))
			var rec keyspace.ItemRecord
			if !ok || json.Unmarshal(val, &rec) != nil || !rec.Start.After(killed) {
				left++
			}
		}
		if left == 0 {
			return time.Since(killed).Seconds(), nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0, fmt.Errorf("%d probe items of %s had not run again 2 minutes after its kill", len(owned), id)
}

func firstLine(b []byte) string {
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return line
}

func rssMiB(pid int) float64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// cpuSeconds is utime+stime of pid, from /proc/<pid>/stat.
func cpuSeconds(pid int) float64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100 // USER_HZ
}

func machine() string {
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				cpu = strings.TrimSpace(strings.SplitN(line, ":", 2)[1])
				break
			}
		}
	}
	return fmt.Sprintf("%d cores (%s), %s/%s", runtime.NumCPU(), cpu, runtime.GOOS, runtime.GOARCH)
}

func markdown(r report, goals []goal) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured %s on %s, %s, benchmarks with -benchtime %s.\n\n", r.Date, r.Machine, r.GoVersion, r.BenchTime)
	b.WriteString(goalsTable(r, goals))
	b.WriteString("\nAll figures:\n\n")
	b.WriteString("| benchmark | trials | p50 ms | p99 ms | max ms | other |\n|---|---|---|---|---|---|\n")
	for _, x := range r.Benchmarks {
		var other []string
		for _, k := range []string{"exec/s", "etcd-req/exec", "keepalive-req/exec", "runs", "map-bytes", "missed-fires", "p99-floor-ms", "p99/floor"} {
			if v, ok := x.Metrics[k]; ok {
				other = append(other, fmt.Sprintf("%s %.4g", k, v))
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %.4g | %.4g | %.4g | %s |\n", x.Name, x.Trials, x.Metrics["p50-ms"], x.Metrics["p99-ms"], x.Metrics["max-ms"], strings.Join(other, ", "))
	}
	if len(r.Delays) > 0 {
		b.WriteString("\n| delay | samples | p50 ms | p99 ms | max ms | floor p50 / p99 ms (fork+exec+bash, no shardd) | how |\n|---|---|---|---|---|---|---|\n")
		for _, x := range r.Delays {
			if x.Error != "" {
				fmt.Fprintf(&b, "| %s | %d | **%s** | | | | %s |\n", x.Scenario, x.Samples, x.Error, x.Command)
				continue
			}
			fmt.Fprintf(&b, "| %s | %d | %.2f | %.2f | %.2f | %.2f / %.2f | %s |\n", x.Scenario, x.Samples, x.P50ms, x.P99ms, x.MaxMs, x.FloorP50ms, x.FloorP99ms, x.Command)
		}
	}
	b.WriteString("\n| resources | jobs x items | instances | maps converged in | RSS per instance | CPU per instance (idle) | `shardd status` | etcd DB | kill -9 + restart: items run again |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, x := range r.Resources {
		if x.Error != "" {
			fmt.Fprintf(&b, "| %s | %d x %d | %d | **%s** | | | | | |\n", x.Scenario, x.Jobs, x.Items, x.Instances, x.Error)
			continue
		}
		status := fmt.Sprintf("%.2f s", x.StatusSecs)
		if x.StatusError != "" {
			status = fmt.Sprintf("**failed after %.1f s: %s**", x.StatusSecs, x.StatusError)
		}
		restart := "-"
		if x.RestartSecs > 0 {
			restart = fmt.Sprintf("%.1f s", x.RestartSecs)
		}
		fmt.Fprintf(&b, "| %s | %d x %d | %d | %.1f s | %.1f MiB | %.2f %% over %.0f s | %s | %.0f MiB | %s |\n", x.Scenario, x.Jobs, x.Items, x.Instances,
			x.ConvergeSecs, x.RSSMiBPerInst, x.CPUPctPerInst, x.WindowSecs, status, x.EtcdDBMiB, restart)
	}
	return b.String()
}
