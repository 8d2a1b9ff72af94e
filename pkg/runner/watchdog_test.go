package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as the watchdog, as the shardd binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == WatchdogCommand {
		os.Exit(WatchdogMain())
	}
	os.Exit(m.Run())
}

func startWatchdog(t *testing.T) *Watchdog {
	t.Helper()
	w, err := StartWatchdog(os.Args[0], slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

// waitFile waits until the file at path holds a whole line: a shell's
// "echo $! > f" creates f before it writes, so existing is not enough.
func waitFile(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if b, err := os.ReadFile(path); err == nil && strings.HasSuffix(string(b), "\n") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not get its line", path)
		}
	}
}

// shardd stopped: the deadline is not moved, the watchdog kills the script.
func TestWatchdogKillsAtAStaleDeadline(t *testing.T) {
	w := startWatchdog(t)
	dir := t.TempDir()
	w.SetDeadline(time.Now().Add(500 * time.Millisecond))
	s := grandchildScript(dir, "trap '' TERM; ")
	s.Watchdog = w
	start := time.Now()
	res := s.Run(context.Background(), ctxFixture)
	if res.OK {
		t.Fatalf("the script survived the deadline: %+v", res)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("killed after %s; the deadline was 500ms", took)
	}
	if pid := readPID(t, dir); alive(pid) {
		t.Errorf("grandchild %d survived the deadline", pid)
	}
}

func TestWatchdogLetsAMovingDeadlineRun(t *testing.T) {
	w := startWatchdog(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			w.SetDeadline(time.Now().Add(300 * time.Millisecond))
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	res := Script{Shell: "sleep 1; echo finished", Watchdog: w}.Run(context.Background(), ctxFixture)
	close(stop)
	<-done
	if !res.OK || res.Output != "finished\n" {
		t.Fatalf("run under a live deadline: %+v", res)
	}
}

// shardd killed with -9: its end of the pipe closes; the watchdog kills.
func TestWatchdogKillsWhenShardDies(t *testing.T) {
	w := startWatchdog(t)
	w.SetDeadline(time.Now().Add(time.Hour))
	dir := t.TempDir()
	s := grandchildScript(dir, "trap '' TERM; ")
	s.Watchdog = w
	resc := make(chan Result)
	go func() { resc <- s.Run(context.Background(), ctxFixture) }()
	waitFile(t, filepath.Join(dir, "pid"))
	w.Close() // what the kernel does to shardd's end of the pipe when shardd dies
	select {
	case res := <-resc:
		if res.OK {
			t.Errorf("script survived: %+v", res)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the script was not killed")
	}
	if pid := readPID(t, dir); alive(pid) {
		t.Errorf("grandchild %d survived shardd", pid)
	}
}

// A group added after the deadline passed (shardd stopped between its
// claim and the script's start) is killed at once: the watchdog's timer had
// fired already, and no newer deadline may come.
func TestWatchdogKillsAGroupAddedAfterTheDeadline(t *testing.T) {
	w := startWatchdog(t)
	w.SetDeadline(time.Now().Add(100 * time.Millisecond))
	time.Sleep(300 * time.Millisecond) // the deadline passes with nothing registered
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	if err := w.Add(registration(t, "late", cmd.Process.Pid, "")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
		t.Fatal("a group added after the deadline passed is alive 5s later")
	}
}

// A run whose context is done before it starts never execs its work, with
// or without a watchdog.
func TestScriptWithCancelledContextNeverStarts(t *testing.T) {
	w := startWatchdog(t)
	w.SetDeadline(time.Now().Add(time.Hour))
	marker := filepath.Join(t.TempDir(), "ran")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, wd := range []*Watchdog{nil, w} {
		for i := 0; i < 20; i++ {
			res := Script{Argv: []string{"/usr/bin/touch", marker}, Watchdog: wd}.Run(ctx, ctxFixture)
			if res.OK || !errors.Is(res.Err, ErrKilled) || !res.Started.IsZero() {
				t.Fatalf("watchdog %v: run with a cancelled context: %+v", wd != nil, res)
			}
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the work ran although its context was cancelled before the start")
	}
}

// A run whose fence deadline has passed never execs: the gate holds the
// script until its group is registered and the run is checked.
func TestScriptPastTheDeadlineNeverStarts(t *testing.T) {
	w := startWatchdog(t)
	w.SetDeadline(time.Now().Add(-time.Second))
	marker := filepath.Join(t.TempDir(), "ran")
	res := Script{Argv: []string{"/usr/bin/touch", marker}, Watchdog: w}.Run(context.Background(), ctxFixture)
	if res.OK || !errors.Is(res.Err, ErrKilled) {
		t.Fatalf("run past the fence deadline: %+v", res)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the work ran past the session's fence deadline")
	}
	// A newer deadline lets work run again, through the gate, with its
	// arguments, environment and exit code intact.
	w.SetDeadline(time.Now().Add(time.Hour))
	res = Script{Argv: []string{"sh", "-c", `touch "$1"; echo "$SHARDD_JOB"; exit 3`, "sh", marker}, Watchdog: w}.Run(context.Background(), ctxFixture)
	if res.ExitCode != 3 || res.Output != ctxFixture.Job+"\n" {
		t.Fatalf("run through the gate: %+v", res)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatal("the work did not run under a live deadline")
	}
	res = Script{Argv: []string{"no-such-program-here"}, Watchdog: w}.Run(context.Background(), ctxFixture)
	if res.OK || res.ExitCode != 127 || !strings.Contains(res.Output, "no-such-program-here") {
		t.Fatalf("missing program through the gate: %+v", res)
	}
}

// registration names pid's group as run token, with pid's start time.
func registration(t *testing.T, token string, pid int, cgroup string) Registration {
	t.Helper()
	start, err := procStart(pid)
	if err != nil {
		t.Fatal(err)
	}
	return Registration{Token: token, PGID: pid, Start: start, Cgroup: cgroup}
}

// group starts sh -c shell in a process group of its own; it is killed
// when the test ends. exited is closed once it is reaped.
func group(t *testing.T, shell string) (cmd *exec.Cmd, exited <-chan struct{}) {
	t.Helper()
	cmd = exec.Command("/bin/sh", "-c", shell)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// A stdin that stays open until the test ends: a script's `read`
	// blocks (a /dev/null stdin let the leader exit before the test had
	// registered it).
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		stdin.Close()
		<-done
	})
	return cmd, done
}

// waitDead waits until pid is gone or a zombie.
func waitDead(t *testing.T, pid int, within time.Duration, what string) {
	t.Helper()
	for deadline := time.Now().Add(within); syscall.Kill(pid, 0) == nil && !zombie(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s (pid %d) is alive %s later", what, pid, within)
		}
	}
}

// watchdogPID returns the pid of w's watchdog process now: the child of
// this process that runs WatchdogCommand (the tests of this package run
// one watchdog at a time).
func watchdogPID(t *testing.T) int {
	t.Helper()
	self := strconv.Itoa(os.Getpid())
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		stat, err := os.ReadFile(d + "/stat")
		i := bytes.LastIndexByte(stat, ')')
		if err != nil || i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		args, _ := os.ReadFile(d + "/cmdline")
		if len(f) > 1 && f[0] != "Z" && f[1] == self && strings.Contains(string(args), "\x00"+WatchdogCommand) {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	t.Fatal("no watchdog process runs")
	return 0
}

// A run's group id is its leader's pid; once that leader is reaped, the
// kernel may give the pid to the next run's gate. That run's registration
// must survive the first run's late unregistration: at the fence deadline
// the watchdog kills it. The test steers the pid with ns_last_pid (root).
func TestWatchdogGuardsARunWhoseGroupReusesAnEndedRunsPid(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to steer pid allocation through /proc/sys/kernel/ns_last_pid")
	}
	w := startWatchdog(t)
	w.SetDeadline(time.Now().Add(time.Hour))
	// Each attempt needs the pid given to this test's fork before any
	// other process of the machine forks: retried for up to a minute.
	for attempt, budget := 1, time.Now().Add(time.Minute); time.Now().Before(budget); attempt++ {
		dir := t.TempDir()
		// Run A exits at once but leaves a process outside its group (and
		// without SHARDD_RUN, so no sweep can tell it) holding its stdout
		// for a while: A's Run spends a second after its leader exited.
		a := Script{Shell: `echo $$ > ` + filepath.Join(dir, "a") + `; setsid env -i sleep 3 & exit 0`, Watchdog: w}
		adone := make(chan Result, 1)
		go func() { adone <- a.Run(context.Background(), ctxFixture) }()
		waitFile(t, filepath.Join(dir, "a"))
		pa := readInt(t, filepath.Join(dir, "a"))
		for deadline := time.Now().Add(10 * time.Second); syscall.Kill(pa, 0) == nil; time.Sleep(2 * time.Millisecond) {
			if time.Now().After(deadline) { // A's leader reaped: its pid is free again
				t.Fatalf("run A's leader %d not reaped 10s after it exited", pa)
			}
		}
		// The next run's gate gets A's pid.
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pa-1)), 0); err != nil {
			t.Fatal(err)
		}
		b := Script{Shell: `echo $$ > ` + filepath.Join(dir, "b") + `; exec sleep 30`, Watchdog: w}
		bctx, bcancel := context.WithCancel(context.Background())
		bdone := make(chan Result, 1)
		go func() { bdone <- b.Run(bctx, ctxFixture) }()
		waitFile(t, filepath.Join(dir, "b"))
		pb := readInt(t, filepath.Join(dir, "b"))
		<-adone // A's run is over: it was unregistered
		if pb != pa {
			bcancel()
			<-bdone
			continue // another process took the pid first
		}
		t.Logf("attempt %d: run B's group %d reuses run A's pid", attempt, pb)
		// shardd is stopped: its fence deadline passes. The watchdog must
		// kill every registered run, B included.
		w.SetDeadline(time.Now().Add(100 * time.Millisecond))
		select {
		case res := <-bdone:
			bcancel()
			if res.OK {
				t.Fatalf("run B: %+v", res)
			}
		case <-time.After(5 * time.Second):
			bcancel()
			<-bdone
			t.Fatalf("run B (pgid %d) still ran 5s after the fence deadline passed: run A's end unregistered it from the watchdog", pb)
		}
		return
	}
	t.Fatal("no run got the pid of the run before it within a minute: too many other processes fork on this machine")
}

// A watchdog killed (kill -9, the OOM killer) is restarted at once, with
// the deadline and every live registration: if shardd stops right after,
// writing nothing more, the script still dies at its fence deadline.
func TestWatchdogRestartedAtOnceWhenItDies(t *testing.T) {
	w := startWatchdog(t)
	w.SetDeadline(time.Now().Add(300 * time.Millisecond)) // the last deadline sent before shardd stops
	dir := t.TempDir()
	s := Script{Shell: `echo $$ > ` + filepath.Join(dir, "pid") + `; exec sleep 30`, Watchdog: w}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan Result, 1)
	go func() { done <- s.Run(ctx, ctxFixture) }()
	waitFile(t, filepath.Join(dir, "pid"))
	first := watchdogPID(t)
	syscall.Kill(first, syscall.SIGKILL) // the watchdog dies
	// shardd is stopped from here on: it writes nothing more.
	select {
	case res := <-done:
		if res.OK {
			t.Fatalf("run: %+v", res)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the script (pid %d) runs 10s past its fence deadline: the watchdog died and was not restarted", readPID(t, dir))
	}
	if pid := watchdogPID(t); pid == first {
		t.Fatalf("watchdog %d still listed after kill -9", pid)
	}
	// The restarted watchdog guards new runs.
	w.SetDeadline(time.Now().Add(time.Hour))
	if res := (Script{Shell: "echo ok", Watchdog: w}).Run(context.Background(), ctxFixture); !res.OK {
		t.Fatalf("run after the restart: %+v", res)
	}
}

// Two registrations with one group id: run A's, whose leader had the pid
// first, and run B's. A's late Del removes A's only; B dies at the
// deadline.
func TestWatchdogDelOfOneRunKeepsAnotherWithTheSameGroupID(t *testing.T) {
	w := startWatchdog(t)
	w.SetDeadline(time.Now().Add(time.Hour))
	b, exited := group(t, "exec sleep 30")
	rb := registration(t, "b", b.Process.Pid, "")
	ra := rb
	ra.Token, ra.Start = "a", rb.Start-1
	for _, r := range []Registration{ra, rb} {
		if err := w.Add(r); err != nil {
			t.Fatal(err)
		}
	}
	w.Del("a")
	w.SetDeadline(time.Now().Add(100 * time.Millisecond))
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("run b is alive 5s after the deadline: run a's Del unregistered it")
	}
}

// A registered run's leader pid now belongs to a process started later
// (the run's group is gone, the pid reused): at the deadline the watchdog
// kills the runs that are still there and spares that process.
func TestWatchdogSparesAGroupThatReusedARunsPid(t *testing.T) {
	for _, how := range []string{"deadline", "shardd gone"} {
		t.Run(how, func(t *testing.T) {
			w := startWatchdog(t)
			w.SetDeadline(time.Now().Add(time.Hour))
			stranger, _ := group(t, "exec sleep 30")
			old := registration(t, "old", stranger.Process.Pid, "")
			old.Start-- // the run's leader, started before the stranger, had its pid
			run, runExited := group(t, "exec sleep 30")
			for _, r := range []Registration{old, registration(t, "run", run.Process.Pid, "")} {
				if err := w.Add(r); err != nil {
					t.Fatal(err)
				}
			}
			if how == "deadline" {
				w.SetDeadline(time.Now().Add(-time.Second))
			} else {
				w.Close()
			}
			select {
			case <-runExited: // killed in the pass that decided on the stranger
			case <-time.After(5 * time.Second):
				t.Fatal("the registered run is alive 5s after the deadline")
			}
			w.Close() // the watchdog has exited: done with every pass
			if !alive(stranger.Process.Pid) {
				t.Fatal("the watchdog killed a process group that reused a run's pid")
			}
		})
	}
}

// A run's leader exited and was reaped, what it started goes on in its
// group (which holds the group's id): the watchdog kills it.
func TestWatchdogKillsWhatIsLeftOfAGroupWhoseLeaderExited(t *testing.T) {
	w := startWatchdog(t)
	w.SetDeadline(time.Now().Add(time.Hour))
	pidFile := filepath.Join(t.TempDir(), "pid")
	leader, exited := group(t, "sleep 30 & echo $! > "+pidFile+"; read -r _")
	if err := w.Add(registration(t, "run", leader.Process.Pid, "")); err != nil {
		t.Fatal(err)
	}
	waitFile(t, pidFile)
	member := readInt(t, pidFile)
	syscall.Kill(leader.Process.Pid, syscall.SIGKILL) // the leader only
	<-exited                                          // and reaped
	if syscall.Kill(member, 0) != nil {
		t.Fatalf("member %d died with its leader", member)
	}
	w.SetDeadline(time.Now().Add(-time.Second))
	waitDead(t, member, 5*time.Second, "a process left in a run's group after its leader")
}

// The watchdog of a newer binary, started by a shardd from before
// versions (after an upgrade on disk), speaks that shardd's protocol 1;
// one told a version it does not speak exits 2.
func TestWatchdogProtocolVersions(t *testing.T) {
	t.Run("1", func(t *testing.T) {
		run, exited := group(t, "exec sleep 30")
		cmd := exec.Command(os.Args[0], WatchdogCommand)
		in, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(in, "deadline %d\nadd %d\nadd 77777\ndel 77777\n", time.Hour.Nanoseconds(), run.Process.Pid)
		in.Close() // that shardd dies
		if err := cmd.Wait(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			t.Fatal("a group added in protocol 1 survived its shardd")
		}
	})
	t.Run("unknown", func(t *testing.T) {
		cmd := exec.Command(os.Args[0], WatchdogCommand)
		cmd.Stdin = strings.NewReader(versionPrefix + "99\n")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(stderr.String(), `protocol "99" not spoken`) {
			t.Fatalf("watchdog told protocol 99: %v, %q", err, stderr.String())
		}
	})
}

// Registrations the watchdog could not act on safely are refused.
func TestWatchdogRefusesBadRegistrations(t *testing.T) {
	w := startWatchdog(t)
	for _, r := range []Registration{
		{Token: "", PGID: 1234},
		{Token: "a b", PGID: 1234},
		{Token: "a", PGID: 1},
		{Token: "a", PGID: 0},
		{Token: "a", PGID: -5},
		{Token: "a", PGID: 1234, Cgroup: "x\ny"},
	} {
		if err := w.Add(r); err == nil {
			t.Errorf("Add(%+v) accepted", r)
		}
	}
}

// A run's leader stays a zombie, its pid (the group's id) taken, until
// the run is over and unregistered: no other process can get the id of a
// group the watchdog or shardd may still kill.
func TestScriptHoldsItsGroupIDUntilItsRunEnds(t *testing.T) {
	w := startWatchdog(t)
	w.SetDeadline(time.Now().Add(time.Hour))
	dir := t.TempDir()
	// The leader exits at once; a process that left the group (and
	// without SHARDD_RUN, so no sweep can tell it) holds its output for a
	// second, so the run goes on after the leader's exit.
	pid := filepath.Join(dir, "pid")
	s := Script{Shell: `echo $$ > ` + filepath.Join(dir, "leader") + `; setsid env -i /bin/sh -c 'echo $$ > ` + pid + `; exec /bin/sleep 3' & until [ -s ` + pid + ` ]; do sleep 0.01; done`, Watchdog: w}
	done := make(chan Result, 1)
	go func() { done <- s.Run(context.Background(), ctxFixture) }()
	waitFile(t, filepath.Join(dir, "leader"))
	waitFile(t, pid)
	leader := readInt(t, filepath.Join(dir, "leader"))
	t.Cleanup(func() { syscall.Kill(readPID(t, dir), syscall.SIGKILL) })
	for deadline := time.Now().Add(5 * time.Second); !zombie(leader); time.Sleep(5 * time.Millisecond) {
		select {
		case res := <-done:
			t.Fatalf("the run ended (%+v) and its leader %d was never seen a zombie", res, leader)
		default:
		}
		if syscall.Kill(leader, 0) != nil {
			t.Fatalf("leader %d reaped while its run goes on", leader)
		}
		if time.Now().After(deadline) {
			t.Fatalf("leader %d did not exit", leader)
		}
	}
	if res := <-done; !res.OK {
		t.Fatalf("run: %+v", res)
	}
	if syscall.Kill(leader, 0) == nil {
		t.Errorf("leader %d not reaped once its run ended", leader)
	}
}

// A command the gate cannot exec is named in the job's words: the gate's
// shell is $0 "shardd-JOB", not an internal name.
func TestAMissingCommandIsTheJobs(t *testing.T) {
	w := startWatchdog(t)
	w.SetDeadline(time.Now().Add(time.Minute))
	res := Script{Argv: []string{"/opt/jobs/sycn-orders.sh"}, Watchdog: w}.Run(context.Background(), ctxFixture)
	if res.OK || res.ExitCode != 127 || !strings.Contains(res.Output, "shardd-orders:") || strings.Contains(res.Output, "shardd-gate") {
		t.Errorf("a missing command: exit %d, output %q; want 127, named after the job", res.ExitCode, res.Output)
	}
}
