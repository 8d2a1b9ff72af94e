package main

// The steps of `shardd run` (cmdRun), each building one part of the daemon.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

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
	"github.com/shardd/shardd/pkg/history"
	"github.com/shardd/shardd/pkg/metrics"
	"github.com/shardd/shardd/pkg/runlog"
	"github.com/shardd/shardd/pkg/runner"
	"github.com/shardd/shardd/pkg/version"
)

// newDaemon starts a `shardd run` of flags f: its logger, its metrics,
// what it reads before it starts anything (f.load), and its actors, whose
// loops' contexts are children of ctx.
func newDaemon(ctx context.Context, e *env, f *runFlags) (*daemon, error) {
	log, err := f.log.logger(e)
	if err != nil {
		return nil, err
	}
	in, err := f.load(log)
	if err != nil {
		return nil, err
	}
	log.Info("starting shardd", "version", version.String(), "instance", f.name, "jobs", len(in.cfg.Jobs), "config", f.config)
	hideEtcdPassword(e, log, &f.etcd)
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, version.String())
	m.Reloaded(true, time.Now())
	return &daemon{f: f, in: in, log: log, reg: reg, m: m, a: actors{ctx: ctx}, hours: history.NewHours()}, nil
}

// daemon is one `shardd run` being built: its flags, what it read before
// starting, its logger and metrics, and the actors that own its
// goroutines. The parts it builds, step by step, pass from step to step.
type daemon struct {
	f   *runFlags
	in  *inputs
	log *slog.Logger
	reg *prometheus.Registry
	m   *metrics.Metrics
	a   actors
	// hours counts this instance's runs per hour, for the console's chart.
	hours *history.Hours
}

// etcdTarget is the etcd shardd run talks to, and its data directory.
type etcdTarget struct {
	endpoints []string // --etcd's, or the embedded etcd's URL
	embedded  bool     // no --etcd: the embedded etcd
	dataDir   string
	implicit  bool   // dataDir is the default, in the working directory
	close     func() // stops the embedded etcd; does nothing for --etcd
}

// startEtcd starts the embedded etcd without --etcd, as one member of a
// cluster with --embed-cluster, and adds the actor that stops every actor
// when it fails.
func (d *daemon) startEtcd(ctx context.Context) (etcdTarget, error) {
	f, log := d.f, d.log
	t := etcdTarget{endpoints: f.etcd.list(), close: func() {}}
	t.embedded = len(t.endpoints) == 0
	t.dataDir, t.implicit = f.etcd.dir(false)
	if err := f.checkEmbed(t.embedded); err != nil {
		return t, err
	}
	peerURL := f.embedPeer
	if f.embedCluster != "" {
		dir, _ := filepath.Abs(t.dataDir)
		// A new cluster is formed by members without data; a member that
		// joins, or restarts on its data, follows the cluster as it is (a
		// cluster grows from 3 to 5 through 4).
		forming := !f.embedJoin && !embedetcd.HasMember(dir)
		var err error
		if peerURL, err = clusterPeer(f.embedCluster, f.name, f.embedPeer, f.embedPeerGiven, forming); err != nil {
			return t, usageError("--embed-cluster: %v", err)
		}
		if ef := embedetcd.Files(dir); !exists(ef.CA) || !exists(ef.CAKey) {
			return t, usageError("--embed-cluster: no cluster CA in %s (ca.crt and ca.key): run `shardd ca` on one host and copy both to every member's --data-dir/tls before its first start (docs/deployment.md); a member with a CA of its own cannot reach the others", ef.Dir)
		}
	}
	if !t.embedded {
		return t, nil
	}
	dir, _ := filepath.Abs(t.dataDir)
	eo := embedetcd.Options{Dir: dir, ClientURL: f.embedURL, PeerURL: peerURL, TLS: true}
	if f.embedCluster != "" {
		eo.Name, eo.InitialCluster, eo.Existing = f.name, f.embedCluster, f.embedJoin
		eo.Waiting = func(waited time.Duration, etcdSays string) {
			log.Warn("embedded etcd: no quorum yet; are the other members started, with this CA and this --embed-cluster list?",
				"waited", waited.Round(time.Second), "etcd_says", etcdSays, "etcd_log", filepath.Join(dir, "etcd.log"))
		}
		log.Info("embedded etcd: starting as member "+f.name+" of a cluster; it serves once a quorum of its members is up", "cluster", f.embedCluster)
	}
	srv, err := embedetcd.Start(ctx, eo)
	if errors.Is(err, syscall.EADDRINUSE) {
		return t, fmt.Errorf("%w\nanother shardd's embedded etcd? join it with --etcd %s --data-dir <the data dir it was started with>, as the same user; or give this one other --embed-client-url and --embed-peer-url", err, f.embedURL)
	}
	if err != nil {
		return t, err
	}
	t.close = srv.Close
	d.logEmbedded(srv, dir, t.dataDir)
	t.endpoints = []string{srv.ClientURL()}
	d.a.wait(func(stop <-chan struct{}) error {
		select {
		case err := <-srv.Err():
			return fmt.Errorf("embedded etcd: %w", err)
		case <-stop:
			return nil
		}
	})
	return t, nil
}

// logEmbedded says what the embedded etcd serving from dir (--data-dir
// dataDir) is for, and how the other commands reach it.
func (d *daemon) logEmbedded(srv *embedetcd.Server, dir, dataDir string) {
	f, log := d.f, d.log
	if f.embedCluster == "" {
		log.Warn("no --etcd given: running an embedded single-node etcd; this is a single-host default for development, use a 3 or 5 member etcd cluster in production (--embed-cluster: see docs/deployment.md)",
			"data_dir", dir, "etcd_log", filepath.Join(dir, "etcd.log"))
	} else {
		log.Info("embedded etcd: member of its cluster, serving", "member", f.name, "data_dir", dir, "etcd_log", filepath.Join(dir, "etcd.log"))
	}
	prefix := ""
	if p := keyspace.NewKeys(f.etcd.prefix).Prefix(); p != keyspace.DefaultPrefix {
		prefix = " --prefix " + p
	}
	how := "shardd status, trigger, ... run as this user reach it with --data-dir " + dir + prefix
	if dataDir == defaultDataDir && prefix == "" {
		how = "shardd status, trigger, ... run as this user in this directory reach it without flags (elsewhere: --data-dir " + dir + ")"
	}
	log.Info("embedded etcd: "+how+"; other local shardd processes of this user join with --etcd "+srv.ClientURL()+" --data-dir "+dir+prefix+
		fmt.Sprintf("; it accepts only clients with the certificate in %s, which only uid %d can read", embedetcd.Files(dir).Dir, os.Geteuid()), "url", srv.ClientURL())
}

// openRunLogs opens the store of run logs (see openRunLogs); nil for
// --run-log-dir none.
func (d *daemon) openRunLogs(dataDir string) (*runlog.Store, error) {
	runLogs, err := openRunLogs(d.f.runLogDir, dataDir, d.f.name)
	if err != nil {
		return nil, err
	}
	if runLogs != nil {
		runLogs.Logger = d.log
		d.log.Info("each run's whole output is kept in its run log", "dir", runLogs.Dir())
	} else {
		d.log.Info("run logs are off (--run-log-dir none): only the last 4 KiB of each run's output is kept, in its history")
	}
	return runLogs, nil
}

// etcdClient is shardd run's connection to etcd.
type etcdClient struct {
	cli  *coord.Client
	opts coord.ClientOptions
	revs *coord.Revisions // the node recovers from what the client sees of etcd going back
}

// connect connects to etcd, counting the requests in the metrics.
func (d *daemon) connect(t etcdTarget) (etcdClient, error) {
	var c etcdClient
	var err error
	if c.opts, err = d.f.etcd.clientOptions(t.endpoints, t.dataDir, t.embedded || t.implicit); err != nil {
		return c, err
	}
	c.opts.Observe = d.m.EtcdRequest
	c.revs = coord.NewRevisions()
	c.opts.Revisions = c.revs
	c.cli, err = coord.NewClient(c.opts)
	return c, err
}

// listenAPI listens on --listen for the HTTP server; nil when it is empty.
func (d *daemon) listenAPI() (net.Listener, error) {
	if d.f.listen == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", d.f.listen)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("--listen: %w (another shardd on this host? give each its own --listen, or --listen \"\" for none)", err)
		}
		return nil, fmt.Errorf("--listen: %w", err)
	}
	warnAPI(d.log, ln.Addr(), d.in.tls != nil, hasRole(d.in.tokens, auth.RoleWrite), hasRole(d.in.tokens, auth.RoleRead))
	return ln, nil
}

// newNode returns this instance's node of the cluster, with the loaded
// jobs; ln, when not nil, is the API it announces.
func (d *daemon) newNode(c etcdClient, ln net.Listener) (*coord.Node, error) {
	f, m := d.f, d.m
	var apiAddr string
	if ln != nil {
		apiAddr = ln.Addr().String()
	}
	return coord.New(coord.Options{
		Client: c.cli, Revisions: c.revs, Prefix: f.etcd.prefix, ID: f.name, TTL: f.ttl, Logger: d.log,
		Info:          keyspace.InstanceInfo{Node: f.name, Host: hostname(), PID: os.Getpid(), Version: version.String(), API: apiAddr, APITLS: d.in.tls != nil, Labels: f.labels},
		Accept:        f.accept,
		OnMapWritten:  func(job string) { m.Reshards.WithLabelValues(job).Inc() },
		OnSessionLost: func(error) { m.SessionLosses.Inc() },
		Explain: func(ctx context.Context) string {
			var why []string
			for _, ep := range c.opts.Endpoints {
				if d := coord.Diagnose(ctx, ep, c.opts); d != "" {
					why = append(why, d)
				}
			}
			return strings.Join(why, "; ")
		},
	}, d.in.cfg.Jobs)
}

// startScriptSupport prepares what runs the scripts lean on: the reaper
// of what they leave behind (an actor), their cgroups when delegated
// (nil, logged, when not), and the watchdog that kills them should
// shardd die.
func (d *daemon) startScriptSupport() (*runner.Watchdog, *runner.Cgroups, error) {
	log := d.log
	// The watchdog is this very build: /proc/self/exe is the running
	// binary even when its file was replaced (an upgrade) or removed since,
	// so both ends of the pipe speak one protocol (see runner's watchdog.go).
	self := "/proc/self/exe"
	if _, err := os.Stat(self); err != nil {
		if self, err = os.Executable(); err != nil {
			return nil, nil, fmt.Errorf("find the shardd binary for the script watchdog: %w", err)
		}
	}
	// What a script leaves behind is reparented here, killed when its run
	// ends, and reaped (see runner's reap.go); as PID 1 in a container too.
	if err := runner.BecomeSubreaper(); err != nil {
		log.Warn("processes a script leaves behind outside its process group may outlive its run", "err", err)
	}
	rctx, rcancel := context.WithCancel(d.a.ctx)
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	d.a.add(func() error { runner.Reap(rctx, 5*time.Second, chld); return nil },
		func() { signal.Stop(chld); rcancel() })
	cgroups, err := runner.DelegatedCgroups()
	if err != nil {
		log.Info("runs are not confined to cgroups: a process that leaves its run's group and clears its environment escapes the end-of-run kill", "why", err)
	} else {
		log.Info("each run gets a cgroup of its own, killed whole when the run ends")
	}
	wd, err := runner.StartWatchdog(self, log)
	if err != nil {
		return nil, nil, err
	}
	return wd, cgroups, nil
}

// newEngine returns the engine that runs node's items, observed in the
// metrics, whose state collector it registers.
func (d *daemon) newEngine(node *coord.Node, wd *runner.Watchdog, cgroups *runner.Cgroups, skew *coord.ClockSkew, runLogs *runlog.Store) *engine.Engine {
	f, m := d.f, d.m
	eng := engine.New(engine.Options{
		Node: node, Logger: d.log, TTL: f.ttl, MaxConcurrency: f.maxConcurrency, Watchdog: wd, Cgroups: cgroups, Skew: skew.Skew, ShutdownGrace: f.grace,
		RunLogs:   runLogs,
		OnStart:   func(job string) { m.Running.WithLabelValues(job).Inc() },
		OnSkipped: func(job string, n int) { m.SkippedFires.WithLabelValues(job).Add(float64(n)) },
		Observe: func(r engine.Run) {
			observeRun(m, r)
			end := r.Result.End
			if end.IsZero() {
				end = time.Now()
			}
			d.hours.Add(end, !r.Result.OK && !r.Killed)
		},
	})
	if runLogs != nil { // the hours before this process began, from its run logs
		began := time.Now()
		go func() {
			if err := d.hours.Seed(runLogs, began); err != nil {
				d.log.Warn("runs per hour: the run logs could not be counted; the console's chart starts now", "err", err)
			}
		}()
	}
	d.reg.MustRegister(metrics.NewStateCollector(func() metrics.State { return nodeState(node) }))
	return eng
}

// newReloader returns the reloader of the config, which gives node and
// eng each valid new one (hup: SIGHUP, caught).
func (d *daemon) newReloader(hup <-chan os.Signal, node *coord.Node, eng *engine.Engine) *reloader {
	rl := &reloader{path: d.f.config, interval: d.f.reloadInterval, allowEmpty: d.f.accept.Applied, log: d.log, metrics: d.m, hup: hup, root: d.in.root, digest: d.in.digest, apply: func(c *config.Config) {
		node.SetJobs(c.Jobs)
		eng.Resync()
	}, rejected: func(err error) {
		why := ""
		if err != nil {
			why = time.Now().UTC().Format(time.RFC3339) + ": " + api.ProblemCount(err)
		}
		node.SetReloadRejected(why) // for shardd status and the console
	}}
	return rl
}

// nodeAndEngine is the daemon's actor: the node, and the engine beside it.
// On stop, it stops firing and lets running items finish, then leaves the
// cluster (resign, revoke the lease).
func nodeAndEngine(ctx context.Context, node *coord.Node, eng *engine.Engine, log *slog.Logger) (run func() error, stop func()) {
	nctx, ncancel := context.WithCancel(ctx)
	ectx, ecancel := context.WithCancel(ctx)
	engDone := make(chan struct{})
	run = func() error {
		go func() {
			defer close(engDone)
			eng.Run(ectx)
		}()
		err := node.Run(nctx)
		ecancel()
		<-engDone
		return err
	}
	stop = func() {
		ecancel() // no new fires
		lctx, lcancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := node.Leave(lctx); err != nil { // idle items move now
			log.Warn("leave", "err", err)
		}
		lcancel()
		<-engDone // running items finish (a second signal kills them)
		ncancel() // resign, revoke
	}
	return run, stop
}

// serveAPI adds the HTTP server on ln: the API, the console and the
// metrics.
func (d *daemon) serveAPI(ln net.Listener, c etcdClient, node *coord.Node, rl *reloader, runLogs *runlog.Store) {
	log, tlsCfg := d.log, d.in.tls
	authority := auth.New(d.in.tokens, 0, tlsCfg != nil)
	// The API and the console read and command through an operator
	// client of this node's connection, whose status reads stay shown
	// while the node refuses etcd's answers (etcd went back in time).
	adm := admin.New(c.cli, node.Keys()).WithShown(node.ShownContext)
	apiOpts := api.Options{
		Instance: node, Admin: adm, Metrics: promhttp.HandlerFor(d.reg, promhttp.HandlerOpts{Registry: d.reg}), ConfigError: rl.Err,
		Auth: authority, Loopback: isLoopback(ln.Addr()), Logger: log.With("instance", node.ID()),
		RunLogs: &api.RunLogs{Store: runLogs, Runs: adm, Transport: d.in.peers, Host: hostname()}, Hours: d.hours,
	}
	// The console's history and chart are the API's: merged over the
	// instances.
	histories := api.NewHistories(apiOpts)
	ui := console.New(console.Options{Instance: node.ID(), Admin: adm, Auth: authority, Endpoints: c.opts.Endpoints, Version: version.String(), Logger: log,
		History: histories.Merged, Hours: histories.MergedHours})
	apiOpts.UI, apiOpts.OnWrite = ui, func() { console.Invalidate(ui) }
	srv := newHTTPServer(api.Handler(apiOpts), tlsCfg, log)
	d.a.serve(func() error { return serve(srv, ln) }, func() {
		sctx, scancel := context.WithTimeout(context.Background(), time.Second)
		defer scancel()
		srv.Shutdown(sctx)
	})
	log.Info("serving HTTP", "addr", ln.Addr().String(), "tls", tlsCfg != nil, "client_certs", tlsCfg != nil && tlsCfg.ClientCAs != nil)
}

// servePprof adds the server of Go's profiles on --pprof-listen.
func (d *daemon) servePprof() error {
	pln, handler, err := listenPprof(d.f.pprofAddr, d.f.pprofAny)
	if err != nil {
		return err
	}
	if !isLoopback(pln.Addr()) {
		d.log.Warn("Go's profiles are served beyond loopback, without a token: whoever reaches the address reads shardd's memory through them, and its command line (--pprof-listen-any)", "addr", pln.Addr().String())
	}
	psrv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	d.a.serve(func() error { return psrv.Serve(pln) }, func() { psrv.Close() })
	d.log.Info("serving Go's profiles", "addr", pln.Addr().String(), "path", "/debug/pprof/")
	return nil
}

// untilSignal is the actor of the stop signals on sig: the first stops
// every actor gracefully; a second, or a stop that hangs, kills running
// items and exits (forceOnSecondSignal).
func untilSignal(sig chan os.Signal, grace time.Duration, log *slog.Logger, kill func()) func(stop <-chan struct{}) error {
	return func(stop <-chan struct{}) error {
		select {
		case s := <-sig:
			log.Info("shutting down; send the signal again to force", "signal", s.String())
			sdNotify("STOPPING=1")
			go forceOnSecondSignal(sig, grace, log, kill)
			return nil
		case <-stop:
			return nil
		}
	}
}

// forceOnSecondSignal exits on another signal, killing running items first
// (kill) so that none outlives this instance's claim. The engine kills them
// itself when the shutdown grace runs out and records them KILLED; if the
// stop still hangs well past that (etcd unreachable), it exits anyway.
func forceOnSecondSignal(sig <-chan os.Signal, grace time.Duration, log *slog.Logger, kill func()) {
	select {
	case s := <-sig:
		log.Warn("second signal: killing running items and exiting now", "signal", s.String())
	case <-time.After(grace + 15*time.Second):
		log.Warn("graceful stop took too long: killing running items and exiting now", "grace", grace)
	}
	kill()
	time.Sleep(100 * time.Millisecond) // let the kills land
	os.Exit(1)
}
