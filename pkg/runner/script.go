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
	"strings"
	"sync"
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
	// Cgroups, if set, confines each run to a cgroup of its own, killed
	// whole when the run ends.
	Cgroups *Cgroups
	// Watchdog, if set, is told the script's process group, so that the
	// script dies with shardd or at the session's fence deadline even when
	// shardd cannot act (see WatchdogMain).
	Watchdog *Watchdog
	// MoreExitCode, if set (streaming dataflow), is the exit status with
	// which the script says it processed data and more may remain: a
	// success, with Result.More.
	MoreExitCode int
}

// maxEnvString is Linux's MAX_ARG_STRLEN: an environment string as long
// makes exec fail with E2BIG.
const maxEnvString = 128 << 10

// Output lines go to the log bounded: a line is cut at maxLogLine bytes
// (and marked truncated), and a run logs at most maxLogLines lines; the
// rest is counted in one last line. The history keeps the output's tail.
const (
	maxLogLine  = 4 << 10
	maxLogLines = 1000
)

// lineLog logs a run's output line by line, within those bounds. Both
// streams write to it, each with its own unfinished line.
type lineLog struct {
	log     *slog.Logger
	job     string
	item    int
	mu      sync.Mutex
	line    [2][]byte
	long    [2]bool // the stream's current line was cut
	lines   int     // complete lines seen
	dropped int     // lines not logged
}

func (l *lineLog) Write(stream int, p []byte) {
	if l.log == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if room := maxLogLine - len(l.line[stream]); len(chunk) > room {
			l.line[stream], l.long[stream] = append(l.line[stream], chunk[:room]...), true
		} else {
			l.line[stream] = append(l.line[stream], chunk...)
		}
		if i < 0 {
			return
		}
		l.emit(stream)
		p = p[i+1:]
	}
}

func (l *lineLog) emit(stream int) {
	l.lines++
	if l.lines > maxLogLines {
		l.dropped++
	} else {
		attrs := []any{"job", l.job, "item", l.item, "line", strings.ToValidUTF8(string(l.line[stream]), "\uFFFD")}
		if stream == stderr {
			attrs = append(attrs, "stream", "stderr")
		}
		if l.long[stream] {
			attrs = append(attrs, "truncated", true)
		}
		l.log.Info("output", attrs...)
	}
	l.line[stream], l.long[stream] = l.line[stream][:0], false
}

// Close logs the last, unterminated lines and what was not logged.
func (l *lineLog) Close() {
	if l.log == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for stream := range l.line {
		if len(l.line[stream]) > 0 || l.long[stream] {
			l.emit(stream)
		}
	}
	if l.dropped > 0 {
		l.log.Info("output not logged", "job", l.job, "item", l.item, "lines", l.dropped,
			"why", fmt.Sprintf("a run logs at most %d lines here; its run log (unless off) has all of its output, its history the tail", maxLogLines))
	}
}

// The streams of a script's output.
const (
	stdout = 0
	stderr = 1
)

// ErrTimeout is the error of a run stopped at its timeout.
var ErrTimeout = errors.New("runner: timed out")

// ErrKilled is the error of a run stopped because ctx was cancelled.
var ErrKilled = errors.New("runner: killed")

// Run executes the script for c. Cancelling ctx kills the whole process
// group at once (SIGKILL): it is how shardd stops work it may no longer own.
// Any processes the script leaves behind in its group are killed when it exits.
func (s Script) Run(ctx context.Context, c Context) (res Result) {
	res = Result{Start: time.Now(), ExitCode: -1}
	defer func() { res.End = time.Now(); res = boundErr(res) }()
	grace, tailBytes := s.Grace, s.TailBytes
	if grace == 0 {
		grace = 5 * time.Second
	}
	if tailBytes == 0 {
		tailBytes = 4096
	}

	if ctx.Err() != nil { // never start work that is no longer wanted
		res.Err = fmt.Errorf("%w before it started: %v", ErrKilled, context.Cause(ctx))
		return res
	}
	var argv []string
	switch {
	case len(s.Argv) > 0:
		argv = append(argv, s.Argv...)
	default:
		argv = []string{"/bin/sh", "-c", s.Shell, "shardd-" + c.Job}
	}
	if s.ContextArg {
		argv = append(argv, c.elasticJobContext())
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	var gate *os.File // the write end of the gate; nil: no gate
	if s.Watchdog != nil {
		// Hold the script in a gate until its group is registered.
		gr, gw, err := os.Pipe()
		if err != nil {
			res.Err = fmt.Errorf("gate pipe: %w", err)
			return res
		}
		defer gr.Close()
		defer gw.Close()
		cmd = exec.Command("/bin/sh", append([]string{"-c", gateScript, "shardd-gate"}, argv...)...)
		cmd.ExtraFiles = []*os.File{gr}
		gate = gw
	}
	cmd.Dir = s.Workdir
	cmd.Env = os.Environ()
	for k, v := range s.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Env = append(cmd.Env, c.Env()...)
	for i, kv := range cmd.Env { // exec refuses a NUL; onFailure passes output on
		cmd.Env[i] = strings.ReplaceAll(kv, "\x00", "\uFFFD")
	}
	for _, kv := range cmd.Env {
		if len(kv) >= maxEnvString {
			res.Err = fmt.Errorf("environment variable %s is %d bytes; Linux allows under %d", kv[:strings.IndexByte(kv, '=')], len(kv), maxEnvString)
			return res
		}
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	// The output's tail (both streams), the log's lines and the run's
	// whole output (c.Output) are fed from two OS pipes, so that Wait does
	// not wait for output from processes the script left behind; each
	// reader ends when the stream's last writer is gone. Memory per run is
	// bounded whatever the output: 32 KiB reads, a capped tail and line.
	out := &syncTail{tail: tail{max: tailBytes}}
	lines := &lineLog{log: s.Log, job: c.Job, item: c.Item}
	var readers [2]*os.File
	copied := make(chan struct{}, 2)
	for stream := range readers {
		pr, pw, err := os.Pipe()
		if err != nil {
			res.Err = fmt.Errorf("output pipe: %w", err)
			return res
		}
		defer pr.Close()
		defer pw.Close() // when start fails; closed below otherwise
		readers[stream] = pr
		var sink io.Writer
		if c.Output != nil {
			sink = c.Output.Stdout()
			if stream == stderr {
				sink = c.Output.Stderr()
			}
		}
		if stream == stdout {
			cmd.Stdout = pw
		} else {
			cmd.Stderr = pw
		}
		go func() {
			defer func() { copied <- struct{}{} }()
			buf := make([]byte, 32<<10)
			for {
				n, err := pr.Read(buf)
				out.Write(buf[:n])
				lines.Write(stream, buf[:n])
				if sink != nil && n > 0 {
					sink.Write(buf[:n])
				}
				if err != nil {
					return
				}
			}
		}()
	}
	closeWriters := func() { cmd.Stdout.(*os.File).Close(); cmd.Stderr.(*os.File).Close() }
	waitCopied := func(limit time.Duration) {
		timer := time.NewTimer(limit)
		defer timer.Stop()
		for n := 0; n < 2; {
			select {
			case <-copied:
				n++
			case <-timer.C: // a process that left the group holds a pipe
				readers[0].Close()
				readers[1].Close()
			}
		}
		lines.Close()
	}

	res.Prepared = time.Now()
	if gate == nil { // no gate to hold it: start it at its time, if still wanted
		if err := release(ctx, c); err != nil {
			res.Err = fmt.Errorf("%w before it started: %v", ErrKilled, err)
			closeWriters()
			waitCopied(time.Second)
			return res
		}
	}
	runID, endRun := newRun()
	defer endRun()
	cmd.Env = append(cmd.Env, RunEnv+"="+runID)
	cg, cgErr := s.Cgroups.prepare(cmd, runID)
	defer cg.kill()
	started, err := start(cmd)
	if cgErr != nil && s.Log != nil {
		s.Log.Warn("run not confined to a cgroup", "job", c.Job, "item", c.Item, "err", cgErr)
	}
	closeWriters() // the child has its copies
	if err != nil {
		waitCopied(time.Second)
		res.Err = fmt.Errorf("start %s: %w", cmd.Path, err)
		return res
	}
	// The leader is reaped last (finish), after the watchdog was told the
	// run ended and after every kill of its group: until then its pid,
	// the group's id, is given to no other process (see watchdog.go).
	pgid := cmd.Process.Pid
	exited := make(chan struct{})
	go func() { waitExit(pgid); close(exited) }()
	var waitErr error
	var reg *Registration // registered with the watchdog
	reaped := false
	finish := func() { // once the leader has exited
		if reaped {
			return
		}
		reaped = true
		if reg != nil {
			s.Watchdog.Del(reg.Token)
		}
		waitErr = cmd.Wait()
		started()
	}
	defer finish()
	if gate != nil {
		var why error
		st, err := procStart(pgid)
		if err == nil {
			reg = &Registration{Token: runID, PGID: pgid, Start: st, Cgroup: cg.path()}
			err = s.Watchdog.Add(*reg)
		}
		switch {
		case err != nil:
			why = fmt.Errorf("watchdog: %w", err) // unguarded work must not run
		case ctx.Err() != nil:
			why = context.Cause(ctx)
		case s.Watchdog.Expired():
			why = errors.New("the session's fence deadline passed")
		}
		res.Prepared = time.Now()
		if why == nil {
			// Prepared (ahead, with a StartAt): released at its time, if
			// still wanted then.
			if why = release(ctx, c); why == nil && s.Watchdog.Expired() {
				why = errors.New("the session's fence deadline passed")
			}
		}
		if why == nil {
			_, why = gate.Write([]byte("go\n"))
		}
		gate.Close()
		if why != nil {
			syscall.Kill(-pgid, syscall.SIGKILL)
			<-exited
			cg.kill()
			waitCopied(time.Second)
			res.Err = fmt.Errorf("%w before it started: %v", ErrKilled, why)
			return res
		}
	}
	res.Started = time.Now()
	if !c.StartAt.IsZero() {
		res.Start = res.Started // prepared ahead: the run starts when it is let go, not before its fire
	}

	var timeout <-chan time.Time
	if s.Timeout > 0 {
		t := time.NewTimer(s.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-exited:
	case <-ctx.Done():
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-exited
		res.Err = fmt.Errorf("%w: %v", ErrKilled, context.Cause(ctx))
	case <-timeout:
		syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(grace):
			syscall.Kill(-pgid, syscall.SIGKILL)
			<-exited
		case <-ctx.Done():
			syscall.Kill(-pgid, syscall.SIGKILL)
			<-exited
		}
		res.Err = fmt.Errorf("%w after %s", ErrTimeout, s.Timeout)
	}
	// Nothing of the item may outlive it: kill what the script left in its
	// group, and what left the group (see reap.go).
	syscall.Kill(-pgid, syscall.SIGKILL)
	cg.kill()
	sweep(runID)
	waitCopied(time.Second)
	finish()

	res.Output = out.String()
	if cmd.ProcessState != nil {
		res.ExitCode = cmd.ProcessState.ExitCode()
	}
	switch {
	case res.Err != nil:
	case waitErr != nil && s.MoreExitCode > 0 && res.ExitCode == s.MoreExitCode:
		res.OK, res.More = true, true // processed data; more may remain
	case waitErr != nil:
		res.Err = waitErr // "exit status 3", "signal: killed"
	default:
		res.OK = true
	}
	res.Retryable = !res.OK && !errors.Is(res.Err, ErrKilled)
	return res
}
