package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/shardd/shardd/pkg/api"
	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/engine"
	"github.com/shardd/shardd/pkg/metrics"
	"github.com/shardd/shardd/pkg/runlog"
	"github.com/shardd/shardd/pkg/selector"
)

// Defaults of `shardd run`.
const (
	defaultListen    = "127.0.0.1:9741"
	defaultDataDir   = "shardd-data"
	defaultEmbedURL  = "https://127.0.0.1:2379"
	defaultEmbedPeer = "https://127.0.0.1:2380"
)

func cmdRun(e *env, args []string) error {
	// SIGHUP's default kills the process: it is ignored from the first
	// package initialization (internal/sighup), and caught from here to
	// the exit, before the config is read. One arriving during start-up
	// waits in the channel and reloads once the reloader runs; after that,
	// during a stop, it is dropped.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	f, err := parseRunFlags(e, args)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d, err := newDaemon(ctx, e, f) // its actors stop in the order they are added
	if err != nil {
		return err
	}
	log, m := d.log, d.m
	etcd, err := d.startEtcd(ctx)
	if err != nil {
		return err
	}
	defer etcd.close()
	runLogs, err := d.openRunLogs(etcd.dataDir)
	if err != nil {
		return err
	}
	if runLogs != nil {
		defer runLogs.Close()
	}
	c, err := d.connect(etcd)
	if err != nil {
		return err
	}
	defer c.cli.Close()
	d.a.loop(func(ctx context.Context) { watchExposure(ctx, log, m, c.opts, keyspace.NewKeys(f.etcd.prefix)) }) // is the control plane open to others?
	ln, err := d.listenAPI()
	if err != nil {
		return err
	}
	if ln != nil {
		defer ln.Close() // when a later step fails; Serve closes it otherwise
	}
	node, err := d.newNode(c, ln)
	if err != nil {
		return err
	}
	wd, cgroups, err := d.startScriptSupport()
	if err != nil {
		return err
	}
	defer wd.Close()
	skew, err := coord.NewClockSkew(c.opts)
	if err != nil {
		return err
	}
	eng := d.newEngine(node, wd, cgroups, skew, runLogs)
	node.OnJobs(eng.Resync) // applied jobs come and go without a reload
	rl := d.newReloader(hup, node, eng)
	if runLogs != nil { // retention for jobs that no longer run, and by age
		d.a.loop(func(ctx context.Context) { sweepRunLogs(ctx, runLogs, time.Hour, log, node.Definitions) })
	}
	d.a.loop(rl.Run)
	d.a.loop(func(ctx context.Context) { skew.Run(ctx, 30*time.Second) }) // clock skew against etcd, for maxTimeDiffSeconds
	d.a.add(nodeAndEngine(ctx, node, eng, log))
	if ln != nil {
		d.serveAPI(ln, c, node, rl, runLogs)
	}
	if f.pprofAddr != "" {
		if err := d.servePprof(); err != nil {
			return err
		}
	}
	d.a.loop(func(ctx context.Context) { runSystemd(ctx, node.Up) }) // systemd: READY when the session is up, watchdog pings
	// signals: the first stops gracefully, a second forces exit
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sig)
	d.a.wait(untilSignal(sig, f.grace, log, eng.Kill))
	// A signal (or an actor that ends) stops the actors one after another
	// in the order they were added: the embedded etcd's watcher
	// (startEtcd), the exposure watch, the reaper (startScriptSupport),
	// the run-log sweep, the reloader, the clock skew, the node and engine
	// (no new fire; runs finish within the grace while the member keys are
	// withdrawn; resign, revoke), the API, pprof, systemd. The deferred
	// closes follow, in reverse.
	err = d.a.run()
	log.Info("stopped")
	return err
}

// runFlags are the flags of `shardd run`.
type runFlags struct {
	config         string
	name           string
	listen         string
	ttl            time.Duration
	maxConcurrency int
	grace          time.Duration
	tokenFile      string
	readTokenFile  string
	reloadInterval time.Duration
	embedURL       string
	pprofAddr      string
	pprofAny       bool
	embedPeer      string
	embedPeerGiven bool // --embed-peer-url was given, not left at its default
	embedCluster   string
	embedJoin      bool
	tls            serverTLS
	runLogDir      string
	apiCA          string
	etcd           etcdFlags
	log            logFlags
	labels         labelsFlag
	accept         config.AcceptPolicy
}

// listFlag is a repeatable flag of values, also comma-separated (as an
// environment variable gives them).
type listFlag struct{ values *[]string }

func (l listFlag) String() string {
	if l.values == nil {
		return ""
	}
	return strings.Join(*l.values, ",")
}

func (l listFlag) Set(s string) error {
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			*l.values = append(*l.values, part)
		}
	}
	return nil
}

// labelsFlag is --label KEY=VALUE, repeatable, or several joined by
// commas (as SHARDD_LABEL gives them).
type labelsFlag map[string]string

func (l labelsFlag) String() string {
	parts := make([]string, 0, len(l))
	for _, k := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, k+"="+l[k])
	}
	return strings.Join(parts, ",")
}

func (l *labelsFlag) Set(s string) error {
	if *l == nil {
		*l = labelsFlag{}
	}
	for part := range strings.SplitSeq(s, ",") {
		k, v, err := selector.ParseLabel(strings.TrimSpace(part))
		if err != nil {
			return err
		}
		if old, ok := (*l)[k]; ok && old != v {
			return fmt.Errorf("label %s given twice, as %q and %q", k, old, v)
		}
		(*l)[k] = v
	}
	return nil
}

// parseRunFlags parses and checks the command line of `shardd run`, with
// the environment under it.
func parseRunFlags(e *env, args []string) (*runFlags, error) {
	f := &runFlags{}
	fs := newFlagSet(e, "run")
	fs.StringVar(&f.config, "config", "", "job definitions: a YAML `file` or a directory of *.yaml and *.yml")
	fs.StringVar(&f.name, "name", hostname(), "instance `id`, unique in the cluster; keep it stable across restarts")
	fs.StringVar(&f.listen, "listen", defaultListen, "`address` of the HTTP server: /healthz, /readyz, /metrics and the /api; empty disables it")
	fs.DurationVar(&f.ttl, "ttl", 10*time.Second, "session `TTL`: how long a dead instance keeps its items, >= 2s")
	fs.IntVar(&f.maxConcurrency, "max-concurrency", 0, "items running at once on this instance, all jobs together; 0 = no cap")
	fs.DurationVar(&f.grace, "shutdown-grace", 10*time.Second, "on SIGTERM, how long running items may finish before they are killed (recorded KILLED)")
	fs.StringVar(&f.tokenFile, "api-token-file", "", "`file` of the API's and console's bearer tokens: lines 'NAME ROLE SECRET' (ROLE read, write or define, SECRET at least 16 characters), or one bare SECRET (named default, role write); without a write token the write endpoints are disabled, without a define token the definition endpoints")
	fs.StringVar(&f.readTokenFile, "api-read-token-file", "", "`file` of more tokens, in --api-token-file's format (a lone secret here is the token read, role read); when any token has the read role, reads need a token")
	fs.DurationVar(&f.reloadInterval, "reload-interval", 5*time.Second, "how often to check the config for changes (SIGHUP reloads at once)")
	fs.StringVar(&f.embedURL, "embed-client-url", defaultEmbedURL, "client `URL` of the embedded etcd (without --etcd); https: it accepts only the client certificate in --data-dir")
	fs.StringVar(&f.pprofAddr, "pprof-listen", "", "loopback `address` to serve Go's profiles on (/debug/pprof/), for performance work; empty: off")
	fs.BoolVar(&f.pprofAny, "pprof-listen-any", false, "let --pprof-listen be an address beyond loopback (in a container, to publish its port): the profiles, and the command line, go to whoever reaches it, without a token")
	fs.StringVar(&f.embedPeer, "embed-peer-url", defaultEmbedPeer, "peer `URL` of the embedded etcd (without --etcd); https")
	fs.StringVar(&f.embedCluster, "embed-cluster", "", "run the embedded etcd as one member of a cluster of shardd hosts: `NAME=PEER_URL,...`, every member (3 or 5), this one under its --name, at its entry's peer URL (--embed-peer-url, if given, must be the same). Each host's --data-dir/tls holds the same ca.crt and ca.key (see docs/deployment.md)")
	fs.BoolVar(&f.embedJoin, "embed-join", false, "with --embed-cluster: join a cluster that runs already (after etcdctl member add), instead of starting a new one")
	fs.StringVar(&f.tls.cert, "tls-cert", "", "certificate `file` (PEM) of the HTTP server: serve --listen over TLS")
	fs.StringVar(&f.tls.key, "tls-key", "", "private key `file` (PEM) of --tls-cert")
	fs.StringVar(&f.tls.clientCA, "tls-client-ca", "", "CA bundle `file`: with it, the HTTP server requires client certificates it signed")
	fs.StringVar(&f.runLogDir, "run-log-dir", "", "`directory` of this instance's run logs, each run's whole output (default <data-dir>/runs/<name>; \"none\" keeps only the history's tail)")
	fs.StringVar(&f.apiCA, "api-ca", "", "CA bundle `file` that verifies the other instances' API certificates, when this one proxies a run log request to them (default: --tls-client-ca's, else the system's roots)")
	f.etcd.register(fs, "etcd endpoint `URLs` with their scheme (https://host:2379), comma-separated; empty runs an embedded single-node etcd in --data-dir")
	fs.Var(&f.labels, "label", "a label of this instance, `KEY=VALUE` (repeatable, or comma-separated), matched by the jobs' instances.selector and shown by shardd status and the console")
	fs.BoolVar(&f.accept.Applied, "accept-applied", false, "run applied definitions (shardd apply, the API, the console's editor) whose selector matches this instance: code an operator with the define role sends to this host (docs/applied.md); without it, --config may define no job")
	fs.Var(listFlag{&f.accept.CommandDirs}, "accept-command-dir", "with --accept-applied: accept only applied definitions whose commands are argv lists of programs under this `directory` (repeatable)")
	fs.Var(listFlag{&f.accept.Env}, "accept-env", "with --accept-command-dir: accept applied definitions whose script.env sets this `variable` (repeatable); no other is accepted, since a variable can make a program load code from elsewhere")
	fs.Var(listFlag{&f.accept.HookHosts}, "accept-hook-host", "with --accept-applied: accept only applied definitions whose hooks and webhooks call this `host` (or host:port; repeatable)")
	f.log.register(fs)
	if err := applyEnv(e, fs); err != nil {
		return nil, err
	}
	if err := parseFlags(fs, args); err != nil {
		return nil, err
	}
	f.embedPeerGiven = flagSet(fs, "embed-peer-url")
	return f, f.check()
}

// check checks the flags that need nothing but the command line.
func (f *runFlags) check() error {
	if f.config == "" {
		return usageError("--config is required")
	}
	if f.ttl < coord.MinTTL || f.ttl%time.Second != 0 {
		return usageError("--ttl must be a whole number of seconds >= %s, got %s", coord.MinTTL, f.ttl)
	}
	if err := config.CheckName(f.name); err != nil {
		return usageError("--name %v", err)
	}
	if !f.accept.Applied && (len(f.accept.CommandDirs) > 0 || len(f.accept.HookHosts) > 0 || len(f.accept.Env) > 0) {
		return usageError("--accept-command-dir, --accept-env and --accept-hook-host restrict --accept-applied, which is not set")
	}
	if len(f.accept.Env) > 0 && len(f.accept.CommandDirs) == 0 {
		return usageError("--accept-env names what --accept-command-dir accepts of script.env; without --accept-command-dir every variable is accepted")
	}
	for _, d := range f.accept.CommandDirs {
		if !filepath.IsAbs(d) {
			return usageError("--accept-command-dir %s: want an absolute path", d)
		}
	}
	return nil
}

// checkEmbed checks the --embed-* flags against --etcd.
func (f *runFlags) checkEmbed(embedded bool) error {
	if !embedded && (f.embedCluster != "" || f.embedJoin) {
		return usageError("--embed-cluster and --embed-join run the embedded etcd: they do not go with --etcd")
	}
	if f.embedJoin && f.embedCluster == "" {
		return usageError("--embed-join needs --embed-cluster: the members of the cluster it joins, this one included")
	}
	return nil
}

// inputs are what shardd run reads before it starts anything.
type inputs struct {
	cfg    *config.Config
	digest [32]byte // of the config files, taken before they were read
	root   bool     // shardd runs as root: unsafe job and token files are refused (see trust.go)
	tokens []auth.Token
	tls    *tls.Config     // of the HTTP server; nil without --tls-cert
	peers  *http.Transport // to the other instances' APIs (see proxyTransport)
}

// load reads the config, the API's tokens and the HTTP server's TLS
// files, and refuses what is invalid, or unsafe as root.
func (f *runFlags) load(log *slog.Logger) (*inputs, error) {
	// The digest is taken before the load: an edit during start-up, even
	// during the load, differs from it and is reloaded.
	in := &inputs{digest: digestOf(f.config), root: os.Geteuid() == 0}
	cfg, err := loadConfig(log, f.config, in.root, f.accept.Applied)
	if errors.Is(err, errUnsafeFile) {
		for _, p := range config.Errors(err) {
			log.Error("unsafe config", "err", p)
		}
		return nil, &exitError{exitFailure, fmt.Errorf("config %s: others can change its files: refused, as root", f.config)}
	}
	if err != nil {
		for _, p := range config.Errors(err) {
			log.Error("invalid config", "err", p)
		}
		return nil, &exitError{exitFailure, fmt.Errorf("invalid config %s", f.config)}
	}
	if len(cfg.Jobs) == 0 && !f.accept.Applied {
		return nil, &exitError{exitFailure, fmt.Errorf("%s defines no jobs; shardd run needs at least one (see jobs.example.yaml), or --accept-applied to run applied ones", f.config)}
	}
	in.cfg = cfg
	if err := vetTokenFiles(log, in.root, f.tokenFile, f.readTokenFile); err != nil {
		for _, p := range config.Errors(err) {
			log.Error("unsafe token file", "err", p)
		}
		return nil, &exitError{exitFailure, errors.New("others can change a token file: refused, as root")}
	}
	if in.tokens, err = loadTokens(f.tokenFile, f.readTokenFile); err != nil {
		return nil, &exitError{exitFailure, err}
	}
	if in.tls, err = f.tls.config(); err != nil {
		return nil, err
	}
	if in.peers, err = proxyTransport(f.apiCA, f.tls); err != nil { // see apiclient.go
		return nil, err
	}
	return in, nil
}

// hideEtcdPassword takes the etcd password out of the environment, or
// warns that it is on the command line.
func hideEtcdPassword(e *env, log *slog.Logger, ef *etcdFlags) {
	// The etcd password is shardd's own secret: the scripts and hooks it
	// starts inherit its environment, so it leaves the environment here.
	// Unsetenv does not change /proc/<pid>/environ, which processes of
	// the same user (the scripts) can read: not dumpable makes it root's.
	if pw := envName("etcd-password"); e.getenv(pw) != "" {
		os.Unsetenv(pw)
		if err := notDumpable(); err != nil {
			log.Warn("could not hide the environment from this user's other processes: scripts can read "+pw+" from /proc; prefer --etcd-password-file", "err", err)
		}
	} else if ef.password != "" && ef.passwordFile == "" {
		log.Warn("--etcd-password on the command line is visible to every local user (ps, /proc/<pid>/cmdline); use --etcd-password-file or " + pw)
	}
}

// observeRun records a finished run in the metrics.
func observeRun(m *metrics.Metrics, r engine.Run) {
	m.Running.WithLabelValues(r.Job).Dec()
	result := metrics.ResultSuccess
	switch {
	case r.Killed:
		result = metrics.ResultKilled
	case !r.Result.OK:
		result = metrics.ResultFailure
	}
	m.Runs.WithLabelValues(r.Job, result, r.Source).Inc()
	m.RunDuration.WithLabelValues(r.Job).Observe(r.Duration.Seconds())
	if !r.Started.IsZero() {
		m.TriggerDelay.WithLabelValues(r.Job).Observe(r.Started.Sub(r.Fire).Seconds())
	}
}

// nodeState reads what the state collector exports.
func nodeState(node *coord.Node) metrics.State {
	var jobs []metrics.JobState
	for _, name := range node.Jobs() {
		v, ok := node.View(name)
		if !ok {
			continue
		}
		js := metrics.JobState{Job: name, Leading: v.Leading, Conflict: v.Conflict}
		if v.Map != nil {
			js.Epoch = v.Map.Epoch
			js.ItemsOwned = len(v.Map.ItemsOf(node.ID()))
		}
		jobs = append(jobs, js)
	}
	return metrics.State{SessionUp: node.Up(), Rewound: node.Rewound() != nil, NoSpace: node.NoSpace() != nil, Jobs: jobs}
}

// loadTokens reads the API's token files ("" for none): the write file's
// bare token is named "default" with the write role, the read file's
// "read" with the read role; named lines give their own (auth.ParseTokens).
func loadTokens(writeFile, readFile string) ([]auth.Token, error) {
	var all []auth.Token
	for _, f := range []struct{ flag, path, name, role string }{
		{"--api-token-file", writeFile, "default", auth.RoleWrite},
		{"--api-read-token-file", readFile, "read", auth.RoleRead},
	} {
		if f.path == "" {
			continue
		}
		b, err := os.ReadFile(f.path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.flag, err)
		}
		ts, err := auth.ParseTokens(string(b), f.path, f.name, f.role)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.flag, err)
		}
		if len(ts) == 0 {
			return nil, fmt.Errorf("%s: %s holds no token", f.flag, f.path)
		}
		for _, t := range ts {
			for _, o := range all {
				if o.Name == t.Name || o.Secret == t.Secret {
					return nil, fmt.Errorf("%s: token %q of %s has the name or secret of token %q of the other token file", f.flag, t.Name, f.path, o.Name)
				}
			}
		}
		all = append(all, ts...)
	}
	return all, nil
}

func hasRole(ts []auth.Token, role string) bool {
	return slices.ContainsFunc(ts, func(t auth.Token) bool { return t.Role == role })
}

// listenPprof listens on addr for the profiles, and returns their
// handler. Profiles show the process's internals (its memory, its command
// line) to whoever can ask, without a token: addr must be a loopback
// address unless beyond is set, and the handler answers, like the API's,
// only to a Host header that no web page can rebind to it (DNS rebinding):
// a loopback address or localhost, or for an address beyond loopback any
// IP address.
func listenPprof(addr string, beyond bool) (net.Listener, http.Handler, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, usageError("--pprof-listen %q: %v", addr, err)
	}
	ip := net.ParseIP(host)
	if !beyond && (ip == nil || !ip.IsLoopback()) {
		return nil, nil, usageError("--pprof-listen %q: only a loopback address (127.0.0.1:PORT, [::1]:PORT), unless --pprof-listen-any", addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--pprof-listen: %w", err)
	}
	check := api.AddressHosts
	if isLoopback(ln.Addr()) {
		check = api.LoopbackHosts
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return ln, api.CheckHost(mux, check), nil
}

// isLoopback reports whether addr is a loopback address.
func isLoopback(addr net.Addr) bool {
	if tcp, ok := addr.(*net.TCPAddr); ok {
		return tcp.IP.IsLoopback()
	}
	return false
}

// openRunLogs returns the store of run logs: dir, or when dir is empty
// <dataDir>/runs/<instance> (instances of one host may share a data dir,
// and each applies its retention to its own logs); nil for "none". The
// store checks its directory (runlog.New) whatever the etcd: with --etcd
// the data directory's own checks do not run, and the run logs are where
// the data directory would be.
func openRunLogs(dir, dataDir, instance string) (*runlog.Store, error) {
	switch dir {
	case "none":
		return nil, nil
	case "":
		dir = filepath.Join(dataDir, "runs", instance)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("--run-log-dir: %w", err)
	}
	s, err := runlog.New(abs)
	if err != nil {
		return nil, fmt.Errorf("--run-log-dir %s: %w (or --run-log-dir none to keep no run logs)", abs, err)
	}
	return s, nil
}

// sweepRunLogs applies the run logs' retention every period until ctx
// ends: runs apply it to their job when they end, this to jobs that no
// longer run and to logs aged past maxAge meanwhile.
func sweepRunLogs(ctx context.Context, s *runlog.Store, period time.Duration, log *slog.Logger, jobs func() []*config.Job) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		byName := map[string]runlog.Retention{}
		for _, j := range jobs() {
			r := j.LogRetention
			byName[j.Name] = runlog.Retention{MaxAge: time.Duration(r.MaxAge), MaxBytesPerRun: int64(r.MaxBytesPerRun), MaxTotalBytes: int64(r.MaxTotalBytes)}
		}
		if err := s.Sweep(func(job string) (runlog.Retention, bool) { r, ok := byName[job]; return r, ok }); err != nil {
			log.Warn("run log retention", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// clusterPeer checks an --embed-cluster list (NAME=PEER_URL,...) and
// returns this member's peer URL: its entry's, which --embed-peer-url,
// when given, must equal.
func clusterPeer(spec, name, peerFlag string, peerGiven, forming bool) (string, error) {
	seen := map[string]bool{}
	var mine string
	for _, m := range strings.Split(spec, ",") {
		n, u, ok := strings.Cut(strings.TrimSpace(m), "=")
		if !ok || n == "" || u == "" {
			return "", fmt.Errorf("%q is not NAME=PEER_URL", m)
		}
		if seen[n] {
			return "", fmt.Errorf("member %s is listed twice", n)
		}
		seen[n] = true
		pu, err := url.Parse(u)
		if err != nil || pu.Scheme != "https" || pu.Host == "" {
			return "", fmt.Errorf("member %s: peer URL %q must be https://HOST:PORT (members authenticate each other with certificates of one CA)", n, u)
		}
		if n == name {
			mine = u
		}
	}
	switch {
	case mine == "":
		return "", fmt.Errorf("this instance's --name %s is not one of the members (%s)", name, spec)
	case forming && (len(seen) == 2 || len(seen) == 4):
		return "", fmt.Errorf("a new cluster of %d members tolerates no more member failures than one of %d: use 3 or 5", len(seen), len(seen)-1)
	case peerGiven && peerFlag != mine:
		return "", fmt.Errorf("--embed-peer-url %s differs from member %s's URL in the list, %s", peerFlag, name, mine)
	}
	return mine, nil
}

// flagSet reports whether the flag name was given (on the command line or
// from the environment), not left at its default.
func flagSet(fs *flag.FlagSet, name string) (set bool) {
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
