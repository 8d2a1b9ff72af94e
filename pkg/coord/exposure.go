package coord

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Whoever can write shardd's keys in etcd decides what every shardd host
// runs: etcd is the control plane, and must be closed to everyone else.
// Exposure checks the two ways it is commonly left open.

// Exposure is what Probe found.
type Exposure struct {
	// Known says whether Probe could tell if etcd is open to anonymous
	// clients: it could not reach it, or reached it but could not tell
	// why a request failed.
	Known bool
	// Anonymous: a client with no certificate and no user read the keys
	// under the prefix, so anyone who reaches an endpoint can also write them.
	Anonymous bool
	// Cleartext lists the endpoints reached without TLS beyond loopback:
	// keys, commands and any password cross the network in clear text.
	Cleartext []string
}

// Probe connects to the endpoints of o as an anonymous client (o's CA, but
// no client certificate, user or password) and tries to read one key under
// k's prefix. A read that succeeds means etcd enforces neither client
// certificates nor authentication (Anonymous). etcd is known to be closed
// when it answers with an authentication error, or when its TLS handshake
// demands a client certificate. Anything else (etcd unreachable, a timeout)
// leaves Known false: try again later.
func Probe(ctx context.Context, o ClientOptions, k keyspace.Keys) Exposure {
	e := Exposure{Cleartext: Cleartext(o.Endpoints)}
	cfg := clientv3.Config{Endpoints: o.Endpoints, DialTimeout: 2 * time.Second, Logger: zap.NewNop()}
	if o.CAFile != "" {
		t, err := tlsConfig(ClientOptions{CAFile: o.CAFile})
		if err != nil {
			return e
		}
		cfg.TLS = t
	}
	cli, err := clientv3.New(cfg)
	if err == nil {
		defer cli.Close()
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err = cli.Get(rctx, k.Prefix()+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		switch {
		case err == nil:
			e.Known, e.Anonymous = true, true
			return e
		case errors.Is(err, rpctypes.ErrUserEmpty), errors.Is(err, rpctypes.ErrPermissionDenied),
			errors.Is(err, rpctypes.ErrInvalidAuthToken), errors.Is(err, rpctypes.ErrAuthNotEnabled):
			e.Known = true
			return e
		}
	}
	// The etcd client hides a refused handshake behind its timeout: ask
	// each endpoint directly whether it demands a client certificate.
	for _, ep := range o.Endpoints {
		if !requiresClientCert(ctx, ep) {
			return e
		}
	}
	e.Known = len(o.Endpoints) > 0
	return e
}

// requiresClientCert reports whether the TLS server at endpoint refuses a
// client that presents no certificate.
// Who the server is does not matter here, so its certificate is not checked.
func requiresClientCert(ctx context.Context, endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "https" {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return false
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	err = tlsVerdict(ctx, conn, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, u.Host)
	return err != nil && (strings.Contains(err.Error(), "certificate required") || strings.Contains(err.Error(), "bad certificate"))
}

// Cleartext returns the endpoints reached without TLS beyond loopback. An
// endpoint without a scheme is dialled without TLS too.
func Cleartext(endpoints []string) []string {
	var out []string
	for _, ep := range endpoints {
		host := ep
		if u, err := url.Parse(ep); err == nil && (u.Scheme == "unix" || u.Scheme == "unixs") {
			continue // a local socket
		} else if err == nil && u.Host != "" {
			if u.Scheme != "http" {
				continue
			}
			host = u.Hostname()
		} else if h, _, err := net.SplitHostPort(ep); err == nil {
			host = h
		}
		if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" {
			out = append(out, ep)
		}
	}
	return out
}
