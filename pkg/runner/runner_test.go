package runner

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"
)

var ctxFixture = Context{
	Job: "orders", Item: 2, ItemParameter: "Guangzhou", Total: 3, JobParameter: "full",
	Fire: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), Fence: 4711, Attempt: 1, Instance: "host-a", Source: "NORMAL",
}

func TestScriptGetsContextAsEnv(t *testing.T) {
	res := Script{Argv: []string{"/bin/sh", "-c", `env | grep '^SHARDD_' | sort`}}.Run(context.Background(), ctxFixture)
	if !res.OK {
		t.Fatalf("run failed: %v\n%s", res.Err, res.Output)
	}
	for _, want := range []string{
		"SHARDD_JOB=orders", "SHARDD_ITEM=2", "SHARDD_ITEM_PARAMETER=Guangzhou", "SHARDD_TOTAL=3",
		"SHARDD_JOB_PARAMETER=full", "SHARDD_FIRE_TIME=2026-01-02T03:04:05Z", "SHARDD_FENCE=4711",
		"SHARDD_ATTEMPT=1", "SHARDD_INSTANCE=host-a", "SHARDD_SOURCE=NORMAL",
	} {
		if !strings.Contains(res.Output, want+"\n") {
			t.Errorf("output lacks %s:\n%s", want, res.Output)
		}
	}
	var got Context
	for _, line := range strings.Split(res.Output, "\n") {
		if v, ok := strings.CutPrefix(line, "SHARDD_CONTEXT="); ok {
			if err := json.Unmarshal([]byte(v), &got); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !reflect.DeepEqual(got, ctxFixture) {
		t.Errorf("SHARDD_CONTEXT = %+v, want %+v", got, ctxFixture)
	}
}

// A hostile item parameter is data: it reaches the script verbatim and runs nothing.
func TestItemParameterIsNeverCode(t *testing.T) {
	dir := t.TempDir()
	pwned := filepath.Join(dir, "pwned")
	param := "$(touch " + pwned + "); rm -rf ~ `touch " + pwned + "`"
	c := ctxFixture
	c.ItemParameter = param
	for name, s := range map[string]Script{
		"argv":  {Argv: []string{"/usr/bin/printenv", "SHARDD_ITEM_PARAMETER"}},
		"shell": {Shell: `echo "$SHARDD_ITEM_PARAMETER"; echo $SHARDD_ITEM_PARAMETER`},
	} {
		res := s.Run(context.Background(), c)
		if !res.OK {
			t.Fatalf("%s: %v", name, res.Err)
		}
		if !strings.HasPrefix(res.Output, param+"\n") {
			t.Errorf("%s: parameter arrived as %q, want %q", name, res.Output, param)
		}
		if _, err := os.Stat(pwned); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: the parameter ran a command", name)
		}
	}
}

func TestScriptExitCodeAndContextArg(t *testing.T) {
	res := Script{Shell: "echo out; echo err >&2; exit 3"}.Run(context.Background(), ctxFixture)
	if res.End.Before(res.Start) || res.Duration() <= 0 {
		t.Errorf("start %s end %s", res.Start, res.End)
	}
	// stdout and stderr are separate pipes: their lines may interleave
	// either way in the tail
	if res.OK || res.ExitCode != 3 || !res.Retryable || (res.Output != "out\nerr\n" && res.Output != "err\nout\n") {
		t.Errorf("exit 3: %+v", res)
	}
	res = Script{Argv: []string{"/bin/sh", "-c", `echo "$1"`, "sh"}, ContextArg: true}.Run(context.Background(), ctxFixture)
	var ej map[string]any
	if err := json.Unmarshal([]byte(res.Output), &ej); err != nil || ej["shardingItem"] != 2.0 || ej["shardingParameter"] != "Guangzhou" || ej["jobName"] != "orders" {
		t.Errorf("ElasticJob context argument: %q (%v)", res.Output, err)
	}
	res = Script{Argv: []string{"/nonexistent/program"}}.Run(context.Background(), ctxFixture)
	if res.OK || res.Err == nil || !strings.Contains(res.Err.Error(), "start /nonexistent/program") {
		t.Errorf("missing program: %+v", res)
	}
}

// alive reports whether pid runs; a zombie (dead, not yet reaped by an init
// that may never reap it in a container) counts as dead. The kill may take a
// moment to land, so it is given one.
func alive(pid int) bool {
	for i := 0; i < 50; i++ {
		if syscall.Kill(pid, 0) != nil {
			return false
		}
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return false
		}
		if f := strings.Fields(string(stat)); len(f) > 2 && f[2] == "Z" {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// grandchild starts a script that leaves a background process and reports its pid.
func grandchildScript(dir, trap string) Script {
	return Script{Shell: trap + `sleep 60 & echo $! > ` + filepath.Join(dir, "pid") + `; wait`, Grace: 300 * time.Millisecond}
}

func readPID(t *testing.T, dir string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

func TestTimeoutKillsTheWholeGroup(t *testing.T) {
	for _, trap := range []string{"", "trap '' TERM; "} { // the second ignores SIGTERM: SIGKILL after the grace
		dir := t.TempDir()
		s := grandchildScript(dir, trap)
		s.Timeout = 300 * time.Millisecond
		res := s.Run(context.Background(), ctxFixture)
		if res.OK || !errors.Is(res.Err, ErrTimeout) {
			t.Fatalf("trap %q: result %+v, want a timeout", trap, res)
		}
		if pid := readPID(t, dir); alive(pid) {
			t.Errorf("trap %q: grandchild %d survived the timeout", trap, pid)
		}
		if d := res.Duration(); d > 3*time.Second {
			t.Errorf("trap %q: the run took %s", trap, d)
		}
	}
}

func TestCancelKillsAtOnce(t *testing.T) {
	dir := t.TempDir()
	s := grandchildScript(dir, "trap '' TERM; ")
	ctx, cancel := context.WithCancelCause(context.Background())
	done := make(chan Result)
	go func() { done <- s.Run(ctx, ctxFixture) }()
	deadline := time.Now().Add(5 * time.Second)
	for _, err := os.Stat(filepath.Join(dir, "pid")); err != nil; _, err = os.Stat(filepath.Join(dir, "pid")) {
		if time.Now().After(deadline) {
			t.Fatal("script did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel(errors.New("session fenced"))
	res := <-done
	if !errors.Is(res.Err, ErrKilled) || res.Retryable || !strings.Contains(res.Err.Error(), "session fenced") {
		t.Errorf("result %+v, want killed and not retryable", res)
	}
	if pid := readPID(t, dir); alive(pid) {
		t.Errorf("grandchild %d survived the cancel", pid)
	}
}

func TestLeftoverProcessesDieWithTheScript(t *testing.T) {
	dir := t.TempDir()
	res := Script{Shell: `sleep 60 & echo $! > ` + filepath.Join(dir, "pid")}.Run(context.Background(), ctxFixture)
	if !res.OK {
		t.Fatal(res.Err)
	}
	if pid := readPID(t, dir); alive(pid) {
		t.Errorf("background process %d outlived the item", pid)
	}
}

func TestOutputTailIsCapped(t *testing.T) {
	res := Script{Shell: `i=0; while [ $i -lt 500 ]; do echo "line $i"; i=$((i+1)); done`, TailBytes: 64}.Run(context.Background(), ctxFixture)
	if !res.OK {
		t.Fatal(res.Err)
	}
	if len(res.Output) > 64+3 || !strings.HasPrefix(res.Output, "...") || !strings.HasSuffix(res.Output, "line 499\n") {
		t.Errorf("tail = %q", res.Output)
	}
}

func TestHTTPHook(t *testing.T) {
	t.Setenv("HOOK_TOKEN", "s3cret")
	var mu sync.Mutex // a timed-out call's handler may still run
	var gotAuth, gotSharding string
	var gotBody Context
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		gotAuth, gotSharding = r.Header.Get("Authorization"), r.Header.Get("shardingContext")
		json.Unmarshal(b, &gotBody)
		mu.Unlock()
		switch r.URL.Path {
		case "/ok":
			w.Write([]byte("done"))
		case "/accepted":
			w.WriteHeader(http.StatusAccepted)
		case "/missing":
			http.NotFound(w, r)
		case "/broken":
			http.Error(w, "boom", http.StatusBadGateway)
		case "/slow":
			time.Sleep(2 * time.Second)
		case "/echo":
			http.Error(w, "you sent "+r.Header.Get("Authorization"), http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	hook := func(path string, codes ...int) *HTTP {
		h, err := NewHTTP(HTTP{URL: srv.URL + path, Method: "POST", Headers: map[string]string{"Authorization": "Bearer ${HOOK_TOKEN}"}, SuccessCodes: codes, Timeout: 500 * time.Millisecond}, TLSFiles{})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}

	res := hook("/ok").Run(context.Background(), ctxFixture)
	if !res.OK || res.HTTPStatus != 200 || res.Output != "done" {
		t.Fatalf("ok: %+v", res)
	}
	mu.Lock()
	if gotAuth != "Bearer s3cret" || !reflect.DeepEqual(gotBody, ctxFixture) || !strings.Contains(gotSharding, `"shardingItem":2`) {
		t.Errorf("request: auth %q, body %+v, shardingContext %q", gotAuth, gotBody, gotSharding)
	}
	mu.Unlock()
	if res := hook("/accepted", 200).Run(context.Background(), ctxFixture); res.OK || res.Retryable {
		t.Errorf("202 outside successCodes [200]: %+v", res)
	}
	if res := hook("/missing").Run(context.Background(), ctxFixture); res.OK || res.Retryable || res.HTTPStatus != 404 {
		t.Errorf("404: %+v", res)
	}
	if res := hook("/broken").Run(context.Background(), ctxFixture); res.OK || !res.Retryable || res.HTTPStatus != 502 || !strings.HasSuffix(res.Err.Error(), ": status 502: boom") {
		t.Errorf("502 must be retryable, its error ending with the status and the body's start: %+v", res)
	}
	if res := hook("/slow").Run(context.Background(), ctxFixture); res.OK || !res.Retryable || res.Duration() > 1500*time.Millisecond {
		t.Errorf("timeout: %+v", res)
	}
	// A hook that echoes its request: the ${VAR} secret is not recorded.
	if res := hook("/echo").Run(context.Background(), ctxFixture); res.OK || strings.Contains(res.Output, "s3cret") || !strings.Contains(res.Output, "you sent Bearer [redacted]") ||
		strings.Contains(res.Err.Error(), "s3cret") || !strings.HasSuffix(res.Err.Error(), "status 500: you sent Bearer [redacted]") {
		t.Errorf("echoed secret: output %q, error %v", res.Output, res.Err)
	}
	h, _ := NewHTTP(HTTP{URL: "http://127.0.0.1:1/", Method: "POST", Timeout: time.Second}, TLSFiles{})
	if res := h.Run(context.Background(), ctxFixture); res.OK || !res.Retryable {
		t.Errorf("connection refused must be retryable: %+v", res)
	}

	// A header naming a variable this host does not have: no request with
	// an empty secret, a failed run that says why.
	mu.Lock()
	gotAuth = "not called"
	mu.Unlock()
	h, _ = NewHTTP(HTTP{URL: srv.URL + "/ok", Method: "POST", Headers: map[string]string{"Authorization": "Bearer ${SHARDD_TEST_NO_SUCH_VAR}"}, Timeout: time.Second}, TLSFiles{})
	res = h.Run(context.Background(), ctxFixture)
	mu.Lock()
	defer mu.Unlock()
	if res.OK || res.Retryable || !strings.Contains(fmt.Sprint(res.Err), "${SHARDD_TEST_NO_SUCH_VAR} is not set") || gotAuth != "not called" {
		t.Errorf("unset header variable: %+v, server saw %q", res, gotAuth)
	}
}

// A server chooses part of a hook's error (a Location, a URL): the error
// that reaches the history in etcd, the log and the run log is bounded.
func TestHTTPHookErrorIsBounded(t *testing.T) {
	huge := "/" + strings.Repeat("a", 1<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", huge)
		w.WriteHeader(http.StatusFound)
	}))
	defer srv.Close()
	for _, follow := range []bool{false, true} {
		h, _ := NewHTTP(HTTP{URL: srv.URL, Method: "POST", FollowRedirects: follow, Timeout: 5 * time.Second}, TLSFiles{})
		res := h.Run(context.Background(), ctxFixture)
		if res.OK || res.Err == nil || len(res.Err.Error()) > maxErr {
			t.Errorf("followRedirects %v: error of %d bytes (OK %v)", follow, len(fmt.Sprint(res.Err)), res.OK)
		}
	}
}

// An answer that breaks off in the middle of a secret it echoes does not
// leak the secret's start.
func TestHTTPHookRedactsAnAnswerCutByAReadError(t *testing.T) {
	const secret = "s3cr3t-token-value-123456"
	t.Setenv("HOOK_KEY", secret)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		echo := "you sent: " + r.Header.Get("Authorization")
		w.Header().Set("Content-Length", strconv.Itoa(len(echo)+100))
		w.WriteHeader(200)
		w.Write([]byte(echo[:len(echo)-1]))
		w.(http.Flusher).Flush()
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}))
	defer srv.Close()
	h, _ := NewHTTP(HTTP{URL: srv.URL, Method: "POST", Headers: map[string]string{"Authorization": "Bearer ${HOOK_KEY}"}, Timeout: 5 * time.Second}, TLSFiles{})
	sink := &memSink{}
	c := ctxFixture
	c.Output = sink
	res := h.Run(context.Background(), c)
	if res.Err == nil {
		t.Fatalf("a broken answer succeeded: %+v", res)
	}
	for _, got := range []string{res.Output, sink.out.String(), res.Err.Error()} {
		if strings.Contains(got, secret[:8]) {
			t.Errorf("the secret's start leaked: %q", got)
		}
	}
}

func TestHTTPHookTLS(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)

	untrusted, _ := NewHTTP(HTTP{URL: srv.URL, Method: "GET", Timeout: time.Second}, TLSFiles{})
	if res := untrusted.Run(context.Background(), ctxFixture); res.OK {
		t.Error("a server with an unknown CA was trusted")
	}
	trusted, err := NewHTTP(HTTP{URL: srv.URL, Method: "GET", Timeout: time.Second}, TLSFiles{CA: ca})
	if err != nil {
		t.Fatal(err)
	}
	if res := trusted.Run(context.Background(), ctxFixture); !res.OK {
		t.Errorf("with the CA: %+v", res)
	}
	if _, err := NewHTTP(HTTP{URL: srv.URL}, TLSFiles{CA: "/nonexistent"}); err == nil {
		t.Error("a missing CA file was accepted")
	}

	// The CA file replaced (rotation): the next run uses the new one.
	other := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	other.TLS = &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}} // not httptest's shared one
	other.StartTLS()
	defer other.Close()
	toOther, _ := NewHTTP(HTTP{URL: other.URL, Method: "GET", Timeout: time.Second}, TLSFiles{CA: ca})
	if res := toOther.Run(context.Background(), ctxFixture); res.OK {
		t.Fatal("a server the CA file does not name was trusted")
	}
	rotated := filepath.Join(filepath.Dir(ca), "rotated.pem")
	os.WriteFile(rotated, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: other.Certificate().Raw}), 0o600)
	os.Rename(rotated, ca)
	if res := toOther.Run(context.Background(), ctxFixture); !res.OK {
		t.Errorf("after the CA file was replaced: %+v", res.Err)
	}
	os.Remove(ca)
	if res := toOther.Run(context.Background(), ctxFixture); res.OK || !strings.Contains(fmt.Sprint(res.Err), "http tls ca") || !res.Started.IsZero() {
		t.Errorf("after the CA file was removed: %+v", res)
	}
	toOther.Close()
}

// Redirects are not followed by default; with followRedirects, only to
// the same origin, with the method, body and headers kept on 307/308.
func TestHTTPHookRedirects(t *testing.T) {
	t.Setenv("HOOK_KEY", "secret-key-value")
	var mu sync.Mutex
	var seen []string
	record := func(who string, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s %s %s key=%s body=%d", who, r.Method, r.URL.Path, r.Header.Get("X-Api-Key"), len(b)))
		mu.Unlock()
	}
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { record("other", r) }))
	defer other.Close()
	otherOrigin := strings.Replace(other.URL, "127.0.0.1", "localhost", 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		record("origin", r)
		switch r.URL.Path {
		case "/elsewhere":
			http.Redirect(w, r, otherOrigin+"/stolen", http.StatusTemporaryRedirect)
		case "/302":
			http.Redirect(w, r, "/landed", http.StatusFound)
		case "/307":
			http.Redirect(w, r, "/landed", http.StatusTemporaryRedirect)
		}
	}))
	defer srv.Close()
	run := func(path string, follow bool, codes ...int) Result {
		mu.Lock()
		seen = nil
		mu.Unlock()
		h, err := NewHTTP(HTTP{URL: srv.URL + path, Method: "POST", Headers: map[string]string{"X-Api-Key": "${HOOK_KEY}"},
			SuccessCodes: codes, FollowRedirects: follow, Timeout: 5 * time.Second}, TLSFiles{})
		if err != nil {
			t.Fatal(err)
		}
		return h.Run(context.Background(), ctxFixture)
	}
	calls := func() string { mu.Lock(); defer mu.Unlock(); return strings.Join(seen, "; ") }

	if res := run("/302", false); res.OK || res.HTTPStatus != 302 || !strings.Contains(fmt.Sprint(res.Err), "not followed") || strings.Contains(calls(), "landed") {
		t.Errorf("302 by default: %+v, calls %s", res, calls())
	}
	if res := run("/302", false, 302); !res.OK {
		t.Errorf("302 in successCodes: %+v", res)
	}
	if res := run("/307", true); !res.OK || !strings.Contains(calls(), "origin POST /landed key=secret-key-value body=") || strings.Contains(calls(), "body=0") {
		t.Errorf("307 followed: %+v, calls %s", res, calls())
	}
	res := run("/elsewhere", true)
	if res.OK || res.Retryable || strings.Contains(calls(), "other") || !strings.Contains(fmt.Sprint(res.Err), "another origin") {
		t.Errorf("redirect to another origin (a refusal: final, not retried): %+v, calls %s", res, calls())
	}
	if res := run("/elsewhere", false); res.OK || strings.Contains(calls(), "other") {
		t.Errorf("redirect elsewhere, not following: %+v, calls %s", res, calls())
	}
}

// An answer whose body stalls past the timeout is a failure, retryable.
func TestHTTPHookStalledBody(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.Write([]byte("partial"))
		w.(http.Flusher).Flush()
		<-release
	}))
	defer srv.Close()
	defer close(release)
	h, _ := NewHTTP(HTTP{URL: srv.URL, Method: "POST", Timeout: 300 * time.Millisecond}, TLSFiles{})
	res := h.Run(context.Background(), ctxFixture)
	if res.OK || !res.Retryable || !strings.Contains(fmt.Sprint(res.Err), "reading the answer") || res.Output != "partial" {
		t.Errorf("stalled body: %+v", res)
	}
}

// A secret the output tail would cut in two is redacted before the cut.
func TestHTTPHookRedactsBeforeTheTail(t *testing.T) {
	const secret = "SECRETVALUE_0123456789"
	t.Setenv("HOOK_KEY", secret)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(r.Header.Get("X-Api-Key") + strings.Repeat("x", 4080)))
	}))
	defer srv.Close()
	h, _ := NewHTTP(HTTP{URL: srv.URL, Method: "POST", Headers: map[string]string{"X-Api-Key": "${HOOK_KEY}"}, Timeout: 5 * time.Second}, TLSFiles{})
	sink := &memSink{}
	c := ctxFixture
	c.Output = sink
	res := h.Run(context.Background(), c)
	for i := 4; i <= len(secret); i++ {
		if strings.Contains(res.Output, secret[len(secret)-i:]) {
			t.Fatalf("the output keeps %q of the secret: %q", secret[len(secret)-i:], res.Output[:40])
		}
	}
	// The run log has the whole answer, redacted too.
	if got := sink.out.String(); got != "[redacted]"+strings.Repeat("x", 4080) {
		t.Errorf("answer in the sink: %.40q (%d bytes)", got, len(got))
	}
}

type countWriter struct{ n atomic.Int64 }

func (w *countWriter) Write(p []byte) (int, error) { w.n.Add(int64(len(p))); return len(p), nil }

// peakHeap runs f and returns the most heap in use meanwhile, above what
// was in use before.
func peakHeap(f func()) uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peak atomic.Uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > base && ms.HeapInuse-base > peak.Load() {
				peak.Store(ms.HeapInuse - base)
			}
			select {
			case <-stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	f()
	close(stop)
	<-done
	return peak.Load()
}

// Whatever a script prints, a run holds a bounded amount of it in memory
// and logs a bounded amount: one 20 MB line without a newline, or 20 MB of
// short lines.
func TestScriptOutputIsBounded(t *testing.T) {
	for _, tt := range []struct {
		name, shell string
		maxLogged   int64
	}{
		{"one 20 MB line", "head -c 20000000 /dev/zero | tr '\\0' a", 2 * maxLogLine},
		{"20 MB of lines", "yes aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa | head -c 20000000", 300 << 10},
	} {
		logged := &countWriter{}
		var res Result
		peak := peakHeap(func() {
			res = Script{Shell: tt.shell, Log: slog.New(slog.NewTextHandler(logged, nil))}.Run(context.Background(), ctxFixture)
		})
		t.Logf("%s: ok=%v, output tail %d bytes, heap +%d KiB, logged %d KiB", tt.name, res.OK, len(res.Output), peak>>10, logged.n.Load()>>10)
		if !res.OK || len(res.Output) > 4100 {
			t.Errorf("%s: %+v", tt.name, res.Err)
		}
		if peak > 16<<20 { // was 191 MiB for 50 MB
			t.Errorf("%s: heap grew by %d MiB while it ran", tt.name, peak>>20)
		}
		if got := logged.n.Load(); got > tt.maxLogged {
			t.Errorf("%s: logged %d bytes, want at most %d", tt.name, got, tt.maxLogged)
		}
	}
}

// Output is passed on in environment variables (onFailure's SHARDD_OUTPUT):
// a NUL byte in it must not stop the command.
func TestOutputWithNulIsPassedOn(t *testing.T) {
	res := Script{Shell: `printf 'a\000b\377c\n'; exit 3`}.Run(context.Background(), ctxFixture)
	if strings.ContainsRune(res.Output, 0) || !utf8.ValidString(res.Output) || !strings.Contains(res.Output, "a\uFFFDb") {
		t.Fatalf("output %q: want valid UTF-8 without NUL", res.Output)
	}
	next := Script{Shell: `printf %s "$SHARDD_OUTPUT"`, Env: map[string]string{"SHARDD_OUTPUT": "x\x00y"}}.Run(context.Background(), ctxFixture)
	if !next.OK || next.Output != "x\uFFFDy" {
		t.Errorf("a command with a NUL in its environment: %+v %q", next.Err, next.Output)
	}
}

// A parameter too big for an environment variable fails the run with a
// message that says so (validate refuses it in the first place).
func TestOversizedEnvironment(t *testing.T) {
	c := ctxFixture
	c.JobParameter = strings.Repeat("x", 140000)
	res := Script{Shell: "echo ok"}.Run(context.Background(), c)
	if res.OK || !strings.Contains(fmt.Sprint(res.Err), "SHARDD_JOB_PARAMETER is 140021 bytes") {
		t.Errorf("oversized parameter: %+v", res.Err)
	}
}

// A process that leaves the script's group (setsid) dies with the run, as
// does its own child, and none is left a zombie.
func TestNoWorkOutlivesItsRun(t *testing.T) {
	if err := BecomeSubreaper(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	pids := filepath.Join(dir, "pids")
	s := Script{Shell: "setsid sh -c 'echo $$ >> " + pids + "; sleep 300 & echo $! >> " + pids + "; wait' & sleep 0.3; echo parent done"}
	res := s.Run(context.Background(), ctxFixture)
	if !res.OK {
		t.Fatalf("run: %+v", res.Err)
	}
	b, _ := os.ReadFile(pids)
	fields := strings.Fields(string(b))
	if len(fields) != 2 {
		t.Fatalf("pids %q", b)
	}
	for _, f := range fields {
		pid, _ := strconv.Atoi(f)
		if err := syscall.Kill(pid, 0); err == nil || !errors.Is(err, syscall.ESRCH) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("pid %d outlived its run (kill 0: %v)", pid, err)
		}
	}
	for _, pid := range children() {
		if zombie(pid) {
			t.Errorf("zombie child %d", pid)
		}
	}
}

// Reap reaps orphans that exit while their run goes on, and kills those
// of runs that are over.
func TestReap(t *testing.T) {
	if err := BecomeSubreaper(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Reap(ctx, 20*time.Millisecond, nil)
	dir := t.TempDir()
	// An orphan exits at once while the run sleeps: no zombie stays.
	res := Script{Shell: "setsid sh -c 'echo $$ > " + dir + "/quick' & sleep 0.5"}.Run(context.Background(), ctxFixture)
	if !res.OK {
		t.Fatal(res.Err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "quick"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid == 0 || zombie(pid) || syscall.Kill(pid, 0) == nil {
		t.Errorf("orphan %d: zombie %v, alive %v", pid, zombie(pid), syscall.Kill(pid, 0) == nil)
	}
	// An orphan whose run cannot be told (no SHARDD_RUN: ssh-agent-like)
	// is left alone while a run is active, since it may be that run's,
	// and killed once none is.
	busy := make(chan Result, 1)
	go func() { busy <- Script{Shell: "sleep 1.5"}.Run(context.Background(), ctxFixture) }()
	time.Sleep(200 * time.Millisecond) // the run is active
	cmd := exec.Command("sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!")
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	var outBuf bytes.Buffer
	cmd.Stdout = &outBuf
	started, err := start(cmd) // shardd's own children go through start
	if err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	started()
	if err != nil {
		t.Fatal(err)
	}
	out := outBuf.Bytes()
	stray, _ := strconv.Atoi(strings.TrimSpace(string(out)))
	time.Sleep(300 * time.Millisecond) // several reap passes
	if syscall.Kill(stray, 0) != nil {
		t.Errorf("an orphan without a run id was killed while a run was active")
	}
	<-busy
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(stray, 0) == nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if syscall.Kill(stray, 0) == nil {
		syscall.Kill(stray, syscall.SIGKILL)
		t.Errorf("stray orphan %d not killed", stray)
	}
}

// selfSigned returns a certificate for 127.0.0.1, signed by itself.
func selfSigned(t *testing.T) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// testCgroups makes a cgroup for this test process to delegate runs under
// (removed at the end), or skips the test where the host offers none.
func testCgroups(t *testing.T, prefix string) (*Cgroups, string) {
	t.Helper()
	mount, err := cgroup2Mount()
	if err != nil {
		t.Skip(err)
	}
	parent := filepath.Join(mount, prefix+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Skip("no cgroup to delegate here:", err)
	}
	t.Cleanup(func() { os.Remove(parent) })
	cg, err := NewCgroups(parent)
	if err != nil {
		t.Skip(err)
	}
	return cg, parent
}

// With a delegated cgroup, a process that leaves the group and clears its
// environment (so that no sweep can find it) still dies with its run.
func TestCgroupConfinesARun(t *testing.T) {
	cg, parent := testCgroups(t, "shardd-test-")
	pidFile := filepath.Join(t.TempDir(), "pid")
	res := Script{Shell: "setsid env -i /bin/sleep 300 & echo $! > " + pidFile + "; sleep 0.2", Cgroups: cg}.Run(context.Background(), ctxFixture)
	if !res.OK {
		t.Fatal(res.Err)
	}
	b, _ := os.ReadFile(pidFile)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid == 0 {
		t.Fatalf("pid file %q", b)
	}
	deadline := time.Now().Add(2 * time.Second)
	for syscall.Kill(pid, 0) == nil && !zombie(pid) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if syscall.Kill(pid, 0) == nil && !zombie(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("pid %d, which left its group and its environment, outlived its run", pid)
	}
	if entries, _ := filepath.Glob(filepath.Join(parent, "run-*")); len(entries) != 0 {
		t.Errorf("run cgroups left: %v", entries)
	}
}

// shardd killed -9 mid-run: the watchdog kills the run's whole cgroup,
// the process that left the group and cleared its environment included.
func TestWatchdogKillsTheRunsCgroup(t *testing.T) {
	cgs, _ := testCgroups(t, "shardd-test-wd-")
	w := startWatchdog(t)
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd := exec.Command("/bin/sh", "-c", "setsid env -i /bin/sleep 300 & echo $! > "+pidFile+"; exec sleep 300")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cg, err := cgs.prepare(cmd, "wd-test")
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cg.kill()
		t.Fatal(err)
	}
	defer func() { // whatever fails below, nothing is left to wait 300 s for
		cg.kill()
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}()
	waitFile(t, pidFile)
	b, _ := os.ReadFile(pidFile)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid == 0 {
		t.Fatalf("pid file %q", b)
	}
	if err := w.Add(registration(t, "wd-test", cmd.Process.Pid, cg.path())); err != nil {
		t.Fatal(err)
	}
	w.Close() // as when shardd dies: the pipe closes
	if syscall.Kill(pid, 0) == nil && !zombie(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("pid %d, which left its process group, outlived shardd's death", pid)
	}
}

// memSink is a Sink in memory.
type memSink struct {
	mu       sync.Mutex
	out, err bytes.Buffer
}

type memStream struct {
	s   *memSink
	buf *bytes.Buffer
}

func (w memStream) Write(p []byte) (int, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.buf.Write(p)
}

func (s *memSink) Stdout() io.Writer { return memStream{s, &s.out} }
func (s *memSink) Stderr() io.Writer { return memStream{s, &s.err} }

func TestWholeOutputReachesTheSinkStreamsApart(t *testing.T) {
	sink := &memSink{}
	c := ctxFixture
	c.Output = sink
	// 200,000 lines on stdout (1.2 MB, far beyond the tail), one on stderr.
	res := Script{Shell: `seq 100000 299999; echo oops >&2`}.Run(context.Background(), c)
	if !res.OK {
		t.Fatalf("run: %+v", res.Err)
	}
	var want bytes.Buffer
	for i := 100000; i <= 299999; i++ {
		fmt.Fprintln(&want, i)
	}
	if !bytes.Equal(sink.out.Bytes(), want.Bytes()) {
		t.Errorf("stdout in the sink: %d bytes, want the whole %d", sink.out.Len(), want.Len())
	}
	if sink.err.String() != "oops\n" {
		t.Errorf("stderr in the sink = %q", sink.err.String())
	}
	if len(res.Output) > 4100 || !strings.HasSuffix(res.Output, "\n") {
		t.Errorf("tail is %d bytes", len(res.Output))
	}
}

func TestRunOfCgroup(t *testing.T) {
	for in, want := range map[string]string{
		"0::/system.slice/shardd.service/run-4242-7\n":                     "4242-7",
		"0::/system.slice/run-u123.service/run-4242-7\n":                   "4242-7",
		"0::/user.slice/app.slice/run-r3f1c.scope/run-4242-7/inner\n":      "4242-7",
		"12:pids:/x\n0::/system.slice/shardd.service/run-probe-99\n":       "",
		"0::/system.slice/run-u123.service\n":                              "",
		"0::/\n":                                                           "",
		"1:name=systemd:/run-1-2\n0::/system.slice/shardd.service/run-5-6": "5-6",
	} {
		if got := runOfCgroup(in); got != want {
			t.Errorf("runOfCgroup(%q) = %q, want %q", in, got, want)
		}
	}
}

// A run prepared ahead starts at its StartAt, not before: the script's
// first instruction comes after it, with the watchdog or without.
func TestScriptStartsAtItsTime(t *testing.T) {
	for _, watched := range []bool{false, true} {
		dir := t.TempDir()
		c := ctxFixture
		c.StartAt = time.Now().Add(300 * time.Millisecond)
		s := Script{Shell: "date +%s%N > " + filepath.Join(dir, "began")}
		if watched {
			s.Watchdog = startWatchdog(t)
			s.Watchdog.SetDeadline(time.Now().Add(time.Hour))
		}
		res := s.Run(context.Background(), c)
		if !res.OK {
			t.Fatalf("watched %v: %+v", watched, res.Err)
		}
		b, _ := os.ReadFile(filepath.Join(dir, "began"))
		ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if began := time.Unix(0, ns); began.Before(c.StartAt) || res.Started.Before(c.StartAt) {
			t.Errorf("watched %v: began %s, Started %s, before StartAt %s", watched, began, res.Started, c.StartAt)
		}
	}
}

// A run prepared ahead and no longer wanted at its time never runs: its
// context ended, or the session's fence deadline passed meanwhile.
func TestScriptPreparedAheadIsNotReleasedWhenUnwanted(t *testing.T) {
	for _, why := range []string{"cancelled", "fenced"} {
		dir := t.TempDir()
		w := startWatchdog(t)
		w.SetDeadline(time.Now().Add(time.Hour))
		c := ctxFixture
		c.StartAt = time.Now().Add(400 * time.Millisecond)
		ctx, cancel := context.WithCancel(context.Background())
		switch why {
		case "cancelled":
			time.AfterFunc(100*time.Millisecond, cancel)
		case "fenced":
			w.SetDeadline(time.Now().Add(200 * time.Millisecond)) // and no newer one
		}
		res := Script{Shell: "touch " + filepath.Join(dir, "ran"), Watchdog: w}.Run(ctx, c)
		cancel()
		if res.OK || !errors.Is(res.Err, ErrKilled) || !res.Started.IsZero() || !strings.Contains(res.Err.Error(), "before it started") {
			t.Errorf("%s: %+v", why, res)
		}
		if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
			t.Errorf("%s: the script ran", why)
		}
	}
}

func TestHTTPHookStartsAtItsTime(t *testing.T) {
	var mu sync.Mutex
	var got time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = time.Now()
		mu.Unlock()
	}))
	defer srv.Close()
	h, _ := NewHTTP(HTTP{URL: srv.URL, Method: "POST", Timeout: 5 * time.Second}, TLSFiles{})
	c := ctxFixture
	c.StartAt = time.Now().Add(200 * time.Millisecond)
	if res := h.Run(context.Background(), c); !res.OK {
		t.Fatal(res.Err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got.Before(c.StartAt) {
		t.Errorf("the hook was called at %s, before StartAt %s", got, c.StartAt)
	}
}

// Release says no at the start time (the engine's session passed its fence
// deadline while shardd was paused): neither a script nor a hook starts.
func TestReleaseRefusedNothingStarts(t *testing.T) {
	fenced := errors.New("fenced")
	c := ctxFixture
	c.StartAt = time.Now().Add(50 * time.Millisecond)
	c.Release = func() error { return fenced }
	dir := t.TempDir()
	for _, watched := range []bool{false, true} {
		s := Script{Shell: "touch " + filepath.Join(dir, "ran")}
		if watched {
			s.Watchdog = startWatchdog(t)
			s.Watchdog.SetDeadline(time.Now().Add(time.Hour))
		}
		res := s.Run(context.Background(), c)
		if res.OK || !errors.Is(res.Err, ErrKilled) || !strings.Contains(res.Err.Error(), "fenced") || !res.Started.IsZero() {
			t.Errorf("script, watched %v: %+v", watched, res)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Error("a script ran")
	}
	called := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { called = true }))
	defer srv.Close()
	h, _ := NewHTTP(HTTP{URL: srv.URL, Method: "POST", Timeout: 5 * time.Second}, TLSFiles{})
	if res := h.Run(context.Background(), c); res.OK || !errors.Is(res.Err, ErrKilled) || called {
		t.Errorf("hook: %+v, called %v", res, called)
	}
}

// Streaming work says "more" by an exit status (a script) or an answer
// {"more": true} (a hook); anything else that succeeds is done, and a
// failure is a failure.
func TestDataflowMore(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/more":
			w.Write([]byte(`{"more": true, "processed": 500}`))
		case "/done":
			w.Write([]byte(`{"more": false}`))
		case "/text":
			w.Write([]byte("ok"))
		case "/fail":
			http.Error(w, `{"more": true}`, http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	for _, tt := range []struct {
		path     string
		more, ok bool
	}{
		{"/more", true, true},
		{"/done", false, true},
		{"/text", false, true},
		{"/fail", false, false},
	} {
		for _, stream := range []bool{true, false} {
			h, err := NewHTTP(HTTP{URL: srv.URL + tt.path, Method: "POST", Timeout: 5 * time.Second, More: stream}, TLSFiles{})
			if err != nil {
				t.Fatal(err)
			}
			res := h.Run(context.Background(), Context{Job: "j"})
			h.Close()
			if res.OK != tt.ok || res.More != (tt.more && stream) {
				t.Errorf("hook %s, streaming %v: ok %v more %v, want ok %v more %v", tt.path, stream, res.OK, res.More, tt.ok, tt.more && stream)
			}
		}
	}
	for _, tt := range []struct {
		exit, more int
		ok, isMore bool
	}{
		{100, 100, true, true},
		{0, 100, true, false},
		{3, 100, false, false},
		{100, 0, false, false}, // not streaming: 100 is a failure
		{7, 7, true, true},
	} {
		s := Script{Shell: "exit " + strconv.Itoa(tt.exit), MoreExitCode: tt.more}
		res := s.Run(context.Background(), Context{Job: "j"})
		if res.OK != tt.ok || res.More != tt.isMore || res.ExitCode != tt.exit {
			t.Errorf("exit %d, moreExitCode %d: ok %v more %v code %d", tt.exit, tt.more, res.OK, res.More, res.ExitCode)
		}
	}
}

func readInt(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
