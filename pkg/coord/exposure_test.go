package coord

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/embedetcd"
)

func TestCleartext(t *testing.T) {
	t.Parallel()
	tests := []struct {
		endpoints []string
		want      []string
	}{
		{[]string{"http://127.0.0.1:2379", "http://localhost:2379", "http://[::1]:2379"}, nil},
		{[]string{"https://etcd1:2379", "https://10.0.0.1:2379"}, nil},
		{[]string{"http://etcd1:2379", "https://etcd2:2379"}, []string{"http://etcd1:2379"}},
		{[]string{"http://10.0.0.1:2379"}, []string{"http://10.0.0.1:2379"}},
		{[]string{"etcd1:2379", "127.0.0.1:2379"}, []string{"etcd1:2379"}}, // no scheme: no TLS
		{[]string{"unix:///run/etcd.sock"}, nil},
	}
	for _, tt := range tests {
		if got := Cleartext(tt.endpoints); !slices.Equal(got, tt.want) {
			t.Errorf("Cleartext(%v) = %v, want %v", tt.endpoints, got, tt.want)
		}
	}
}

func TestProbeAndDiagnose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	k := keyspace.NewKeys("")

	// The tests' etcd: no TLS, no auth.
	open := etcdtest.Shared(t)
	if e := Probe(ctx, ClientOptions{Endpoints: []string{open.Endpoint()}}, k); !e.Known || !e.Anonymous || len(e.Cleartext) != 0 {
		t.Errorf("an etcd without TLS and auth: %+v, want known anonymous, not cleartext (loopback)", e)
	}
	if e := Probe(ctx, ClientOptions{Endpoints: []string{"http://" + etcdtest.FreeAddr(t)}}, k); e.Known {
		t.Errorf("nothing listening: %+v, want not known", e)
	}

	// The embedded default: client certificates required. Probe presents
	// none, even when the options it is given hold one.
	dir := t.TempDir()
	client, peer := "https://"+etcdtest.FreeAddr(t), "https://"+etcdtest.FreeAddr(t)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	srv, err := embedetcd.Start(sctx, embedetcd.Options{Dir: dir, ClientURL: client, PeerURL: peer, TLS: true, LogLevel: "error"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	f := embedetcd.Files(dir)
	o := ClientOptions{Endpoints: []string{client}, CAFile: f.CA, CertFile: f.ClientCert, KeyFile: f.ClientKey}
	cli, err := NewClient(o)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, k.Prefix()+"/x", "y"); err != nil {
		t.Fatalf("the owner's client: %v", err)
	}
	if e := Probe(ctx, o, k); !e.Known || e.Anonymous {
		t.Errorf("an etcd requiring client certificates: %+v, want known closed", e)
	}

	// Diagnose tells each way of failing to reach it apart.
	other := embedetcd.Files(t.TempDir())
	if _, err := embedetcd.EnsureTLS(filepath.Dir(other.Dir), []string{"127.0.0.1"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		endpoint string
		o        ClientOptions
		want     string
	}{
		{"the owner", client, o, ""},
		{"no client certificate", client, ClientOptions{CAFile: f.CA}, "requires a client certificate and none was given"},
		{"another cluster's client certificate", client, ClientOptions{CAFile: f.CA, CertFile: other.ClientCert, KeyFile: other.ClientKey}, "refused the client certificate"},
		{"another cluster's CA", client, ClientOptions{CAFile: other.CA, CertFile: other.ClientCert, KeyFile: other.ClientKey}, "is not signed by the CA"},
		{"plain HTTP to the TLS port", strings.Replace(client, "https", "http", 1), ClientOptions{}, "serves TLS: use https://"},
		{"https to a plain etcd", strings.Replace(open.Endpoint(), "http", "https", 1), ClientOptions{}, "does not serve TLS"},
		{"nothing there", "https://" + etcdtest.FreeAddr(t), o, "nothing answers at"},
		{"a plain etcd, over http", open.Endpoint(), ClientOptions{}, ""},
	}
	for _, tt := range tests {
		got := Diagnose(ctx, tt.endpoint, tt.o)
		if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
			t.Errorf("%s: Diagnose = %q, want %q", tt.name, got, tt.want)
		}
	}
}
