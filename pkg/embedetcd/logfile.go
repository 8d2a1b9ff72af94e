package embedetcd

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Each Server writes etcd's log through a logger of its own, never through
// etcd's EnableLogRotation: that registers a process-wide zap sink once, so
// a second embedded etcd in the process (a cluster test, a restart) wrote
// into the first's file, racing on its name, and its lumberjack kept a
// goroutine for the life of the process.

const (
	logMaxSize    = 64 << 20 // a log file is rotated past this size
	logMaxBackups = 3        // rotated files kept: path.1 (newest) .. path.3
)

// logFile is an append-only log file rotated by size: past maxSize the file
// becomes path.1, path.1 becomes path.2, ..., and the oldest beyond
// maxBackups is removed. Safe for concurrent use; no goroutine.
type logFile struct {
	path       string
	maxSize    int64
	maxBackups int

	mu     sync.Mutex
	f      *os.File
	size   int64
	closed bool

	// stopping is set when the server is closed on purpose: etcd then logs
	// its listeners' ends as errors, which they are not (stopCore).
	stopping atomic.Bool
}

// openLogFile opens (creating, 0600, never through a symbolic link) the
// log at path for appending.
func openLogFile(path string, maxSize int64, maxBackups int) (*logFile, error) {
	l := &logFile{path: path, maxSize: maxSize, maxBackups: maxBackups}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *logFile) open() error {
	// etcd's log names keys and members: keep it the owner's, like the data.
	f, err := os.OpenFile(l.path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("embedded etcd log %s: %w", l.path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("embedded etcd log %s: %w", l.path, err)
	}
	f.Chmod(0o600)
	l.f, l.size = f, st.Size()
	return nil
}

// Write appends p, rotating first when p would take the file past maxSize.
// After Close it drops p (etcd may log while it stops).
func (l *logFile) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return len(p), nil
	}
	if l.f == nil || (l.size > 0 && l.size+int64(len(p)) > l.maxSize) {
		if err := l.rotate(); err != nil {
			return 0, err
		}
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	return n, err
}

// rotate moves the file to path.1 (shifting older ones up, dropping the
// oldest) and opens a new one. A failed rename still reopens the file:
// the log goes on growing rather than stopping.
func (l *logFile) rotate() error {
	if l.f != nil {
		l.f.Close()
		l.f = nil
		os.Remove(fmt.Sprintf("%s.%d", l.path, l.maxBackups))
		for i := l.maxBackups - 1; i >= 1; i-- {
			os.Rename(fmt.Sprintf("%s.%d", l.path, i), fmt.Sprintf("%s.%d", l.path, i+1))
		}
		if l.maxBackups > 0 {
			os.Rename(l.path, l.path+".1")
		} else {
			os.Remove(l.path)
		}
	}
	return l.open()
}

// Sync flushes the file to disk.
func (l *logFile) Sync() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	return l.f.Sync()
}

// Close closes the file; later writes are dropped.
func (l *logFile) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// newLogger is the logger etcd builds for itself (logutil's default
// config: its JSON encoder, sampling, stack traces at error; etcd.log reads
// as before) at level, writing to w.
//
// While stopping is set, etcd's errors that only say a listener closed are
// written at info, without their stack trace: a clean stop leaves no error
// lines in etcd.log.
func newLogger(w zapcore.WriteSyncer, level string, stopping *atomic.Bool) *zap.Logger {
	c := logutil.DefaultZapLoggerConfig
	var core zapcore.Core = stopCore{zapcore.NewCore(zapcore.NewJSONEncoder(c.EncoderConfig), w, zap.NewAtomicLevelAt(logutil.ConvertToZapLevel(level))), stopping}
	core = zapcore.NewSamplerWithOptions(core, time.Second, c.Sampling.Initial, c.Sampling.Thereafter)
	return zap.New(core, zap.AddCaller(), zap.AddStacktrace(zapcore.ErrorLevel), zap.ErrorOutput(w))
}

// stopCore writes, while stopping, an error entry whose error field says a
// listener closed ("http: Server closed", "mux: server closed", "use of
// closed network connection") at info level, without its stack: etcd's Close logs each of
// its servers' ends so ("setting up serving from embedded etcd failed.").
type stopCore struct {
	zapcore.Core
	stopping *atomic.Bool
}

func (c stopCore) With(fields []zapcore.Field) zapcore.Core {
	return stopCore{c.Core.With(fields), c.stopping}
}

func (c stopCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

func (c stopCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	if ent.Level >= zapcore.ErrorLevel && c.stopping.Load() && closedListener(fields) {
		ent.Level, ent.Stack = zapcore.InfoLevel, ""
	}
	return c.Core.Write(ent, fields)
}

// closedText matches the texts of those errors once they crossed a
// goroutine as text: net's, http's and cmux's ("mux: server closed").
func closedText(s string) bool {
	return strings.Contains(s, "use of closed network connection") || strings.HasSuffix(strings.ToLower(s), "server closed")
}

// closedListener reports whether fields hold an error that says a server
// or listener was closed.
func closedListener(fields []zapcore.Field) bool {
	for _, f := range fields {
		if err, ok := f.Interface.(error); ok && f.Type == zapcore.ErrorType &&
			(errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) || closedText(err.Error())) {
			return true
		}
	}
	return false
}
