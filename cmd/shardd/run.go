package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	oklogrun "github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/shardd/shardd/pkg/api"
	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/console"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/embedetcd"
	"github.com/shardd/shardd/pkg/engine"
	"github.com/shardd/shardd/pkg/metrics"
	"github.com/shardd/shardd/pkg/runlog"
	"github.com/shardd/shardd/pkg/runner"
	"github.com/shardd/shardd/pkg/version"
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
	fs := newFlagSet(e, "run")
	var (
		cfgPath   = fs.String("config", "", "job definitions: a YAML `file` or a directory of *.yaml and *.yml")
		name      = fs.String("name", hostname(), "instance `id`, unique in the cluster; keep it stable across restarts")
		listen    = fs.String("listen", defaultListen, "`address` of the HTTP server: /healthz, /readyz, /metrics and the /api; empty disables it")
		ttl       = fs.Duration("ttl", 10*time.Second, "session `TTL`: how long a dead instance keeps its items, >= 2s")
		maxConc   = fs.Int("max-concurrency", 0, "items running at once on this instance, all jobs together; 0 = no cap")
		grace     = fs.Duration("shutdown-grace", 10*time.Second, "on SIGTERM, how long running items may finish before they are killed (recorded KILLED)")
		tokenFile = fs.String("api-token-file", "", "`file` of the API's and console's bearer tokens: lines 'NAME ROLE SECRET' (ROLE read or write, SECRET at least 16 characters), or one bare SECRET (named default, role write); without a write token the write endpoints are disabled")
		readFile  = fs.String("api-read-token-file", "", "`file` of more tokens, in --api-token-file's format (a lone secret here is the token read, role read); when any token has the read role, reads need a token")
		reloadInt = fs.Duration("reload-interval", 5*time.Second, "how often to check the config for changes (SIGHUP reloads at once)")
		embedURL  = fs.String("embed-client-url", defaultEmbedURL, "client `URL` of the embedded etcd (without --etcd); https: it accepts only the client certificate in --data-dir")
		pprofAddr = fs.String("pprof-listen", "", "loopback `address` to serve Go's profiles on (/debug/pprof/), for performance work; empty: off")
		pprofAny  = fs.Bool("pprof-listen-any", false, "let --pprof-listen be an address beyond loopback (in a container, to publish its port): the profiles, and the command line, go to whoever reaches it, without a token")
		embedPeer = fs.String("embed-peer-url", defaultEmbedPeer, "peer `URL` of the embedded etcd (without --etcd); https")
		embedClus = fs.String("embed-cluster", "", "run the embedded etcd as one member of a cluster of shardd hosts: `NAME=PEER_URL,...`, every member (3 or 5), this one under its --name; its peer URL is this host's --embed-peer-url. Each host's --data-dir/tls holds the same ca.crt and ca.key (see docs/deployment.md)")
		embedJoin = fs.Bool("embed-join", false, "with --embed-cluster: join a cluster that runs already (after etcdctl member add), instead of starting a new one")
		tlsCert   = fs.String("tls-cert", "", "certificate `file` (PEM) of the HTTP server: serve --listen over TLS")
		tlsKey    = fs.String("tls-key", "", "private key `file` (PEM) of --tls-cert")
		tlsCA     = fs.String("tls-client-ca", "", "CA bundle `file`: with it, the HTTP server requires client certificates it signed")
		runLogDir = fs.String("run-log-dir", "", "`directory` of this instance's run logs, each run's whole output (default <data-dir>/runs/<name>; \"none\" keeps only the history's tail)")
		apiCA     = fs.String("api-ca", "", "CA bundle `file` that verifies the other instances' API certificates, when this one proxies a run log request to them (default: --tls-client-ca's, else the system's roots)")
		ef        etcdFlags
		lf        logFlags
	)
	ef.register(fs, "etcd endpoint `URLs`, comma-separated; empty runs an embedded single-node etcd in --data-dir")
	lf.register(fs)
	if err := applyEnv(e, fs); err != nil {
		return err
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *cfgPath == "" {
		return usageError("--config is required")
	}
	if *ttl < coord.MinTTL || *ttl%time.Second != 0 {
		return usageError("--ttl must be a whole number of seconds >= %s, got %s", coord.MinTTL, *ttl)
	}
	if err := config.CheckName(*name); err != nil {
		return usageError("--name %v", err)
	}
	log, err := lf.logger(e)
	if err != nil {
		return err
	}
	// The digest is taken before the load: an edit during start-up, even
	// during the load, differs from it and is reloaded.
	digest := digestOf(*cfgPath)
	root := os.Geteuid() == 0
	cfg, err := loadConfig(log, *cfgPath, root)
	if errors.Is(err, errUnsafeFile) {
		for _, p := range config.Errors(err) {
			log.Error("unsafe config", "err", p)
		}
		return &exitError{exitFailure, fmt.Errorf("config %s: others can change its files: refused, as root", *cfgPath)}
	}
	if err != nil {
		for _, p := range config.Errors(err) {
			log.Error("invalid config", "err", p)
		}
		return &exitError{exitFailure, fmt.Errorf("invalid config %s", *cfgPath)}
	}
	if len(cfg.Jobs) == 0 {
		return &exitError{exitFailure, fmt.Errorf("%s defines no jobs; shardd run needs at least one (see jobs.example.yaml)", *cfgPath)}
	}
	if err := vetTokenFiles(log, root, *tokenFile, *readFile); err != nil {
		for _, p := range config.Errors(err) {
			log.Error("unsafe token file", "err", p)
		}
		return &exitError{exitFailure, errors.New("others can change a token file: refused, as root")}
	}
	tokens, err := loadTokens(*tokenFile, *readFile)
	if err != nil {
		return &exitError{exitFailure, err}
	}
	tlsCfg, err := serverTLS{*tlsCert, *tlsKey, *tlsCA}.config()
	if err != nil {
		return err
	}
	peers, err := proxyTransport(*apiCA, serverTLS{*tlsCert, *tlsKey, *tlsCA}) // see logs.go
	if err != nil {
		return err
	}
	log.Info("starting shardd", "version", version.String(), "instance", *name, "jobs", len(cfg.Jobs), "config", *cfgPath)
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
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, version.String())
	m.Reloaded(true, time.Now())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var g oklogrun.Group

	endpoints := ef.list()
	embedded := len(endpoints) == 0
	dataDir, implicit := ef.dir(false)
	if !embedded && (*embedClus != "" || *embedJoin) {
		return usageError("--embed-cluster and --embed-join run the embedded etcd: they do not go with --etcd")
	}
	if *embedJoin && *embedClus == "" {
		return usageError("--embed-join needs --embed-cluster: the members of the cluster it joins, this one included")
	}
	peerURL := *embedPeer
	if *embedClus != "" {
		dir, _ := filepath.Abs(dataDir)
		// A new cluster is formed by members without data; a member that
		// joins, or restarts on its data, follows the cluster as it is (a
		// cluster grows from 3 to 5 through 4).
		forming := !*embedJoin && !embedetcd.HasMember(dir)
		if peerURL, err = clusterPeer(*embedClus, *name, *embedPeer, flagSet(fs, "embed-peer-url"), forming); err != nil {
			return usageError("--embed-cluster: %v", err)
		}
		if f := embedetcd.Files(dir); !exists(f.CA) || !exists(f.CAKey) {
			return usageError("--embed-cluster: no cluster CA in %s (ca.crt and ca.key): run `shardd ca` on one host and copy both to every member's --data-dir/tls before its first start (docs/deployment.md); a member with a CA of its own cannot reach the others", f.Dir)
		}
	}
	if embedded {
		dir, _ := filepath.Abs(dataDir)
		eo := embedetcd.Options{Dir: dir, ClientURL: *embedURL, PeerURL: peerURL, TLS: true}
		if *embedClus != "" {
			eo.Name, eo.InitialCluster, eo.Existing = *name, *embedClus, *embedJoin
			eo.Waiting = func(waited time.Duration, etcdSays string) {
				log.Warn("embedded etcd: no quorum yet; are the other members started, with this CA and this --embed-cluster list?",
					"waited", waited.Round(time.Second), "etcd_says", etcdSays, "etcd_log", filepath.Join(dir, "etcd.log"))
			}
			log.Info("embedded etcd: starting as member "+*name+" of a cluster; it serves once a quorum of its members is up", "cluster", *embedClus)
		}
		srv, err := embedetcd.Start(ctx, eo)
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("%w\nanother shardd's embedded etcd? join it with --etcd %s --data-dir <the data dir it was started with>, as the same user; or give this one other --embed-client-url and --embed-peer-url", err, *embedURL)
		}
		if err != nil {
			return err
		}
		defer srv.Close()
		if *embedClus == "" {
			log.Warn("no --etcd given: running an embedded single-node etcd; this is a single-host default for development, use a 3 or 5 member etcd cluster in production (--embed-cluster: see docs/deployment.md)",
				"data_dir", dir, "etcd_log", filepath.Join(dir, "etcd.log"))
		} else {
			log.Info("embedded etcd: member of its cluster, serving", "member", *name, "data_dir", dir, "etcd_log", filepath.Join(dir, "etcd.log"))
		}
		prefix := ""
		if p := keyspace.NewKeys(ef.prefix).Prefix(); p != keyspace.DefaultPrefix {
			prefix = " --prefix " + p
		}
		how := "shardd status, trigger, ... run as this user reach it with --data-dir " + dir + prefix
		if dataDir == defaultDataDir && prefix == "" {
			how = "shardd status, trigger, ... run as this user in this directory reach it without flags (elsewhere: --data-dir " + dir + ")"
		}
		log.Info("embedded etcd: "+how+"; other local shardd processes of this user join with --etcd "+srv.ClientURL()+" --data-dir "+dir+prefix+
			fmt.Sprintf("; it accepts only clients with the certificate in %s, which only uid %d can read", embedetcd.Files(dir).Dir, os.Geteuid()), "url", srv.ClientURL())
		endpoints = []string{srv.ClientURL()}
		stop := make(chan struct{})
		g.Add(func() error {
			select {
			case err := <-srv.Err():
				return fmt.Errorf("embedded etcd: %w", err)
			case <-stop:
				return nil
			}
		}, func(error) { close(stop) })
	}

	runLogs, err := openRunLogs(*runLogDir, dataDir, *name)
	if err != nil {
		return err
	}
	if runLogs != nil {
		defer runLogs.Close()
		runLogs.Logger = log
		log.Info("each run's whole output is kept in its run log", "dir", runLogs.Dir())
	} else {
		log.Info("run logs are off (--run-log-dir none): only the last 4 KiB of each run's output is kept, in its history")
	}

	copts, err := ef.clientOptions(endpoints, dataDir, embedded || implicit)
	if err != nil {
		return err
	}
	copts.Observe = m.EtcdRequest
	hist := coord.NewHistory() // the node recovers from what the client sees of etcd going back
	copts.History = hist
	cli, err := coord.NewClient(copts)
	if err != nil {
		return err
	}
	defer cli.Close()

	{ // is the control plane open to others?
		pctx, pcancel := context.WithCancel(ctx)
		g.Add(func() error {
			watchExposure(pctx, log, m, copts, keyspace.NewKeys(ef.prefix))
			return nil
		}, func(error) { pcancel() })
	}

	var apiAddr string
	var ln net.Listener
	if *listen != "" {
		if ln, err = net.Listen("tcp", *listen); err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return fmt.Errorf("--listen: %w (another shardd on this host? give each its own --listen, or --listen \"\" for none)", err)
			}
			return fmt.Errorf("--listen: %w", err)
		}
		apiAddr = ln.Addr().String()
		defer ln.Close() // when a later step fails; Serve closes it otherwise
		warnAPI(log, ln.Addr(), tlsCfg != nil, hasRole(tokens, auth.RoleWrite), hasRole(tokens, auth.RoleRead))
	}
	node, err := coord.New(coord.Options{
		Client: cli, History: hist, Prefix: ef.prefix, ID: *name, TTL: *ttl, Logger: log,
		Info:          keyspace.InstanceInfo{Node: *name, Host: hostname(), PID: os.Getpid(), Version: version.String(), API: apiAddr, APITLS: tlsCfg != nil},
		OnMapWritten:  func(job string) { m.Reshards.WithLabelValues(job).Inc() },
		OnSessionLost: func(error) { m.SessionLosses.Inc() },
		Explain: func(ctx context.Context) string {
			var why []string
			for _, ep := range copts.Endpoints {
				if d := coord.Diagnose(ctx, ep, copts); d != "" {
					why = append(why, d)
				}
			}
			return strings.Join(why, "; ")
		},
	}, cfg.Jobs)
	if err != nil {
		return err
	}
	// The watchdog is this very build: /proc/self/exe is the running
	// binary even when its file was replaced (an upgrade) or removed since,
	// so both ends of the pipe speak one protocol (see runner's watchdog.go).
	self := "/proc/self/exe"
	if _, err := os.Stat(self); err != nil {
		if self, err = os.Executable(); err != nil {
			return fmt.Errorf("find the shardd binary for the script watchdog: %w", err)
		}
	}
	// What a script leaves behind is reparented here, killed when its run
	// ends, and reaped (see runner's reap.go); as PID 1 in a container too.
	if err := runner.BecomeSubreaper(); err != nil {
		log.Warn("processes a script leaves behind outside its process group may outlive its run", "err", err)
	}
	{
		rctx, rcancel := context.WithCancel(ctx)
		chld := make(chan os.Signal, 1)
		signal.Notify(chld, syscall.SIGCHLD)
		g.Add(func() error { runner.Reap(rctx, 5*time.Second, chld); return nil },
			func(error) { signal.Stop(chld); rcancel() })
	}
	cgroups, err := runner.DelegatedCgroups()
	if err != nil {
		log.Info("runs are not confined to cgroups: a process that leaves its run's group and clears its environment escapes the end-of-run kill", "why", err)
	} else {
		log.Info("each run gets a cgroup of its own, killed whole when the run ends")
	}
	wd, err := runner.StartWatchdog(self, log)
	if err != nil {
		return err
	}
	defer wd.Close()
	skew, err := coord.NewClockSkew(copts)
	if err != nil {
		return err
	}
	eng := engine.New(engine.Options{
		Node: node, Logger: log, TTL: *ttl, MaxConcurrency: *maxConc, Watchdog: wd, Cgroups: cgroups, Skew: skew.Skew, ShutdownGrace: *grace,
		RunLogs:   runLogs,
		OnStart:   func(job string) { m.Running.WithLabelValues(job).Inc() },
		OnSkipped: func(job string, n int) { m.SkippedFires.WithLabelValues(job).Add(float64(n)) },
		Observe:   func(r engine.Run) { observeRun(m, r) },
	})
	reg.MustRegister(metrics.NewStateCollector(func() metrics.State { return nodeState(node) }))
	var jobs atomic.Pointer[[]*config.Job] // the jobs loaded last
	jobs.Store(&cfg.Jobs)
	rl := &reloader{path: *cfgPath, interval: *reloadInt, log: log, metrics: m, hup: hup, root: root, digest: digest, apply: func(c *config.Config) {
		jobs.Store(&c.Jobs)
		node.SetJobs(c.Jobs)
		eng.Resync()
	}}
	if runLogs != nil { // retention for jobs that no longer run, and by age
		sctx, scancel := context.WithCancel(ctx)
		g.Add(func() error {
			sweepRunLogs(sctx, runLogs, time.Hour, log, func() []*config.Job { return *jobs.Load() })
			return nil
		}, func(error) { scancel() })
	}
	{
		rctx, rcancel := context.WithCancel(ctx)
		g.Add(func() error { rl.Run(rctx); return nil }, func(error) { rcancel() })
	}
	{ // clock skew against etcd, for maxTimeDiffSeconds
		sctx, scancel := context.WithCancel(ctx)
		g.Add(func() error { skew.Run(sctx, 30*time.Second); return nil }, func(error) { scancel() })
	}
	killWork = eng.Kill

	{ // the daemon: on interrupt, stop firing and let running items finish,
		// then leave the cluster (resign, revoke the lease)
		nctx, ncancel := context.WithCancel(ctx)
		ectx, ecancel := context.WithCancel(ctx)
		engDone := make(chan struct{})
		g.Add(func() error {
			go func() {
				defer close(engDone)
				eng.Run(ectx)
			}()
			err := node.Run(nctx)
			ecancel()
			<-engDone
			return err
		}, func(error) {
			ecancel() // no new fires
			lctx, lcancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := node.Leave(lctx); err != nil { // idle items move now
				log.Warn("leave", "err", err)
			}
			lcancel()
			<-engDone // running items finish (a second signal kills them)
			ncancel() // resign, revoke
		})
	}
	if ln != nil {
		authority := auth.New(tokens, 0, tlsCfg != nil)
		// The API and the console read and command through an operator
		// client of this node's connection, whose status reads stay shown
		// while the node refuses etcd's answers (etcd went back in time).
		adm := admin.New(cli, node.Keys()).WithShown(node.ShownContext)
		ui := console.New(console.Options{Instance: node.ID(), Admin: adm, Auth: authority, Endpoints: copts.Endpoints, Version: version.String(), Logger: log})
		srv := newHTTPServer(api.Handler(api.Options{
			Instance: node, Admin: adm, Metrics: promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}), ConfigError: rl.Err,
			Auth: authority, UI: ui, Loopback: isLoopback(ln.Addr()), Logger: log.With("instance", node.ID()), OnWrite: func() { console.Invalidate(ui) },
			RunLogs: &api.RunLogs{Store: runLogs, Runs: adm, Transport: peers, Host: hostname()},
		}), tlsCfg, log)
		g.Add(func() error {
			if err := serve(srv, ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		}, func(error) {
			sctx, scancel := context.WithTimeout(context.Background(), time.Second)
			defer scancel()
			srv.Shutdown(sctx)
		})
		log.Info("serving HTTP", "addr", apiAddr, "tls", tlsCfg != nil, "client_certs", tlsCfg != nil && tlsCfg.ClientCAs != nil)
	}
	if *pprofAddr != "" {
		pln, handler, err := listenPprof(*pprofAddr, *pprofAny)
		if err != nil {
			return err
		}
		if !isLoopback(pln.Addr()) {
			log.Warn("Go's profiles are served beyond loopback, without a token: whoever reaches the address reads shardd's memory through them, and its command line (--pprof-listen-any)", "addr", pln.Addr().String())
		}
		psrv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		g.Add(func() error {
			if err := psrv.Serve(pln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		}, func(error) { psrv.Close() })
		log.Info("serving Go's profiles", "addr", pln.Addr().String(), "path", "/debug/pprof/")
	}
	{ // systemd: READY when the session is up, watchdog pings
		sctx, scancel := context.WithCancel(ctx)
		g.Add(func() error { runSystemd(sctx, node.Up); return nil }, func(error) { scancel() })
	}
	{ // signals: the first stops gracefully, a second forces exit
		sig := make(chan os.Signal, 2)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		stop := make(chan struct{})
		g.Add(func() error {
			select {
			case s := <-sig:
				log.Info("shutting down; send the signal again to force", "signal", s.String())
				sdNotify("STOPPING=1")
				go forceOnSecondSignal(sig, *grace, log)
				return nil
			case <-stop:
				return nil
			}
		}, func(error) { close(stop) })
		defer signal.Stop(sig)
	}
	err = g.Run()
	log.Info("stopped")
	return err
}

// killWork stops every running item at once; set once the engine exists.
var killWork = func() {}

// forceOnSecondSignal exits on another signal, killing running items first
// so that none outlives this instance's claim. The engine kills them itself
// when the shutdown grace runs out and records them KILLED; if the stop
// still hangs well past that (etcd unreachable), it exits anyway.
func forceOnSecondSignal(sig <-chan os.Signal, grace time.Duration, log *slog.Logger) {
	select {
	case s := <-sig:
		log.Warn("second signal: killing running items and exiting now", "signal", s.String())
	case <-time.After(grace + 15*time.Second):
		log.Warn("graceful stop took too long: killing running items and exiting now", "grace", grace)
	}
	killWork()
	time.Sleep(100 * time.Millisecond) // let the kills land
	os.Exit(1)
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
