package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/embedetcd"
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
	dataDir     string
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
	fs.StringVar(&f.dataDir, "data-dir", "", "`directory` of the embedded etcd: its data, and in tls/ the only client certificate it accepts (default "+defaultDataDir+"; for commands other than run, "+systemdDataDir+" when only that exists)")
}

// etcdFlagNames are the names etcdFlags registers: the connection flags.
var etcdFlagNames = []string{"etcd", "etcd-ca", "etcd-cert", "etcd-key", "etcd-user", "etcd-password", "etcd-dial-timeout", "prefix", "data-dir"}

// systemdDataDir is the --data-dir of the systemd unit (systemd/shardd.env).
const systemdDataDir = "/var/lib/shardd"

// dir returns --data-dir, or its default: shardd-data, or for the
// commands that only connect (search), the systemd unit's directory when
// shardd-data does not exist and that does.
func (f *etcdFlags) dir(search bool) string {
	if f.dataDir != "" {
		return f.dataDir
	}
	if search {
		if _, err := os.Stat(defaultDataDir); errors.Is(err, os.ErrNotExist) {
			if _, err := os.Stat(systemdDataDir); err == nil {
				return systemdDataDir
			}
		}
	}
	return defaultDataDir
}

func (f *etcdFlags) list() []string {
	var out []string
	for _, ep := range strings.Split(f.endpoints, ",") {
		if ep = strings.TrimSpace(ep); ep != "" {
			out = append(out, ep)
		}
	}
	return out
}

// clientOptions returns the options of a client of endpoints. The embedded
// etcd accepts only the client certificate it generated into its data
// directory: without --etcd-ca, --etcd-cert and --etcd-key, a client of an
// https endpoint presents that certificate when the data directory (dir,
// see etcdFlags.dir) has one. embedded says the endpoints are the embedded
// default rather than --etcd: then the certificate is required.
func (f *etcdFlags) clientOptions(endpoints []string, dir string, embedded bool) (coord.ClientOptions, error) {
	o := coord.ClientOptions{
		Endpoints: endpoints, CAFile: f.ca, CertFile: f.cert, KeyFile: f.key,
		Username: f.user, Password: f.password, DialTimeout: f.dialTimeout,
	}
	if f.ca != "" || f.cert != "" || f.key != "" || !slices.ContainsFunc(endpoints, isHTTPS) {
		return o, nil
	}
	files, err := embedetcd.ClientCredentials(dir)
	switch {
	case err == nil:
		o.CAFile, o.CertFile, o.KeyFile = files.CA, files.ClientCert, files.ClientKey
		return o, nil
	case errors.Is(err, embedetcd.ErrNoCredentials) && !embedded:
		return o, nil // an external etcd with a CA the system trusts
	case errors.Is(err, embedetcd.ErrNoCredentials):
		abs, _ := filepath.Abs(dir)
		return o, fmt.Errorf("%w (--data-dir %s): the embedded etcd at %s accepts only that certificate; "+
			"pass the --data-dir shardd run was given (or set SHARDD_DATA_DIR), or --etcd and its --etcd-* flags for another etcd", err, abs, strings.Join(endpoints, ","))
	}
	return o, fmt.Errorf("etcd client certificate of --data-dir %s: %w", dir, err)
}

func isHTTPS(endpoint string) bool { return strings.HasPrefix(endpoint, "https://") }

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
