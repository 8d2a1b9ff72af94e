package embedetcd

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/shardd/shardd/pkg/trust"
)

// The embedded etcd accepts only its owner: it serves clients and peers over
// TLS and requires a client certificate signed by a CA of its own. The CA and
// the certificates are generated on first start into Dir/tls, a directory only
// the owner can enter:
//
//	tls/                 0700
//	  ca.crt             the CA's certificate
//	  ca.key             0600  the CA's key (signs the other two)
//	  server.crt         the member's certificate, for the client and peer
//	  server.key         0600  listeners (server and client auth, as etcd's own
//	                           gateway and peers present it too)
//	  client.crt         the certificate shardd and its CLI present
//	  client.key         0600
//
// Whoever can read client.key can do anything to the cluster; file
// permissions decide who that is. The server certificate is reissued from
// the same CA when it does not name a host the member now listens on, or
// when it expires within renewBefore; the CA and the client certificate are
// kept, so clients need nothing new.
const (
	tlsDirName  = "tls"
	caValidity  = 20 * 365 * 24 * time.Hour
	leafValid   = 5 * 365 * 24 * time.Hour
	renewBefore = 30 * 24 * time.Hour
)

// TLSFiles are the paths of the embedded etcd's TLS material.
type TLSFiles struct {
	Dir                   string
	CA, CAKey             string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
	// Endpoint holds the client URL the embedded etcd serves: the only
	// endpoint the client certificate is presented to.
	Endpoint string
}

// Files returns the paths of the TLS material of the embedded etcd whose
// data directory is dataDir. It does not look at the files.
func Files(dataDir string) TLSFiles {
	d := filepath.Join(dataDir, tlsDirName)
	return TLSFiles{
		Dir: d,
		CA:  filepath.Join(d, "ca.crt"), CAKey: filepath.Join(d, "ca.key"),
		ServerCert: filepath.Join(d, "server.crt"), ServerKey: filepath.Join(d, "server.key"),
		ClientCert: filepath.Join(d, "client.crt"), ClientKey: filepath.Join(d, "client.key"),
		Endpoint: filepath.Join(d, "endpoint"),
	}
}

// ErrNoCredentials is returned by ClientCredentials when dataDir holds no
// client certificate.
var ErrNoCredentials = errors.New("no embedded etcd client certificate")

// Credentials are what a client needs to reach an embedded etcd.
type Credentials struct {
	TLSFiles
	// URL is the client URL the embedded etcd serves ("" if unknown: a
	// data directory of an earlier version).
	URL string
}

// ClientCredentials returns the CA, the client certificate and the URL of
// the embedded etcd of dataDir, after checking that the caller can read
// them and that nobody but their owner can have written them. With own,
// the owner must be this user: for a data directory found implicitly (in
// the working directory), which another user may have planted. Its errors
// say why not: ErrNoCredentials when there are none (wrong --data-dir, or
// not started yet), a permission error naming the owner when they belong
// to another user, ErrNotTrusted.
func ClientCredentials(dataDir string, own bool) (Credentials, error) {
	c := Credentials{TLSFiles: Files(dataDir)}
	for _, p := range []string{c.Dir, c.CA, c.ClientCert, c.ClientKey} {
		fi, err := os.Lstat(p)
		if err == nil {
			err = trust.Check(p, fi, own)
		}
		if err == nil {
			var fh *os.File
			if fh, err = os.Open(p); err == nil {
				fh.Close()
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, fs.ErrNotExist):
			return c, fmt.Errorf("%w in %s", ErrNoCredentials, c.Dir)
		case errors.Is(err, fs.ErrPermission):
			return c, fmt.Errorf("%w: the embedded etcd accepts only its owner%s; run this command as that user", err, owner(c.Dir, dataDir))
		default:
			return c, err
		}
	}
	if b, err := os.ReadFile(c.Endpoint); err == nil {
		c.URL = strings.TrimSpace(string(b))
	}
	return c, nil
}

// owner describes the owner of the first of paths it can see, for an
// error message: " (uid 998, who owns shardd-data/tls)".
func owner(paths ...string) string {
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			return fmt.Sprintf(" (uid %d, who owns %s)", st.Uid, p)
		}
	}
	return ""
}

// EnsureTLS creates the TLS material in dataDir/tls if it is missing, and
// reissues the server certificate when it does not name every host in hosts
// or expires within 30 days of now. It returns the paths.
func EnsureTLS(dataDir string, hosts []string, now time.Time) (TLSFiles, error) {
	f := Files(dataDir)
	for _, p := range []string{f.Dir, f.CA, f.CAKey, f.ServerCert, f.ServerKey, f.ClientCert, f.ClientKey, f.Endpoint} {
		if err := trust.Owned(p); err != nil {
			return f, fmt.Errorf("embedded etcd TLS: %w", err)
		}
	}
	if err := os.MkdirAll(f.Dir, 0o700); err != nil {
		return f, fmt.Errorf("embedded etcd TLS directory: %w", err)
	}
	// MkdirAll keeps the mode of a directory that exists: tighten it.
	if err := os.Chmod(f.Dir, 0o700); err != nil {
		return f, fmt.Errorf("embedded etcd TLS directory: %w", err)
	}
	ca, caKey, err := loadPair(f.CA, f.CAKey)
	if errors.Is(err, fs.ErrNotExist) {
		ca, caKey, err = newCA(now)
		if err == nil {
			err = writePair(f.CA, f.CAKey, ca, caKey)
		}
		// A new CA invalidates every certificate it did not sign.
		for _, p := range []string{f.ServerCert, f.ServerKey, f.ClientCert, f.ClientKey} {
			if rerr := os.Remove(p); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) && err == nil {
				err = rerr
			}
		}
	}
	if err != nil {
		return f, fmt.Errorf("embedded etcd CA %s: %w (if the CA's files are damaged, remove %s: a new CA and certificates are made, and clients need the new ones)", f.CA, err, f.Dir)
	}
	if current(f.ServerCert, f.ServerKey, ca, hosts, now) != nil {
		crt, key, err := issue(ca, caKey, "shardd embedded etcd member", hosts, now)
		if err == nil {
			err = writePair(f.ServerCert, f.ServerKey, crt, key)
		}
		if err != nil {
			return f, fmt.Errorf("embedded etcd server certificate: %w", err)
		}
	}
	if current(f.ClientCert, f.ClientKey, ca, nil, now) != nil {
		crt, key, err := issue(ca, caKey, "shardd", nil, now)
		if err == nil {
			err = writePair(f.ClientCert, f.ClientKey, crt, key)
		}
		if err != nil {
			return f, fmt.Errorf("embedded etcd client certificate: %w", err)
		}
	}
	return f, nil
}

// current returns nil when the pair at certPath, keyPath is signed by ca,
// valid for renewBefore past now, and names every host in hosts.
func current(certPath, keyPath string, ca *x509.Certificate, hosts []string, now time.Time) error {
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return err
	}
	crt, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return err
	}
	if err := crt.CheckSignatureFrom(ca); err != nil {
		return err
	}
	if now.Add(renewBefore).After(crt.NotAfter) {
		return errors.New("expires soon")
	}
	for _, h := range hosts {
		if err := crt.VerifyHostname(h); err != nil {
			return err
		}
	}
	return nil
}

func newKey() (*ecdsa.PrivateKey, error) { return ecdsa.GenerateKey(elliptic.P256(), rand.Reader) }

func serial() (*big.Int, error) { return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127)) }

func newCA(now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "shardd embedded etcd CA " + host},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	crt, err := x509.ParseCertificate(der)
	return crt, key, err
}

// issue signs a certificate for cn usable for both server and client auth;
// hosts (names or IPs) become its subject alternative names.
func issue(ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, hosts []string, now time.Time) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := newKey()
	if err != nil {
		return nil, nil, err
	}
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(leafValid),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if !slices.Contains(tmpl.DNSNames, h) {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	crt, err := x509.ParseCertificate(der)
	return crt, key, err
}

func loadPair(certPath, keyPath string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	pair, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		// LoadX509KeyPair wraps the os error: keep ErrNotExist visible.
		return nil, nil, err
	}
	crt, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, nil, err
	}
	key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, nil, fmt.Errorf("%s: not an ECDSA key", keyPath)
	}
	return crt, key, nil
}

// writePair writes the certificate (0644, in the 0700 directory) and the
// key (0600), each through a temporary file and a rename, so that a crash
// leaves the old file or the new one, never half of one.
func writePair(certPath, keyPath string, crt *x509.Certificate, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := writeFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	return writeFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: crt.Raw}), 0o644)
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// CopyCA copies the cluster CA (ca.crt, ca.key) of fromDir's tls/ into
// toDir's, as an operator does for each member before its first start.
func CopyCA(fromDir, toDir string) error {
	from, to := Files(fromDir), Files(toDir)
	if err := os.MkdirAll(to.Dir, 0o700); err != nil {
		return err
	}
	for src, dst := range map[string]string{from.CA: to.CA, from.CAKey: to.CAKey} {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			return err
		}
	}
	return nil
}
