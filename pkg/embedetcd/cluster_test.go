package embedetcd

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func freeURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "https://" + ln.Addr().String()
}

// A member removed from its cluster while in use reports it on Err (shardd
// then stops: its session would otherwise go on through nothing); its data
// dir, its etcd data wiped, is refused as a new member of the cluster (a
// blank member could outvote those that kept the writes).
func TestRemovedAndWipedMember(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a 3-member etcd cluster")
	}
	type member struct{ name, dir, client, peer string }
	var ms []member
	var spec []string
	for i := 1; i <= 3; i++ {
		m := member{name: fmt.Sprintf("m%d", i), dir: t.TempDir(), client: freeURL(t), peer: freeURL(t)}
		ms = append(ms, m)
		spec = append(spec, m.name+"="+m.peer)
	}
	cluster := strings.Join(spec, ",")
	// One CA for all, as shardd ca and the copy make it.
	if _, err := EnsureTLS(ms[0].dir, []string{"127.0.0.1"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms[1:] {
		if err := CopyCA(ms[0].dir, m.dir); err != nil {
			t.Fatal(err)
		}
	}
	opts := func(m member) Options {
		return Options{Dir: m.dir, ClientURL: m.client, PeerURL: m.peer, TLS: true, Name: m.name, InitialCluster: cluster}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srvs := make([]*Server, 3)
	errs := make(chan error, 3)
	for i, m := range ms {
		go func() {
			var err error
			srvs[i], err = Start(ctx, opts(m))
			errs <- err
		}()
	}
	for range ms {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	defer func() {
		for _, s := range srvs {
			if s != nil {
				s.Close()
			}
		}
	}()

	cli := clusterClient(t, ms[0].dir, ms[0].client)
	defer cli.Close()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var id uint64
	for _, mm := range resp.Members {
		if mm.Name == "m3" {
			id = mm.ID
		}
	}
	// etcd refuses to remove a member until its peers have been connected
	// for a while ("unhealthy cluster").
	for {
		_, err := cli.MemberRemove(ctx, id)
		if err == nil {
			break
		}
		if ctx.Err() != nil || !strings.Contains(err.Error(), "unhealthy cluster") {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	select {
	case err := <-srvs[2].Err():
		t.Logf("removed member: %v", err)
		if !strings.Contains(err.Error(), "removed from its cluster") {
			t.Errorf("Err of a removed member = %v, want it to say it may have been removed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a member removed from its cluster said nothing on Err for 20 s")
	}
	srvs[2].Close()
	srvs[2] = nil

	// Its etcd data wiped, the data dir is refused as a new member.
	if err := os.RemoveAll(filepath.Join(ms[2].dir, "etcd")); err != nil {
		t.Fatal(err)
	}
	_, err = Start(ctx, opts(ms[2]))
	if err == nil || !strings.Contains(err.Error(), "was part of a cluster") || !strings.Contains(err.Error(), "--embed-join") {
		t.Fatalf("Start of a wiped member of a cluster: %v, want a refusal pointing to --embed-join", err)
	}

	// m2 loses its data and is started with --embed-join (Existing) while
	// the cluster still lists it: refused, it is not a new member.
	srvs[1].Close()
	srvs[1] = nil
	if err := os.RemoveAll(filepath.Join(ms[1].dir, "etcd")); err != nil {
		t.Fatal(err)
	}
	o := opts(ms[1])
	o.Existing = true
	_, err = Start(ctx, o)
	if err == nil || !strings.Contains(err.Error(), "has served already") || !strings.Contains(err.Error(), "member remove") {
		t.Fatalf("Start --embed-join of a listed member without data: %v, want a refusal", err)
	}
	t.Logf("wiped member joining: %v", err)
}

func clusterClient(t *testing.T, dir, endpoint string) *clientv3.Client {
	t.Helper()
	f := Files(dir)
	pair, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		TLS: &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool}})
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

func TestLastPeerProblem(t *testing.T) {
	path := filepath.Join(t.TempDir(), "etcd.log")
	log := `{"level":"info","ts":"2026-12-01T08:00:00Z","msg":"starting"}
{"level":"warn","ts":"2026-12-01T08:00:01Z","caller":"embed/config_logging.go:170","msg":"rejected connection on peer endpoint","remote-addr":"127.0.0.1:40000","error":"tls: bad certificate"}
{"level":"info","ts":"2026-12-01T08:00:02Z","msg":"something else"}
not json
`
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	want := "rejected connection on peer endpoint: tls: bad certificate remote-addr=127.0.0.1:40000"
	if got := lastPeerProblem(path); got != want {
		t.Errorf("lastPeerProblem = %q, want %q", got, want)
	}
	if got := lastPeerProblem(filepath.Join(t.TempDir(), "none")); got != "" {
		t.Errorf("lastPeerProblem of no file = %q", got)
	}
}
