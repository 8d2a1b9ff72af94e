package coord

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// Client is the etcd client coord's functions take. Packages outside coord
// hold it without importing the etcd client themselves: every etcd request
// shardd makes is written in this package.
type Client = clientv3.Client

// ClientOptions configure the etcd client.
type ClientOptions struct {
	Endpoints []string
	// TLS: a CA bundle to verify the servers, and a client certificate and key.
	CAFile, CertFile, KeyFile string
	Username, Password        string
	// DialTimeout bounds connecting; default 5s.
	DialTimeout time.Duration
	// Observe, if set, is called after every etcd request with its operation
	// (the gRPC method's name: Range, Txn, LeaseGrant, ...), latency and error.
	Observe func(operation string, d time.Duration, err error)
	// Revisions, if set, sees every answer first and refuses those that show
	// etcd's history went back (see Revisions); a Node given the same one in
	// its Options recovers from it.
	Revisions *Revisions
}

// NewClient connects to etcd. gRPC keepalives detect a dead or black-holed
// connection within about 7 seconds. They ping no more often than etcd's
// --grpc-keepalive-min-time (default 5s) allows, and only while streams are
// open, as etcd's server policy requires: a client that pings faster is
// sent GOAWAY "too_many_pings" and loses its connection.
func NewClient(o ClientOptions) (*clientv3.Client, error) {
	if len(o.Endpoints) == 0 {
		return nil, errors.New("coord: no etcd endpoints")
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 5 * time.Second
	}
	cfg := clientv3.Config{
		Endpoints:            o.Endpoints,
		DialTimeout:          o.DialTimeout,
		DialKeepAliveTime:    5 * time.Second,
		DialKeepAliveTimeout: 2 * time.Second,
		Username:             o.Username,
		Password:             o.Password,
		Logger:               zap.NewNop(),
	}
	if o.CAFile != "" || o.CertFile != "" || o.KeyFile != "" {
		t, err := tlsConfig(o)
		if err != nil {
			return nil, err
		}
		cfg.TLS = t
	}
	if o.Revisions != nil {
		cfg.DialOptions = append(cfg.DialOptions, o.Revisions.interceptors()...)
	}
	if o.Observe != nil {
		observe := o.Observe
		cfg.DialOptions = append(cfg.DialOptions,
			grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
				start := time.Now()
				err := invoker(ctx, method, req, reply, cc, opts...)
				observe(methodName(method), time.Since(start), err)
				return err
			}))
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client for %v: %w", o.Endpoints, err)
	}
	return cli, nil
}

func tlsConfig(o ClientOptions) (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, fmt.Errorf("etcd CA: %w", err)
		}
		t.RootCAs = x509.NewCertPool()
		if !t.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd CA %s: no PEM certificates", o.CAFile)
		}
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, errors.New("etcd client certificate: set both cert and key, or neither")
	}
	if o.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("etcd client certificate: %w", err)
		}
		t.Certificates = []tls.Certificate{cert}
	}
	return t, nil
}
