// Package etcdtest runs a real etcd server for tests: embedded in the test
// process, on free loopback ports, with its data in a temporary directory.
//
// Start gives a test an etcd of its own, which it may stop, restart,
// restore or wipe. Shared gives it a keyspace of its own in the package's
// one etcd: every client it returns sees only keys under a prefix no other
// test uses (etcd's namespace wrappers of KV, Watcher and Lease), so tests
// that only read and write keys run in parallel on one server instead of
// starting one each. A package that uses Shared runs its tests through
// Main (func TestMain(m *testing.M) { os.Exit(etcdtest.Main(m)) }).
// Revisions are the server's, shared by every test; a test that needs
// revisions of its own, compacts, raises alarms or counts the server's
// watchers uses Start.
package etcdtest

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/namespace"
	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/shardd/shardd/pkg/embedetcd"
)

// Server is one embedded etcd member that can be stopped and restarted on
// the same data directory and ports; or a test's keyspace in the
// package's shared member (Shared), which cannot.
type Server struct {
	t                  testing.TB
	dir                string
	clientURL, peerURL string
	e                  *embedetcd.Server
	// ns is the prefix of a shared server's test keyspace; "" for a
	// server of the test's own.
	ns string
}

// shared is the package's one etcd of Shared, started at its first use.
var shared struct {
	sync.Mutex
	main bool // Main runs the tests
	srv  *Server
	dir  string
	next int
}

// Main runs the tests of a package that uses Shared, then stops the shared
// server and removes its data. It returns m.Run's exit code.
func Main(m *testing.M) int {
	shared.Lock()
	shared.main = true
	shared.Unlock()
	code := m.Run()
	shared.Lock()
	defer shared.Unlock()
	if shared.srv != nil && shared.srv.e != nil {
		shared.srv.e.Close()
		os.RemoveAll(shared.dir)
	}
	return code
}

// Shared returns a keyspace of t's own in the package's shared etcd (see
// the package doc): its clients see only the keys t writes.
func Shared(t testing.TB) *Server {
	t.Helper()
	shared.Lock()
	defer shared.Unlock()
	if !shared.main {
		t.Fatal("etcdtest.Shared needs the package's TestMain to run the tests through etcdtest.Main")
	}
	if shared.srv == nil {
		dir, err := os.MkdirTemp("", "etcdtest-shared-")
		if err != nil {
			t.Fatal(err)
		}
		srv := &Server{t: t, dir: dir}
		for range 10 {
			srv.clientURL, srv.peerURL = "http://"+FreeAddr(t), "http://"+FreeAddr(t)
			if err = srv.start(); err == nil {
				break
			}
		}
		if err != nil {
			os.RemoveAll(dir)
			t.Fatalf("start the shared etcd: %v", err)
		}
		shared.srv, shared.dir = srv, dir
	}
	shared.next++
	name := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	return &Server{t: t, dir: shared.dir, clientURL: shared.srv.clientURL, peerURL: shared.srv.peerURL,
		ns: fmt.Sprintf("/etcdtest/%s-%d/", name, shared.next)}
}

// own fails t when s is a keyspace of the shared server: what a test does
// to the server itself needs a server of its own (Start).
func (s *Server) own(what string) {
	s.t.Helper()
	if s.ns != "" {
		s.t.Fatalf("etcdtest: %s needs an etcd of the test's own (etcdtest.Start), not the shared one", what)
	}
}

// Start starts a server that is stopped when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, dir: t.TempDir()}
	var err error
	for range 10 {
		// A free port may be taken by another test before etcd binds it:
		// then take other ports (Restart must keep its ports, and waits).
		s.clientURL, s.peerURL = "http://"+FreeAddr(t), "http://"+FreeAddr(t)
		if err = s.start(); err == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("start etcd: %v", err)
	return nil
}

// start starts the server once.
func (s *Server) start() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	s.e, err = embedetcd.Start(ctx, embedetcd.Options{Dir: s.dir, ClientURL: s.clientURL, PeerURL: s.peerURL, LogLevel: "error"})
	return err
}

// Endpoint is the client URL.
func (s *Server) Endpoint() string { return s.clientURL }

// Addr is the client host:port.
func (s *Server) Addr() string { return s.clientURL[len("http://"):] }

// Stop stops the server; its data stays for Restart.
func (s *Server) Stop() {
	s.own("Stop")
	if s.e != nil {
		s.e.Close()
		s.e = nil
	}
}

// Restart starts the server (again) on the same data directory and ports.
func (s *Server) Restart() {
	s.t.Helper()
	s.own("Restart")
	var err error
	for attempt := 0; attempt < 50; attempt++ { // a just-closed port can take a moment to free
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("start etcd: %v", err)
}

// Backup stops the server, copies its data to a new directory (a backup
// of the member's data as an operator takes one, consistent since the
// server is down), and starts it again. It returns the copy for Restore.
func (s *Server) Backup() string {
	s.t.Helper()
	s.own("Backup")
	s.Stop()
	to := s.t.TempDir()
	if err := os.CopyFS(to, os.DirFS(s.dir)); err != nil {
		s.t.Fatalf("back up etcd's data: %v", err)
	}
	s.Restart()
	return to
}

// Restore stops the server and starts it again on a copy of backup (from
// Backup): etcd comes back with the state, revision and leases of the
// backup, at the same URL, with the same cluster and member ids, as after
// a restore of a snapshot.
func (s *Server) Restore(backup string) {
	s.t.Helper()
	s.own("Restore")
	s.Stop()
	s.replaceData(func(dir string) error { return os.CopyFS(dir, os.DirFS(backup)) })
	s.Restart()
}

// Wipe stops the server and starts a new, empty one at the same URL: a new
// cluster at revision 1.
func (s *Server) Wipe() {
	s.t.Helper()
	s.own("Wipe")
	s.Stop()
	s.replaceData(func(string) error { return nil })
	s.Restart()
}

// Snapshot saves a snapshot of the running server (the Maintenance API,
// as etcdctl snapshot save does) and returns its file, for
// RestoreSnapshot.
func (s *Server) Snapshot() string {
	s.t.Helper()
	s.own("Snapshot")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := s.Client().Snapshot(ctx)
	if err != nil {
		s.t.Fatalf("snapshot etcd: %v", err)
	}
	defer r.Close()
	path := filepath.Join(s.t.TempDir(), "snap.db")
	f, err := os.Create(path)
	if err == nil {
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		s.t.Fatalf("save etcd's snapshot: %v", err)
	}
	return path
}

// RestoreSnapshot stops the server and starts it again on a snapshot (from
// Snapshot) restored with etcd's own restore code (etcdutl snapshot
// restore), raising the revision by bump and, if markCompacted, marking
// the revisions up to it compacted: the operator's procedure of
// docs/operations.md.
func (s *Server) RestoreSnapshot(snap string, bump uint64, markCompacted bool) {
	s.t.Helper()
	s.own("RestoreSnapshot")
	s.Stop()
	s.replaceData(func(dir string) error {
		return snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
			SnapshotPath:        snap,
			Name:                "shardd",
			OutputDataDir:       filepath.Join(dir, "etcd"),
			PeerURLs:            []string{s.peerURL},
			InitialCluster:      "shardd=" + s.peerURL,
			InitialClusterToken: "etcd-cluster",
			RevisionBump:        bump,
			MarkCompacted:       markCompacted,
		})
	})
	s.Restart()
}

// replaceData points the server at a new data directory that fill fills.
func (s *Server) replaceData(fill func(dir string) error) {
	dir := s.t.TempDir()
	if err := fill(dir); err != nil {
		s.t.Fatalf("replace etcd's data: %v", err)
	}
	s.dir = dir
}

// WireKey is key as etcd and a client's gRPC interceptors see it: under a
// shared server, prefixed with the test's keyspace.
func (s *Server) WireKey(key string) string { return s.ns + key }

// Client returns a client of endpoint (the server's by default) that is
// closed when the test ends; of a shared server, one that sees only the
// test's keyspace.
func (s *Server) Client(endpoint ...string) *clientv3.Client {
	s.t.Helper()
	return s.ClientWith(nil, endpoint...)
}

// ClientWith is Client with extra gRPC dial options (interceptors).
func (s *Server) ClientWith(opts []grpc.DialOption, endpoint ...string) *clientv3.Client {
	s.t.Helper()
	if len(endpoint) == 0 {
		endpoint = []string{s.clientURL}
	}
	cli, err := clientv3.New(clientv3.Config{
		DialOptions:          opts,
		Endpoints:            endpoint,
		DialTimeout:          2 * time.Second,
		DialKeepAliveTime:    2 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Logger:               zap.NewNop(),
	})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { cli.Close() })
	if s.ns != "" {
		cli.KV = namespace.NewKV(cli.KV, s.ns)
		cli.Watcher = namespace.NewWatcher(cli.Watcher, s.ns)
		cli.Lease = namespace.NewLease(cli.Lease, s.ns)
	}
	return cli
}

// handedOut are the addresses FreeAddr has returned in this process.
var handedOut struct {
	sync.Mutex
	addrs map[string]bool
}

// FreeAddr returns a loopback host:port that was free a moment ago and
// that it has not returned before in this process: the kernel hands a
// just-closed port out again, so two calls in a row could otherwise
// return the same port (a server and its neighbour then fight over it).
func FreeAddr(t testing.TB) string {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.addrs == nil {
		handedOut.addrs = map[string]bool{}
	}
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		if !handedOut.addrs[addr] {
			handedOut.addrs[addr] = true
			return addr
		}
	}
	t.Fatal("no free loopback port not handed out before")
	return ""
}

// RaiseNoSpace raises the NOSPACE alarm on cli's first member, as etcd
// raises it when its database reaches its quota: etcd refuses every write
// until the returned disarm is called.
func RaiseNoSpace(t testing.TB, cli *clientv3.Client) (disarm func()) {
	t.Helper()
	ctx := context.Background()
	members, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id := members.Members[0].ID
	if _, err := etcdserverpb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, &etcdserverpb.AlarmRequest{
		Action: etcdserverpb.AlarmRequest_ACTIVATE, MemberID: id, Alarm: etcdserverpb.AlarmType_NOSPACE}); err != nil {
		t.Fatalf("raise NOSPACE: %v", err)
	}
	return func() {
		t.Helper()
		if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: id, Alarm: etcdserverpb.AlarmType_NOSPACE}); err != nil {
			t.Fatalf("disarm NOSPACE: %v", err)
		}
	}
}
