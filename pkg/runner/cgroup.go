package runner

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Cgroups confines each script run to a cgroup v2 of its own, made in a
// directory delegated to shardd (systemd's Delegate=yes), and kills the
// whole cgroup, with any cgroups made inside it, when the run ends
// (cgroup.kill). A process cannot leave its cgroup by what it does to its
// process group or its environment; one that runs as shardd's user could
// write itself into another cgroup of shardd's subtree, which is why the
// SHARDD_RUN sweep (reap.go) still runs too. Without a delegated cgroup,
// the process group and the sweep do it for every process that keeps its
// environment. Cgroups of a shardd killed with -9 are removed by the next
// one; until then the watchdog still kills the runs' process groups.
//
// The run is started straight into its cgroup (clone3 CLONE_INTO_CGROUP),
// so not even its first instruction runs outside.
type Cgroups struct {
	dir string
}

// NewCgroups uses dir, a cgroup v2 directory this process may make
// cgroups in. It checks that it can, and that the kernel starts a process
// straight into a cgroup (Linux 5.7).
func NewCgroups(dir string) (*Cgroups, error) {
	c := &Cgroups{dir: dir}
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	cg, err := c.prepare(cmd, "probe-"+strconv.Itoa(os.Getpid()))
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: %w", dir, err)
	}
	defer cg.kill()
	done, err := start(cmd)
	if err == nil {
		err = cmd.Wait()
		done()
	}
	if err != nil {
		return nil, fmt.Errorf("cgroup %s: starting a process in it: %w", dir, err)
	}
	c.removeStale()
	return c, nil
}

// removeStale kills and removes the run cgroups of a shardd that is gone
// (killed with -9: nothing removed them).
func (c *Cgroups) removeStale() {
	dirs, _ := filepath.Glob(filepath.Join(c.dir, "run-*"))
	for _, d := range dirs {
		id := strings.TrimPrefix(filepath.Base(d), "run-")
		owner, _, _ := strings.Cut(strings.TrimPrefix(id, "probe-"), "-") // run-<pid>-<seq>, run-probe-<pid>
		if pid, err := strconv.Atoi(owner); err == nil && (pid == os.Getpid() || syscall.Kill(pid, 0) == nil) {
			continue // a live shardd's (or a probe's)
		}
		(&runCgroup{dir: d, fd: nil}).kill()
	}
}

// DelegatedCgroups returns the cgroups of this process's own cgroup v2 if
// it was delegated to it (it is not the root cgroup, and it may make
// cgroups in it), or an error that says why not.
func DelegatedCgroups() (*Cgroups, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	path, ok := "", false
	for _, line := range strings.Split(string(b), "\n") {
		if p, found := strings.CutPrefix(line, "0::"); found {
			path, ok = p, true
		}
	}
	if !ok {
		return nil, errors.New("no cgroup v2 (unified) hierarchy for this process")
	}
	if path == "/" {
		return nil, errors.New("this process is in the root cgroup: none was delegated to it (systemd: Delegate=yes)")
	}
	mount, err := cgroup2Mount()
	if err != nil {
		return nil, err
	}
	return NewCgroups(filepath.Join(mount, path))
}

// cgroup2Mount returns where the cgroup v2 hierarchy is mounted.
func cgroup2Mount() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source options
		left, right, ok := strings.Cut(s.Text(), " - ")
		if !ok {
			continue
		}
		if fields := strings.Fields(right); len(fields) > 0 && fields[0] == "cgroup2" {
			if lf := strings.Fields(left); len(lf) > 4 {
				return lf[4], nil
			}
		}
	}
	return "", errors.New("no cgroup2 file system mounted")
}

// runCgroup is one run's cgroup.
type runCgroup struct {
	dir  string
	fd   *os.File
	done bool
}

// prepare makes run id's cgroup and sets cmd to start in it. A nil
// Cgroups prepares nothing.
func (c *Cgroups) prepare(cmd *exec.Cmd, id string) (*runCgroup, error) {
	if c == nil {
		return nil, nil
	}
	dir := filepath.Join(c.dir, "run-"+id)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("run cgroup: %w", err)
	}
	fd, err := os.Open(dir)
	if err != nil {
		os.Remove(dir)
		return nil, fmt.Errorf("run cgroup: %w", err)
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = int(fd.Fd())
	return &runCgroup{dir: dir, fd: fd}, nil
}

// path returns the cgroup's directory; "" for none.
func (r *runCgroup) path() string {
	if r == nil {
		return ""
	}
	return r.dir
}

// signal sends SIGKILL to every process in the run's cgroup at once
// (cgroup.kill), or before Linux 5.14 to each one listed now; it does not
// wait.
func (r *runCgroup) signal() {
	if r == nil || r.done {
		return
	}
	if err := os.WriteFile(filepath.Join(r.dir, "cgroup.kill"), []byte("1"), 0o644); err != nil {
		for _, pid := range r.procs() {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// kill kills every process in the run's cgroup, waits for it to empty
// (at most 5 s) and removes it.
func (r *runCgroup) kill() {
	if r == nil || r.done {
		return
	}
	r.done = true
	if r.fd != nil {
		defer r.fd.Close()
	}
	if err := os.WriteFile(filepath.Join(r.dir, "cgroup.kill"), []byte("1"), 0o644); err != nil {
		// Before Linux 5.14: kill what is listed, until nothing is.
		for range 50 {
			pids := r.procs()
			if len(pids) == 0 {
				break
			}
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for r.populated() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// cgroup.kill killed the whole subtree; remove it deepest first (a
	// script of shardd's user may have made cgroups inside its own).
	var dirs []string
	filepath.WalkDir(r.dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		os.Remove(dirs[i])
	}
}

func (r *runCgroup) procs() []int {
	b, _ := os.ReadFile(filepath.Join(r.dir, "cgroup.procs"))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

func (r *runCgroup) populated() bool {
	b, err := os.ReadFile(filepath.Join(r.dir, "cgroup.events"))
	if err != nil {
		return len(r.procs()) > 0
	}
	return strings.Contains(string(b), "populated 1")
}
