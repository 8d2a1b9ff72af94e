package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
)

// As PID 1 (a container without an init), shardd reaps what its runs
// leave behind: after many runs of a job that backgrounds processes, no
// zombie and no leftover child.
func TestAsPID1NothingLingers(t *testing.T) {
	parallel(t)
	if os.Getuid() != 0 {
		t.Skip("needs root for a PID namespace")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip(err)
	}
	e := startEtcd(t)
	cfg := filepath.Join(t.TempDir(), "jobs.yaml")
	os.WriteFile(cfg, []byte(`jobs:
  - name: bg
    cron: "@every 1s"
    shardingTotalCount: 2
    script: "setsid sleep 300 & sleep 300 & echo bg"
`), 0o644)
	cmd := exec.Command("unshare", "--fork", "--pid", "--mount-proc", bin.shardd, "run", "--config", cfg,
		"--etcd", e.clientURL, "--name", "pid1", "--ttl", "2s", "--listen", "", "--run-log-dir", t.TempDir())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}()
	var pid1 int // shardd, PID 1 of the namespace, as seen from here
	etcdtest.Eventually(t, 10*time.Second, "shardd as PID 1", func() bool {
		kids := childrenOf(cmd.Process.Pid)
		if len(kids) == 1 {
			pid1 = kids[0]
		}
		return pid1 != 0
	})
	runs := func() int {
		n := 0
		for _, c := range childrenOf(pid1) {
			if comm(c) == "sleep" {
				n++
			}
		}
		return n
	}
	time.Sleep(8 * time.Second) // about 16 runs, each leaving 2 processes behind
	zombies, sleeps := 0, runs()
	for _, c := range childrenOf(pid1) {
		if state(c) == "Z" {
			zombies++
		}
	}
	if zombies > 2 || sleeps > 4 { // at most the runs in progress: 2 items x 2 processes
		t.Errorf("as PID 1 after ~16 runs: %d zombie children, %d sleeping leftovers", zombies, sleeps)
	}
}

func childrenOf(pid int) []int {
	var out []int
	files, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

func comm(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(b))
}

func state(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return ""
}
