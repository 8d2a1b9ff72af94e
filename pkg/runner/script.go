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
	// Starts, if set, bounds the scripts starting at once (starts.go).
	Starts *Starts
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
	r := &scriptRun{s: s}
	defer r.close()
	if err := r.prepare(c, tailBytes); err != nil {
		res.Err = err
		return res
	}

	res.Prepared = time.Now()
	if r.gate == nil { // no gate to hold it: start it at its time, if still wanted
		if err := release(ctx, c); err != nil {
			res.Err = fmt.Errorf("%w before it started: %v", ErrKilled, err)
			r.out.closeWriters()
			r.out.wait(time.Second)
			return res
		}
	}
	due := c.Fire // the start queue's order: when the run came due
	if c.StartAt.After(due) {
		due = c.StartAt
	}
	forked, err := s.Starts.take(ctx, due)
	if err == nil && ctx.Err() != nil {
		forked()
		err = context.Cause(ctx)
	}
	if err != nil {
		res.Err = fmt.Errorf("%w before it started: %v", ErrKilled, err)
		r.out.closeWriters()
		r.out.wait(time.Second)
		return res
	}
	defer forked()
	runID, endRun := newRun()
	defer endRun()
	r.cmd.Env = append(r.cmd.Env, RunEnv+"="+runID)
	cg, cgErr := s.Cgroups.prepare(r.cmd, runID)
	defer cg.kill()
	r.cg = cg
	err = r.start(c, cgErr)
	forked() // the fork is done: the next may start (the watchdog's registration may wait for its restart)
	if err != nil {
		res.Err = err
		return res
	}
	defer r.finish()
	if r.gate != nil {
		var why error
		if res.Prepared, why = r.openGate(ctx, c, runID); why != nil {
			r.kill()
			cg.kill()
			r.out.wait(time.Second)
			res.Err = fmt.Errorf("%w before it started: %v", ErrKilled, why)
			return res
		}
	}
	res.Started = time.Now()
	if !c.StartAt.IsZero() {
		res.Start = res.Started // prepared ahead: the run starts when it is let go, not before its fire
	}

	res.Err = r.wait(ctx, grace)
	// Nothing of the item may outlive it: kill what the script left in its
	// group, and what left the group (see reap.go).
	syscall.Kill(-r.pgid, syscall.SIGKILL)
	cg.kill()
	sweep(runID)
	r.out.wait(time.Second)
	r.finish()
	return r.result(res)
}

// scriptRun is one run of a Script: its command, the gate that holds it
// until its process group is registered with the watchdog, its output,
// and its process group once started.
type scriptRun struct {
	s     Script
	cmd   *exec.Cmd
	gate  *os.File   // the write end of the gate; nil: no gate
	files []*os.File // the gate's ends, closed when the run ends
	out   *output
	cg    *runCgroup

	// The leader is reaped last (finish), after the watchdog was told the
	// run ended and after every kill of its group: until then its pid,
	// the group's id, is given to no other process (see watchdog.go).
	pgid    int
	exited  chan struct{} // closed when the leader has exited
	reg     *Registration // registered with the watchdog
	reaped  bool
	waitErr error
	started func() // ends start's record of the leader
}

// prepare builds the command for c: its argv (with ElasticJob's context
// argument), behind a gate when a watchdog guards it, its environment,
// and the pipes of its output.
func (r *scriptRun) prepare(c Context, tailBytes int) error {
	s := r.s
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
	if s.Watchdog != nil {
		// Hold the script in a gate until its group is registered.
		gr, gw, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("gate pipe: %w", err)
		}
		r.files = append(r.files, gr, gw)
		// $0 names the job: what the gate's shell says of a command it
		// cannot exec ("shardd-JOB: 1: exec: /opt/x.sh: not found") is
		// the job's, as the shell form's is.
		cmd = exec.Command("/bin/sh", append([]string{"-c", gateScript, "shardd-" + c.Job}, argv...)...)
		cmd.ExtraFiles = []*os.File{gr}
		r.gate = gw
	}
	r.cmd = cmd
	cmd.Dir = s.Workdir
	env, err := s.environ(c)
	if err != nil {
		return err
	}
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r.out = &output{tail: &syncTail{tail: tail{max: tailBytes}}, lines: &lineLog{log: s.Log, job: c.Job, item: c.Item}, copied: make(chan struct{}, 2)}
	return r.out.pipe(cmd, c.Output)
}

// environ is the script's environment for c: shardd's, then Env, then the
// context's SHARDD_* variables.
func (s Script) environ(c Context) ([]string, error) {
	env := os.Environ()
	for k, v := range s.Env {
		env = append(env, k+"="+v)
	}
	env = append(env, c.Env()...)
	for i, kv := range env { // exec refuses a NUL; onFailure passes output on
		env[i] = strings.ReplaceAll(kv, "\x00", "\uFFFD")
	}
	for _, kv := range env {
		if len(kv) >= maxEnvString {
			return nil, fmt.Errorf("environment variable %s is %d bytes; Linux allows under %d", kv[:strings.IndexByte(kv, '=')], len(kv), maxEnvString)
		}
	}
	return env, nil
}

// start starts the command (cgErr: why it is not confined to a cgroup)
// and closes the output's write ends, which the child has copies of.
func (r *scriptRun) start(c Context, cgErr error) error {
	started, err := start(r.cmd)
	if cgErr != nil && r.s.Log != nil {
		r.s.Log.Warn("run not confined to a cgroup", "job", c.Job, "item", c.Item, "err", cgErr)
	}
	r.out.closeWriters() // the child has its copies
	if err != nil {
		r.out.wait(time.Second)
		return fmt.Errorf("start %s: %w", r.cmd.Path, err)
	}
	r.started = started
	pgid := r.cmd.Process.Pid
	r.pgid, r.exited = pgid, make(chan struct{})
	go func() { waitExit(pgid); close(r.exited) }()
	return nil
}

// openGate registers the run's group with the watchdog (unguarded work
// must not run), then lets the script through its gate at its time
// (prepared ahead, with a StartAt), if still wanted then. It returns when
// the run was ready, and why the script was not let through, if it was not.
func (r *scriptRun) openGate(ctx context.Context, c Context, runID string) (prepared time.Time, why error) {
	wd := r.s.Watchdog
	st, err := procStart(r.pgid)
	if err == nil {
		r.reg = &Registration{Token: runID, PGID: r.pgid, Start: st, Cgroup: r.cg.path()}
		err = wd.Add(*r.reg)
	}
	switch {
	case err != nil:
		why = fmt.Errorf("watchdog: %w", err) // unguarded work must not run
	case ctx.Err() != nil:
		why = context.Cause(ctx)
	case wd.Expired():
		why = errors.New("the session's fence deadline passed")
	}
	prepared = time.Now()
	if why == nil {
		// Prepared (ahead, with a StartAt): released at its time, if
		// still wanted then.
		if why = release(ctx, c); why == nil && wd.Expired() {
			why = errors.New("the session's fence deadline passed")
		}
	}
	if why == nil {
		_, why = r.gate.Write([]byte("go\n"))
	}
	r.gate.Close()
	return prepared, why
}

// wait waits until the script exits. When ctx ends it kills the group at
// once (SIGKILL); at the timeout it sends SIGTERM, and SIGKILL Grace later.
// The error says why the script was stopped, if it was.
func (r *scriptRun) wait(ctx context.Context, grace time.Duration) error {
	var timeout <-chan time.Time
	if r.s.Timeout > 0 {
		t := time.NewTimer(r.s.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-r.exited:
		return nil
	case <-ctx.Done():
		r.kill()
		return fmt.Errorf("%w: %v", ErrKilled, context.Cause(ctx))
	case <-timeout:
		syscall.Kill(-r.pgid, syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(grace):
			r.kill()
		case <-ctx.Done():
			r.kill()
		}
		return fmt.Errorf("%w after %s", ErrTimeout, r.s.Timeout)
	}
}

// result completes res, of the run that ended, with its output's tail
// and how the script exited.
func (r *scriptRun) result(res Result) Result {
	res.Output = r.out.tail.String()
	if r.cmd.ProcessState != nil {
		res.ExitCode = r.cmd.ProcessState.ExitCode()
	}
	switch {
	case res.Err != nil:
	case r.waitErr != nil && r.s.MoreExitCode > 0 && res.ExitCode == r.s.MoreExitCode:
		res.OK, res.More = true, true // processed data; more may remain
	case r.waitErr != nil:
		res.Err = r.waitErr // "exit status 3", "signal: killed"
	default:
		res.OK = true
	}
	res.Retryable = !res.OK && !errors.Is(res.Err, ErrKilled)
	return res
}

// kill kills the run's process group and waits for its leader to exit.
func (r *scriptRun) kill() {
	syscall.Kill(-r.pgid, syscall.SIGKILL)
	<-r.exited
}

// finish reaps the leader once it has exited, after unregistering the run
// from the watchdog; it does so once.
func (r *scriptRun) finish() {
	if r.reaped {
		return
	}
	r.reaped = true
	if r.reg != nil {
		r.s.Watchdog.Del(r.reg.Token)
	}
	r.waitErr = r.cmd.Wait()
	r.started()
}

// close closes the ends of the run's pipes left open.
func (r *scriptRun) close() {
	if r.out != nil {
		r.out.close()
	}
	for _, f := range r.files {
		f.Close()
	}
}

// output feeds a script's output, the tail (both streams), the log's lines
// and the run's whole output (c.Output), from two OS pipes, so that Wait
// does not wait for output from processes the script left behind; each
// reader ends when the stream's last writer is gone. Memory per run is
// bounded whatever the output: 32 KiB reads, a capped tail and line.
type output struct {
	tail    *syncTail
	lines   *lineLog
	readers [2]*os.File
	writers [2]*os.File
	copied  chan struct{} // buffered(2): a reader ended
}

// pipe gives cmd the pipes' write ends and copies from their read ends to
// the tail, the lines and sink (nil: none).
func (o *output) pipe(cmd *exec.Cmd, sink Sink) error {
	for stream := range o.readers {
		pr, pw, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("output pipe: %w", err)
		}
		o.readers[stream], o.writers[stream] = pr, pw
		var w io.Writer
		if sink != nil {
			w = sink.Stdout()
			if stream == stderr {
				w = sink.Stderr()
			}
		}
		if stream == stdout {
			cmd.Stdout = pw
		} else {
			cmd.Stderr = pw
		}
		go func() {
			defer func() { o.copied <- struct{}{} }()
			buf := make([]byte, 32<<10)
			for {
				n, err := pr.Read(buf)
				o.tail.Write(buf[:n])
				o.lines.Write(stream, buf[:n])
				if w != nil && n > 0 {
					w.Write(buf[:n])
				}
				if err != nil {
					return
				}
			}
		}()
	}
	return nil
}

// closeWriters closes the write ends: once the command has started, or
// will not.
func (o *output) closeWriters() { o.writers[stdout].Close(); o.writers[stderr].Close() }

// wait waits for both readers to end, at most limit before it closes
// their pipes (a process that left the group holds one), and logs the
// last lines.
func (o *output) wait(limit time.Duration) {
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for n := 0; n < 2; {
		select {
		case <-o.copied:
			n++
		case <-timer.C: // a process that left the group holds a pipe
			o.readers[0].Close()
			o.readers[1].Close()
		}
	}
	o.lines.Close()
}

// close closes the pipes' ends left open.
func (o *output) close() {
	for _, f := range append(o.readers[:], o.writers[:]...) {
		if f != nil {
			f.Close()
		}
	}
}
