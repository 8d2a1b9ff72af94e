package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// No work outlives its run. A script runs in a process group of its own,
// killed when the run ends; but a process can leave the group (setsid, a
// daemon's double fork) and be reparented away from shardd. So:
//
//   - shardd is a child subreaper (prctl PR_SET_CHILD_SUBREAPER; PID 1 in a
//     container is one anyway): whatever a script leaves behind is
//     reparented to shardd, not to init;
//   - every run's environment carries SHARDD_RUN, a unique id, which its
//     processes inherit;
//   - when a run ends, sweep kills every child of shardd that shardd did not
//     start itself (an orphan) and carries that run's id, and reaps it; its
//     own children are then reparented to shardd in turn, and killed the
//     same way, until none is left;
//   - Reap, run for the daemon's life, reaps every orphan that exits, so
//     none stays a zombie, and kills orphans of runs that are over; one
//     whose run cannot be told (it cleared its environment, or made it
//     unreadable: ssh-agent does) only while no run is active, since it may
//     belong to one. With cgroups (cgroup.go) the run is read from the
//     orphan's cgroup instead, which it cannot hide.
//
// Orphans are told from shardd's own children (exec.Cmd, which waits for
// them itself) by the set of pids started through start: the reaper never
// waits for a pid in it, and start holds a lock so that the reaper cannot
// see a child of start before it is in the set.

// RunEnv names the environment variable that carries a run's id.
const RunEnv = "SHARDD_RUN"

var procs struct {
	mu      sync.RWMutex // start holds it for reading, the reaper for writing
	started sync.Map     // pid -> struct{}: children waited for by their exec.Cmd
	active  sync.Map     // run id -> struct{}: runs still going
	seq     atomic.Int64
}

// BecomeSubreaper makes this process the reaper of its descendants'
// orphans (Linux 3.4+).
func BecomeSubreaper() error {
	const prSetChildSubreaper = 36
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %w", errno)
	}
	return nil
}

// start starts cmd as a child that its exec.Cmd waits for; done must be
// called once cmd.Wait returned.
func start(cmd *exec.Cmd) (done func(), err error) {
	procs.mu.RLock()
	defer procs.mu.RUnlock()
	if err := cmd.Start(); err != nil {
		return func() {}, err
	}
	pid, token := cmd.Process.Pid, new(int)
	procs.started.Store(pid, token)
	// Only this start's entry: a pid reused by a later start keeps its own.
	return func() { procs.started.CompareAndDelete(pid, token) }, nil
}

// newRun returns a fresh run id, registered as active until end is called.
func newRun() (id string, end func()) {
	id = strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(procs.seq.Add(1), 10)
	procs.active.Store(id, struct{}{})
	return id, func() { procs.active.Delete(id) }
}

// sweep kills the orphans of run id, and theirs in turn, and reaps them;
// see the package comment. It needs no lock: an orphan carrying id cannot
// be a child start has not recorded yet (that one carries its own run's
// id), and it waits only for the orphans it killed, at most about a second
// for all of them.
func sweep(id string) int {
	killed := 0
	deadline := time.Now().Add(time.Second)
	for pass := 0; pass < 100 && time.Now().Before(deadline); pass++ {
		var victims []int
		for _, pid := range children() {
			if _, ours := procs.started.Load(pid); !ours && !zombie(pid) && runOf(pid) == id {
				if syscall.Kill(pid, syscall.SIGKILL) == nil {
					victims = append(victims, pid)
				}
			}
		}
		if len(victims) == 0 {
			break
		}
		killed += len(victims)
		// Reaped, their own children are reparented here for the next pass.
		for _, pid := range victims {
			for !reap(pid) && time.Now().Before(deadline) {
				time.Sleep(2 * time.Millisecond)
			}
		}
	}
	return killed
}

// Reap reaps orphans that exited and kills those of runs that are over,
// every interval (and at once on SIGCHLD via wake), until ctx ends. It
// never waits for a process, and skips a pass while a start is in progress
// (a hung exec must not stall it, nor it every other start).
func Reap(ctx context.Context, interval time.Duration, wake <-chan os.Signal) {
	t := time.NewTicker(interval)
	defer t.Stop()
	resisted := map[int]bool{} // killed once and still there (another user's, or in D state)
	for {
		if procs.mu.TryLock() {
			reapPass(resisted)
			procs.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
	}
}

// reapPass reaps every exited orphan, and kills the orphans that belong
// to no active run: those whose run is over, and, while no run is
// active, those whose run cannot be told (no SHARDD_RUN, or an environment
// this process may not read). procs.mu must be held: it keeps start's
// children out of sight until they are recorded.
func reapPass(resisted map[int]bool) {
	idle := true
	procs.active.Range(func(any, any) bool { idle = false; return false })
	alive := map[int]bool{}
	for _, pid := range children() {
		if _, ours := procs.started.Load(pid); ours {
			continue
		}
		if zombie(pid) {
			reap(pid)
			continue
		}
		alive[pid] = true
		run := runOf(pid)
		_, active := procs.active.Load(run)
		if resisted[pid] || active || (run == "" && !idle) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) != nil {
			resisted[pid] = true
		}
	}
	for pid := range resisted {
		if !alive[pid] {
			delete(resisted, pid)
		}
	}
}

// reap reaps the orphan pid if it has exited; it never waits.
func reap(pid int) bool {
	var ws syscall.WaitStatus
	for {
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		return got == pid || err != nil
	}
}

// children lists the children of this process's main thread, which is
// where the kernel reparents orphans (to the reaper's first live thread:
// its leader, alive for as long as shardd is); the children shardd starts
// itself, from any thread, need not be listed. One read per sweep.
func children() []int {
	self := strconv.Itoa(os.Getpid())
	tasks := []string{"/proc/self/task/" + self + "/children"}
	if _, err := os.Stat(tasks[0]); err != nil {
		return childrenByStat(self) // a kernel without CONFIG_PROC_CHILDREN
	}
	seen := map[int]bool{}
	var out []int
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, field := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(field); err == nil && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
	}
	return out
}

// childrenByStat lists the processes whose parent is self, from every
// /proc/<pid>/stat: slower, for kernels without the children file.
func childrenByStat(self string) []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []int
	for _, d := range dirs {
		b, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		if f := strings.Fields(string(b[i+1:])); len(f) > 1 && f[1] == self {
			if pid, err := strconv.Atoi(filepath.Base(d)); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

// zombie reports whether pid has exited and waits to be reaped.
func zombie(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// procStart returns pid's start time: /proc/<pid>/stat field 22, in clock
// ticks since boot. With the pid, it names one process for the life of
// the system.
func procStart(pid int) (uint64, error) {
	path := "/proc/" + strconv.Itoa(pid) + "/stat"
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses;
	// the fields after it start at field 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("%s: no command name", path)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 22-2 {
		return 0, fmt.Errorf("%s: %d fields, want 22 or more", path, len(f)+2)
	}
	start, err := strconv.ParseUint(f[22-3], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: start time (field 22): %w", path, err)
	}
	return start, nil
}

// waitExit waits until the child pid has exited, and leaves it a zombie
// (waitid WNOWAIT): its pid, and so its process group's id, is given to no
// other process until its exec.Cmd's Wait reaps it.
func waitExit(pid int) error {
	const pPID = 1     // P_PID
	var info [128]byte // a siginfo_t, not read
	const opts = syscall.WEXITED | syscall.WNOWAIT
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid), uintptr(unsafe.Pointer(&info)), opts, 0, 0)
		if errno != syscall.EINTR {
			if errno != 0 {
				return fmt.Errorf("waitid %d: %w", pid, errno)
			}
			return nil
		}
	}
}

// isRunID reports whether id has the shape of newRun's ids: <pid>-<seq>.
func isRunID(id string) bool {
	pid, seq, ok := strings.Cut(id, "-")
	return ok && allDigits(pid) && allDigits(seq)
}

func allDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

// runOfCgroup returns the run id in a /proc/<pid>/cgroup: the first
// directory of its cgroup v2 path named run-<pid>-<seq> (not systemd's
// run-u123.service or run-r<hash>.scope, which may come before it).
func runOfCgroup(procCgroup string) string {
	for _, line := range strings.Split(procCgroup, "\n") {
		if path, ok := strings.CutPrefix(line, "0::"); ok {
			for _, dir := range strings.Split(path, "/") {
				if id, ok := strings.CutPrefix(dir, "run-"); ok && isRunID(id) {
					return id
				}
			}
		}
	}
	return ""
}

// runOf returns pid's run id: from its cgroup (run-<id>) when runs get
// cgroups, else from SHARDD_RUN in its environment; "" if neither says.
func runOf(pid int) string {
	if b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup"); err == nil {
		if id := runOfCgroup(string(b)); id != "" {
			return id
		}
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return ""
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte(RunEnv+"=")); ok {
			return string(v)
		}
	}
	return ""
}
