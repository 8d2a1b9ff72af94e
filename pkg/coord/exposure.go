package coord

import (
	"context"
	"net"
	"net/url"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Whoever can write shardd's keys in etcd decides what every shardd host
// runs: etcd is the control plane, and must be closed to everyone else.
// Exposure checks the two ways it is commonly left open.

// Exposure is what Probe found.
type Exposure struct {
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
// certificates nor authentication. A read that fails for any reason (the
// TLS handshake, "user name is empty", an unreachable endpoint) counts as
// closed: Probe reports what it saw, not what it could not see.
func Probe(ctx context.Context, o ClientOptions, k Keys) Exposure {
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
	if err != nil {
		return e
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	_, err = cli.Get(ctx, k.prefix+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	e.Anonymous = err == nil
	return e
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
