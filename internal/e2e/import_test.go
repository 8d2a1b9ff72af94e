package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// zooKeeperJar is Debian's zookeeper package's server.
const zooKeeperJar = "/usr/share/java/zookeeper.jar"

// startZooKeeper runs a standalone ZooKeeper on a loopback port and
// returns its address. Without Debian's zookeeper (and a Java) the test is
// skipped, unless SHARDD_REQUIRE_ZOOKEEPER is set (CI sets it).
func startZooKeeper(t *testing.T) string {
	t.Helper()
	java, err := exec.LookPath("java")
	if _, serr := os.Stat(zooKeeperJar); err != nil || serr != nil {
		if os.Getenv("SHARDD_REQUIRE_ZOOKEEPER") != "" {
			t.Fatalf("no ZooKeeper here (java: %v, %s: %v): apt-get install -y --no-install-recommends zookeeper", err, zooKeeperJar, serr)
		}
		t.Skipf("no ZooKeeper here: apt-get install -y --no-install-recommends zookeeper (SHARDD_REQUIRE_ZOOKEEPER=1 makes this a failure)")
	}
	dir := t.TempDir()
	addr := etcdtest.FreeAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	cfg := filepath.Join(dir, "zoo.cfg")
	os.WriteFile(cfg, []byte(fmt.Sprintf("tickTime=2000\ndataDir=%s\nclientPort=%s\nclientPortAddress=%s\nadmin.enableServer=false\n", filepath.Join(dir, "data"), port, host)), 0o644)
	cmd := exec.Command(java, "-Xmx256m", "-cp", "/etc/zookeeper/conf:"+zooKeeperJar, "org.apache.zookeeper.server.ZooKeeperServerMain", cfg)
	logf, _ := os.Create(filepath.Join(dir, "zookeeper.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		logf.Close()
	})
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			data, _ := os.ReadFile(filepath.Join(dir, "zookeeper.log"))
			t.Fatalf("ZooKeeper did not listen on %s within 60s:\n%s", addr, data)
		}
	}
}

// The job configs of an ElasticJob 3 namespace, as its registry keeps
// them: a script job, an HTTP job, a Java class job (no script, no HTTP:
// not converted), and the nodes ElasticJob keeps beside the configs.
var registryJobs = map[string]string{
	"settle": `jobName: settle
cron: 0 0/5 * * * ?
shardingTotalCount: 2
shardingItemParameters: 0=east,1=west
failover: true
misfire: true
jobShardingStrategyType: ROUND_ROBIN
props:
  script.command.line: /opt/jobs/settle.sh --all
disabled: false
overwrite: true
`,
	"ping": `jobName: ping
cron: 0 * * * * ?
shardingTotalCount: 1
props:
  http.uri: http://hooks.internal/ping
  http.method: POST
`,
	"javaJob": `jobName: javaJob
cron: 0/5 * * * * ?
shardingTotalCount: 3
props: {}
`,
}

// shardd import from a live ZooKeeper with job configs written in
// ElasticJob's layout (/<namespace>/<job>/config, among its other nodes):
// the script and HTTP jobs convert, the Java job is listed as not
// converted (exit status 1); --apply registers them in shardd's cluster.
// Then the same from an etcd registry.
func TestImportFromALiveRegistry(t *testing.T) {
	parallel(t)
	zkAddr := startZooKeeper(t)
	conn, _, err := zk.Connect([]string{zkAddr}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	create := func(p string, data string) {
		t.Helper()
		var err error
		for range 50 { // the session comes up in the background
			if _, err = conn.Create(p, []byte(data), 0, zk.WorldACL(zk.PermAll)); err == nil || err == zk.ErrNodeExists {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("create %s: %v", p, err)
	}
	create("/demo", "")
	for job, cfg := range registryJobs {
		create("/demo/"+job, "")
		create("/demo/"+job+"/config", cfg)
		create("/demo/"+job+"/servers", "")
		create("/demo/"+job+"/leader", "")
	}
	create("/demo/not-a-job", "") // no config: not a job

	e := startEtcd(t)
	code, out := cli(t, e, nil, "import", "--registry", "zk://"+zkAddr, "--namespace", "demo")
	if code != 1 {
		t.Errorf("import with a Java job: exit %d, want 1 (not everything converted)\n%s", code, out)
	}
	for _, want := range []string{
		"# converted from ElasticJob (zk://" + zkAddr + " namespace demo) by shardd import: 2 job(s)",
		"- name: ping", "url: http://hooks.internal/ping",
		"- name: settle", "command: [/opt/jobs/settle.sh, --all]", "strategy: ROUND_ROBIN", "shardingItemParameters: 0=east,1=west",
		"shardd import: job javaJob: not converted: no work",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("import's output has no %q:\n%s", want, out)
		}
	}
	if code, out := cli(t, e, nil, "import", "--registry", "zk://"+zkAddr, "--namespace", "nosuch"); code != 1 || !strings.Contains(out, "has no namespace nosuch (it has: demo)") {
		t.Errorf("a namespace that is not there: %d %s", code, out)
	}
	if strings.Contains(out, "not-a-job") {
		t.Errorf("a node without a config was taken for a job:\n%s", out)
	}

	code, out = cli(t, e, nil, "import", "--registry", "zk://"+zkAddr, "--namespace", "demo", "--job", "settle", "--time-zone", "Asia/Shanghai", "--apply")
	if code != 0 || !strings.Contains(out, "job settle: created (version 1") || !strings.Contains(out, "job settle: overwrite: true left out") {
		t.Fatalf("import --apply: %d\n%s", code, out)
	}
	adm := admin.New(e.client(), keyspace.NewKeys(""))
	d, err := adm.Definition(context.Background(), "settle")
	if err != nil || !d.Applied() || d.Job.ShardingTotalCount != 2 || !d.Job.Script.ContextArg || d.Job.TimeZone != "Asia/Shanghai" {
		t.Fatalf("settle after import --apply: %+v, %v", d, err)
	}
	vs, err := adm.Versions(context.Background(), "settle")
	if err != nil || len(vs) != 1 || vs[0].Change != "import" {
		t.Errorf("settle's versions: %+v, %v", vs, err)
	}

	// ElasticJob's etcd registry: the same paths, as keys.
	reg := startEtcd(t)
	for job, cfg := range registryJobs {
		if _, err := reg.client().Put(context.Background(), "/demo/"+job+"/config", cfg); err != nil {
			t.Fatal(err)
		}
	}
	code, out = cli(t, e, nil, "import", "--registry", "etcd://"+reg.addr(), "--namespace", "demo", "--job", "ping", "--time-zone", "UTC")
	if code != 0 || !strings.Contains(out, "- name: ping") || strings.Contains(out, "settle") {
		t.Errorf("import --job ping from etcd: %d\n%s", code, out)
	}
}
