package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// cli runs the shardd command line against e with the environment env
// (added to shardd's own) and returns its exit code and combined output.
func cli(t *testing.T, e *etcdProc, env []string, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(bin.shardd, append(args, "--etcd", e.clientURL)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("shardd %v: %v", args, err)
	return 0, ""
}

// Every operator command checks its target and says what it did or why it
// refused; the CLI takes only connection flags from the environment, so
// a job's own onFailure can run `shardd disable $SHARDD_JOB`.
func TestOperatorCommandsValidateTheirTarget(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	e := startEtcd(t)
	etcd := e.client()
	cfg := filepath.Join(dir, "jobs.yaml")
	os.WriteFile(cfg, []byte(`jobs:
  - name: j
    shardingTotalCount: 3
    script: [/bin/true]
  - name: off
    disabled: true
    script: [/bin/true]
  - name: failing
    script: [/bin/false]
    onFailure:
      command: '`+bin.shardd+` disable "$SHARDD_JOB" --etcd `+e.clientURL+` >> `+filepath.Join(dir, "onfailure.out")+` 2>&1'
`), 0o644)
	a := startShardd(t, e, "a", cfg)
	etcdtest.Eventually(t, 15*time.Second, "j's map", func() bool { return agreed(t, etcd, "j", map[string][]int{"a": {0, 1, 2}}, a) })

	for _, tc := range []struct {
		env  []string
		args []string
		code int
		want string
	}{
		{nil, []string{"trigger", "j", "--item", "7"}, 1, `job "j" has items 0-2; there is no item 7`},
		{nil, []string{"trigger", "j", "--item", "-3"}, 2, "items are numbered from 0"},
		{nil, []string{"trigger", "nope"}, 1, `no job "nope" in the cluster at prefix /shardd (jobs: failing, j, off)`},
		{nil, []string{"trigger", "off"}, 1, `job "off" is disabled in its definition (disabled: true, registered by a`},
		{nil, []string{"disable", "nope"}, 1, `no job "nope"`},
		{nil, []string{"disable", "j", "--item", "5"}, 1, "there is no item 5"},
		{nil, []string{"disable", "j", "--instance", "ghost"}, 1, "instance ghost does not run job j (its instances: a); to disable it before it starts, force it (--force"},
		{nil, []string{"enable", "off"}, 1, `job "off" stays disabled: its definition says disabled: true`},
		{nil, []string{"enable", "j", "--item", "1"}, 0, "item 1 of job j was already enabled; nothing changed"},
		{nil, []string{"history", "nope"}, 1, `no job "nope"`},
		{nil, []string{"history", "j", "--item", "3"}, 1, "there is no item 3"},
		{nil, []string{"remove", "j"}, 1, `job "j" is still defined by live instances (a)`},
		// Flags anywhere on the line.
		{nil, []string{"history", "--item", "0", "j"}, 0, "job j has no executions recorded yet"},
		// A job's own variables are not the CLI's flags.
		{[]string{"SHARDD_ITEM=2", "SHARDD_INSTANCE=a", "SHARDD_JOB=off"}, []string{"trigger", "j"}, 0, "triggered every item (0,1,2) of job j"},
		{[]string{"SHARDD_ITEM=2", "SHARDD_INSTANCE=a"}, []string{"disable", "j", "--instance", "ghost", "--force"}, 0, "disabled instance ghost for job j"},
	} {
		code, out := cli(t, e, tc.env, tc.args...)
		if code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("%v %v: exit %d %q, want %d and %q", tc.env, tc.args, code, out, tc.code, tc.want)
		}
	}

	if len(a.find(func(rec map[string]any) bool {
		return rec["msg"] == "job is disabled by its definition (disabled: true): its fires are not run" && rec["job"] == "off"
	})) == 0 {
		t.Error("a did not log that job off is disabled")
	}

	// Nothing refused above left a trace: no phantom job, no stray key.
	resp, err := etcd.Get(context.Background(), keyspace.NewKeys("").Jobs()+"nope", clientv3WithPrefix()...)
	if err != nil || len(resp.Kvs) != 0 {
		t.Errorf("a refused command wrote %d keys of job nope (%v)", len(resp.Kvs), err)
	}
	for _, key := range []string{keyspace.NewKeys("").DisabledItem("j", 5), keyspace.NewKeys("").DisabledInstance("j", "ghost")} {
		resp, _ := etcd.Get(context.Background(), key)
		if want := strings.HasSuffix(key, "ghost"); (len(resp.Kvs) == 1) != want {
			t.Errorf("%s exists: %v, want %v", key, len(resp.Kvs) == 1, want)
		}
	}

	// The failing job's onFailure disables the whole job, not one item.
	cli(t, e, nil, "trigger", "failing")
	etcdtest.Eventually(t, 15*time.Second, "onFailure to disable the job", func() bool {
		resp, err := etcd.Get(context.Background(), keyspace.NewKeys("").DisabledJob("failing"))
		return err == nil && len(resp.Kvs) == 1
	})
	// The command prints after its write: wait for it to have said so.
	etcdtest.Eventually(t, 10*time.Second, "onFailure's shardd disable to say what it did", func() bool {
		out, _ := os.ReadFile(filepath.Join(dir, "onfailure.out"))
		return strings.Contains(string(out), "disabled job failing")
	})
	if resp, _ := etcd.Get(context.Background(), keyspace.NewKeys("").DisabledItems("failing"), clientv3WithPrefix()...); len(resp.Kvs) != 0 {
		t.Error("onFailure disabled an item")
	}

	// Status names the cluster, lists the disabled instance, and says NO
	// INSTANCES once the only host stopped; then remove deletes the job.
	if code, out := cli(t, e, nil, "status"); code != 0 || !strings.Contains(out, "cluster: etcd "+e.clientURL+", prefix /shardd") ||
		!strings.Contains(out, "disabled instances: ghost") {
		t.Errorf("status: %d\n%s", code, out)
	}
	a.stop(syscall.SIGTERM)
	etcdtest.Eventually(t, 10*time.Second, "NO INSTANCES", func() bool {
		_, out := cli(t, e, nil, "status", "-o", "json")
		var st admin.ClusterStatus
		if json.Unmarshal([]byte(out), &st) != nil {
			return false
		}
		for _, j := range st.Jobs {
			if j.Name == "j" {
				return j.Status == admin.StatusNoInstances
			}
		}
		return false
	})
	if code, out := cli(t, e, nil, "remove", "j"); code != 0 || !strings.Contains(out, "removed job j") {
		t.Errorf("remove: %d %q", code, out)
	}
	if resp, _ := etcd.Get(context.Background(), keyspace.NewKeys("").Jobs()+"j/", clientv3WithPrefix()...); len(resp.Kvs) != 0 {
		t.Errorf("%d keys of j left after remove", len(resp.Kvs))
	}
	if code, out := cli(t, e, nil, "remove", "j"); code != 1 || !strings.Contains(out, `no job "j"`) {
		t.Errorf("second remove: %d %q", code, out)
	}
}

// versionJob is a job whose runs append "<version> <instance>" to dir/runs.
func versionJob(dir, version, extra string) string {
	return fmt.Sprintf(`jobs:
  - name: v
    cron: "@every 1s"
    shardingTotalCount: 2
%s    script:
      command: 'echo "$VERSION $SHARDD_INSTANCE" >> %s'
      env: {VERSION: %s}
`, extra, filepath.Join(dir, "runs"), version)
}

// runsSince returns the versions each instance ran after the first n lines.
func runsSince(t *testing.T, dir string, n int) (map[string]map[string]bool, int) {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(dir, "runs"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	out := map[string]map[string]bool{}
	for _, l := range lines[min(n, len(lines)):] {
		version, instance, ok := strings.Cut(l, " ")
		if !ok {
			continue
		}
		if out[instance] == nil {
			out[instance] = map[string]bool{}
		}
		out[instance][version] = true
	}
	return out, len(lines)
}

// Two hosts with conflicting overwrite: true definitions run one
// definition, and the other host shows the conflict; a plain edit and
// reload on one host changes the job on both.
func TestOneDefinitionAcrossHosts(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	e := startEtcd(t)
	etcd := e.client()
	cfgA, cfgB := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	os.WriteFile(cfgA, []byte(versionJob(dir, "A", "    overwrite: true\n")), 0o644)
	os.WriteFile(cfgB, []byte(versionJob(dir, "B", "    overwrite: true\n")), 0o644)
	addrA := etcdtest.FreeAddr(t)
	a := startShardd(t, e, "a", cfgA, "--listen", addrA, "--reload-interval", "500ms")
	etcdtest.Eventually(t, 15*time.Second, "a's map", func() bool { return agreed(t, etcd, "v", map[string][]int{"a": {0, 1}}, a) })
	b := startShardd(t, e, "b", cfgB, "--reload-interval", "500ms")
	etcdtest.Eventually(t, 15*time.Second, "the map over a and b", func() bool {
		return agreed(t, etcd, "v", map[string][]int{"a": {0}, "b": {1}}, a, b)
	})

	// b's definition is new to the cluster: it is the one; a runs it too.
	oneVersion := func(want string) {
		t.Helper()
		var n int
		_, n = runsSince(t, dir, 0)
		time.Sleep(2500 * time.Millisecond) // the hosts take the definition
		_, n = runsSince(t, dir, n)
		time.Sleep(3 * time.Second) // three fires
		got, _ := runsSince(t, dir, n)
		for _, id := range []string{"a", "b"} {
			if len(got[id]) != 1 || !got[id][want] {
				t.Errorf("%s ran versions %v in the last 3 s, want only %s", id, got[id], want)
			}
		}
	}
	oneVersion("B")
	if _, body := httpGet(t, "http://"+addrA+"/metrics"); !strings.Contains(body, `shardd_job_definition_conflict{shardd_job="v"} 1`) {
		t.Error("a's metrics do not show its conflict")
	}
	if _, body := httpGet(t, "http://"+addrA+"/api/v1/jobs/v"); !strings.Contains(body, `"conflict": true`) {
		t.Errorf("a's API does not show its conflict:\n%s", body)
	}
	if code, out := cli(t, e, nil, "status"); code != 0 || !strings.Contains(out, "instance a has a different local definition") {
		t.Errorf("status does not show a's conflict:\n%s", out)
	}
	// A reconnect of a does not put its definition back.
	a.cut()
	etcdtest.Eventually(t, 10*time.Second, "a to fence", func() bool { return len(a.find(msg("session lost: stopping leaderships and work"))) > 0 })
	a.heal()
	etcdtest.Eventually(t, 15*time.Second, "a back", func() bool { return len(a.find(msg("session up"))) >= 2 })
	oneVersion("B")

	// A plain edit on a, without overwrite, reloaded: C runs on both.
	os.WriteFile(cfgA, []byte(versionJob(dir, "C", "")), 0o644)
	oneVersion("C")
	if _, body := httpGet(t, "http://"+addrA+"/metrics"); !strings.Contains(body, `shardd_job_definition_conflict{shardd_job="v"} 0`) {
		t.Error("a still shows a conflict after its edit was published")
	}
	if len(b.find(msg("job definition changed"))) == 0 {
		t.Error("b did not log the definition change")
	}
	if len(a.find(func(rec map[string]any) bool { return rec["msg"] == "instance joined" && rec["other"] == "b" })) == 0 {
		t.Error("a did not log b joining")
	}
	if len(b.find(func(rec map[string]any) bool {
		return strings.HasPrefix(fmt.Sprint(rec["msg"]), "instance left") && rec["other"] == "a"
	})) == 0 {
		t.Error("b did not log a leaving (its lease expired while it was cut off)")
	}
}
