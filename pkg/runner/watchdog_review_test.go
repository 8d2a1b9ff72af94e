package runner

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// From a review: a watchdog stopped with SIGSTOP (kill
// -STOP, a freezer, a debugger) reads nothing, and every line shardd sends
// it is written under the Watchdog's one mutex into a pipe that no longer
// drains. Once its 64 KiB buffer is full (about 700 runs' add and del
// lines, or a few thousand deadline moves: followSession moves it at every
// keep-alive), the write blocks with the mutex held, and with it every
// Add (no run starts, and none fails: it hangs after its claim), every Del
// (a run that ended never records its outcome: its item stays RUNNING
// under a live session, so no other instance takes it over), every
// SetDeadline (followSession, which also wakes the jobs at a new session)
// and Close (shardd cannot stop). The package doc says only that "shardd's
// writes block once the pipe's buffer is full"; the consequence is a
// silent wedge of the whole instance while its status says OK.
//
// What must hold: with the watchdog stopped, Add, Del and SetDeadline
// each return within a bound (Add may fail: the run then does not start),
// so that the runs already going end and record their outcomes, and Close
// returns.
func TestStoppedWatchdogNeverWedgesShardd(t *testing.T) {
	w := startWatchdog(t)
	w.SetDeadline(time.Now().Add(time.Hour))
	run, _ := group(t, "exec sleep 60") // a real group, never killed: every run is Del'd
	pid := watchdogPID(t)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) }) // lets the cleanup's Close end
	base := registration(t, "x", run.Process.Pid, "")
	var progress atomic.Int64 // runs whose calls all returned
	go func() {
		// 2000 runs and as many keep-alives: a few hours of an instance
		// that starts a run every few seconds.
		for i := range 2000 {
			r := base
			r.Token = fmt.Sprintf("run-%04d-%s", i, "0123456789abcdef0123456789abcdef")
			w.Add(r) // an error is fine: that run does not start
			w.Del(r.Token)
			w.SetDeadline(time.Now().Add(time.Hour + time.Duration(i)*time.Millisecond))
			progress.Add(1)
		}
	}()
	seen, since := int64(0), time.Now()
	for progress.Load() < 2000 {
		if n := progress.Load(); n != seen {
			seen, since = n, time.Now()
		}
		if time.Since(since) > 10*time.Second {
			t.Fatalf("with the watchdog stopped (SIGSTOP), a call to it has not returned for 10s after %d runs: "+
				"its pipe is full and the Watchdog's mutex is held by the blocked write (no run can start or end, Close hangs)", seen)
		}
		time.Sleep(10 * time.Millisecond) // polling a counter, not waiting for an event
	}
}
