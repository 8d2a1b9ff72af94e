package main

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/metrics"
)

// reloader applies configuration changes without a restart: on SIGHUP, and
// when the content of the config file or directory changes (checked every
// interval). A new configuration is vetted (see trust.go: as root, a job
// file that someone else could change is refused), loaded and validated
// in full and only then swapped in; an invalid one is rejected, logged and
// shown in a metric and in /readyz, and the previous one keeps running.
type reloader struct {
	path     string
	interval time.Duration
	log      *slog.Logger
	metrics  *metrics.Metrics
	apply    func(*config.Config)
	// rejected, if set, is told each reload's error: nil when it was applied.
	rejected func(error)
	hup      <-chan os.Signal // SIGHUP, caught for the whole process
	root     bool             // shardd runs as root: unsafe job files are refused (see trust.go)
	// allowEmpty lets a reload leave no file job (--accept-applied: the
	// instance runs applied ones).
	allowEmpty bool

	mu      sync.Mutex
	lastErr error
	digest  [32]byte
}

// Err returns the last reload's error, nil after a success.
func (r *reloader) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

// digestOf hashes the names and contents of the config files at path.
func digestOf(path string) [32]byte {
	h := sha256.New()
	files := []string{path}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		files, _ = config.Files(path)
	}
	for _, f := range files {
		b, _ := os.ReadFile(f)
		h.Write([]byte(f))
		h.Write([]byte{0})
		h.Write(b)
	}
	var d [32]byte
	copy(d[:], h.Sum(nil))
	return d
}

// reload loads the configuration and applies it if valid.
func (r *reloader) reload(why string) {
	d := digestOf(r.path)
	cfg, err := loadConfig(r.log, r.path, r.root, r.allowEmpty)
	if err == nil && len(cfg.Jobs) == 0 && !r.allowEmpty {
		err = fmt.Errorf("%s defines no jobs; to stop every job, stop shardd", r.path)
	}
	r.mu.Lock()
	r.digest = d
	r.lastErr = err
	r.mu.Unlock()
	if r.rejected != nil {
		r.rejected(err)
	}
	if err != nil {
		for _, p := range config.Errors(err) {
			r.log.Error("configuration reload rejected; the previous configuration keeps running", "trigger", why, "err", p)
		}
		r.metrics.Reloaded(false, time.Now())
		return
	}
	r.apply(cfg)
	r.metrics.Reloaded(true, time.Now())
	r.log.Info("configuration reloaded", "trigger", why, "jobs", len(cfg.Jobs), "files", len(cfg.Files))
}

// loadConfig vets the files of the config at path (vetConfig) and loads
// it: at start and at every reload. allowEmpty takes a directory without
// job files for no job (an instance that runs applied ones).
func loadConfig(log *slog.Logger, path string, root, allowEmpty bool) (*config.Config, error) {
	if err := vetConfig(log, path, root); err != nil {
		return nil, err
	}
	c, err := config.Load(path)
	if allowEmpty && errors.Is(err, config.ErrNoFiles) {
		return &config.Config{}, nil
	}
	return c, err
}

// Run reloads on SIGHUP and on file changes until ctx is done.
func (r *reloader) Run(ctx context.Context) {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.hup:
			r.reload("SIGHUP")
		case <-t.C:
			r.mu.Lock()
			changed := digestOf(r.path) != r.digest
			r.mu.Unlock()
			if changed {
				r.reload("file change")
			}
		}
	}
}
