package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/runner"
)

// hookTimeout bounds a failure notification or a listener.
const hookTimeout = 30 * time.Second

// notifyFailure tells the job's onFailure targets about a failed run.
func (e *Engine) notifyFailure(job *config.Job, rc runner.Context, res runner.Result) {
	of := job.OnFailure
	if of == nil {
		return
	}
	log := e.log.With("job", job.Name, "item", rc.Item, "fire", rc.Fire)
	summary := fmt.Sprintf("shardd: job %s item %d (fire %s, attempt %d) failed on %s: %v", job.Name, rc.Item, rc.Fire.Format(time.RFC3339), rc.Attempt, rc.Instance, res.Err)
	ctx, cancel := context.WithTimeout(e.killCtx, hookTimeout) // a forced stop (or the grace end) stops it
	defer cancel()
	if of.Webhook != "" {
		if err := postWebhook(ctx, of.Webhook, of.Format, summary, rc, res); err != nil {
			log.Warn("onFailure webhook", "err", err)
		}
	}
	if of.Command != nil {
		s := runner.Script{Argv: of.Command.Argv, Shell: of.Command.Shell, Timeout: hookTimeout, Env: map[string]string{
			"SHARDD_RESULT":      "FAILED",
			"SHARDD_EXIT_CODE":   strconv.Itoa(res.ExitCode),
			"SHARDD_HTTP_STATUS": strconv.Itoa(res.HTTPStatus),
			"SHARDD_ERROR":       fmt.Sprint(res.Err),
			"SHARDD_OUTPUT":      res.Output,
		}}
		if r := s.Run(ctx, rc); !r.OK {
			log.Warn("onFailure command", "err", r.Err, "output", r.Output)
		}
	}
}

// webhookBody shapes a failure for a chat's incoming webhook.
func webhookBody(format, summary string, rc runner.Context, res runner.Result) any {
	switch format {
	case "slack":
		return map[string]string{"text": summary}
	case "dingtalk", "wechat": // both take a text message of this shape
		return map[string]any{"msgtype": "text", "text": map[string]string{"content": summary}}
	}
	return map[string]any{
		"text": summary, "context": rc, "exitCode": res.ExitCode, "httpStatus": res.HTTPStatus, "error": fmt.Sprint(res.Err),
		"output": res.Output, "start": res.Start, "end": res.End,
	}
}

func postWebhook(ctx context.Context, url, format, summary string, rc runner.Context, res runner.Result) error {
	body, err := json.Marshal(webhookBody(format, summary, rc, res))
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
