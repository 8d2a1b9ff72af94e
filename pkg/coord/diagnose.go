package coord

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// Diagnose says why the etcd at endpoint did not answer a client of o,
// when it can tell from one connection: nothing listening, a server
// certificate the CA does not sign, a client certificate the server
// refuses, or a TLS server reached over plain HTTP. It returns "" when it
// sees nothing wrong. The etcd client itself only reports that its
// deadline passed, retrying underneath.
func Diagnose(ctx context.Context, endpoint string, o ClientOptions) string {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return fmt.Sprintf("nothing answers at %s: %v", u.Host, err)
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	if u.Scheme != "https" {
		// Does it speak TLS? Its certificate does not matter here.
		tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true})
		if err := tc.HandshakeContext(ctx); err == nil || !notTLS(err) {
			return fmt.Sprintf("%s serves TLS: use https://%s (the embedded etcd of shardd run serves only https)", u.Host, u.Host)
		}
		return ""
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if o.CAFile != "" || o.CertFile != "" || o.KeyFile != "" {
		if cfg, err = tlsConfig(o); err != nil {
			return err.Error()
		}
	}
	cfg = cfg.Clone()
	cfg.ServerName = u.Hostname()
	if err = tlsVerdict(ctx, conn, cfg, u.Host); err == nil {
		return ""
	}
	var unknown x509.UnknownAuthorityError
	switch {
	case errors.As(err, &unknown):
		hint := "a different cluster, or the wrong --data-dir / --etcd-ca?"
		if o.CAFile == "" {
			hint = "a --data-dir's certificate is used only when --etcd is that data dir's etcd alone; for other or several endpoints, as an embedded cluster's members, give --etcd-ca, --etcd-cert and --etcd-key: the ca.crt, client.crt and client.key in a member's DATA_DIR/tls/"
		}
		return fmt.Sprintf("the certificate of %s is not signed by the CA %s (%s): %v", u.Host, orSystem(o.CAFile), hint, err)
	case strings.Contains(err.Error(), "certificate required"), strings.Contains(err.Error(), "bad certificate"), strings.Contains(err.Error(), "unknown certificate authority"):
		if o.CertFile == "" {
			return fmt.Sprintf("%s requires a client certificate and none was given: pass the --data-dir its shardd run was started with, or --etcd-cert and --etcd-key: %v", u.Host, err)
		}
		return fmt.Sprintf("%s refused the client certificate %s (a different cluster's, or the wrong --data-dir?): %v", u.Host, o.CertFile, err)
	case notTLS(err):
		return fmt.Sprintf("%s does not serve TLS: use http://%s", u.Host, u.Host)
	}
	return fmt.Sprintf("TLS with %s failed: %v", u.Host, err)
}

func orSystem(ca string) string {
	if ca == "" {
		return "of the system"
	}
	return ca
}

// notTLS reports whether a handshake failed because the server does not
// speak TLS: it answered something else, or hung up on the ClientHello.
func notTLS(err error) bool {
	var rh tls.RecordHeaderError
	return errors.As(err, &rh) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)
}

// tlsVerdict runs a TLS handshake on conn and returns the server's verdict
// on this client: with TLS 1.3 a refused client certificate is told only
// after the handshake, so it asks for /version and reads the answer's
// first line.
func tlsVerdict(ctx context.Context, conn net.Conn, cfg *tls.Config, host string) error {
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		return err
	}
	fmt.Fprintf(tc, "GET /version HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
	_, err := bufio.NewReader(tc).ReadString('\n')
	return err
}

// Leaderless says, when etcd at endpoint answers but sees no leader (cut
// off from a majority, or its cluster lost its quorum: it serves no read
// or write), so; "" otherwise.
func Leaderless(ctx context.Context, endpoint string, o ClientOptions) string {
	o.Endpoints = []string{endpoint}
	cli, err := NewClient(o)
	if err != nil {
		return ""
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, endpoint)
	if err != nil || st.Leader != 0 {
		return ""
	}
	return fmt.Sprintf("etcd at %s answers but sees no leader: it is cut off from a majority of its cluster's members, or the cluster lost its quorum; nothing is read or written through it, and its shardd runs nothing, until it reaches a majority again", endpoint)
}
