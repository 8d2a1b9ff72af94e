package runner

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
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
// pipe, each run's process group and the session's fence deadline; the
// watchdog kills every registered run
//
//   - when the pipe closes: shardd is gone (then it exits);
//   - when the deadline passes without a newer one: shardd is stopped or
//     cut off from etcd, and its lease may expire at any moment. A run
//     added after that (shardd was stopped between a claim and its run)
//     is killed at once, until a newer deadline comes.
//
// A script is registered before it can run: it starts behind a gate (a
// tiny /bin/sh, see gateScript), in its own process group, waiting on a
// pipe; shardd registers the group, checks that the run is still wanted,
// and only then lets the gate exec the script.
//
// # Runs, not pids
//
// A process group's id is its leader's pid, and pids are reused. The
// watchdog therefore knows runs: a registration is the run's token (its
// SHARDD_RUN id, unique to the run), its process group id, and its
// leader's start time (/proc/<pid>/stat field 22, clock ticks since boot),
// which shardd reads while the leader is its unreaped child, so that it is
// that process's. A run is unregistered by its token: a late "del" of a run
// that ended never removes another run's registration, even one whose
// group got the same id.
//
// The kernel gives a number out again only once no process has it as its
// pid, its process group id or its session id (a zombie counts until it is
// reaped). Before signalling a registered group, the watchdog reads
// /proc/<pgid>/stat:
//
//   - the start time is the registered one: the leader, alive or a zombie,
//     holds the id; the group is the run's. It is killed.
//   - another start time: the number went to a process started later,
//     which it could only once every process of the run's group was gone.
//     Nothing is killed: the group there is not the run's.
//   - no such process: the leader exited and was reaped. What is left of
//     its group, if anything, still holds the id, so killing the group
//     reaches those processes and no others. The one exception needs every
//     process of the group gone, the number handed out again (after a
//     full turn of pid_max allocations), taken as a new group's id, and
//     that group's leader gone in turn, all before the watchdog acts.
//     shardd keeps that from happening while it lives: a run's leader is
//     reaped only after the run's "del" was sent and shardd's own kills of
//     the group are done (it waits for the exit with waitid WNOWAIT and
//     reaps later), so every registered group's id stays taken. The case
//     is left to a shardd that died (its zombies are reaped by init) in
//     the milliseconds before the watchdog reads end of file and kills.
//
// A run's cgroup directory (run-<token>), if it has one, is the run's by
// name: it is killed whatever its leader's pid says.
//
// # The watchdog's own failures
//
// The watchdog's exit is an event: a goroutine of shardd waits on the
// process and restarts it at once (no more often than once a second),
// sending the deadline again (as the time left; one that passed makes the
// new watchdog kill at once) and every live registration. Between the
// death and the restart, the time to start a process, nothing guards the
// runs; an Add that finds the watchdog dead waits for the restart and fails
// (the run does not start) if none comes within restartWait. A watchdog
// that cannot be started is retried each second, with an error logged each
// time. A watchdog that dies while shardd itself is stopped is restarted
// when shardd resumes: one of the two processes failing is covered, not
// both at once. It asks the kernel to spare it from the OOM killer
// (oom_score_adj -1000) where it may (CAP_SYS_RESOURCE). A stopped
// watchdog (SIGSTOP) is not noticed: shardd's writes block once the pipe's
// buffer is full.
//
// # Protocol
//
// One command a line, on the watchdog's standard input:
//
//	shardd-watchdog 2                        the first line: the version
//	deadline <nanoseconds from now>
//	add <token> <pgid> <start time> [<cgroup directory>]
//	del <token>
//
// Deadlines travel as durations, so the two processes' readings of the
// wall clock never matter. The watchdog answers the version line with the
// same line on its standard output, the only thing it ever writes there;
// shardd uses no watchdog that does not answer within startWait (an older
// binary would not). A watchdog told a version it does not speak says so on
// standard error and exits 2. A first line that is not a version line is
// protocol 1, that of shardd before tokens: "add <pgid> [<cgroup>]" and
// "del <pgid>", keyed by the group's id and killed unchecked, as that
// shardd expects; it is kept so that a shardd running while its binary
// was upgraded on disk can restart its watchdog from the new file.
// cmd/shardd starts the watchdog from /proc/self/exe, its own running
// binary even when the file was replaced or removed since: both ends are
// the same build.

// The protocol shardd speaks, and its version line's prefix; WatchdogMain
// also speaks protocol 1.
const (
	protocolVersion = 2
	versionPrefix   = "shardd-watchdog "
)

const (
	// startWait bounds a watchdog's start, up to its answer.
	startWait = 10 * time.Second
	// restartWait bounds how long an Add waits for a dead watchdog's
	// restart.
	restartWait = startWait + 5*time.Second
	// restartEvery is the least time between two restarts (the first
	// after a death is at once).
	restartEvery = time.Second
)

var errWatchdogClosed = errors.New("watchdog: closed")

// A Registration is one run as the watchdog knows it.
type Registration struct {
	// Token is the run's id (SHARDD_RUN), unique to the run.
	Token string
	// PGID is the run's process group: its leader's pid.
	PGID int
	// Start is the leader's start time, /proc/<pid>/stat field 22.
	Start uint64
	// Cgroup is the directory of the run's cgroup, or "".
	Cgroup string
}

func (r Registration) check() error {
	switch {
	case r.Token == "" || strings.ContainsAny(r.Token, " \t\n"):
		return fmt.Errorf("watchdog: run token %q is empty or has a space", r.Token)
	case r.PGID <= 1: // kill(-1) and kill(0) reach far more than a run
		return fmt.Errorf("watchdog: run %s: process group %d is not a run's", r.Token, r.PGID)
	case strings.ContainsAny(r.Cgroup, "\n"):
		return fmt.Errorf("watchdog: run %s: cgroup path %q has a newline", r.Token, r.Cgroup)
	}
	return nil
}

func (r Registration) line() string {
	l := fmt.Sprintf("add %s %d %d", r.Token, r.PGID, r.Start)
	if r.Cgroup != "" {
		l += " " + r.Cgroup
	}
	return l + "\n"
}

// Watchdog is shardd's side of the watchdog process.
type Watchdog struct {
	bin  string
	log  *slog.Logger
	stop chan struct{} // closed by Close
	done chan struct{} // closed when supervise has returned

	mu       sync.Mutex
	proc     *watchdogProc // nil from a watchdog's exit to its restart
	up       chan struct{} // closed when proc is next set
	runs     map[string]Registration
	deadline time.Time
	closed   bool
}

// watchdogProc is one watchdog process.
type watchdogProc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	exited chan struct{} // closed when it is reaped
	err    error         // what cmd.Wait returned; set before exited closes
}

// kill kills the process and waits until it is reaped.
func (p *watchdogProc) kill() {
	p.cmd.Process.Kill()
	<-p.exited
}

// StartWatchdog starts `bin __watchdog`; bin is the shardd binary
// (cmd/shardd passes /proc/self/exe). The watchdog is restarted whenever it
// exits, until Close.
func StartWatchdog(bin string, log *slog.Logger) (*Watchdog, error) {
	w := &Watchdog{bin: bin, log: log, stop: make(chan struct{}), done: make(chan struct{}),
		up: make(chan struct{}), runs: map[string]Registration{}}
	p, err := w.spawn()
	if err != nil {
		return nil, err
	}
	w.proc = p
	go w.supervise(p)
	return w, nil
}

// spawn starts a watchdog process and waits for its answer to the
// version line.
func (w *Watchdog) spawn() (*watchdogProc, error) {
	cmd := exec.Command(w.bin, WatchdogCommand)
	cmd.Args[0] = os.Args[0] // in ps, under the name shardd was started with
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // not in shardd's group
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("start the script watchdog: %w", err)
	}
	answer, aw, err := os.Pipe()
	if err != nil {
		in.Close()
		return nil, fmt.Errorf("start the script watchdog: %w", err)
	}
	defer answer.Close()
	cmd.Stdout = aw
	started, err := start(cmd)
	aw.Close()
	if err != nil {
		return nil, fmt.Errorf("start the script watchdog %s: %w", w.bin, err)
	}
	p := &watchdogProc{cmd: cmd, in: in, exited: make(chan struct{})}
	go func() { // reaps it; supervise (or spawn's caller) waits for it
		defer close(p.exited)
		p.err = cmd.Wait()
		started()
	}()
	version := versionPrefix + strconv.Itoa(protocolVersion) + "\n"
	_, err = io.WriteString(in, version)
	var got string
	if err == nil {
		answer.SetReadDeadline(time.Now().Add(startWait))
		got, err = bufio.NewReader(answer).ReadString('\n')
	}
	if err != nil || got != version {
		p.kill()
		return nil, fmt.Errorf("the script watchdog %s did not answer protocol %d within %s (a shardd binary from before it?): got %q, %v", w.bin, protocolVersion, startWait, got, err)
	}
	return p, nil
}

// supervise restarts the watchdog each time it exits, until Close.
func (w *Watchdog) supervise(p *watchdogProc) {
	defer close(w.done)
	var last time.Time // the last restart: the first is at once
	for {
		<-p.exited
		w.mu.Lock()
		w.proc = nil
		closed := w.closed
		w.mu.Unlock()
		if closed {
			return
		}
		w.log.Error("script watchdog exited; restarting it", "err", p.err, "runs", w.registered())
		for {
			if wait := restartEvery - time.Since(last); wait > 0 {
				select {
				case <-w.stop:
					return
				case <-time.After(wait):
				}
			}
			last = time.Now()
			np, err := w.restart()
			if errors.Is(err, errWatchdogClosed) {
				return
			}
			if err == nil {
				p = np
				w.log.Info("script watchdog restarted", "pid", np.cmd.Process.Pid)
				break
			}
			w.log.Error("restart the script watchdog; runs cannot start until it runs", "err", err)
		}
	}
}

// restart starts a watchdog and sends it the deadline and every live
// registration.
func (w *Watchdog) restart() (*watchdogProc, error) {
	p, err := w.spawn()
	if err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		p.kill()
		return nil, errWatchdogClosed
	}
	w.proc = p
	if !w.deadline.IsZero() {
		w.send(deadlineLine(w.deadline))
	}
	for _, r := range w.runs {
		w.send(r.line())
	}
	// A failed write means this one died too: supervise sees it exit.
	close(w.up)
	w.up = make(chan struct{})
	return p, nil
}

func (w *Watchdog) registered() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.runs)
}

func deadlineLine(t time.Time) string {
	return fmt.Sprintf("deadline %d\n", time.Until(t).Nanoseconds())
}

// send writes a line to the watchdog; w.mu is held. A watchdog that died
// gets none: its restart sends what it must know.
func (w *Watchdog) send(line string) error {
	if w.closed {
		return errWatchdogClosed
	}
	if w.proc == nil {
		return errors.New("watchdog: not running (restarting)")
	}
	// A watchdog that reads nothing (stopped: SIGSTOP, a frozen cgroup)
	// would block this write once the pipe is full, with w.mu held: every
	// run's Add and Del, the deadline and Close behind it. One that takes
	// longer than sendTimeout is killed, as a dead one: supervise restarts
	// it and sends it everything again.
	if d, ok := w.proc.in.(interface{ SetWriteDeadline(time.Time) error }); ok {
		d.SetWriteDeadline(time.Now().Add(sendTimeout))
	}
	if _, err := io.WriteString(w.proc.in, line); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			w.log.Error("script watchdog takes no more lines (stopped?): killing it, to restart it", "pid", w.proc.cmd.Process.Pid)
			w.proc.kill()
		}
		return fmt.Errorf("watchdog: %w", err)
	}
	return nil
}

// sendTimeout bounds one write to the watchdog.
const sendTimeout = 2 * time.Second

// SetDeadline moves the time at which every registered group is killed.
// A watchdog restarted later is sent it too.
func (w *Watchdog) SetDeadline(t time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if t.Equal(w.deadline) {
		return nil
	}
	w.deadline = t
	return w.send(deadlineLine(t))
}

// Expired reports whether the last deadline set has passed: a run must not
// start then (its session may have lost the item).
func (w *Watchdog) Expired() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.deadline.IsZero() && !time.Now().Before(w.deadline)
}

// Add registers a run. If the watchdog is dead, it waits for its restart,
// which sends the registration; it fails when none comes within
// restartWait, or once Close was called: the run must not start then.
func (w *Watchdog) Add(r Registration) error {
	if err := r.check(); err != nil {
		return err
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return errWatchdogClosed
	}
	w.runs[r.Token] = r
	err := w.send(r.line())
	up := w.up
	w.mu.Unlock()
	if err == nil {
		return nil
	}
	t := time.NewTimer(restartWait)
	defer t.Stop()
	select {
	case <-up:
		return nil
	case <-w.stop:
		return errWatchdogClosed
	case <-t.C:
		return fmt.Errorf("%w; not restarted within %s", err, restartWait)
	}
}

// Del unregisters a run that has ended; only that run's registration,
// whatever its process group's id.
func (w *Watchdog) Del(token string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.runs[token]; !ok {
		return
	}
	delete(w.runs, token)
	w.send("del " + token + "\n")
}

// Close stops the watchdog, which kills the runs still registered, and
// waits for it to exit.
func (w *Watchdog) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		<-w.done
		return nil
	}
	w.closed = true
	close(w.stop)
	p := w.proc
	var err error
	if p != nil {
		err = p.in.Close()
	}
	w.mu.Unlock()
	if p == nil { // between a death and a restart: supervise ends itself
		<-w.done
		return err
	}
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
		p.kill()
		<-w.done
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
