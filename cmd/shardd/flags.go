package main

import (
	"flag"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/coord"
)

// envName is the environment variable that sets flag name: SHARDD_ETCD_CA for etcd-ca.
func envName(name string) string {
	return "SHARDD_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// applyEnv sets the flags of fs named in names (every flag when names is
// empty) from their environment variables, so that the command line still
// overrides the environment. Flag help mentions the variable.
//
// The operator commands take only connection flags from the environment:
// a script run by shardd has SHARDD_JOB, SHARDD_ITEM, SHARDD_INSTANCE...
// in its environment, and `shardd disable $SHARDD_JOB` in its onFailure
// must disable the job, not one item of it.
func applyEnv(e *env, fs *flag.FlagSet, names ...string) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if len(names) > 0 && !slices.Contains(names, f.Name) {
			return
		}
		f.Usage += " (env " + envName(f.Name) + ")"
		if v := e.getenv(envName(f.Name)); v != "" && err == nil {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = usageError("%s=%q: %v", envName(f.Name), v, serr)
			}
		}
	})
	return err
}

// etcdFlags are the etcd client flags shared by the commands that talk to etcd.
type etcdFlags struct {
	endpoints   string
	ca          string
	cert        string
	key         string
	user        string
	password    string
	dialTimeout time.Duration
	prefix      string
}

func (f *etcdFlags) register(fs *flag.FlagSet, endpointsHelp string) {
	fs.StringVar(&f.endpoints, "etcd", "", endpointsHelp)
	fs.StringVar(&f.ca, "etcd-ca", "", "CA bundle `file` to verify etcd servers (TLS)")
	fs.StringVar(&f.cert, "etcd-cert", "", "client certificate `file` for etcd (TLS)")
	fs.StringVar(&f.key, "etcd-key", "", "client key `file` for etcd (TLS)")
	fs.StringVar(&f.user, "etcd-user", "", "etcd user `name`")
	fs.StringVar(&f.password, "etcd-password", "", "etcd `password` (prefer the environment variable)")
	fs.DurationVar(&f.dialTimeout, "etcd-dial-timeout", 5*time.Second, "how long to wait for an etcd connection")
	fs.StringVar(&f.prefix, "prefix", coord.DefaultPrefix, "etcd key `prefix` of this shardd cluster")
}

// etcdFlagNames are the names etcdFlags registers: the connection flags.
var etcdFlagNames = []string{"etcd", "etcd-ca", "etcd-cert", "etcd-key", "etcd-user", "etcd-password", "etcd-dial-timeout", "prefix"}

func (f *etcdFlags) list() []string {
	var out []string
	for _, ep := range strings.Split(f.endpoints, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			out = append(out, ep)
		}
	}
	return out
}

func (f *etcdFlags) clientOptions(endpoints []string) coord.ClientOptions {
	return coord.ClientOptions{
		Endpoints: endpoints, CAFile: f.ca, CertFile: f.cert, KeyFile: f.key,
		Username: f.user, Password: f.password, DialTimeout: f.dialTimeout,
	}
}

// logFlags choose the log format and level.
type logFlags struct {
	format string
	level  string
}

func (f *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.format, "log-format", "text", "log `format`: text or json")
	fs.StringVar(&f.level, "log-level", "info", "log `level`: debug, info, warn or error")
}

func (f *logFlags) logger(e *env) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.level)); err != nil {
		return nil, usageError("--log-level: want debug, info, warn or error, got %q", f.level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch f.format {
	case "text":
		return slog.New(slog.NewTextHandler(e.stderr, opts)), nil
	case "json":
		// Durations as "1.5s", not as integer nanoseconds.
		opts.ReplaceAttr = func(_ []string, a slog.Attr) slog.Attr {
			if a.Value.Kind() == slog.KindDuration {
				a.Value = slog.StringValue(a.Value.Duration().String())
			}
			return a
		}
		return slog.New(slog.NewJSONHandler(e.stderr, opts)), nil
	}
	return nil, usageError("--log-format: want text or json, got %q", f.format)
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	return h
}
