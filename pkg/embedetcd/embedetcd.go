// Package embedetcd runs an etcd server inside the shardd process: a
// single member, the default when no etcd endpoints are configured, or one
// member of a cluster whose members are the shardd hosts (InitialCluster). With
// Options.TLS it accepts only clients that present the certificate it
// generates into its data directory (see EnsureTLS).
package embedetcd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
)

// Server is a single-member etcd server run inside the shardd process: the
// default when no endpoints are configured. It is meant for one host and for
// development: a single member can lose an acknowledged write on a crash
// (etcd #14370); production clusters should run 3 or 5 members.
type Server struct {
	e         *embed.Etcd
	errc      chan error
	clientURL string
	unlock    func() // releases the data dir's lock
	log       *logFile
}

// Options configure Start.
type Options struct {
	// Dir holds the member's data; it is created if missing.
	Dir string
	// ClientURL and PeerURL to listen on, e.g. http://127.0.0.1:2379;
	// https with TLS.
	ClientURL, PeerURL string
	// TLS serves clients and peers over TLS and requires a client
	// certificate signed by the CA in Dir/tls, generated on first start:
	// only who can read Dir/tls/client.key reaches the server.
	TLS bool
	// Name of the member; default "shardd".
	Name string
	// InitialCluster lists the members of a new cluster as
	// name=peerURL,...; default this member alone. With other members
	// Start waits (until ctx ends) for a quorum of them: the first
	// member of a new cluster is ready when a second one starts.
	InitialCluster string
	// Existing joins a cluster that runs already (the member was added
	// with etcdctl member add); default: a new cluster. Ignored once the
	// member has data: a restart rejoins with it.
	Existing bool
	// LogLevel of etcd's own log (debug, info, warn, error); default warn.
	LogLevel string
	// LogFile receives etcd's own log; default Dir/etcd.log, rotated at
	// 64 MB, 3 old files kept (LogFile.1, the newest, to .3). Fatal
	// errors also come out of Err.
	LogFile string
	// Waiting, if set, is called every 30 s while a member of a cluster
	// waits for a quorum, with what etcd's log said last of its peers
	// (a refused certificate, another cluster's ID, ...; "" if nothing).
	Waiting func(waited time.Duration, etcdSays string)
}

// Start starts an embedded etcd and returns once it serves clients,
// or with an error when it fails or ctx ends first.
func Start(ctx context.Context, o Options) (*Server, error) {
	o.setDefaults()
	cu, pu, err := o.urls()
	if err != nil {
		return nil, err
	}
	// URLs name where the member is reached; it listens there, or, for a
	// host name (h1:2380, a container's name), on every address at that
	// port: a name may resolve differently here than where the others
	// are (Debian maps a host's own name to 127.0.1.1), and etcd binds
	// IPs only. TLS with client certificates guards every address.
	lcu, lpu := listenURL(cu, o.TLS), listenURL(pu, o.TLS)
	if err := portsFree(lcu, lpu); err != nil {
		return nil, err
	}
	unlock, err := prepareDir(o.Dir)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			unlock()
		}
	}()
	cfg, err := o.config(cu, pu, lcu, lpu)
	if err != nil {
		return nil, err
	}
	alone := !strings.Contains(cfg.InitialCluster, ",")
	// A logger of this server's own (logfile.go), not etcd's log rotation.
	lf, err := openLogFile(o.LogFile, logMaxSize, logMaxBackups)
	if err != nil {
		return nil, err
	}
	defer func() {
		if !started {
			lf.Close()
		}
	}()
	cfg.LogOutputs = []string{o.LogFile}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newLogger(lf, o.LogLevel, &lf.stopping))

	inCluster := o.InitialCluster != ""
	if err := o.checkMember(cfg.Dir, pu); err != nil {
		return nil, err
	}
	hint := ""
	if inCluster {
		hint = " (a member removed from its cluster stops so: to bring this host back, delete " + cfg.Dir +
			", etcdctl member add it, and start it with --embed-join; docs/deployment.md)"
	}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd: %w%s", err, hint)
	}
	if err := o.waitReady(ctx, e, alone, hint); err != nil {
		return nil, err
	}
	started = true
	srv := &Server{e: e, errc: make(chan error, 1), clientURL: reachable(cu), unlock: unlock, log: lf}
	go srv.watch(hint)
	return srv, nil
}

// setDefaults fills in the options left empty.
func (o *Options) setDefaults() {
	if o.Name == "" {
		o.Name = "shardd"
	}
	if o.LogLevel == "" {
		o.LogLevel = "warn"
	}
	if o.LogFile == "" {
		o.LogFile = filepath.Join(o.Dir, "etcd.log")
	}
}

// urls parses the client and peer URLs, which must be https with TLS,
// http without.
func (o *Options) urls() (client, peer *url.URL, err error) {
	cu, err := url.Parse(o.ClientURL)
	if err != nil {
		return nil, nil, fmt.Errorf("embedded etcd client URL %q: %w", o.ClientURL, err)
	}
	pu, err := url.Parse(o.PeerURL)
	if err != nil {
		return nil, nil, fmt.Errorf("embedded etcd peer URL %q: %w", o.PeerURL, err)
	}
	want := "http"
	if o.TLS {
		want = "https"
	}
	for _, u := range []*url.URL{cu, pu} {
		if u.Scheme != want {
			if o.TLS {
				return nil, nil, fmt.Errorf("embedded etcd URL %s must be https: the embedded etcd accepts only clients with its certificate", u)
			}
			return nil, nil, fmt.Errorf("embedded etcd URL %s must be http without TLS", u)
		}
	}
	return cu, pu, nil
}

// portsFree fails before anything is created when a port to listen on is
// taken, most likely by another shardd's embedded etcd: its data
// directory is the one to join.
func portsFree(urls ...*url.URL) error {
	for _, u := range urls {
		ln, err := net.Listen("tcp", u.Host)
		if err != nil {
			return fmt.Errorf("embedded etcd: cannot listen on %s: %w", u, err)
		}
		ln.Close()
	}
	return nil
}

// config returns the etcd configuration of the member advertised at cu
// and pu and listening at lcu and lpu, its log aside; with TLS, it first
// generates the certificates it needs (EnsureTLS) and records the client
// URL for the other commands.
func (o *Options) config(cu, pu, lcu, lpu *url.URL) (*embed.Config, error) {
	cfg := embed.NewConfig()
	if o.TLS {
		f, err := EnsureTLS(o.Dir, certHosts(cu, pu), time.Now())
		if err != nil {
			return nil, err
		}
		if err := writeFile(f.Endpoint, []byte(reachable(cu)+"\n"), 0o644); err != nil {
			return nil, fmt.Errorf("embedded etcd: %w", err)
		}
		info := transport.TLSInfo{CertFile: f.ServerCert, KeyFile: f.ServerKey, TrustedCAFile: f.CA, ClientCertAuth: true}
		cfg.ClientTLSInfo, cfg.PeerTLSInfo = info, info
	}
	cfg.Name = o.Name
	cfg.Dir = filepath.Join(o.Dir, "etcd")
	cfg.ListenClientUrls = []url.URL{*lcu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*lpu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if o.InitialCluster != "" {
		cfg.InitialCluster = o.InitialCluster
		cfg.InitialClusterToken = "shardd"
	}
	if o.Existing {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	cfg.LogLevel = o.LogLevel
	// Keep revisions for an hour, so watches rarely see compaction.
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "1h"
	return cfg, nil
}

// checkMember refuses to start a member of a cluster without data
// (etcdDir is empty) when that could lose the cluster's writes: one whose
// data dir was a member's, or one joining under the peer URL pu of a
// member that has served.
func (o *Options) checkMember(etcdDir string, pu *url.URL) error {
	inCluster := o.InitialCluster != ""
	if inCluster && !o.Existing && !HasMember(o.Dir) {
		if was, err := os.ReadFile(markerFile(o.Dir)); err == nil {
			return fmt.Errorf("this data dir's member (%s, says %s) was part of a cluster, and its data (%s) is gone: "+
				"started as a new member it could outvote the members that kept the cluster's writes. "+
				"Bring it back as a new member: etcdctl member remove <its id>, etcdctl member add, "+
				"then start it with --embed-join (docs/deployment.md). Only if every member lost its data "+
				"and a new cluster is meant, delete %s", strings.TrimSpace(string(was)), markerFile(o.Dir), etcdDir, markerFile(o.Dir))
		}
	}
	if inCluster && o.Existing && !HasMember(o.Dir) && o.TLS {
		// Joining without data: the cluster must list this peer URL as a
		// member that was added and has not served yet. One that has is
		// this host's old member, whose data is gone: joining under its ID
		// with an empty log could lose the cluster's writes.
		if err := checkJoin(o.Dir, pu.String(), o.InitialCluster); err != nil {
			return err
		}
	}
	return nil
}

// waitReady waits until e serves, and then, for a member of a cluster,
// marks the data dir as a member's. On failure, or when ctx ends first,
// it closes e. hint ends the errors of a member of a cluster.
func (o *Options) waitReady(ctx context.Context, e *embed.Etcd, alone bool, hint string) error {
	inCluster := o.InitialCluster != ""
	// A lone member is ready at once; a member of a cluster when a quorum
	// of members is up, which may take as long as the operator takes to
	// start them.
	var timeout <-chan time.Time
	if alone {
		timeout = time.After(time.Minute)
	}
	waiting := time.NewTicker(30 * time.Second)
	defer waiting.Stop()
	begun := time.Now()
	for {
		select {
		case <-e.Server.ReadyNotify():
			if inCluster {
				// Marks the data dir as a member's: see checkMember.
				id := fmt.Sprintf("%s %x of cluster %x\n", o.Name, uint64(e.Server.MemberID()), uint64(e.Server.Cluster().ID()))
				if err := writeFile(markerFile(o.Dir), []byte(id), 0o600); err != nil {
					e.Close()
					return fmt.Errorf("embedded etcd: %w", err)
				}
			}
			return nil
		case err := <-e.Err():
			e.Close()
			return fmt.Errorf("embedded etcd: %w%s", err, hint)
		case <-e.Server.StopNotify():
			e.Close()
			return fmt.Errorf("embedded etcd stopped before it served%s", hint)
		case <-ctx.Done():
			e.Close()
			return ctx.Err()
		case <-timeout:
			e.Close()
			return fmt.Errorf("embedded etcd not ready after a minute")
		case <-waiting.C:
			if o.Waiting != nil && !alone {
				o.Waiting(time.Since(begun), lastPeerProblem(o.LogFile))
			}
		}
	}
}

// markerFile is written once the data dir's member has served in a
// cluster: a data dir with it and without etcd data lost its member.
func markerFile(dir string) string { return filepath.Join(dir, "etcd-member") }

// watch reports on errc a fatal error of the server, or its stop while
// shardd still uses it (its member removed from the cluster, or failed).
func (e *Server) watch(hint string) {
	select {
	case err := <-e.e.Err():
		e.errc <- fmt.Errorf("%w%s", err, hint)
	case <-e.e.Server.StopNotify():
		e.errc <- fmt.Errorf("the etcd member stopped: removed from its cluster, or failed (see etcd.log)%s", hint)
	}
}

// lastPeerProblem returns what etcd's log at path said last at level warn
// or above, for a member waiting for its peers ("" if nothing).
func lastPeerProblem(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const window = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > window {
		f.Seek(st.Size()-window, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var rec map[string]any
		if json.Unmarshal([]byte(lines[i]), &rec) != nil {
			continue
		}
		if lvl, _ := rec["level"].(string); lvl != "warn" && lvl != "error" {
			continue
		}
		msg, _ := rec["msg"].(string)
		if e, ok := rec["error"].(string); ok {
			msg += ": " + e
		}
		for _, k := range []string{"remote-addr", "remote-peer-id", "local-member-cluster-id", "remote-peer-cluster-id"} {
			if v, ok := rec[k].(string); ok {
				msg += " " + k + "=" + v
			}
		}
		return msg
	}
	return ""
}

// certHosts are the names the member's certificate must hold: loopback,
// and the hosts of its URLs; for a URL on every address (0.0.0.0), this
// host's name and addresses.
func certHosts(urls ...*url.URL) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	add := func(h string) {
		if h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	for _, u := range urls {
		ip := net.ParseIP(u.Hostname())
		if ip == nil || !ip.IsUnspecified() {
			add(u.Hostname())
			continue
		}
		if h, err := os.Hostname(); err == nil {
			add(h)
		}
		addrs, _ := net.InterfaceAddrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				add(n.IP.String())
			}
		}
	}
	return hosts
}

// reachable returns the URL clients dial to reach a server listening on u:
// a server on every address (0.0.0.0, [::]) is reached on loopback.
func reachable(u *url.URL) string {
	c := *u
	if ip := net.ParseIP(c.Hostname()); ip != nil && ip.IsUnspecified() {
		c.Host = net.JoinHostPort("127.0.0.1", c.Port())
	}
	return c.String()
}

// ClientURL is where clients on this host reach the embedded server.
func (e *Server) ClientURL() string { return e.clientURL }

// Err reports a fatal server error, or that the member stopped while in
// use (removed from its cluster): shardd cannot go on without it.
func (e *Server) Err() <-chan error { return e.errc }

// Close stops the server and waits for it.
func (e *Server) Close() {
	e.log.stopping.Store(true)
	e.e.Close()
	e.log.Close()
	e.unlock()
}

// listenURL is the URL the member listens on to be reached at u: u itself
// when its host is an IP address, every address at u's port when it is a
// name and the member takes only clients with its certificates (tls)
// (localhost: 127.0.0.1); a
// name without TLS stays as given (etcd refuses it: an IP is needed).
func listenURL(u *url.URL, tls bool) *url.URL {
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || !tls || net.ParseIP(host) != nil {
		return u
	}
	l := *u
	if strings.EqualFold(host, "localhost") {
		l.Host = net.JoinHostPort("127.0.0.1", port)
		return &l
	}
	l.Host = net.JoinHostPort("0.0.0.0", port)
	return &l
}

// HasMember reports whether dataDir holds an etcd member's data (a member
// that restarts rejoins its cluster with it).
func HasMember(dataDir string) bool {
	_, err := os.Stat(filepath.Join(dataDir, "etcd", "member"))
	return err == nil
}

// checkJoin asks the other members (their peer endpoints' /members, with
// this member's certificate) how they list peerURL; it refuses a join
// whose member has served already. Unreachable peers: no verdict (etcd's
// own join needs them anyway).
func checkJoin(dir, peerURL, initialCluster string) error {
	f := Files(dir)
	pair, err := tls.LoadX509KeyPair(f.ServerCert, f.ServerKey)
	if err != nil {
		return nil
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return nil
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cl := http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool}}}
	for _, m := range strings.Split(initialCluster, ",") {
		_, u, _ := strings.Cut(strings.TrimSpace(m), "=")
		if u == "" || u == peerURL {
			continue
		}
		resp, err := cl.Get(strings.TrimRight(u, "/") + "/members")
		if err != nil {
			continue
		}
		var members []struct {
			ID       json.RawMessage `json:"id"`
			Name     string          `json:"name"`
			PeerURLs []string        `json:"peerURLs"`
		}
		err = json.NewDecoder(resp.Body).Decode(&members)
		resp.Body.Close()
		if err != nil {
			continue
		}
		for _, mm := range members {
			if slices.Contains(mm.PeerURLs, peerURL) && mm.Name != "" {
				return fmt.Errorf("--embed-join: the cluster lists %s as member %s (id %s), which has served already, and this data dir has no etcd data: "+
					"it is that member with its data lost, and joining under its id could lose the cluster's writes. "+
					"Remove it (etcdctl member remove), add it again (etcdctl member add), then start this host again (docs/deployment.md)",
					peerURL, mm.Name, hexID(mm.ID))
			}
		}
		return nil
	}
	return nil
}

// hexID writes a member id as etcdctl does (hex).
func hexID(raw json.RawMessage) string {
	var id uint64
	if json.Unmarshal(raw, &id) == nil {
		return fmt.Sprintf("%x", id)
	}
	return strings.Trim(string(raw), `"`)
}
