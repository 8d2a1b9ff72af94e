package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/keyspace"
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
	endpoints    string
	ca           string
	cert         string
	key          string
	user         string
	password     string
	passwordFile string
	dialTimeout  time.Duration
	prefix       string
	dataDir      string
}

func (f *etcdFlags) register(fs *flag.FlagSet, endpointsHelp string) {
	fs.StringVar(&f.endpoints, "etcd", "", endpointsHelp)
	fs.StringVar(&f.ca, "etcd-ca", "", "CA bundle `file` to verify etcd servers (TLS)")
	fs.StringVar(&f.cert, "etcd-cert", "", "client certificate `file` for etcd (TLS)")
	fs.StringVar(&f.key, "etcd-key", "", "client key `file` for etcd (TLS)")
	fs.StringVar(&f.user, "etcd-user", "", "etcd user `name`")
	fs.StringVar(&f.password, "etcd-password", "", "etcd `password` (prefer --etcd-password-file)")
	fs.StringVar(&f.passwordFile, "etcd-password-file", "", "`file` whose first line is the etcd password (keep it 0600)")
	fs.DurationVar(&f.dialTimeout, "etcd-dial-timeout", 5*time.Second, "how long to wait for an etcd connection")
	fs.StringVar(&f.prefix, "prefix", keyspace.DefaultPrefix, "etcd key `prefix` of this shardd cluster")
	fs.StringVar(&f.dataDir, "data-dir", "", "`directory` of shardd's state: the embedded etcd's data, in tls/ the only client certificate it accepts, and in runs/ the run logs (default "+defaultDataDir+"; for commands other than run, "+systemdDataDir+" when only that exists)")
}

// etcdFlagNames are the names etcdFlags registers: the connection flags.
var etcdFlagNames = []string{"etcd", "etcd-ca", "etcd-cert", "etcd-key", "etcd-user", "etcd-password", "etcd-password-file", "etcd-dial-timeout", "prefix", "data-dir"}

// systemdDataDir is the --data-dir of the systemd unit (systemd/shardd.env).
const systemdDataDir = "/var/lib/shardd"

// dir returns --data-dir, or its default: shardd-data, or for the
// commands that only connect (search), the systemd unit's directory when
// shardd-data does not exist and that does. implicit says the directory
// was found in the working directory rather than named.
func (f *etcdFlags) dir(search bool) (dir string, implicit bool) {
	if f.dataDir != "" {
		return f.dataDir, false
	}
	if search {
		if _, err := os.Stat(defaultDataDir); errors.Is(err, os.ErrNotExist) {
			if _, err := os.Stat(systemdDataDir); err == nil {
				return systemdDataDir, false
			}
		}
	}
	return defaultDataDir, true
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

// checkEndpoint refuses an endpoint without its scheme: the etcd client
// would take 127.0.0.1:2379 for plain HTTP and, at a TLS etcd, wait for the
// dial timeout before asking whether etcd runs there.
func checkEndpoint(ep string) error {
	for _, scheme := range []string{"https://", "http://", "unix://", "unixs://"} {
		if strings.HasPrefix(ep, scheme) {
			if len(ep) == len(scheme) {
				return usageError("--etcd %s: no address after the scheme", ep)
			}
			return nil
		}
	}
	if strings.Contains(ep, "://") {
		return usageError("--etcd %s: the scheme is https://, http://, unix:// or unixs://", ep)
	}
	return usageError("--etcd %s: give the scheme: https://%s for an etcd with TLS (the embedded one), http://%s without", ep, ep, ep)
}

// clientOptions returns the options of a client of endpoints; no
// endpoints means the embedded etcd of the data directory (dir, see
// etcdFlags.dir), at the URL it recorded (default https://127.0.0.1:2379).
//
// The embedded etcd accepts only the client certificate it generated into
// its data directory. Without --etcd-ca, --etcd-cert and --etcd-key, the
// client presents that certificate, and trusts that CA, for the embedded
// etcd's own URL only: never for another endpoint, which could be anyone.
// own requires the data directory to belong to this user: for one found
// implicitly in the working directory, which someone else may have planted.
func (f *etcdFlags) clientOptions(endpoints []string, dir string, own bool) (coord.ClientOptions, error) {
	embedded := len(endpoints) == 0
	for _, ep := range endpoints {
		if err := checkEndpoint(ep); err != nil {
			return coord.ClientOptions{}, err
		}
	}
	if f.passwordFile != "" {
		if f.password != "" {
			return coord.ClientOptions{}, usageError("--etcd-password and --etcd-password-file: give one")
		}
		b, err := os.ReadFile(f.passwordFile)
		if err != nil {
			return coord.ClientOptions{}, &exitError{exitFailure, fmt.Errorf("--etcd-password-file: %w", err)}
		}
		f.password = strings.TrimRight(strings.SplitN(string(b), "\n", 2)[0], "\r")
	}
	o := coord.ClientOptions{
		Endpoints: endpoints, CAFile: f.ca, CertFile: f.cert, KeyFile: f.key,
		Username: f.user, Password: f.password, DialTimeout: f.dialTimeout,
	}
	if embedded {
		o.Endpoints = []string{defaultEmbedURL}
	}
	if f.ca != "" || f.cert != "" || f.key != "" {
		return o, nil
	}
	creds, err := embedetcd.ClientCredentials(dir, own)
	switch {
	case err == nil:
	case errors.Is(err, embedetcd.ErrNoCredentials) && !embedded:
		return o, nil // an external etcd
	case errors.Is(err, embedetcd.ErrNoCredentials):
		abs, _ := filepath.Abs(dir)
		return o, fmt.Errorf("%w (--data-dir %s): the embedded etcd accepts only that certificate; "+
			"pass the --data-dir shardd run was given (or set SHARDD_DATA_DIR), or --etcd and its --etcd-* flags for another etcd", err, abs)
	case !embedded && !slices.ContainsFunc(endpoints, isHTTPS):
		return o, nil // not the embedded etcd: its data dir does not matter
	default:
		return o, fmt.Errorf("etcd client certificate of --data-dir %s: %w", dir, err)
	}
	if embedded && creds.URL != "" {
		o.Endpoints = []string{creds.URL}
	}
	for _, ep := range o.Endpoints {
		if !sameURL(ep, creds.URL) {
			return o, nil // another etcd: the embedded one's CA and certificate are for it alone
		}
	}
	o.CAFile, o.CertFile, o.KeyFile = creds.CA, creds.ClientCert, creds.ClientKey
	return o, nil
}

func isHTTPS(endpoint string) bool { return strings.HasPrefix(endpoint, "https://") }

// sameURL reports whether two endpoint URLs name the same scheme, host and
// port (https://127.0.0.1:2379/ is https://127.0.0.1:2379).
func sameURL(a, b string) bool {
	ua, erra := url.Parse(a)
	ub, errb := url.Parse(b)
	return erra == nil && errb == nil && ua.Scheme == ub.Scheme && strings.EqualFold(ua.Host, ub.Host) &&
		strings.Trim(ua.Path, "/") == strings.Trim(ub.Path, "/")
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

// notDumpable makes this process not dumpable: its /proc files, environ
// among them, then belong to root, not to its user (prctl(2)
// PR_SET_DUMPABLE). Children get their own setting back at exec.
func notDumpable() error {
	const prSetDumpable = 4
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0); errno != 0 {
		return errno
	}
	return nil
}
