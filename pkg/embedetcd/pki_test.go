package embedetcd

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// verify checks that the pair at cert/key chains to the CA of f, for usage
// and, if host is set, for that host.
func verify(t *testing.T, f TLSFiles, cert, key, host string, usage x509.ExtKeyUsage) {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(pair.Certificate[0])
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(read(t, f.CA))
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: host, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		t.Errorf("%s for %q: %v", cert, host, err)
	}
}

func TestEnsureTLS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	if _, err := ClientCredentials(dir, true); !errors.Is(err, ErrNoCredentials) {
		t.Fatalf("before the first start: %v, want ErrNoCredentials", err)
	}
	f, err := EnsureTLS(dir, []string{"localhost", "127.0.0.1", "::1"}, now)
	if err != nil {
		t.Fatal(err)
	}
	modes := map[string]os.FileMode{f.Dir: 0o700, f.CAKey: 0o600, f.ServerKey: 0o600, f.ClientKey: 0o600, f.CA: 0o644}
	for p, want := range modes {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: %v, mode %v, want %v", p, err, fi.Mode().Perm(), want)
		}
	}
	verify(t, f, f.ServerCert, f.ServerKey, "127.0.0.1", x509.ExtKeyUsageServerAuth)
	verify(t, f, f.ServerCert, f.ServerKey, "localhost", x509.ExtKeyUsageServerAuth)
	verify(t, f, f.ServerCert, f.ServerKey, "", x509.ExtKeyUsageClientAuth) // etcd's gateway and peers present it
	verify(t, f, f.ClientCert, f.ClientKey, "", x509.ExtKeyUsageClientAuth)
	if _, err := ClientCredentials(dir, true); err != nil {
		t.Errorf("after the first start: %v", err)
	}

	snapshot := func() map[string][]byte {
		m := map[string][]byte{}
		for _, p := range []string{f.CA, f.CAKey, f.ServerCert, f.ServerKey, f.ClientCert, f.ClientKey} {
			m[p] = read(t, p)
		}
		return m
	}
	first := snapshot()
	changed := func(before, after map[string][]byte) (out []string) {
		for p := range before {
			if !bytes.Equal(before[p], after[p]) {
				out = append(out, filepath.Base(p))
			}
		}
		return out
	}

	// A second start changes nothing.
	if _, err := EnsureTLS(dir, []string{"127.0.0.1"}, now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if c := changed(first, snapshot()); len(c) != 0 {
		t.Errorf("a second start rewrote %v", c)
	}

	// A new host: only the server certificate is reissued, by the same CA.
	if _, err := EnsureTLS(dir, []string{"127.0.0.1", "shardd-1.example"}, now); err != nil {
		t.Fatal(err)
	}
	second := snapshot()
	if c := changed(first, second); len(c) != 2 || !bytes.Equal(first[f.CA], second[f.CA]) {
		t.Errorf("a new host rewrote %v, want server.crt and server.key only", c)
	}
	verify(t, f, f.ServerCert, f.ServerKey, "shardd-1.example", x509.ExtKeyUsageServerAuth)

	// 30 days before the leaf certificates expire, both are renewed; the CA stays.
	if _, err := EnsureTLS(dir, []string{"127.0.0.1"}, now.Add(leafValid-29*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	third := snapshot()
	if c := changed(second, third); len(c) != 4 || !bytes.Equal(second[f.CAKey], third[f.CAKey]) {
		t.Errorf("near expiry rewrote %v, want the server and client pairs", c)
	}

	// A lost CA key: a new CA, and every certificate reissued by it.
	os.Remove(f.CAKey)
	if _, err := EnsureTLS(dir, []string{"127.0.0.1"}, now); err != nil {
		t.Fatal(err)
	}
	if c := changed(third, snapshot()); len(c) != 6 {
		t.Errorf("a lost CA key rewrote %v, want everything", c)
	}
	verify(t, f, f.ClientCert, f.ClientKey, "", x509.ExtKeyUsageClientAuth)

	// A TLS directory someone widened is tightened again.
	os.Chmod(f.Dir, 0o755)
	if _, err := EnsureTLS(dir, nil, now); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(f.Dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("tls dir mode %v after a start, want 0700", fi.Mode().Perm())
	}
}
