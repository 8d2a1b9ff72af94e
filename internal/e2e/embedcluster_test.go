package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/ledger"
	"github.com/shardd/shardd/pkg/embedetcd"
	"github.com/shardd/shardd/pkg/schedule"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// member is one host of an embedded cluster: its name, data dir and URLs.
type member struct {
	name, dir, client, peer string
}

// embeddedCluster prepares 3 members on loopback sharing one CA (what the
// deployment guide has an operator copy to each host) and returns them
// with the --embed-cluster list.
func embeddedCluster(t *testing.T) ([]member, string) {
	t.Helper()
	var ms []member
	var spec []string
	for _, n := range []string{"n1", "n2", "n3"} {
		m := member{name: n, dir: t.TempDir(), client: "https://" + etcdtest.FreeAddr(t), peer: "https://" + etcdtest.FreeAddr(t)}
		ms = append(ms, m)
		spec = append(spec, n+"="+m.peer)
	}
	// The first member's CA (shardd ca), copied to the others before their
	// first start, as docs/deployment.md says.
	if out, err := exec.Command(bin.shardd, "ca", "--data-dir", ms[0].dir).CombinedOutput(); err != nil {
		t.Fatalf("shardd ca: %v\n%s", err, out)
	}
	for _, m := range ms[1:] {
		if err := embedetcd.CopyCA(ms[0].dir, m.dir); err != nil {
			t.Fatal(err)
		}
	}
	return ms, strings.Join(spec, ",")
}

// etcdLeader names the member that leads the embedded cluster now, read
// with the first member's client certificate.
func etcdLeader(t *testing.T, ms []member) string {
	t.Helper()
	f := embedetcd.Files(ms[0].dir)
	pair, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	var eps []string
	for _, m := range ms {
		eps = append(eps, m.client)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		TLS: &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for _, m := range ms {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		st, err := cli.Status(ctx, m.client)
		cancel()
		if err == nil && st.Header.MemberId == st.Leader {
			return m.name
		}
	}
	t.Fatal("no member says it leads")
	return ""
}

// startMember starts shardd on member m of the embedded cluster spec,
// with extra flags (a later flag wins).
func startMember(t *testing.T, m member, spec, cfg string, extra ...string) *proc {
	t.Helper()
	return launchShardd(t, m.name, append([]string{"run", "--config", cfg, "--name", m.name, "--data-dir", m.dir,
		"--embed-client-url", m.client, "--embed-peer-url", m.peer, "--embed-cluster", spec,
		"--ttl", ttl.String(), "--shutdown-grace", memberGrace.String(), "--listen", "", "--log-format", "json", "--run-log-dir", filepath.Join(m.dir, "runs")}, extra...), nil)
}

// memberGrace is the embedded cluster's hosts' --shutdown-grace.
const memberGrace = 5 * time.Second

// Three shardd hosts whose embedded etcd members form the cluster they
// coordinate through (--embed-cluster). kill -9 one: the other two keep a
// quorum and every due fire runs; it restarts on its data dir and rejoins.
// kill -9 two: no run while the quorum is lost (the survivor fences), no
// duplicate after it returns, and the missed fires are caught up by the
// misfire policy (the latest runs, coalescing the others). The ledger
// checks every due fire (G1-G4).
func TestEmbeddedClusterQuorum(t *testing.T) {
	longE2E(t)
	dir := t.TempDir()
	// A period longer than the failure bound (TTL + 2 s): a lost fire shows.
	cfg := filepath.Join(dir, "jobs.yaml")
	job := `jobs:
  - name: five
    cron: "@every 5s"
    shardingTotalCount: 3
    failover: true
    script:
      command: ` + etcdtest.YAMLQuote(ledgerScript) + `
      env: {LEDGER_DIR: ` + etcdtest.YAMLQuote(dir) + `, LEDGER_SLEEP: "1"}
`
	if err := os.WriteFile(cfg, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	ms, spec := embeddedCluster(t)
	procs := make([]*proc, 3)
	api := etcdtest.FreeAddr(t) // n1's console
	for i, m := range ms {
		var extra []string
		if i == 0 {
			extra = []string{"--listen", api}
		}
		procs[i] = startMember(t, m, spec, cfg, extra...)
	}
	up := func(p *proc) bool { return len(p.find(msg("session up"))) > 0 }
	etcdtest.Eventually(t, 60*time.Second, "the 3 members to form the cluster and their shardd sessions up", func() bool {
		return up(procs[0]) && up(procs[1]) && up(procs[2])
	})
	threeInMap := func() bool {
		for _, p := range procs {
			recs := p.find(func(r map[string]any) bool { return r["msg"] == "shard map" && r["job"] == "five" })
			if len(recs) == 0 {
				return false
			}
			if in, _ := recs[len(recs)-1]["instances"].([]any); len(in) != 3 {
				return false
			}
		}
		return true
	}
	etcdtest.Eventually(t, 30*time.Second, "every instance in the map", threeInMap)
	from := time.Now()
	bound := ttl + 2*time.Second
	var failures []ledger.Failure
	var faults []ledger.Window

	// 1. kill -9 one host (its member too): two keep the quorum. A host
	// whose member is not etcd's leader: G3's bound holds while etcd has a
	// leader (a leader's loss is an election first; the chaos suite checks
	// fires across elections).
	time.Sleep(7 * time.Second)
	leader := etcdLeader(t, ms)
	v := 2
	for ms[v].name == leader {
		v--
	}
	procs[v].stop(syscall.SIGKILL)
	failures = append(failures, ledger.Failure{At: time.Now(), Instance: ms[v].name})
	faults = append(faults, ledger.Window{From: time.Now(), To: time.Now().Add(bound)})
	t.Logf("killed %s (etcd leader: %s) at %s", ms[v].name, leader, time.Now().Format(time.RFC3339Nano))
	// shardd status (from n1's data dir) and the console say the member is
	// down and that the cluster tolerates no more failures.
	etcdtest.Eventually(t, 10*time.Second, "status and the console to show "+ms[v].name+" down", func() bool {
		out, _ := exec.Command(bin.shardd, "status", "--data-dir", ms[0].dir).CombinedOutput()
		_, page := httpGet(t, "http://"+api+"/instances")
		return strings.Contains(string(out), "etcd: 3 voting member(s), 2 up (quorum 2): tolerates 0 more failure(s)") &&
			strings.Contains(string(out), "member "+ms[v].name+" (") && strings.Contains(string(out), "DOWN") &&
			strings.Contains(page, "tolerates 0 more failure(s)") && strings.Contains(page, ">DOWN<") && strings.Contains(page, "etcd member "+ms[v].name+" (")
	})
	time.Sleep(10 * time.Second)

	// 2. it restarts on its data dir and rejoins.
	procs[v] = startMember(t, ms[v], spec, cfg)
	etcdtest.Eventually(t, 60*time.Second, ms[v].name+" to rejoin", func() bool { return up(procs[v]) })
	etcdtest.Eventually(t, 30*time.Second, "every instance in the map again", threeInMap)
	time.Sleep(7 * time.Second)

	// 3. kill -9 two hosts: the quorum is lost.
	lost := time.Now()
	procs[1].stop(syscall.SIGKILL)
	procs[2].stop(syscall.SIGKILL)
	failures = append(failures, ledger.Failure{At: lost, Instance: "n2"}, ledger.Failure{At: lost, Instance: "n3"})
	t.Logf("killed n2 and n3 at %s: no quorum", lost.Format(time.RFC3339Nano))
	time.Sleep(15 * time.Second)
	back := time.Now()
	procs[1] = startMember(t, ms[1], spec, cfg)
	procs[2] = startMember(t, ms[2], spec, cfg)
	etcdtest.Eventually(t, 60*time.Second, "the quorum back and the sessions up", func() bool {
		return len(procs[1].find(msg("session up"))) > 0 && len(procs[2].find(msg("session up"))) > 0
	})
	healed := time.Now()
	t.Logf("quorum back: members restarted at %s, sessions up at %s", back.Format(time.RFC3339Nano), healed.Format(time.RFC3339Nano))
	// Fires due while the quorum was lost run (the latest) when it returns.
	faults = append(faults, ledger.Window{From: lost, To: healed.Add(bound)})
	time.Sleep(15 * time.Second)
	to := time.Now()

	// 4. The quorum lost again with a run in flight on n1, which is then
	// stopped (SIGTERM): its outcome writes cannot land, and its stop is
	// bounded by its shutdown grace, not held until etcd returns.
	ran := func(p *proc, m string) int {
		return len(p.find(func(r map[string]any) bool { return r["msg"] == m && r["job"] == "five" }))
	}
	etcdtest.Eventually(t, 30*time.Second, "a run in flight on n1", func() bool {
		return ran(procs[0], "run") > ran(procs[0], "done")+ran(procs[0], "failed")+ran(procs[0], "killed")
	})
	procs[1].stop(syscall.SIGKILL)
	procs[2].stop(syscall.SIGKILL)
	stopAt := time.Now()
	procs[0].signal(syscall.SIGTERM)
	select {
	case <-procs[0].exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("n1 without a quorum did not stop within a minute of SIGTERM")
	}
	took := time.Since(stopAt)
	t.Logf("n1 without a quorum stopped in %s (shutdown grace %s)", took.Round(time.Millisecond), memberGrace)
	if limit := memberGrace + 4*time.Second; took > limit {
		t.Errorf("n1 without a quorum took %s to stop, over its grace + 4 s (%s): its shutdown waited on etcd", took.Round(time.Millisecond), limit)
	}
	if len(procs[0].find(msg("outcome not recorded"))) == 0 {
		t.Errorf("n1 stopped without a quorum, a run in flight, yet logged no outcome it could not record")
	}

	events := ledgerEvents(t, dir)
	// No run started while there was no quorum (after the survivor's
	// session could have fenced: TTL after the loss).
	for _, ev := range events {
		if ev.Kind == "start" && ev.At.After(lost.Add(ttl+time.Second)) && ev.At.Before(back) {
			t.Errorf("a run started without a quorum: %+v", ev)
		}
	}
	every5, err := schedule.Parse("@every 5s", nil)
	if err != nil {
		t.Fatal(err)
	}
	r := ledger.Check(events, ledger.Options{
		Jobs:  map[string]ledger.Job{"five": {Items: 3, Schedule: every5, Failover: true}},
		Bound: bound, From: from, To: to, Failures: failures, Faults: faults,
		Records: policyRecords(t, procs),
	})
	t.Logf("ledger: %s", r)
	for _, v := range r.Violations {
		t.Error(v)
	}
	if r.FiresCoalesced == 0 {
		t.Errorf("no fire was coalesced: the fires missed without a quorum should have been caught up by one run each: %s", r)
	}
}
