package runner

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// GuardCommand is the hidden subcommand of the shardd binary that runs the
// guard: `shardd __guard --deadline <unix-nanos> -- argv...`.
const GuardCommand = "__guard"

// The guard is a small process between shardd and a script. shardd could be
// killed with -9 or stopped with SIGSTOP while a script runs; the script,
// in its own process group, would go on running after shardd's lease ended
// and another instance took the item over (G1). The guard runs the script in
// its own process group and kills the whole group, itself included:
//
//   - when its standard input, a pipe from shardd, closes: shardd is gone;
//   - at the deadline shardd last sent, unless a later one came: shardd is
//     stopped or cut off. The deadline is the session's fence time, which
//     falls before etcd can expire the lease.
//
// shardd writes "<unix-nanos>\n" lines to move the deadline.

// GuardMain runs the guard with args (after the subcommand) and returns the
// exit code: the script's, or 128+signal when a signal ended it.
func GuardMain(args []string) int {
	if len(args) < 4 || args[0] != "--deadline" || args[2] != "--" {
		fmt.Fprintln(os.Stderr, "usage: shardd "+GuardCommand+" --deadline UNIX_NANOS -- ARGV...")
		return 2
	}
	first, err := strconv.ParseInt(args[1], 10, 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, "shardd guard: bad deadline:", err)
		return 2
	}
	// Lead a process group of our own, so that killing the group can only
	// take the script, its children and this guard.
	if err := syscall.Setpgid(0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "shardd guard: setpgid:", err)
		return 1
	}
	cmd := exec.Command(args[3], args[4:]...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr // the script's output goes where the guard's goes
	cmd.Env = os.Environ()
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "shardd guard:", err)
		return 127
	}
	killGroup := func() {
		syscall.Kill(-syscall.Getpgrp(), syscall.SIGKILL) // the script, its children and this guard
		os.Exit(137)
	}

	deadlines := make(chan time.Time, 1)
	go func() {
		s := bufio.NewScanner(os.Stdin)
		for s.Scan() {
			if n, err := strconv.ParseInt(strings.TrimSpace(s.Text()), 10, 64); err == nil {
				select {
				case <-deadlines:
				default:
				}
				deadlines <- time.Unix(0, n)
			}
		}
		close(deadlines) // shardd is gone
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	timer := time.NewTimer(time.Until(time.Unix(0, first)))
	for {
		select {
		case err := <-exited:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					return 128 + int(ws.Signal())
				}
				return ee.ExitCode()
			}
			if err != nil {
				return 1
			}
			return 0
		case d, ok := <-deadlines:
			if !ok {
				killGroup()
			}
			timer.Stop()
			timer = time.NewTimer(time.Until(d))
		case <-timer.C:
			killGroup()
		}
	}
}
