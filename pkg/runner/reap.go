package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
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
//   - Reap, run for the daemon's life, kills orphans of runs that are over
//     (or that carry no run id at all: nothing else is shardd's child) and
//     reaps every orphan that exits, so none stays a zombie.
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
	pid := cmd.Process.Pid
	procs.started.Store(pid, struct{}{})
	return func() { procs.started.Delete(pid) }, nil
}

// newRun returns a fresh run id, registered as active until end is called.
func newRun() (id string, end func()) {
	id = strconv.Itoa(os.Getpid()) + "-" + strconv.FormatInt(procs.seq.Add(1), 10)
	procs.active.Store(id, struct{}{})
	return id, func() { procs.active.Delete(id) }
}

// sweep kills and reaps the orphans of run id; see the package comment.
func sweep(id string) int {
	procs.mu.Lock()
	defer procs.mu.Unlock()
	return killOrphans(func(run string) bool { return run == id })
}

// Reap kills the orphans of runs that are over and reaps orphans that
// exit, every interval (and at once on SIGCHLD via wake), until ctx ends.
func Reap(ctx context.Context, interval time.Duration, wake <-chan os.Signal) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		procs.mu.Lock()
		killOrphans(func(run string) bool {
			_, active := procs.active.Load(run)
			return !active
		})
		procs.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
	}
}

// killOrphans kills every orphan whose run id doesFor accepts ("" for an
// orphan without one), reaps every orphan that has exited, and returns how
// many it killed. Killed orphans are reaped at once, and their children,
// reparented here, are handled in the next pass. procs.mu must be held.
func killOrphans(doFor func(run string) bool) int {
	killed := 0
	for pass := 0; pass < 100; pass++ {
		progress := false
		for _, pid := range children() {
			if _, ours := procs.started.Load(pid); ours {
				continue
			}
			if zombie(pid) {
				reap(pid, true)
				continue
			}
			if doFor(runOf(pid)) {
				syscall.Kill(pid, syscall.SIGKILL)
				reap(pid, false)
				killed++
				progress = true
			}
		}
		if !progress {
			break
		}
	}
	return killed
}

// reap waits for the orphan pid; nohang returns at once if it still runs.
func reap(pid int, nohang bool) {
	opts := 0
	if nohang {
		opts = syscall.WNOHANG
	}
	var ws syscall.WaitStatus
	for {
		_, err := syscall.Wait4(pid, &ws, opts, nil)
		if !errors.Is(err, syscall.EINTR) {
			return
		}
	}
}

// children lists the children of this process's main thread, which is
// where the kernel reparents orphans (to the reaper's first live thread:
// its leader, alive for as long as shardd is); the children shardd starts
// itself, from any thread, need not be listed. One read per sweep.
func children() []int {
	tasks := []string{"/proc/self/task/" + strconv.Itoa(os.Getpid()) + "/children"}
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

// runOf returns the run id in pid's environment, "" if none or unreadable.
func runOf(pid int) string {
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
