// Package e2e tests shardd as operators run it: separate shardd processes
// built from this repository, a separate etcd process, and real faults
// (kill -9, SIGSTOP, a black-holed connection, an etcd restart).
package e2e

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/ledger"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/faultproxy"
	"github.com/shardd/shardd/pkg/schedule"
)

// ttl is the session TTL the tests run shardd with.
const ttl = 2 * time.Second

var bin struct{ shardd, etcd string }

func TestMain(m *testing.M) {
	flag.Parse()
	if spec := os.Getenv(attackEnv); spec != "" { // this binary, run as the attacker
		runAttacks(spec)
		os.Exit(0)
	}
	if testing.Short() {
		fmt.Println("e2e: skipped in -short mode")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "shardd-e2e-bin")
	if err != nil {
		panic(err)
	}
	bin.shardd = filepath.Join(dir, "shardd")
	bin.etcd = filepath.Join(dir, "testetcd")
	build := []string{"build"}
	if raceEnabled {
		build = append(build, "-race")
		os.Setenv("GORACE", "log_path="+filepath.Join(dir, "race"))
	}
	for out, pkg := range map[string]string{bin.shardd: "github.com/shardd/shardd/cmd/shardd", bin.etcd: "github.com/shardd/shardd/internal/etcdtest/testetcd"} {
		cmd := exec.Command("go", append(build, "-o", out, pkg)...)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: build", pkg, err)
			os.Exit(1)
		}
	}
	if !raceEnabled {
		// This package bounds its concurrency itself (slots,
		// faultSlot): go test's -parallel only counts the tests that may
		// wait on them, and a fault test waiting for another's end must
		// not keep the tests that could run meanwhile from starting.
		flag.Set("test.parallel", "64")
	}
	code := m.Run()
	if reports, _ := filepath.Glob(filepath.Join(dir, "race.*")); len(reports) > 0 {
		for _, r := range reports {
			b, _ := os.ReadFile(r)
			fmt.Fprintf(os.Stderr, "e2e: a shardd process found a data race (%s):\n%s\n", r, b)
		}
		code = 1
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// etcdProc is an etcd server in its own process.
type etcdProc struct {
	t                  *testing.T
	dir                string
	clientURL, peerURL string
	extra              []string // member name and initial cluster, for a multi-member cluster
	cmd                *exec.Cmd
	ready              *bufio.Reader
}

// startEtcdCluster starts an n-member etcd cluster, one process a member.
func startEtcdCluster(t *testing.T, n int) []*etcdProc {
	members := make([]*etcdProc, n)
	var initial []string
	for i := range members {
		members[i] = newEtcd(t)
		initial = append(initial, fmt.Sprintf("m%d=%s", i, members[i].peerURL))
	}
	for i, m := range members {
		m.extra = []string{"--name", fmt.Sprintf("m%d", i), "--initial-cluster", strings.Join(initial, ",")}
		m.launch()
	}
	for _, m := range members {
		m.waitReady()
	}
	return members
}

func startEtcd(t *testing.T) *etcdProc {
	e := newEtcd(t)
	e.start()
	return e
}

// newEtcd prepares an etcd process without starting it.
func newEtcd(t *testing.T) *etcdProc {
	e := &etcdProc{t: t, dir: t.TempDir(), clientURL: "http://" + etcdtest.FreeAddr(t), peerURL: "http://" + etcdtest.FreeAddr(t)}
	t.Cleanup(func() { e.signal(syscall.SIGKILL) })
	return e
}

func (e *etcdProc) addr() string { return strings.TrimPrefix(e.clientURL, "http://") }

func (e *etcdProc) start() {
	e.t.Helper()
	for attempt := 0; ; attempt++ {
		e.launch()
		if e.waitReady() {
			return
		}
		if attempt == 20 { // the ports of a just-killed etcd can take a moment
			e.t.Fatalf("etcd did not start")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// launch starts the process; waitReady waits for it to serve.
func (e *etcdProc) launch() {
	e.t.Helper()
	args := append([]string{"--data-dir", e.dir, "--client-url", e.clientURL, "--peer-url", e.peerURL}, e.extra...)
	cmd := exec.Command(bin.etcd, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.cmd, e.ready = cmd, bufio.NewReader(out)
}

func (e *etcdProc) waitReady() bool {
	line, _ := e.ready.ReadString('\n')
	if strings.HasPrefix(line, "ready") {
		return true
	}
	e.cmd.Wait()
	e.cmd = nil
	return false
}

func (e *etcdProc) signal(s syscall.Signal) {
	if e.cmd == nil {
		return
	}
	e.cmd.Process.Signal(s)
	if s == syscall.SIGKILL || s == syscall.SIGTERM {
		e.cmd.Wait()
		e.cmd = nil
	}
}

// client returns a client straight to etcd, closed at the end of the test.
func (e *etcdProc) client() *clientv3.Client {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.clientURL}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { cli.Close() })
	return cli
}

// proc is one shardd process, talking to etcd through its own proxy.
type proc struct {
	t       *testing.T
	name    string
	cmd     *exec.Cmd
	proxy   *faultproxy.Proxy   // the first of proxies
	proxies []*faultproxy.Proxy // one per etcd member
	start   time.Time

	mu     sync.Mutex
	logs   []map[string]any
	raw    strings.Builder
	exited chan struct{}
	err    error
}

// startShardd starts `shardd run` with the config file cfg.
func startShardd(t *testing.T, e *etcdProc, name, cfg string, extra ...string) *proc {
	t.Helper()
	return startSharddOn(t, []*etcdProc{e}, ttl, name, cfg, extra...)
}

// startSharddOn starts `shardd run` on the members, each reached through a
// proxy of its own, with session TTL sessionTTL.
func startSharddOn(t *testing.T, members []*etcdProc, sessionTTL time.Duration, name, cfg string, extra ...string) *proc {
	t.Helper()
	var proxies []*faultproxy.Proxy
	var endpoints []string
	for _, m := range members {
		px, err := faultproxy.Start(m.addr())
		if err != nil {
			t.Fatal(err)
		}
		proxies = append(proxies, px)
		endpoints = append(endpoints, "http://"+px.Addr())
	}
	args := append([]string{"run", "--config", cfg, "--etcd", strings.Join(endpoints, ","), "--name", name,
		"--ttl", sessionTTL.String(), "--listen", "", "--log-format", "json", "--run-log-dir", filepath.Join(t.TempDir(), "runs")}, extra...)
	return launchShardd(t, name, args, proxies)
}

// launchShardd starts shardd with args; proxies (may be none) are its
// connections to etcd, closed with it.
func launchShardd(t *testing.T, name string, args []string, proxies []*faultproxy.Proxy) *proc {
	t.Helper()
	p := &proc{t: t, name: name, cmd: exec.Command(bin.shardd, args...), proxies: proxies, exited: make(chan struct{})}
	if len(proxies) > 0 {
		p.proxy = proxies[0]
	}
	p.cmd.Env = append(os.Environ(), "SHARDD_LOG_LEVEL=debug")
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		s := bufio.NewScanner(stderr)
		s.Buffer(make([]byte, 1<<20), 1<<20)
		for s.Scan() {
			var rec map[string]any
			p.mu.Lock()
			p.raw.WriteString(s.Text() + "\n")
			if json.Unmarshal(s.Bytes(), &rec) == nil {
				p.logs = append(p.logs, rec)
			}
			p.mu.Unlock()
		}
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.signal(syscall.SIGCONT)
		p.signal(syscall.SIGKILL)
		<-p.exited
		for _, px := range proxies {
			px.Close()
		}
		if t.Failed() {
			t.Logf("log of %s (INFO and above, as text; the last %d lines):\n%s", name, failureLogLines, p.textLog(failureLogLines))
		}
		p.keepLog()
	})
	return p
}

// keepLog writes p's whole log (JSON lines) into SHARDD_E2E_KEEP, when
// set, for a look after the run: <test>-<name>-<start>.log.
func (p *proc) keepLog() {
	d := os.Getenv("SHARDD_E2E_KEEP")
	if d == "" {
		return
	}
	p.mu.Lock()
	raw := p.raw.String()
	p.mu.Unlock()
	file := fmt.Sprintf("%s-%s-%s.log", strings.ReplaceAll(p.t.Name(), "/", "_"), p.name, p.start.Format("150405.000"))
	if err := os.WriteFile(filepath.Join(d, file), []byte(raw), 0o644); err != nil {
		p.t.Logf("keep the log of %s: %v", p.name, err)
	}
}

// cut black-holes every connection of p to etcd; heal restores them.
func (p *proc) cut() {
	for _, px := range p.proxies {
		px.Blackhole()
	}
}

func (p *proc) heal() {
	for _, px := range p.proxies {
		px.Restore()
	}
}

func (p *proc) signal(s syscall.Signal) {
	select {
	case <-p.exited:
	default:
		p.cmd.Process.Signal(s)
	}
}

// stop sends sig and waits for the process to exit.
func (p *proc) stop(sig syscall.Signal) {
	p.signal(sig)
	p.wait(sig.String())
}

// wait waits for the process to exit, after what (a signal sent).
func (p *proc) wait(after string) {
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		p.t.Fatalf("%s did not exit after %s", p.name, after)
	}
}

// failureLogLines is how many lines of each process's log a failed test
// prints.
const failureLogLines = 150

// textLog renders the last max lines of p's log at INFO and above as text
// ("15:04:05.000 WARN msg key=value ..."): CI keeps a failed run's output
// but drops its JSON lines. Lines that are not JSON are kept as they are.
func (p *proc) textLog(max int) string {
	p.mu.Lock()
	raw := p.raw.String()
	p.mu.Unlock()
	var lines []string
	for _, line := range strings.Split(strings.TrimRight(raw, "\n"), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			lines = append(lines, line)
			continue
		}
		level, _ := rec["level"].(string)
		if level == "DEBUG" {
			continue
		}
		at, _ := rec["time"].(string)
		if ts, err := time.Parse(time.RFC3339Nano, at); err == nil {
			at = ts.UTC().Format("15:04:05.000")
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s %v", at, level, rec["msg"])
		keys := make([]string, 0, len(rec))
		for k := range rec {
			if k != "time" && k != "level" && k != "msg" {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%v", k, rec[k])
		}
		lines = append(lines, b.String())
	}
	if len(lines) > max {
		lines = append([]string{fmt.Sprintf("(%d lines before)", len(lines)-max)}, lines[len(lines)-max:]...)
	}
	return strings.Join(lines, "\n")
}

func (p *proc) rawLog() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.raw.String()
}

// find returns the log records for which match holds.
func (p *proc) find(match func(rec map[string]any) bool) []map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []map[string]any
	for _, r := range p.logs {
		if match(r) {
			out = append(out, r)
		}
	}
	return out
}

func msg(m string) func(map[string]any) bool {
	return func(r map[string]any) bool { return r["msg"] == m }
}

// view returns the epoch and items of the last shard map p logged for job.
func (p *proc) view(job string) (int64, []int) {
	recs := p.find(func(r map[string]any) bool { return r["msg"] == "shard map" && r["job"] == job })
	if len(recs) == 0 {
		return 0, nil
	}
	r := recs[len(recs)-1]
	items := []int{}
	list, _ := r["items"].([]any) // null when the instance owns nothing
	for _, v := range list {
		items = append(items, int(v.(float64)))
	}
	return int64(r["epoch"].(float64)), items
}

// agreed reports whether the stored map of job assigns want and every
// process in procs has logged that map as its view.
func agreed(t *testing.T, cli *clientv3.Client, job string, want map[string][]int, procs ...*proc) bool {
	m := etcdtest.StoredMap(cli, job)
	if m == nil || !reflect.DeepEqual(m.Items, want) {
		return false
	}
	for _, p := range procs {
		epoch, items := p.view(job)
		if epoch != m.Epoch || !reflect.DeepEqual(items, want[p.name]) {
			return false
		}
	}
	return true
}

// writeConfig writes a job file with the given jobs ("name:total" each).
func writeConfig(t *testing.T, jobs ...string) string {
	var b strings.Builder
	b.WriteString("jobs:\n")
	for _, j := range jobs {
		name, total, _ := strings.Cut(j, ":")
		fmt.Fprintf(&b, "  - name: %s\n    shardingTotalCount: %s\n    script: [/bin/true]\n", name, total)
	}
	path := filepath.Join(t.TempDir(), "jobs.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func clientv3WithPrefix() []clientv3.OpOption { return []clientv3.OpOption{clientv3.WithPrefix()} }

// httpGetQuiet fetches url, returning its body on a 200.
func httpGetQuiet(url string) ([]byte, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET %s: %d", url, resp.StatusCode)
	}
	return b, err
}

// policyRecords are shardd's explicit records, in its JSON logs, of fires
// it did not run by policy: skips, cut runs of failover: false jobs (see
// engine's msgSkipped and msgSettled), and runs killed by a fence or at
// the end of a shutdown grace (which count only for failover: false jobs).
func policyRecords(t *testing.T, procs []*proc) []ledger.Record {
	t.Helper()
	var logs []map[string]any
	for _, p := range procs {
		logs = append(logs, p.find(func(map[string]any) bool { return true })...)
	}
	return policyRecordsOf(t, logs)
}

// policyRecordsOf are the policy records among the JSON log records logs.
func policyRecordsOf(t *testing.T, logs []map[string]any) []ledger.Record {
	t.Helper()
	var out []ledger.Record
	parse := func(v any) time.Time {
		s, _ := v.(string)
		at, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatalf("log time %q: %v", s, err)
		}
		return at
	}
	for _, r := range logs {
		if !(r["msg"] == "fires recorded skipped" || r["msg"] == "run cut by a failure; not run again (failover: false)" ||
			r["msg"] == "killed" && (r["reason"] == "fence" || r["reason"] == "shutdown")) {
			continue
		}
		job, _ := r["job"].(string)
		item, _ := r["item"].(float64)
		rec := ledger.Record{Job: job, Item: int(item), At: parse(r["time"]), Why: r["msg"].(string)}
		n, _ := r["skipped"].(float64)
		x, _ := r["excluded"].(float64) // a calendar's: accounted for too
		n += x
		switch r["msg"] {
		case "killed": // the run's fire and those it coalesced
			rec.Why, rec.Through, rec.Count = ledger.WhyKilled, parse(r["fire"]), 1+int(n)
		case "fires recorded skipped":
			rec.Through, rec.Count = parse(r["through"]), int(n)
		default:
			rec.Through, rec.Count = parse(r["fire"]), 1
		}
		out = append(out, rec)
	}
	return out
}

// mustSchedule parses a job's cron spec for the ledger checker.
func mustSchedule(t *testing.T, spec string) schedule.Schedule {
	t.Helper()
	s, err := schedule.Parse(spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// slots bounds how many multi-process tests run at once, whatever go
// test's -parallel: each starts an etcd and shardd processes whose
// sessions (TTL 2 s) fence when the CPU is starved, and three at a time
// keep both cores of the CI machine busy without starving them.
var slots = newSlots(3)

// faultSlot is held by the test that faults processes and judges timings
// (faultTest): one such test at a time.
var faultSlot = make(chan struct{}, 1)

// faultTestSlots is how many slots a fault test holds: it runs beside at
// most one other test, so that the bounds it judges (items moved within
// TTL + 1 s, a due fire started within TTL + 2 s) are not stretched by a
// crowded machine.
const faultTestSlots = 2

// parallel runs t in parallel with the other tests that call it, at most
// cap(slots) at a time. A test that faults processes and judges timings
// calls faultTest instead.
func parallel(t *testing.T) {
	t.Parallel()
	slots.acquire(1, false)
	t.Cleanup(func() { slots.release(1) })
}

// faultTest runs t in parallel with the tests that call parallel, one fault
// test at a time, holding faultTestSlots slots. The fault tests wait on the
// clock (a fire, a lease) far more than they use the CPU; run one after
// the other they were half of the package's time. They go before the
// others (slots serves a waiting fault test first), so that their chain,
// the longest, starts at once.
//
// Under the race detector, whose binaries are slower by several times,
// they run alone, one after the other, as they did before.
func faultTest(t *testing.T) {
	if raceEnabled {
		return
	}
	t.Parallel()
	faultSlot <- struct{}{}
	slots.acquire(faultTestSlots, true)
	t.Cleanup(func() {
		slots.release(faultTestSlots)
		<-faultSlot
	})
}

// testSlots is a counting semaphore whose waiting fault test is served
// before the others.
type testSlots struct {
	mu           sync.Mutex
	changed      *sync.Cond
	free         int
	faultWaiting bool
}

func newSlots(n int) *testSlots {
	s := &testSlots{free: n}
	s.changed = sync.NewCond(&s.mu)
	return s
}

func (s *testSlots) acquire(n int, fault bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fault {
		s.faultWaiting = true
	}
	for s.free < n || (!fault && s.faultWaiting) {
		s.changed.Wait()
	}
	s.free -= n
	if fault { // the others may take what is left
		s.faultWaiting = false
		s.changed.Broadcast()
	}
}

func (s *testSlots) release(n int) {
	s.mu.Lock()
	s.free += n
	s.mu.Unlock()
	s.changed.Broadcast()
}
