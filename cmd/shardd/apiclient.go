package main

// A client of the instances' APIs: its flags, its token, and the TLS of its
// requests (shardd logs, and the daemon's own proxy to another instance's API).

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/shardd/shardd/pkg/auth"
)

// apiFlags are the flags of a client of the instances' APIs.
type apiFlags struct {
	tokenFile, ca, cert, key string
}

// apiFlagNames are the flags apiFlags registers: connection flags, taken
// from the environment too.
var apiFlagNames = []string{"api-token-file", "api-ca", "api-cert", "api-key"}

func (f *apiFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.tokenFile, "api-token-file", "", "`file` with a token of the instances' API, as shardd run's token files (NAME ROLE SECRET lines, or one SECRET): its first read token, else its first, is used; needed when the API has read tokens")
	fs.StringVar(&f.ca, "api-ca", "", "CA bundle `file` that verifies the instances' API certificates (their --tls-cert); default: the system's roots")
	fs.StringVar(&f.cert, "api-cert", "", "client certificate `file` (PEM) for an API that requires one (--tls-client-ca)")
	fs.StringVar(&f.key, "api-key", "", "private key `file` (PEM) of --api-cert")
}

// clientTLS returns the TLS configuration of a client of the APIs: ca's
// roots (the system's when ca is ""), and the client certificate when
// cert and key are given.
func clientTLS(ca, cert, key, caFlag, certFlag string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, &exitError{exitFailure, fmt.Errorf("%s: %w", caFlag, err)}
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, &exitError{exitFailure, fmt.Errorf("%s %s: no PEM certificates", caFlag, ca)}
		}
	}
	if (cert == "") != (key == "") {
		return nil, usageError("%s and its key go together: give both, or neither", certFlag)
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, &exitError{exitFailure, fmt.Errorf("%s: %w", certFlag, err)}
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// apiTransport is a transport to the instances' APIs with cfg's TLS.
func apiTransport(cfg *tls.Config, headerTimeout time.Duration) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = cfg
	t.ResponseHeaderTimeout = headerTimeout
	t.Proxy = nil // the cluster's own addresses: never through an HTTP proxy of the environment
	return t
}

// proxyTransport is the transport of the run log requests `shardd run`
// proxies to the instance that ran the run: it trusts --api-ca (default:
// --tls-client-ca, else the system's roots) and presents this instance's
// own --tls-cert, for an API that requires client certificates (the
// certificate must then allow client authentication).
func proxyTransport(apiCA string, s serverTLS) (*http.Transport, error) {
	ca, caFlag := apiCA, "--api-ca"
	if ca == "" {
		ca, caFlag = s.clientCA, "--tls-client-ca"
	}
	cfg, err := clientTLS(ca, s.cert, s.key, caFlag, "--tls-cert")
	if err != nil {
		return nil, err
	}
	return apiTransport(cfg, 10*time.Second), nil
}

// cliToken returns the secret the command line presents to the API, from
// a token file in shardd run's format (auth.ParseTokens: NAME ROLE SECRET
// lines, or one bare SECRET): its first token of the read role, else its
// first token (reads need no more). "" without a file.
func cliToken(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	ts, err := auth.ParseTokens(string(b), path, "default", auth.RoleRead)
	if err != nil {
		return "", err
	}
	if len(ts) == 0 {
		return "", fmt.Errorf("%s holds no token", path)
	}
	for _, t := range ts {
		if t.Role == auth.RoleRead {
			return t.Secret, nil
		}
	}
	return ts[0].Secret, nil
}
