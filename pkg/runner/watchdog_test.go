package runner

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
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

func waitFile(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear", path)
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
