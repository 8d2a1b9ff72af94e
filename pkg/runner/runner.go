// Package runner executes one item of one job: a script as a child process
// or a call to an HTTP hook. It knows nothing about etcd or schedules: it is
// given the execution's context and returns its result.
//
// The context travels as data, never spliced into a command line: scripts get
// environment variables (SHARDD_JOB, SHARDD_ITEM, ...) and the whole context
// as JSON in SHARDD_CONTEXT; HTTP hooks get the JSON as the request body.
package runner

import (
	"context"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Context describes one execution: (job, fire, item) and its attempt.
type Context struct {
	Job           string    `json:"job"`
	Item          int       `json:"item"`
	ItemParameter string    `json:"itemParameter"`
	Total         int       `json:"total"`
	JobParameter  string    `json:"jobParameter"`
	Fire          time.Time `json:"fire"`
	// Fence is the etcd revision of the claim: strictly increasing per
	// (job, item), so downstream systems can reject stale writers.
	Fence int64 `json:"fence"`
	// Attempt counts the claims of this fire: 1, and one more for each
	// failover re-run. Retry counts the tries within one attempt: 0 for
	// the first, n for the job's n-th retry.
	Attempt  int    `json:"attempt"`
	Retry    int    `json:"retry"`
	Instance string `json:"instance"`
	// Source is NORMAL, MISFIRE, FAILOVER, MANUAL or UPSTREAM.
	Source string `json:"source"`
	// Skipped counts the fires before Fire that this run stands for
	// (coalesced by the misfire policy); they do not run on their own.
	Skipped int `json:"skipped,omitempty"`
	// TriggerParameter is the one-off parameter an operator gave a manual
	// run (`shardd trigger --param`); "" otherwise.
	TriggerParameter string `json:"triggerParameter,omitempty"`
	// TriggeredBy names who triggered a manual run (for its run log).
	TriggeredBy string `json:"-"`
	// Iteration counts the iterations of a streaming (dataflow) run, from
	// 1; 0 for a run that is not streaming.
	Iteration int `json:"iteration,omitempty"`
	// ParentJob and ParentFire are, for a run of a job with dependsOn,
	// the parent whose completed fire triggered it and that fire's time
	// (RFC 3339); "" otherwise.
	ParentJob  string `json:"parentJob,omitempty"`
	ParentFire string `json:"parentFire,omitempty"`

	// StartAt, if set, is when the work starts: a run prepared ahead (a
	// script's process waits behind its gate, registered with the
	// watchdog) is released then, if its context is still live and the
	// session's fence deadline has not passed. Zero: at once.
	StartAt time.Time `json:"-"`
	// Release, if set, is asked right before the work starts whether it
	// still may (nil error): the engine checks that its session's fence
	// deadline has not passed. A pause of shardd across StartAt must not
	// start a run whose claim another instance may have taken over; the
	// context's cancellation by the session's timer may come a moment
	// after the pause ends, too late to be seen.
	Release func() error `json:"-"`
	// Output, if set, receives the run's whole output as it comes: the
	// script's stdout and stderr, or the hook's answer (redacted). It is
	// where the run goes, not what it is: never sent to the work.
	Output Sink `json:"-"`
}

// Sink receives a run's whole output; a runlog.Log is one. Its writers must
// be safe to use from two goroutines (one per stream) and should not fail:
// the run does not stop for its output's sake.
type Sink interface {
	Stdout() io.Writer
	Stderr() io.Writer
}

// JSON returns the context as JSON.
func (c Context) JSON() []byte {
	b, _ := json.Marshal(c) // plain data: cannot fail
	return b
}

// Env returns the context as SHARDD_* environment variables.
func (c Context) Env() []string {
	return []string{
		"SHARDD_JOB=" + c.Job,
		"SHARDD_ITEM=" + strconv.Itoa(c.Item),
		"SHARDD_ITEM_PARAMETER=" + c.ItemParameter,
		"SHARDD_TOTAL=" + strconv.Itoa(c.Total),
		"SHARDD_JOB_PARAMETER=" + c.JobParameter,
		"SHARDD_FIRE_TIME=" + c.Fire.Format(time.RFC3339),
		"SHARDD_FENCE=" + strconv.FormatInt(c.Fence, 10),
		"SHARDD_ATTEMPT=" + strconv.Itoa(c.Attempt),
		"SHARDD_RETRY=" + strconv.Itoa(c.Retry),
		"SHARDD_INSTANCE=" + c.Instance,
		"SHARDD_SOURCE=" + c.Source,
		"SHARDD_SKIPPED=" + strconv.Itoa(c.Skipped),
		"SHARDD_TRIGGER_PARAMETER=" + c.TriggerParameter,
		"SHARDD_ITERATION=" + strconv.Itoa(c.Iteration),
		"SHARDD_PARENT_JOB=" + c.ParentJob,
		"SHARDD_PARENT_FIRE=" + c.ParentFire,
		"SHARDD_CONTEXT=" + string(c.JSON()),
	}
}

// elasticJobContext is the shardingContext JSON ElasticJob passes to its
// script jobs, for scripts migrated from it.
func (c Context) elasticJobContext() string {
	b, _ := json.Marshal(map[string]any{
		"jobName":            c.Job,
		"taskId":             c.Job + "@-@" + strconv.Itoa(c.Item) + "@-@" + c.Source + "@-@" + c.Instance,
		"shardingTotalCount": c.Total,
		"jobParameter":       c.JobParameter,
		"shardingItem":       c.Item,
		"shardingParameter":  c.ItemParameter,
	})
	return string(b)
}

// Result is the outcome of one execution.
type Result struct {
	Start, End time.Time
	// Started is when the work began: the child process existed, or the
	// request was about to be sent. Zero when it never began.
	Started time.Time
	// Prepared is when the work was ready to start: a script's process
	// waiting behind its gate, a hook's request built. For a run with a
	// StartAt, it says how long before its time it was ready (or late).
	Prepared time.Time
	// OK is set when the work succeeded: exit 0, or an accepted HTTP status.
	OK bool
	// ExitCode of a script; -1 if it did not exit normally, and for a hook.
	ExitCode int
	// HTTPStatus of a hook's response; 0 for a script, or with no response.
	HTTPStatus int
	// Err says why the work failed, nil when OK.
	Err error
	// More is set on a successful run of streaming work that says it
	// processed data and more may remain: a script's exit status
	// Script.MoreExitCode, a hook's answer {"more": true} (HTTP.More).
	More bool
	// Retryable is set when trying again may help: a network error or a 5xx.
	Retryable bool
	// Output is the tail of the script's output or the response body.
	Output string
}

// release waits until c.StartAt (if set) or ctx's end, and says whether the
// work may start: ctx is live and c.Release agrees.
func release(ctx context.Context, c Context) error {
	if err := waitUntil(ctx, c.StartAt); err != nil {
		return err
	}
	if c.Release != nil {
		return c.Release()
	}
	return nil
}

// waitUntil waits until t or ctx's end, and returns ctx's cause if it ended.
func waitUntil(ctx context.Context, t time.Time) error {
	if d := time.Until(t); d > 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-ctx.Done():
		}
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return nil
}

// Duration is how long the execution took.
func (r Result) Duration() time.Duration { return r.End.Sub(r.Start) }

// tail keeps the last max bytes written to it.
type tail struct {
	max int
	buf []byte
	cut bool
}

func (t *tail) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
		t.cut = true
	}
	return len(p), nil
}

// syncTail is a tail written by two goroutines.
type syncTail struct {
	mu sync.Mutex
	tail
}

func (t *syncTail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tail.Write(p)
}

func (t *syncTail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.tail.String()
}

func (t *tail) String() string {
	// Valid UTF-8 without NUL: it goes to JSON, logs and environment variables.
	s := strings.ReplaceAll(strings.ToValidUTF8(string(t.buf), "\uFFFD"), "\x00", "\uFFFD")
	if t.cut {
		return "..." + s
	}
	return s
}
