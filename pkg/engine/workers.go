package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/runner"
)

// runFunc runs one item's work.
type runFunc func(ctx context.Context, c runner.Context) runner.Result

// runnerCache holds a job's runner, built once per job definition.
type runnerCache struct {
	mu    sync.Mutex
	hash  string
	run   runFunc
	close func() // releases the runner's resources (an HTTP hook's connections)
}

// scriptEnv is what every script runner of an engine shares.
type scriptEnv struct {
	watchdog *runner.Watchdog
	cgroups  *runner.Cgroups
	starts   *runner.Starts
	log      *slog.Logger
}

func (c *runnerCache) get(job *config.Job, env scriptEnv) (runFunc, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run != nil && c.hash == job.Hash() {
		return c.run, nil
	}
	run, closeRun, err := newRunner(job, env)
	if err != nil {
		return nil, err
	}
	if c.close != nil {
		c.close() // the replaced definition's
	}
	c.hash, c.run, c.close = job.Hash(), run, closeRun
	return run, nil
}

func newRunner(job *config.Job, env scriptEnv) (runFunc, func(), error) {
	switch {
	case job.Script != nil:
		s := runner.Script{
			Argv: job.Script.Command.Argv, Shell: job.Script.Command.Shell, Env: job.Script.Env,
			Workdir: job.Script.Workdir, Timeout: time.Duration(job.Timeout), Log: env.log, Watchdog: env.watchdog, Cgroups: env.cgroups,
			ContextArg: job.Script.ContextArg, Starts: env.starts,
		}
		if d := job.Dataflow; d != nil && d.Streaming {
			s.MoreExitCode = d.MoreExitCode
		}
		return s.Run, func() {}, nil
	case job.HTTP != nil:
		timeout := time.Duration(job.HTTP.Timeout)
		if job.Timeout > 0 {
			timeout = min(timeout, time.Duration(job.Timeout))
		}
		var files runner.TLSFiles
		if t := job.HTTP.TLS; t != nil {
			files = runner.TLSFiles{CA: t.CA, Cert: t.Cert, Key: t.Key}
		}
		h, err := runner.NewHTTP(runner.HTTP{
			URL: job.HTTP.URL, Method: job.HTTP.Method, Headers: job.HTTP.Headers, Body: job.HTTP.Body,
			SuccessCodes: job.HTTP.SuccessCodes, FollowRedirects: job.HTTP.FollowRedirects, Timeout: timeout,
			More: job.Dataflow != nil && job.Dataflow.Streaming,
		}, files)
		if err != nil {
			return nil, nil, err
		}
		return h.Run, h.Close, nil
	}
	return nil, nil, errors.New("job has neither script nor http")
}
