package runner

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// HTTP calls a hook. Build it with NewHTTP, which prepares its client.
type HTTP struct {
	URL    string
	Method string
	// Headers are sent with ${VAR} expanded from the environment, so that
	// secrets stay out of the job file.
	Headers map[string]string
	// Body is sent as is; empty sends the context as JSON.
	Body string
	// SuccessCodes accepted; empty accepts any 2xx.
	SuccessCodes []int
	// More (streaming dataflow) reads a successful answer as JSON: {"more":
	// true} says the hook processed data and more may remain (Result.More).
	More bool
	// FollowRedirects follows redirects to the URL's origin (see checkRedirect).
	FollowRedirects bool
	// Timeout bounds the whole call; the connection alone gets ConnectTimeout.
	Timeout, ConnectTimeout time.Duration
	TailBytes               int

	conn *httpConn
}

// TLSFiles configure an HTTP hook's TLS: a CA bundle to verify the server,
// and a client certificate and key.
type TLSFiles struct {
	CA, Cert, Key string
}

// NewHTTP returns h ready to run, with its TLS files loaded. Run loads
// them again when they change (a rotated client certificate), and Close
// releases the connections.
func NewHTTP(h HTTP, tlsFiles TLSFiles) (*HTTP, error) {
	if h.ConnectTimeout == 0 {
		h.ConnectTimeout = 5 * time.Second
	}
	if h.TailBytes == 0 {
		h.TailBytes = 4096
	}
	h.conn = &httpConn{files: tlsFiles}
	if _, err := h.clientNow(); err != nil {
		return nil, err
	}
	return &h, nil
}

// httpConn is an HTTP hook's client, rebuilt when its TLS files change.
type httpConn struct {
	files  TLSFiles
	mu     sync.Mutex
	stamp  string // the files' names, sizes and times, as loaded
	tr     *http.Transport
	client *http.Client
}

// clientNow returns the hook's client, rebuilt first if a TLS file
// changed since it was loaded; the old one's connections are closed.
func (h *HTTP) clientNow() (*http.Client, error) {
	c := h.conn
	stamp := filesStamp(c.files)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client != nil && stamp == c.stamp {
		return c.client, nil
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = (&net.Dialer{Timeout: h.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext
	tr.TLSHandshakeTimeout = h.ConnectTimeout
	if c.files != (TLSFiles{}) {
		cfg, err := loadTLS(c.files)
		if err != nil {
			return nil, err
		}
		tr.TLSClientConfig = cfg
	}
	if c.tr != nil {
		c.tr.CloseIdleConnections()
	}
	c.tr, c.stamp = tr, stamp
	c.client = &http.Client{Transport: tr, Timeout: h.Timeout, CheckRedirect: h.checkRedirect}
	return c.client, nil
}

// Close closes the hook's idle connections; a replaced definition's hook
// is closed so that its connections do not pile up.
func (h *HTTP) Close() {
	h.conn.mu.Lock()
	defer h.conn.mu.Unlock()
	if h.conn.tr != nil {
		h.conn.tr.CloseIdleConnections()
	}
}

func filesStamp(f TLSFiles) string {
	var b strings.Builder
	for _, p := range []string{f.CA, f.Cert, f.Key} {
		if p == "" {
			continue
		}
		fi, err := os.Stat(p)
		if err != nil {
			fmt.Fprintf(&b, "%s:missing;", p)
			continue
		}
		fmt.Fprintf(&b, "%s:%d:%d;", p, fi.Size(), fi.ModTime().UnixNano())
	}
	return b.String()
}

func loadTLS(f TLSFiles) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CA != "" {
		pem, err := os.ReadFile(f.CA)
		if err != nil {
			return nil, fmt.Errorf("http tls ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("http tls ca %s: no PEM certificates", f.CA)
		}
	}
	if f.Cert != "" || f.Key != "" {
		cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
		if err != nil {
			return nil, fmt.Errorf("http tls client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// maxAnswer is how much of a hook's answer is read.
const maxAnswer = 1 << 20

// checkRedirect follows a redirect only with FollowRedirects, and only to
// the origin (scheme, host and port) of the hook's URL: the job's headers
// (secrets among them) and body never go anywhere else. 307 and 308 keep
// the method and body; 301, 302 and 303 turn into a GET, as in browsers.
// Without FollowRedirects the 3xx answer is the result: a failure, unless
// successCodes lists it.
func (h *HTTP) checkRedirect(req *http.Request, via []*http.Request) error {
	if !h.FollowRedirects {
		return http.ErrUseLastResponse
	}
	if len(via) >= 10 {
		return errors.New("stopped after 10 redirects")
	}
	if from := via[0].URL; origin(req.URL) != origin(from) {
		return fmt.Errorf("%w: %s is another origin than %s, and the job's headers and body go only there", errRedirectRefused, cut(req.URL.Redacted(), 256), origin(from))
	}
	return nil
}

// errRedirectRefused is the error of a redirect to another origin.
var errRedirectRefused = errors.New("redirect refused")

// origin is scheme://host:port of u, with the scheme's default port.
func origin(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	return u.Scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

// Run calls the hook once for c. Network errors and 5xx answers are
// retryable; other statuses outside SuccessCodes are final failures.
func (h *HTTP) Run(ctx context.Context, c Context) (res Result) {
	res = Result{Start: time.Now(), ExitCode: -1}
	defer func() { res.End = time.Now() }()
	if ctx.Err() != nil { // never start work that is no longer wanted
		res.Err = fmt.Errorf("%w before it started: %v", ErrKilled, context.Cause(ctx))
		return res
	}
	req, secret, err := h.request(ctx, c)
	if err != nil {
		res.Err = err
		return res
	}
	defer func() { res = boundErr(redact(res, secret)) }()
	client, err := h.clientNow()
	if err != nil {
		res.Err = err
		return res
	}
	res.Prepared = time.Now()
	if err := release(ctx, c); err != nil { // prepared ahead: sent at its time, if still wanted
		res.Err = fmt.Errorf("%w before it started: %v", ErrKilled, err)
		return res
	}
	res.Started = time.Now()
	if !c.StartAt.IsZero() {
		res.Start = res.Started // prepared ahead: the run starts when it is let go, not before its fire
	}
	resp, err := client.Do(req)
	if err != nil {
		res.Err = err
		// a refused redirect is the job's policy, not a passing failure
		res.Retryable = ctx.Err() == nil && !errors.Is(err, errRedirectRefused)
		if ctx.Err() != nil {
			res.Err = fmt.Errorf("%w: %v", ErrKilled, err)
		}
		return res
	}
	defer resp.Body.Close()
	return h.answer(ctx, c, resp, secret, res)
}

// request is the hook's request for c, and the redactor of the values of
// its headers' ${VAR}s: they are never recorded.
func (h *HTTP) request(ctx context.Context, c Context) (*http.Request, *redactor, error) {
	body := []byte(h.Body)
	if h.Body == "" {
		body = c.JSON()
	}
	req, err := http.NewRequestWithContext(ctx, h.Method, h.URL, bytes.NewReader(body))
	if err != nil {
		return nil, nil, fmt.Errorf("request: %w", err)
	}
	if h.Body == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("User-Agent", "shardd")
	req.Header.Set("shardingContext", c.elasticJobContext()) // for hooks migrated from ElasticJob
	var secrets []string                                     // the values of the ${VAR}s: never recorded
	for k, v := range h.Headers {
		val, missing := ExpandEnv(v)
		if len(missing) > 0 {
			return nil, nil, fmt.Errorf("header %s: ${%s} is not set in shardd's environment on this host; not sending an empty value", k, missing[0])
		}
		os.Expand(v, func(name string) string {
			secrets = append(secrets, os.Getenv(name))
			return ""
		})
		req.Header.Set(k, val)
	}
	return req, newRedactor(secrets), nil
}

// bodyStart is the start of a refused answer's body for its error: ": "
// and its first 200 characters on one line, "" for an empty body.
func bodyStart(text string) string {
	text = strings.Join(strings.Fields(strings.ToValidUTF8(text, "\uFFFD")), " ")
	if text == "" {
		return ""
	}
	if r := []rune(text); len(r) > 200 {
		text = string(r[:197]) + "..."
	}
	return ": " + text
}

// answer completes res from the hook's answer resp: its status, and the
// tail of its body with the secrets taken out.
func (h *HTTP) answer(ctx context.Context, c Context, resp *http.Response, secret *redactor, res Result) Result {
	text, rerr := readAnswer(resp.Body, secret)
	if c.Output != nil {
		c.Output.Stdout().Write([]byte(text))
	}
	out := &tail{max: h.TailBytes}
	out.Write([]byte(text))
	res.Output = out.String()
	res.HTTPStatus = resp.StatusCode
	if rerr != nil {
		res.Err = fmt.Errorf("%s %s: status %d, reading the answer: %w", h.Method, h.URL, resp.StatusCode, rerr)
		res.Retryable = ctx.Err() == nil
		if ctx.Err() != nil {
			res.Err = fmt.Errorf("%w: %v", ErrKilled, res.Err)
		}
		return res
	}
	ok := resp.StatusCode >= 200 && resp.StatusCode < 300
	if len(h.SuccessCodes) > 0 {
		ok = slices.Contains(h.SuccessCodes, resp.StatusCode)
	}
	if !ok {
		res.Err = fmt.Errorf("%s %s: status %d%s", h.Method, h.URL, resp.StatusCode, bodyStart(text))
		if loc := resp.Header.Get("Location"); resp.StatusCode/100 == 3 && loc != "" {
			res.Err = fmt.Errorf("%w, a redirect to %s (not followed: set followRedirects: true to follow redirects to the same origin)", res.Err, cut(loc, 256))
		}
		res.Retryable = resp.StatusCode >= 500
		return res
	}
	res.OK = true
	if h.More {
		var answer struct {
			More bool `json:"more"`
		}
		if json.Unmarshal([]byte(text), &answer) == nil {
			res.More = answer.More
		}
	}
	return res
}

// readAnswer reads the answer's first MiB, with the secrets taken out of
// the whole before its tail is kept (a secret cut in two by the tail's
// start would escape redaction).
func readAnswer(body io.Reader, secret *redactor) (string, error) {
	var answer bytes.Buffer
	n, err := io.Copy(&answer, io.LimitReader(body, maxAnswer))
	text := answer.String()
	if n == maxAnswer || err != nil { // cut: a secret may start in the last bytes read
		return secret.Cut(text), err
	}
	return secret.String(text), err
}

// ExpandEnv expands ${VAR} and $VAR in s from the environment, as
// os.ExpandEnv does, and also returns the variables that are not set.
func ExpandEnv(s string) (string, []string) {
	var missing []string
	out := os.Expand(s, func(name string) string {
		v, ok := os.LookupEnv(name)
		if !ok {
			missing = append(missing, name)
		}
		return v
	})
	return out, missing
}

// redact replaces every secret in the recorded parts of res (output and
// error, which reach the log, the history and the API) with "[redacted]":
// a hook that echoes its request, or an error that quotes it, must not
// publish a header's ${VAR} value (see redact.go).
func redact(res Result, secret *redactor) Result {
	res.Output = secret.String(res.Output)
	if res.Err != nil {
		if msg := secret.String(res.Err.Error()); msg != res.Err.Error() {
			res.Err = &redactedError{msg: msg, err: res.Err}
		}
	}
	return res
}

// maxErr bounds the message of a run's error: it reaches the log, the
// history in etcd (whose requests are limited in size) and the run log,
// and a hook's server chooses part of it (a Location, a URL).
const maxErr = 4 << 10

// boundErr cuts res.Err's message to maxErr bytes.
func boundErr(res Result) Result {
	if res.Err != nil && len(res.Err.Error()) > maxErr {
		res.Err = &redactedError{msg: cut(res.Err.Error(), maxErr), err: res.Err}
	}
	return res
}

// cut returns s cut to at most n bytes (on a UTF-8 boundary), marked.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "...[cut]"
	s = s[:n-len(mark)]
	for i := 0; i < utf8.UTFMax-1 && s != ""; i++ { // not in the middle of a rune
		if r, size := utf8.DecodeLastRuneInString(s); r != utf8.RuneError || size != 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s + mark
}

// redactedError is an error whose message had secrets taken out, or was
// cut; it still
// unwraps to the original for errors.Is (ErrKilled, ...).
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
