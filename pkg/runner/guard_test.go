package runner

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// The test binary doubles as the guard, as the shardd binary does.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == GuardCommand {
		os.Exit(GuardMain(os.Args[2:]))
	}
	os.Exit(m.Run())
}

func guarded(dir string, deadline func() time.Time) Script {
	s := grandchildScript(dir, "")
	s.Guard, s.Deadline = os.Args[0], deadline
	return s
}

func TestGuardKillsAtAStaleDeadline(t *testing.T) {
	dir := t.TempDir()
	fixed := time.Now().Add(500 * time.Millisecond) // never moved: as if shardd were stopped
	start := time.Now()
	res := guarded(dir, func() time.Time { return fixed }).Run(context.Background(), ctxFixture)
	if res.OK {
		t.Fatalf("the script survived its deadline: %+v", res)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("killed after %s, deadline was 500ms", took)
	}
	if pid := readPID(t, dir); alive(pid) {
		t.Errorf("grandchild %d survived the deadline", pid)
	}
}

func TestGuardLetsAMovingDeadlineRun(t *testing.T) {
	var deadline atomic.Int64
	deadline.Store(time.Now().Add(300 * time.Millisecond).UnixNano())
	stop := make(chan struct{})
	defer close(stop)
	go func() { // the session keeps renewing
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				deadline.Store(time.Now().Add(300 * time.Millisecond).UnixNano())
			}
		}
	}()
	s := Script{Shell: "sleep 1; echo finished", Guard: os.Args[0], Deadline: func() time.Time { return time.Unix(0, deadline.Load()) }}
	res := s.Run(context.Background(), ctxFixture)
	if !res.OK || res.Output != "finished\n" {
		t.Fatalf("guarded run with a live deadline: %+v", res)
	}
}

// shardd killed with -9: the guard's control pipe closes and it kills the script.
func TestGuardKillsWhenShardDies(t *testing.T) {
	dir := t.TempDir()
	far := strconv.FormatInt(time.Now().Add(time.Hour).UnixNano(), 10)
	cmd := exec.Command(os.Args[0], GuardCommand, "--deadline", far, "--", "/bin/sh", "-c", "sleep 60 & echo $! > "+filepath.Join(dir, "pid")+"; wait")
	w, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "pid")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("script did not start")
		}
	}
	w.Close() // what the kernel does to shardd's end when shardd dies
	done := make(chan error)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("guard did not end after its control pipe closed")
	}
	if pid := readPID(t, dir); alive(pid) {
		t.Errorf("grandchild %d survived shardd", pid)
	}
}
