package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/metrics"
)

// Limits of the HTTP server. Its requests are small (no endpoint takes a
// body of more than a few bytes) and its answers are JSON documents or a
// metrics page; the limits keep a slow or hostile client from holding
// connections, memory or goroutines.
const (
	maxHeaderBytes    = 64 << 10
	maxBodyBytes      = 64 << 10
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 2 * time.Minute
)

// serverTLS are the --tls-* flags of the HTTP server.
type serverTLS struct{ cert, key, clientCA string }

// config loads the files into a TLS configuration; nil without --tls-cert.
func (s serverTLS) config() (*tls.Config, error) {
	if s.cert == "" && s.key == "" {
		if s.clientCA != "" {
			return nil, usageError("--tls-client-ca needs --tls-cert and --tls-key: client certificates are checked only over TLS")
		}
		return nil, nil
	}
	if s.cert == "" || s.key == "" {
		return nil, usageError("--tls-cert and --tls-key go together: give both, or neither")
	}
	pair, err := tls.LoadX509KeyPair(s.cert, s.key)
	if err != nil {
		return nil, &exitError{exitFailure, fmt.Errorf("--tls-cert/--tls-key: %w", err)}
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}
	if s.clientCA != "" {
		pem, err := os.ReadFile(s.clientCA)
		if err != nil {
			return nil, &exitError{exitFailure, fmt.Errorf("--tls-client-ca: %w", err)}
		}
		cfg.ClientCAs = x509.NewCertPool()
		if !cfg.ClientCAs.AppendCertsFromPEM(pem) {
			return nil, &exitError{exitFailure, fmt.Errorf("--tls-client-ca %s: no PEM certificates", s.clientCA)}
		}
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// newHTTPServer returns the server of h with shardd's limits, serving TLS
// when cfg is not nil.
func newHTTPServer(h http.Handler, cfg *tls.Config, log *slog.Logger) *http.Server {
	return &http.Server{
		Handler:           limitBody(h),
		TLSConfig:         cfg,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		// TLS handshake errors and the like; never request contents.
		ErrorLog: slog.NewLogLogger(log.With("component", "http").Handler(), slog.LevelDebug),
	}
}

// limitBody refuses a request whose declared body is over maxBodyBytes
// (413), and cuts an undeclared one there.
func limitBody(h http.Handler) http.Handler {
	limited := http.MaxBytesHandler(h, maxBodyBytes)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > maxBodyBytes {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusRequestEntityTooLarge)
			fmt.Fprintf(w, "{\"error\": \"request body over %d bytes\"}\n", maxBodyBytes)
			return
		}
		limited.ServeHTTP(w, r)
	})
}

// serve serves srv on ln, over TLS when srv has a TLS configuration.
func serve(srv *http.Server, ln net.Listener) error {
	if srv.TLSConfig != nil {
		return srv.ServeTLS(ln, "", "")
	}
	return srv.Serve(ln)
}

// warnAPI logs what makes the API less safe than it could be.
func warnAPI(log *slog.Logger, addr net.Addr, tlsOn, writeToken, readToken bool) {
	if !tlsOn && !isLoopback(addr) {
		log.Warn("the API listens beyond loopback without TLS: its bearer tokens and the cluster's data cross the network in clear text; give --tls-cert and --tls-key", "addr", addr.String())
	}
	if !writeToken {
		log.Info("the API's write endpoints are disabled: no --api-token-file (the CLI's trigger, disable, enable and remove work through etcd)", "addr", addr.String())
	}
	if !readToken {
		log.Info("the API's read endpoints (definitions, status, history with output tails, run logs) are open to whoever reaches "+addr.String()+", every local user included; --api-read-token-file closes them", "addr", addr.String())
	}
}

// watchExposure probes etcd as an anonymous client and says, loudly, when
// it is open: whoever can write shardd's keys makes every host run anything.
// It probes until it can tell (etcd may be down at start), then every ten
// minutes, and logs when the answer changes.
func watchExposure(ctx context.Context, log *slog.Logger, m *metrics.Metrics, o coord.ClientOptions, k keyspace.Keys) {
	gauge := func(b bool) float64 {
		if b {
			return 1
		}
		return 0
	}
	if clear := coord.Cleartext(o.Endpoints); len(clear) > 0 {
		log.Warn("SECURITY: etcd endpoints beyond loopback without TLS: job definitions, run records and any etcd password cross the network in clear text (see docs/security.md)",
			"endpoints", strings.Join(clear, ","))
		m.EtcdExposed.WithLabelValues("cleartext").Set(1)
	} else {
		m.EtcdExposed.WithLabelValues("cleartext").Set(0)
	}
	var known, open bool
	wait := 2 * time.Second
	for {
		e := coord.Probe(ctx, o, k)
		if ctx.Err() != nil {
			return
		}
		switch {
		case !e.Known:
			wait = min(2*wait, time.Minute)
		case !known || e.Anonymous != open:
			known, open = true, e.Anonymous
			m.EtcdExposed.WithLabelValues("anonymous").Set(gauge(open))
			if open {
				log.Error("SECURITY: etcd accepts anonymous clients: anyone who can reach "+strings.Join(o.Endpoints, ",")+
					" can write shardd's job definitions and so run any command, as this user, on every shardd host. "+
					"Enable etcd client-certificate auth or users with a role limited to the prefix (see docs/security.md)",
					"endpoints", strings.Join(o.Endpoints, ","), "prefix", k.Prefix())
			} else {
				log.Info("etcd refuses anonymous clients", "endpoints", strings.Join(o.Endpoints, ","))
			}
			fallthrough
		default:
			wait = 10 * time.Minute
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}
