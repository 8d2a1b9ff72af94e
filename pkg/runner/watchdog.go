package runner

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// WatchdogCommand is the hidden subcommand of the shardd binary that runs
// the watchdog (see WatchdogMain).
const WatchdogCommand = "__watchdog"

// The watchdog is one small process beside shardd. shardd could be killed
// with -9 or stopped with SIGSTOP while scripts run; the scripts, each in
// its own process group, would go on after shardd's lease ended and another
// instance took their items over (G1). shardd tells the watchdog, over a
// pipe, each script's process group and the session's fence deadline; the
// watchdog kills every registered group
//
//   - when the pipe closes: shardd is gone (then it exits);
//   - when the deadline passes without a newer one: shardd is stopped or
//     cut off from etcd, and its lease may expire at any moment. A group
//     added after that (shardd was stopped between a claim and its run)
//     is killed at once, until a newer deadline comes.
//
// Protocol, one command a line: "deadline <nanoseconds from now>",
// "add <pgid> [<cgroup directory>]", "del <pgid>". A group added with its
// run's cgroup is killed with the whole cgroup (cgroup.kill, or each of its
// processes), so what left the process group (setsid, a daemon's double
// fork) dies with it even though shardd, which kills such processes when a
// run ends, is gone. Deadlines travel as durations, so the two
// processes' readings of the wall clock never matter.
//
// A script is registered before it can run: it starts behind a gate (a
// tiny /bin/sh, see gateScript), in its own process group, waiting on a
// pipe; shardd registers the group, checks that the run is still wanted,
// and only then lets the gate exec the script.

// WatchdogMain runs the watchdog on standard input; it returns when the
// input closes, after killing every group still registered.
func WatchdogMain() int {
	// A SIGHUP meant for shardd (systemctl kill -s HUP reaches the whole
	// unit) must not end the watchdog.
	signal.Ignore(syscall.SIGHUP)
	groups := map[int]string{} // pgid -> the run's cgroup directory, or ""
	killAll := func(why string) {
		// Every group and cgroup is signalled first, at once: the fence
		// deadline needs all of them dead, not one after another's wait.
		for pgid, cg := range groups {
			syscall.Kill(-pgid, syscall.SIGKILL)
			if cg != "" {
				(&runCgroup{dir: cg}).signal()
			}
		}
		for pgid, cg := range groups {
			if cg != "" {
				(&runCgroup{dir: cg}).kill() // what forked meanwhile; then removed
				fmt.Fprintf(os.Stderr, "shardd watchdog: killed process group %d and cgroup %s: %s\n", pgid, cg, why)
			} else {
				fmt.Fprintf(os.Stderr, "shardd watchdog: killed process group %d: %s\n", pgid, why)
			}
			delete(groups, pgid)
		}
	}
	lines := make(chan string)
	go func() {
		s := bufio.NewScanner(os.Stdin)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	var deadline *time.Timer
	var fire <-chan time.Time
	expired := false
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				killAll("shardd is gone")
				return 0
			}
			cmd, arg, _ := strings.Cut(line, " ")
			arg, cgroup, _ := strings.Cut(arg, " ")
			n, err := strconv.ParseInt(arg, 10, 64)
			if err != nil {
				fmt.Fprintf(os.Stderr, "shardd watchdog: bad line %q\n", line)
				continue
			}
			switch cmd {
			case "deadline":
				if deadline != nil {
					deadline.Stop()
				}
				deadline = time.NewTimer(time.Duration(n))
				fire, expired = deadline.C, false
			case "add":
				groups[int(n)] = cgroup
				if expired {
					killAll("added after the session's fence deadline passed")
				}
			case "del":
				delete(groups, int(n))
			}
		case <-fire:
			expired = true
			killAll("the session's fence deadline passed")
		}
	}
}

// Watchdog is shardd's side of the watchdog process.
type Watchdog struct {
	bin string
	log *slog.Logger

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{} // closed when the current watchdog process is reaped
	w        io.WriteCloser
	groups   map[int]string // pgid -> its run's cgroup directory, or ""
	deadline time.Time
	closed   bool
}

// StartWatchdog starts `bin __watchdog`; bin is the shardd binary.
func StartWatchdog(bin string, log *slog.Logger) (*Watchdog, error) {
	w := &Watchdog{bin: bin, log: log, groups: map[int]string{}}
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.start(); err != nil {
		return nil, err
	}
	return w, nil
}

func (w *Watchdog) start() error {
	cmd := exec.Command(w.bin, WatchdogCommand)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // not in shardd's group
	in, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	started, err := start(cmd)
	if err != nil {
		return fmt.Errorf("start the script watchdog: %w", err)
	}
	exited := make(chan struct{})
	w.cmd, w.w, w.exited = cmd, in, exited
	go func() { // reaps it; a dead watchdog shows as a failed write
		defer close(exited)
		cmd.Wait()
		started()
	}()
	if !w.deadline.IsZero() {
		fmt.Fprintf(in, "deadline %d\n", time.Until(w.deadline).Nanoseconds())
	}
	for pgid, cg := range w.groups {
		fmt.Fprint(in, addLine(pgid, cg))
	}
	return nil
}

// send writes a line, restarting a dead watchdog once.
func (w *Watchdog) send(line string) error {
	if w.closed {
		return errors.New("watchdog closed")
	}
	if _, err := io.WriteString(w.w, line); err == nil {
		return nil
	}
	w.log.Error("script watchdog died; restarting it")
	w.w.Close()
	if err := w.start(); err != nil {
		return err
	}
	_, err := io.WriteString(w.w, line)
	return err
}

// SetDeadline moves the time at which every registered group is killed.
func (w *Watchdog) SetDeadline(t time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if t.Equal(w.deadline) {
		return nil
	}
	w.deadline = t
	return w.send(fmt.Sprintf("deadline %d\n", time.Until(t).Nanoseconds()))
}

// Expired reports whether the last deadline set has passed: a run must not
// start then (its session may have lost the item).
func (w *Watchdog) Expired() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.deadline.IsZero() && !time.Now().Before(w.deadline)
}

// Add registers a script's process group, and the directory of its run's
// cgroup ("" for none).
func (w *Watchdog) Add(pgid int, cgroup string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if strings.ContainsAny(cgroup, "\n") {
		return fmt.Errorf("watchdog: cgroup path %q has a newline", cgroup)
	}
	w.groups[pgid] = cgroup
	return w.send(addLine(pgid, cgroup))
}

func addLine(pgid int, cgroup string) string {
	if cgroup == "" {
		return fmt.Sprintf("add %d\n", pgid)
	}
	return fmt.Sprintf("add %d %s\n", pgid, cgroup)
}

// Del unregisters a process group that has ended.
func (w *Watchdog) Del(pgid int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.groups, pgid)
	w.send(fmt.Sprintf("del %d\n", pgid))
}

// Close stops the watchdog, which kills the groups still registered, and
// waits for it to exit.
func (w *Watchdog) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	err := w.w.Close()
	exited := w.exited
	w.mu.Unlock()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		w.cmd.Process.Kill()
		<-exited
	}
	return err
}

// gateScript holds a script until shardd lets it go: /bin/sh reads a line
// from file descriptor 3, closes it and replaces itself with the script's
// argv (looked up in PATH; 127 if it cannot run). If the pipe closes
// without that line, the run was no longer wanted: it exits 125 and
// nothing runs. A shell, not the shardd binary: starting a Go binary that
// links etcd costs far more per run than sh.
const gateScript = `read -r _ <&3 || exit 125; exec 3<&-; exec "$@"`
