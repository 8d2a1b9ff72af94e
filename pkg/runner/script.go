package runner

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Script runs a program in its own process group.
type Script struct {
	// Argv runs directly; Shell runs with /bin/sh -c. Exactly one is set.
	Argv  []string
	Shell string
	// Env is added to shardd's environment, and the context's SHARDD_* after it.
	Env     map[string]string
	Workdir string
	// ContextArg appends ElasticJob's shardingContext JSON as the last argument.
	ContextArg bool
	// Timeout bounds the run (0: none). At the timeout the process group gets
	// SIGTERM, and SIGKILL Grace later (default 5s).
	Timeout, Grace time.Duration
	// TailBytes caps the output kept in the result (default 4096).
	TailBytes int
	// Log receives every output line (nil: discarded).
	Log *slog.Logger
	// Guard is the shardd binary that runs the guard (see GuardMain), and
	// Deadline the current fence time it is fed. With both set, the script
	// dies with shardd, and at the deadline if shardd stops moving it.
	Guard    string
	Deadline func() time.Time
}

// feedDeadlines sends the guard each new deadline until stop is closed.
func feedDeadlines(w *os.File, deadline func() time.Time, stop <-chan struct{}) {
	var last time.Time
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if d := deadline(); !d.Equal(last) {
			if _, err := fmt.Fprintf(w, "%d\n", d.UnixNano()); err != nil {
				return
			}
			last = d
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// ErrTimeout is the error of a run stopped at its timeout.
var ErrTimeout = errors.New("runner: timed out")

// ErrKilled is the error of a run stopped because ctx was cancelled.
var ErrKilled = errors.New("runner: killed")

// Run executes the script for c. Cancelling ctx kills the whole process
// group at once (SIGKILL): it is how shardd stops work it may no longer own.
// Any processes the script leaves behind in its group are killed when it exits.
func (s Script) Run(ctx context.Context, c Context) (res Result) {
	res = Result{Start: time.Now(), ExitCode: -1}
	defer func() { res.End = time.Now() }()
	grace, tailBytes := s.Grace, s.TailBytes
	if grace == 0 {
		grace = 5 * time.Second
	}
	if tailBytes == 0 {
		tailBytes = 4096
	}

	var cmd *exec.Cmd
	switch {
	case len(s.Argv) > 0:
		args := append([]string(nil), s.Argv[1:]...)
		if s.ContextArg {
			args = append(args, c.elasticJobContext())
		}
		cmd = exec.Command(s.Argv[0], args...)
	default:
		args := []string{"-c", s.Shell, "shardd-" + c.Job}
		if s.ContextArg {
			args = append(args, c.elasticJobContext())
		}
		cmd = exec.Command("/bin/sh", args...)
	}
	var feed *os.File // the guard's control pipe
	if s.Guard != "" && s.Deadline != nil {
		args := append([]string{GuardCommand, "--deadline", strconv.FormatInt(s.Deadline().UnixNano(), 10), "--", cmd.Path}, cmd.Args[1:]...)
		cmd = exec.Command(s.Guard, args...)
		r, w, err := os.Pipe()
		if err != nil {
			res.Err = fmt.Errorf("guard pipe: %w", err)
			return res
		}
		defer r.Close()
		defer w.Close()
		cmd.Stdin, feed = r, w
	}
	cmd.Dir = s.Workdir
	cmd.Env = os.Environ()
	for k, v := range s.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, c.Env()...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	out := &tail{max: tailBytes}
	// An OS pipe, so that Wait does not wait for output from processes the
	// script left behind; the reader ends when the last writer is gone.
	pr, pw, err := os.Pipe()
	if err != nil {
		res.Err = fmt.Errorf("output pipe: %w", err)
		return res
	}
	defer pr.Close()
	cmd.Stdout, cmd.Stderr = pw, pw
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		r := bufio.NewReader(pr)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				out.Write([]byte(line))
				if s.Log != nil {
					s.Log.Info("output", "job", c.Job, "item", c.Item, "line", strings.TrimRight(line, "\n"))
				}
			}
			if err != nil {
				io.Copy(io.Discard, pr)
				return
			}
		}
	}()

	err = cmd.Start()
	pw.Close() // the child has its copy
	if err != nil {
		<-copied
		res.Err = fmt.Errorf("start %s: %w", cmd.Path, err)
		return res
	}
	pgid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if feed != nil {
		stopFeed := make(chan struct{})
		defer close(stopFeed)
		go feedDeadlines(feed, s.Deadline, stopFeed)
	}

	var timeout <-chan time.Time
	if s.Timeout > 0 {
		t := time.NewTimer(s.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	var waitErr error
	select {
	case waitErr = <-exited:
	case <-ctx.Done():
		syscall.Kill(-pgid, syscall.SIGKILL)
		waitErr = <-exited
		res.Err = fmt.Errorf("%w: %v", ErrKilled, context.Cause(ctx))
	case <-timeout:
		syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case waitErr = <-exited:
		case <-time.After(grace):
			syscall.Kill(-pgid, syscall.SIGKILL)
			waitErr = <-exited
		case <-ctx.Done():
			syscall.Kill(-pgid, syscall.SIGKILL)
			waitErr = <-exited
		}
		res.Err = fmt.Errorf("%w after %s", ErrTimeout, s.Timeout)
	}
	// Nothing of the item may outlive it: kill what the script left in its group.
	syscall.Kill(-pgid, syscall.SIGKILL)
	select {
	case <-copied:
	case <-time.After(time.Second): // a process that left the group holds the pipe
		pr.Close()
		<-copied
	}

	res.Output = out.String()
	if cmd.ProcessState != nil {
		res.ExitCode = cmd.ProcessState.ExitCode()
	}
	switch {
	case res.Err != nil:
	case waitErr != nil:
		res.Err = fmt.Errorf("exit %d: %w", res.ExitCode, waitErr)
	default:
		res.OK = true
	}
	res.Retryable = !res.OK && !errors.Is(res.Err, ErrKilled)
	return res
}
