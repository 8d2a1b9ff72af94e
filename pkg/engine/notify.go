package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runner"
)

// hookTimeout bounds a failure notification or a listener.
const hookTimeout = 30 * time.Second

// notifyFailure tells the job's onFailure targets about a run that
// failed or timed out, as its outcome out records it (the result and reason
// history shows: FAILED, or KILLED with reason timeout).
func (e *Engine) notifyFailure(job *config.Job, rc runner.Context, out coord.Outcome) {
	of := job.OnFailure
	if of == nil {
		return
	}
	log := e.log.With("job", job.Name, "item", rc.Item, "fire", rc.Fire)
	how := "failed"
	if out.State != keyspace.StateFailed {
		how = fmt.Sprintf("was %s (%s)", out.State, out.Reason)
	}
	summary := fmt.Sprintf("shardd: job %s item %d (fire %s, attempt %d) %s on %s: %s", job.Name, rc.Item, rc.Fire.Format(time.RFC3339), rc.Attempt, how, rc.Instance, out.Err)
	e.tell(of, summary, rc, out, log)
}

// tell sends summary, about rc and out, to the onFailure targets of.
func (e *Engine) tell(of *config.OnFailure, summary string, rc runner.Context, out coord.Outcome, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(e.killCtx, hookTimeout) // a forced stop (or the grace end) stops it
	defer cancel()
	if of.Webhook != "" {
		if err := postWebhook(ctx, of.Webhook, of.Format, summary, rc, out); err != nil {
			log.Warn("onFailure webhook", "err", err)
		}
	}
	if of.Command != nil {
		s := runner.Script{Argv: of.Command.Argv, Shell: of.Command.Shell, Timeout: hookTimeout, Env: map[string]string{
			"SHARDD_RESULT":      out.State,
			"SHARDD_REASON":      out.Reason,
			"SHARDD_EXIT_CODE":   strconv.Itoa(out.ExitCode),
			"SHARDD_HTTP_STATUS": strconv.Itoa(out.HTTPStatus),
			"SHARDD_ERROR":       out.Err,
			"SHARDD_OUTPUT":      out.Output,
		}}
		if r := s.Run(ctx, rc); !r.OK {
			log.Warn("onFailure command", "err", r.Err, "output", r.Output)
		}
	}
}

// notifyPause tells the job's onFailure targets that its failed fires
// paused it (pauseAfterFailures), once, from the instance whose note of
// the fire paused it. The result they see is PAUSED.
func (e *Engine) notifyPause(job *config.Job, fire time.Time, b keyspace.Barrier) {
	e.log.Warn("job paused after failed fires in a row; shardd enable resumes it", "job", job.Name, "after", job.PauseAfterFailures, "fire", fire.UTC(), "failed", b.Failed)
	of := job.OnFailure
	if of == nil {
		return
	}
	summary := fmt.Sprintf("shardd: job %s paused: %d of its fires in a row failed (the last, %s: item(s) %v); shardd enable %s resumes it",
		job.Name, job.PauseAfterFailures, fire.Format(time.RFC3339), b.Failed, job.Name)
	rc := runner.Context{Job: job.Name, Item: -1, Fire: fire, Instance: e.opts.Node.ID(), Source: "PAUSE"}
	out := coord.Outcome{State: "PAUSED", Reason: "pauseAfterFailures", ExitCode: -1, Err: summary}
	e.tell(of, summary, rc, out, e.log.With("job", job.Name))
}

// webhookBody shapes a failure for a chat's incoming webhook.
func webhookBody(format, summary string, rc runner.Context, out coord.Outcome) any {
	switch format {
	case "slack":
		return map[string]string{"text": summary}
	case "dingtalk", "wechat": // both take a text message of this shape
		return map[string]any{"msgtype": "text", "text": map[string]string{"content": summary}}
	}
	return map[string]any{
		"text": summary, "context": rc, "result": out.State, "reason": out.Reason, "exitCode": out.ExitCode, "httpStatus": out.HTTPStatus,
		"error": out.Err, "output": out.Output, "start": out.Start, "end": out.End,
	}
}

func postWebhook(ctx context.Context, url, format, summary string, rc runner.Context, out coord.Outcome) error {
	body, err := json.Marshal(webhookBody(format, summary, rc, out))
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		return fmt.Errorf("POST %s: status %d", url, resp.StatusCode)
	}
	return nil
}

// listener runs a before/after command of job for fire and items.
func (e *Engine) listener(job *config.Job, which string, c *config.Command, fire time.Time, items []int) {
	if c == nil {
		return
	}
	list := make([]string, len(items))
	for i, item := range items {
		list[i] = strconv.Itoa(item)
	}
	ctx, cancel := context.WithTimeout(e.killCtx, hookTimeout) // a forced stop (or the grace end) stops it
	defer cancel()
	s := runner.Script{Argv: c.Argv, Shell: c.Shell, Timeout: hookTimeout, Env: map[string]string{"SHARDD_ITEMS": strings.Join(list, ",")}}
	r := s.Run(ctx, runner.Context{Job: job.Name, Item: -1, Fire: fire, Instance: e.opts.Node.ID(), Source: which})
	if !r.OK {
		e.log.Warn("listener failed", "job", job.Name, "listener", which, "fire", fire, "err", r.Err, "output", r.Output)
	}
}
