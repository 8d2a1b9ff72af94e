package runner

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
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
	if err := w.Add(cmd.Process.Pid, ""); err != nil {
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
