package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"gopkg.in/yaml.v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/ledger"
	"github.com/shardd/shardd/pkg/schedule"
)

// The compose tests run the repository's compose files, unmodified, on a
// real Docker engine (make e2e-compose: it installs and starts one, and
// builds local stand-ins for the base images when no registry is there).
// One override file is added on top: it mounts a jobs file (the example
// jobs plus a ledger job) and a ledger directory into the three shardd.

// composeTTL is the compose files' SHARDD_TTL; composeBound is G3's bound.
const (
	composeTTL   = 10 * time.Second
	composeBound = composeTTL + 2*time.Second
)

// composeLedgerJob fires every 15 s (longer than the bound: a lost fire or a
// failover that waits for the next fire shows) on 3 items for 3 s.
var composeLedgerJob = `name: ledger
cron: "0/15 * * * * ?"
shardingTotalCount: 3
failover: true
script:
  command: ` + etcdtest.YAMLQuote(ledgerScript) + `
  env: {LEDGER_DIR: /ledger, LEDGER_SLEEP: "3"}
`

type composeCluster struct {
	t       *testing.T
	project string
	files   []string
	dir     string // the ledger directory, mounted at /ledger
	ports   map[string]string
}

func composeE2E(t *testing.T) {
	t.Helper()
	if os.Getenv("SHARDD_E2E_COMPOSE") == "" {
		t.Skip("needs a Docker engine and the compose images: make e2e-compose (SHARDD_E2E_COMPOSE=1)")
	}
}

// startCompose brings up file with the ledger override under project.
func startCompose(t *testing.T, project, file string) *composeCluster {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	c := &composeCluster{t: t, project: project, dir: filepath.Join(tmp, "ledger"),
		ports: map[string]string{"shardd1": "9741", "shardd2": "9742", "shardd3": "9743"}}
	if err := os.Mkdir(c.dir, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(c.dir, 0o777) // the containers' shardd user writes there
	jobs := filepath.Join(tmp, "jobs.yaml")
	if err := os.WriteFile(jobs, exampleWithLedgerJob(t, filepath.Join(root, "jobs.example.yaml")), 0o644); err != nil {
		t.Fatal(err)
	}
	var override strings.Builder
	override.WriteString("services:\n")
	for _, s := range []string{"shardd1", "shardd2", "shardd3"} {
		fmt.Fprintf(&override, "  %s:\n    volumes: [%q, %q]\n", s, jobs+":/etc/shardd/jobs.yaml:ro", c.dir+":/ledger")
	}
	ov := filepath.Join(tmp, "ledger.override.yml")
	if err := os.WriteFile(ov, []byte(override.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	c.files = []string{filepath.Join(root, file), ov}
	c.compose(10*time.Minute, "down", "-v", "--remove-orphans") // a previous run's leftovers
	t.Cleanup(func() {
		if t.Failed() {
			for _, s := range []string{"shardd1", "shardd2", "shardd3"} {
				if id := c.id(s); id != "" {
					out, _ := exec.Command("docker", "logs", "--tail", "60", id).CombinedOutput()
					t.Logf("last log lines of %s:\n%s", s, out)
				}
			}
		}
		c.compose(2*time.Minute, "down", "-v", "--remove-orphans")
	})
	start := time.Now()
	c.compose(15*time.Minute, "up", "--build", "-d")
	t.Logf("%s: up --build in %s", file, time.Since(start).Round(time.Second))
	etcdtest.Eventually(t, 3*time.Minute, "the 3 shardd ready", func() bool {
		for _, p := range c.ports {
			if !httpOK("http://127.0.0.1:" + p + "/readyz") {
				return false
			}
		}
		return true
	})
	return c
}

// exampleWithLedgerJob is jobs.example.yaml with the ledger job added.
func exampleWithLedgerJob(t *testing.T, example string) []byte {
	t.Helper()
	b, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	var job yaml.Node
	if err := yaml.Unmarshal([]byte(composeLedgerJob), &job); err != nil {
		t.Fatal(err)
	}
	root := doc.Content[0]
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "jobs" {
			root.Content[i+1].Content = append(root.Content[i+1].Content, job.Content[0])
			out, err := yaml.Marshal(&doc)
			if err != nil {
				t.Fatal(err)
			}
			return out
		}
	}
	t.Fatalf("%s has no jobs list", example)
	return nil
}

func (c *composeCluster) compose(timeout time.Duration, args ...string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	full := []string{"-p", c.project}
	for _, f := range c.files {
		full = append(full, "-f", f)
	}
	out, err := exec.CommandContext(ctx, "docker-compose", append(full, args...)...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("docker-compose %s: %v\n%s", strings.Join(args, " "), err, tail(string(out), 60))
	}
	return string(out)
}

func (c *composeCluster) docker(args ...string) string {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", args...).CombinedOutput()
	if err != nil {
		c.t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// id is the container of service s ("" if none).
func (c *composeCluster) id(s string) string {
	full := []string{"-p", c.project}
	for _, f := range c.files {
		full = append(full, "-f", f)
	}
	out, _ := exec.Command("docker-compose", append(full, "ps", "-q", s)...).Output()
	return strings.TrimSpace(string(out))
}

// network is the compose project's default network.
func (c *composeCluster) network() string { return c.project + "_default" }

// ip is service s's address on the project's network.
func (c *composeCluster) ip(s string) string {
	return c.docker("inspect", "-f", `{{(index .NetworkSettings.Networks "`+c.network()+`").IPAddress}}`, c.id(s))
}

// owners returns, as seen by the instance at port, each item's owner of
// job ("" for none); ok is false when the instance does not answer.
func (c *composeCluster) owners(port, job string) (owners []string, ok bool) {
	var j struct {
		Items []struct {
			Item     int    `json:"item"`
			Instance string `json:"instance"`
		} `json:"items"`
	}
	if err := getJSON("http://127.0.0.1:"+port+"/api/v1/jobs/"+job, &j); err != nil {
		return nil, false
	}
	for _, it := range j.Items {
		owners = append(owners, it.Instance)
	}
	return owners, true
}

// ownersOf returns the owners of every item of jobs as seen from port.
func (c *composeCluster) ownersOf(port string, jobs ...string) ([]string, bool) {
	var all []string
	for _, job := range jobs {
		o, ok := c.owners(port, job)
		if !ok {
			return nil, false
		}
		all = append(all, o...)
	}
	return all, true
}

// logs are the JSON log records of service s.
func (c *composeCluster) logs(s string) []map[string]any {
	out, _ := exec.Command("docker", "logs", c.id(s)).CombinedOutput()
	var recs []map[string]any
	for _, line := range strings.Split(string(out), "\n") {
		var r map[string]any
		if json.Unmarshal([]byte(line), &r) == nil {
			recs = append(recs, r)
		}
	}
	return recs
}

// check runs the ledger check of the ledger job over [from, to].
func (c *composeCluster) check(from, to time.Time, failures []ledger.Failure, faults []ledger.Window) ledger.Report {
	t := c.t
	t.Helper()
	every15, err := schedule.Parse("0/15 * * * * ?", nil)
	if err != nil {
		t.Fatal(err)
	}
	var logs []map[string]any
	for _, s := range []string{"shardd1", "shardd2", "shardd3"} {
		logs = append(logs, c.logs(s)...)
	}
	r := ledger.Check(ledgerEvents(t, c.dir), ledger.Options{
		Jobs:  map[string]ledger.Job{"ledger": {Items: 3, Schedule: every15, Failover: true}},
		Bound: composeBound, From: from, To: to, Failures: failures, Faults: faults,
		Records: policyRecordsOf(t, logs),
	})
	t.Logf("ledger: %s", r)
	for _, v := range r.Violations {
		t.Error(v)
	}
	if r.FiresChecked == 0 {
		t.Errorf("no fire of the ledger job was checked: %s", r)
	}
	return r
}

// exampleJobs are the example jobs that have items on a schedule, and the
// ledger job.
var exampleJobs = []string{"sync-orders", "drain-spool", "nightly-report", "ledger"}

// spread waits until the items of the example jobs are spread over the 3
// instances and sync-orders (every 10 s) has run on each of its items.
func (c *composeCluster) spread() {
	t := c.t
	t.Helper()
	etcdtest.Eventually(t, 60*time.Second, "the example jobs' items spread over the 3 instances", func() bool {
		all, ok := c.ownersOf("9741", exampleJobs...)
		return ok && slices.Contains(all, "shardd1") && slices.Contains(all, "shardd2") && slices.Contains(all, "shardd3")
	})
	etcdtest.Eventually(t, 60*time.Second, "a run of every item of sync-orders", func() bool {
		var h []struct {
			Item  int    `json:"item"`
			State string `json:"state"`
		}
		if getJSON("http://127.0.0.1:9741/api/v1/jobs/sync-orders/history", &h) != nil {
			return false
		}
		done := map[int]bool{}
		for _, r := range h {
			if r.State == "DONE" {
				done[r.Item] = true
			}
		}
		return len(done) == 3
	})
}

// moved waits until, seen from port, no item of the checked jobs is owned
// by gone and none is without an owner; it returns how long that took
// since at.
func (c *composeCluster) moved(port, gone string, at time.Time, limit time.Duration) time.Duration {
	c.t.Helper()
	etcdtest.Eventually(c.t, limit, "the items of "+gone+" to move", func() bool {
		all, ok := c.ownersOf(port, exampleJobs...)
		return ok && !slices.Contains(all, gone) && !slices.Contains(all, "")
	})
	return time.Since(at)
}

// back waits until name owns items again, seen from port.
func (c *composeCluster) back(port, name string) {
	c.t.Helper()
	etcdtest.Eventually(c.t, 90*time.Second, name+" to own items again", func() bool {
		all, ok := c.ownersOf(port, exampleJobs...)
		return ok && slices.Contains(all, name)
	})
}

// The compose cluster (docker-compose.yml: 3 etcd, 3 shardd, Prometheus)
// under real faults: docker kill of a shardd, a shardd cut from the network
// and back, the etcd leader cut from the network; every fire of a 15 s job
// accounted for (G1-G4), Prometheus scraping the 3 shardd.
func TestComposeCluster(t *testing.T) {
	composeE2E(t)
	c := startCompose(t, "shardde2e", "docker-compose.yml")
	c.spread()
	from := time.Now()
	var failures []ledger.Failure
	var faults []ledger.Window

	// 1. docker kill shardd2 while it runs an item of the ledger job: its
	// items run elsewhere, the cut run is re-run at once.
	c.waitRunOn("shardd2")
	c.docker("kill", c.id("shardd2"))
	killed := time.Now()
	failures = append(failures, ledger.Failure{At: killed, Instance: "shardd2"})
	faults = append(faults, ledger.Window{From: killed, To: killed.Add(composeBound)})
	took := c.moved("9741", "shardd2", killed, 2*composeTTL)
	t.Logf("docker kill shardd2: its items moved in %s (TTL %s)", took.Round(time.Millisecond), composeTTL)
	if took > composeTTL+time.Second {
		t.Errorf("shardd2's items moved %s after docker kill, over TTL + 1 s", took.Round(time.Millisecond))
	}
	time.Sleep(20 * time.Second) // fires due meanwhile run on the others
	c.docker("start", c.id("shardd2"))
	c.back("9741", "shardd2")

	// 2. shardd3 cut from the network: it fences, its items move, no
	// overlap (the ledger's G1); reconnected, it rejoins.
	id3 := c.id("shardd3")
	c.waitRunOn("shardd3")
	c.docker("network", "disconnect", c.network(), id3)
	cut := time.Now()
	failures = append(failures, ledger.Failure{At: cut, Instance: "shardd3"})
	faults = append(faults, ledger.Window{From: cut, To: cut.Add(composeBound)})
	took = c.moved("9741", "shardd3", cut, 2*composeTTL)
	t.Logf("shardd3 disconnected: its items moved in %s", took.Round(time.Millisecond))
	if took > composeTTL+time.Second {
		t.Errorf("shardd3's items moved %s after it was cut off, over TTL + 1 s", took.Round(time.Millisecond))
	}
	etcdtest.Eventually(t, composeTTL, "shardd3 to fence itself", func() bool {
		for _, r := range c.logs("shardd3") {
			if r["msg"] == "session lost: stopping leaderships and work" {
				return true
			}
		}
		return false
	})
	time.Sleep(15 * time.Second)
	c.docker("network", "connect", "--alias", "shardd3", c.network(), id3)
	c.back("9741", "shardd3")

	// 3. the etcd leader cut from the network: a new leader, runs go on.
	leader, members := c.etcdLeader("")
	c.docker("network", "disconnect", c.network(), c.id(leader))
	lost := time.Now()
	var others []string
	for _, m := range members {
		if m != leader {
			others = append(others, m)
		}
	}
	var newLeader string
	etcdtest.Eventually(t, 30*time.Second, "a new etcd leader", func() bool {
		newLeader, _ = c.etcdLeader(leader, others...)
		return newLeader != ""
	})
	elected := time.Now()
	t.Logf("etcd leader %s cut off: %s leads after %s", leader, newLeader, elected.Sub(lost).Round(time.Millisecond))
	faults = append(faults, ledger.Window{From: lost, To: elected.Add(composeBound + composeTTL)})
	time.Sleep(30 * time.Second)
	c.docker("network", "connect", "--alias", leader, c.network(), c.id(leader))

	// 4. Prometheus scrapes the 3 shardd.
	etcdtest.Eventually(t, 90*time.Second, "Prometheus to report the 3 shardd targets up", func() bool {
		var r struct {
			Data struct {
				ActiveTargets []struct {
					Labels map[string]string `json:"labels"`
					Health string            `json:"health"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		if getJSON("http://127.0.0.1:9090/api/v1/targets", &r) != nil {
			return false
		}
		up := 0
		for _, tg := range r.Data.ActiveTargets {
			if tg.Labels["job"] == "shardd" && tg.Health == "up" {
				up++
			}
		}
		return up == 3
	})
	time.Sleep(20 * time.Second) // fires after the faults, all 3 instances back
	r := c.check(from, time.Now(), failures, faults)
	if r.Failovers == 0 {
		t.Errorf("no failover re-run: the run docker kill cut should have been re-run elsewhere: %s", r)
	}
}

// waitRunOn waits until instance name runs an item of the ledger job (a
// start in the ledger without its end).
func (c *composeCluster) waitRunOn(name string) {
	c.t.Helper()
	etcdtest.Eventually(c.t, 45*time.Second, "a run of the ledger job on "+name, func() bool {
		events := append(readEvents(c.t, c.dir, "start"), readEvents(c.t, c.dir, "end")...)
		type run struct {
			item    int
			fire    time.Time
			attempt int
		}
		open := map[run]bool{}
		for _, ev := range events { // starts first, then ends
			if ev.Instance != name || ev.Job != "ledger" {
				continue
			}
			k := run{ev.Item, ev.Fire, ev.Attempt}
			if ev.Kind == "start" {
				open[k] = time.Since(ev.At) < 2*time.Second
			} else {
				delete(open, k)
			}
		}
		for _, recent := range open {
			if recent {
				return true
			}
		}
		return false
	})
}

// etcdLeader returns the compose etcd member (of names, default all three;
// never skip) that says it leads, and the members asked.
func (c *composeCluster) etcdLeader(skip string, names ...string) (string, []string) {
	if len(names) == 0 {
		names = []string{"etcd1", "etcd2", "etcd3"}
	}
	for _, n := range names {
		if n == skip {
			continue
		}
		ep := c.ip(n) + ":2379"
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := cli.Status(ctx, ep)
		cancel()
		cli.Close()
		if err == nil && st.Leader != 0 && st.Header.MemberId == st.Leader {
			return n, names
		}
	}
	return "", names
}

// The embedded compose cluster (docker-compose.embedded.yml: 3 shardd
// hosts, each one member of the etcd cluster): spread, docker kill of one
// host (member and all) while it runs an item -> the other two keep the
// quorum, re-run the cut run and run every due fire; started again on its
// volume, it rejoins; down and up, the cluster comes back with its data.
func TestComposeEmbeddedCluster(t *testing.T) {
	composeE2E(t)
	c := startCompose(t, "shardde2eemb", "docker-compose.embedded.yml")
	c.spread()
	from := time.Now()
	c.waitRunOn("shardd3")
	c.docker("kill", c.id("shardd3"))
	killed := time.Now()
	took := c.moved("9741", "shardd3", killed, 3*composeTTL)
	// If its member led etcd, an election and etcd's lease extension on a
	// new leader come first (docs/deployment.md): a TTL more at most.
	t.Logf("docker kill shardd3 (host and member): its items moved in %s", took.Round(time.Millisecond))
	time.Sleep(20 * time.Second)
	c.docker("start", c.id("shardd3"))
	c.back("9741", "shardd3")
	time.Sleep(20 * time.Second)
	to := time.Now()

	// down (volumes kept) and up: the cluster comes back on its volumes,
	// its jobs' records with it.
	var before []map[string]any
	if err := getJSON("http://127.0.0.1:9741/api/v1/jobs/ledger/history", &before); err != nil || len(before) == 0 {
		t.Fatalf("ledger history before down: %v (%d records)", err, len(before))
	}
	c.compose(5*time.Minute, "down")
	c.compose(5*time.Minute, "up", "-d")
	etcdtest.Eventually(t, 3*time.Minute, "the 3 shardd ready after down and up", func() bool {
		for _, p := range c.ports {
			if !httpOK("http://127.0.0.1:" + p + "/readyz") {
				return false
			}
		}
		return true
	})
	var after []map[string]any
	if err := getJSON("http://127.0.0.1:9741/api/v1/jobs/ledger/history", &after); err != nil || len(after) < len(before) {
		t.Errorf("ledger history after down and up: %v, %d records (before: %d): the cluster did not keep its data", err, len(after), len(before))
	}
	c.spread()

	r := c.check(from, to, []ledger.Failure{{At: killed, Instance: "shardd3"}},
		[]ledger.Window{{From: killed, To: killed.Add(composeBound + composeTTL)}})
	if r.Failovers == 0 {
		t.Errorf("no failover re-run: the run docker kill cut should have been re-run elsewhere: %s", r)
	}
}

func httpOK(url string) bool {
	cl := http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

func getJSON(url string, v any) error {
	cl := http.Client{Timeout: 3 * time.Second}
	resp, err := cl.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
