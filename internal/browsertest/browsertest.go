//go:build linux

// Package browsertest runs real-browser end-to-end tests from Go: it starts
// Debian's headless Chromium under chromedp (github.com/chromedp/chromedp),
// one browser per test, and stops it when the test ends. It is for tests
// only; nothing in shardd's binaries imports it.
//
// A test gets a chromedp context from [New] and drives the page with
// chromedp's actions, through [Do] and [Run] (which bound each call with
// [StepTimeout] and fail the test on an error) or directly:
//
//	ctx := browsertest.New(t)
//	browsertest.Do(t, ctx,
//		chromedp.Navigate(srv.URL+"/login"),
//		chromedp.SendKeys(chromedp.CSS("#user"), "ada"),
//		chromedp.Click(chromedp.CSS("button[type=submit]")),
//		chromedp.WaitVisible(chromedp.CSS("#jobs")),
//	)
//	browsertest.Screenshot(t, ctx, "jobs")
//	browsertest.NoConsoleErrors(t, ctx)
//
// # Finding the browser
//
// The browser is $SHARDD_CHROMIUM when that is set, else /usr/bin/chromium
// (Debian's package "chromium"; install it with
// `apt-get install -y --no-install-recommends chromium`). Without one, [New]
// skips the test, unless SHARDD_REQUIRE_BROWSER=1, when it fails it: CI sets
// that, so that a missing browser can never pass as a run of skipped tests.
// A browser that is there but does not start always fails the test.
//
// # Flags
//
// The tests run as root on a machine whose only network is the loopback, on
// two shared cores. The browser starts with:
//
//   - --headless: no display. This is Chrome's "new" headless mode, the full
//     browser without a window.
//   - --no-sandbox: Chromium refuses to run as root with its sandbox.
//   - --disable-gpu: there is no GPU; the page is drawn in software.
//   - --disable-dev-shm-usage: shared memory goes to /tmp, not /dev/shm,
//     which is 64 MB in a default container and crashes the renderer when
//     full. (Debian's wrapper script means to add it when /dev/shm is small,
//     but its test breaks when /dev/shm is mounted twice, as it is here, and
//     prints "[: ...: unexpected operator".)
//   - --disable-quic, --disable-background-networking,
//     --disable-component-update, --disable-sync,
//     --disable-client-side-phishing-detection, --disable-default-apps,
//     --disable-extensions, --disable-component-extensions-with-background-pages,
//     --safebrowsing-disable-auto-update, --metrics-recording-only,
//     --disable-breakpad, --disable-field-trial-config, --no-service-autorun,
//     --no-first-run, --no-default-browser-check: less traffic of the
//     browser's own (updates, sync, safe browsing, metrics, first-run pages).
//     On a closed network those connections are refused, and they cost
//     start-up time and log noise.
//   - --disable-features=NetworkTimeServiceQuerying,AutofillServerCommunication,
//     CertificateTransparencyComponentUpdater,Translate,OptimizationHints,
//     MediaRouter: the flags above leave these on, and each asks a Google
//     server for something (the time, form field types, ...).
//   - --gaia-url and --component-updater=url-source=<the proxy below>: the
//     Google account check (ListAccounts) and the on-device model component
//     run at start-up whatever the flags say; these send them to the test's
//     own listener instead.
//   - --proxy-server=<a listener of this package on 127.0.0.2>: Chromium
//     sends loopback URLs (127.0.0.1, localhost, [::1]) directly and every
//     other URL through the proxy, a listener in the test process that
//     answers 403 and records the URL. So the browser reaches nothing but
//     this machine, and resolves no host name (the proxy would). A page of
//     the test that asks for anything elsewhere (a CDN script, a web font)
//     gets the 403 at once instead of a timeout, and the test fails with the
//     URL (New watches the tab's requests). What the browser itself still
//     asks for is refused and only logged: with Chromium 156 that is a
//     spelling dictionary, once text is typed into a field.
//   - --disable-background-timer-throttling, --disable-renderer-backgrounding,
//     --disable-backgrounding-occluded-windows: a headless tab counts as
//     hidden, and its timers would otherwise be slowed.
//   - --window-size (1280x800 unless [WithWindowSize]), --hide-scrollbars,
//     --force-color-profile=srgb, --mute-audio: screenshots of the same page
//     look the same from run to run.
//   - --password-store=basic: no keyring daemon is asked for.
//   - --user-data-dir=<t.TempDir()>: a fresh profile for each test, so no
//     cookie or cache leaks between tests, and no lock of another browser
//     is met. XDG_CONFIG_HOME points under it too, so the crash handler's
//     database is not in $HOME/.config/chromium.
//
// /usr/bin/chromium is Debian's wrapper script; it adds flags of its own
// (such as --enable-gpu-rasterization and --disable-pings) and execs
// /usr/lib/chromium/chromium, so the process chromedp starts is the
// browser. Its complaints on stderr (D-Bus is absent, the /dev/shm test)
// are harmless; New logs the browser's output when a test fails.
//
// chromedp talks to the browser over a pipe (--remote-debugging-pipe), so
// the browser opens no debugging port.
//
// # Lifetime
//
// [New] starts the browser before it returns (about half a second to a
// second here), in a process group of its own and with Pdeathsig, so a test
// binary that dies takes its browser with it. It registers a cleanup that
// takes a screenshot when the test failed, closes the browser, waits for its
// process to exit, and fails the test if any process of that browser (the
// zygotes, renderers, GPU, network and storage services, crash handlers) is
// still alive 5s later, after it killed them.
//
// # Screenshots and the console
//
// [Screenshot] saves a full-page PNG under $SHARDD_SCREENSHOTS, or under the
// test's temporary directory (removed after the test; the path is logged).
// The screenshot of a failed test is kept in a directory under os.TempDir()
// when $SHARDD_SCREENSHOTS is not set.
//
// [ConsoleErrors] returns what the page reported as an error since the
// browser started: console.error and console.assert calls, uncaught
// exceptions and unhandled promise rejections, and the browser's own error
// entries (a failed resource load, a blocked request, a CSP violation).
// [NoConsoleErrors] fails the test on any of them. A 404 for /favicon.ico,
// which Chromium asks for by itself, is such an error: a page served to
// these tests needs a favicon, or <link rel="icon" href="data:,">.
// Only the first tab is watched, not popups.
package browsertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/cdp"
	jsonv2 "github.com/chromedp/cdproto/cdp/jsonv2"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// Environment variables that the package reads.
const (
	// EnvChromium names the browser binary to use instead of
	// /usr/bin/chromium.
	EnvChromium = "SHARDD_CHROMIUM"
	// EnvRequire set to 1 makes a missing browser fail the test, not skip it.
	EnvRequire = "SHARDD_REQUIRE_BROWSER"
	// EnvScreenshots is the directory that [Screenshot] writes to.
	EnvScreenshots = "SHARDD_SCREENSHOTS"
)

// DefaultChromium is where Debian's package "chromium" puts the browser.
const DefaultChromium = "/usr/bin/chromium"

// Timeouts. They are generous because the tests share two cores with the
// rest of `go test ./...`.
var (
	// StartTimeout bounds the start of the browser in [New].
	StartTimeout = 60 * time.Second
	// StepTimeout bounds one call of [Do] or [Run].
	StepTimeout = 30 * time.Second
	// DefaultTimeout is the deadline of the context that [New] returns,
	// unless [WithTimeout] sets another: a test that uses chromedp directly
	// and waits for something that never comes fails then, instead of at
	// go test's -timeout.
	DefaultTimeout = 3 * time.Minute
	// closeTimeout bounds the graceful close of the browser; after it the
	// process is killed.
	closeTimeout = 10 * time.Second
)

// An Option changes how [New] starts the browser.
type Option func(*config)

type config struct {
	timeout       time.Duration
	width, height int
}

// WithTimeout sets the deadline of the context that [New] returns, counted
// from the end of the browser's start.
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithWindowSize sets the size of the page's viewport, and of the browser
// window (default 1280x800). A full-page screenshot is at least that big.
func WithWindowSize(width, height int) Option {
	return func(c *config) { c.width, c.height = width, height }
}

// session is what New keeps about one browser. The context that New returns
// holds it.
type session struct {
	t       testing.TB
	base    context.Context // the browser's context, with no deadline
	dataDir string
	output  *tailBuffer

	pgid int // the browser's process group

	mu          sync.Mutex
	console     []string // errors the page reported, formatted
	pageOffHost []string // non-loopback URLs that the tab asked for
	proxied     []string // URLs that the proxy refused
}

type sessionKey struct{}

func sessionOf(t testing.TB, ctx context.Context) *session {
	t.Helper()
	s, _ := ctx.Value(sessionKey{}).(*session)
	if s == nil {
		t.Fatalf("browsertest: the context does not come from browsertest.New")
	}
	return s
}

// New starts a headless Chromium for the test and returns a chromedp
// context for its first tab. The browser is closed, and its processes are
// checked to be gone, when the test ends. The context has a deadline
// ([DefaultTimeout], or [WithTimeout]).
//
// Without a browser, New skips the test (see the package documentation),
// unless SHARDD_REQUIRE_BROWSER=1.
func New(t testing.TB, opts ...Option) context.Context {
	t.Helper()
	cfg := config{timeout: DefaultTimeout, width: 1280, height: 800}
	for _, o := range opts {
		o(&cfg)
	}
	bin := findChromium(t, DefaultChromium)

	// t.TempDir before t.Cleanup: cleanups run last-in first-out, so the
	// browser is gone before its profile directory is removed.
	s := &session{t: t, dataDir: t.TempDir(), output: &tailBuffer{max: 256 << 10}}
	proxy := "http://" + s.startProxy(t)

	allocOpts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin),
		chromedp.UserDataDir(s.dataDir),
		chromedp.CombinedOutput(s.output),
		chromedp.WindowSize(cfg.width, cfg.height),
		chromedp.ProxyServer(proxy),
		chromedp.Flag("gaia-url", proxy),
		chromedp.Flag("component-updater", "url-source="+proxy+"/"),
		// Crashpad keeps its database under $XDG_CONFIG_HOME/chromium, and
		// its handlers are no children of the browser: put both in the
		// test's directory, where checkGone finds them.
		chromedp.Env("XDG_CONFIG_HOME=" + filepath.Join(s.dataDir, "xdg-config")),
		chromedp.ModifyCmdFunc(func(cmd *exec.Cmd) {
			cmd.SysProcAttr = &syscall.SysProcAttr{
				// Kill the browser when the test binary dies (chromedp's
				// default, which ModifyCmdFunc replaces).
				Pdeathsig: syscall.SIGKILL,
				// Its own process group, which its helpers inherit.
				Setpgid: true,
			}
		}),
	}
	for _, f := range flags {
		allocOpts = append(allocOpts, chromedp.Flag(f.name, f.value))
	}
	// Not the test's context: testing cancels that before the cleanups run,
	// and the cleanup below still needs the browser for a screenshot.
	allocCtx, allocCancel := chromedp.NewExecAllocator(context.Background(), allocOpts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	s.base = context.WithValue(ctx, sessionKey{}, s)

	start := time.Now()
	started := make(chan error, 1)
	go func() { started <- s.startBrowser() }()
	var err error
	select {
	case err = <-started:
	case <-time.After(StartTimeout):
		err = fmt.Errorf("no answer in %v", StartTimeout)
	}
	if err != nil {
		cancel()
		allocCancel()
		s.checkGone(t)
		t.Fatalf("browsertest: starting %s: %v\nbrowser output:\n%s", bin, err, s.output)
	}
	startTime := time.Since(start)
	// The window of the new headless mode is --window-size with room for
	// the browser's own bars, so the page gets less (1280x657 of 1280x800);
	// set the page's viewport itself.
	if err := chromedp.Do(s.base, chromedp.EmulateViewport(int64(cfg.width), int64(cfg.height))); err != nil {
		cancel()
		allocCancel()
		t.Fatalf("browsertest: setting the viewport: %v", err)
	}
	s.pgid = chromedp.FromContext(s.base).Browser.Process().Pid
	version, err := chromedp.CallBrowser(s.base, browser.GetVersion, cdp.Empty{})
	if err != nil {
		version.Product = "version unknown: " + err.Error()
	}
	t.Logf("browsertest: %s (%s) started in %v", bin, version.Product, startTime.Round(time.Millisecond))

	t.Cleanup(func() {
		if t.Failed() {
			s.failureArtifacts()
		}
		cctx, ccancel := context.WithTimeout(s.base, closeTimeout)
		if err := chromedp.Cancel(cctx); err != nil && !errors.Is(err, context.Canceled) {
			t.Logf("browsertest: closing the browser: %v", err)
		}
		ccancel()
		cancel()
		allocCancel() // waits for the process to exit
		s.checkGone(t)
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, u := range s.pageOffHost {
			t.Errorf("browsertest: the page asked for %s; only the loopback is reachable from a test: serve it from the test's server", u)
		}
		for _, u := range s.proxied {
			if !slices.Contains(s.pageOffHost, u) {
				t.Logf("browsertest: the browser's own request to %s was refused", u)
			}
		}
	})

	tctx, tcancel := context.WithTimeout(s.base, cfg.timeout)
	t.Cleanup(tcancel)
	return tctx
}

// flags are the browser's command line, less the ones New adds for each
// browser. The package documentation says why each is there.
var flags = []struct {
	name  string
	value any
}{
	{"headless", true},
	{"no-sandbox", true},
	{"disable-gpu", true},
	{"disable-dev-shm-usage", true},
	{"disable-quic", true},
	{"no-first-run", true},
	{"no-default-browser-check", true},
	{"disable-background-networking", true},
	{"disable-component-update", true},
	{"disable-sync", true},
	{"disable-client-side-phishing-detection", true},
	{"disable-default-apps", true},
	{"disable-extensions", true},
	{"safebrowsing-disable-auto-update", true},
	{"metrics-recording-only", true},
	{"disable-breakpad", true},
	{"disable-component-extensions-with-background-pages", true},
	{"disable-field-trial-config", true},
	{"no-service-autorun", true},
	{"disable-features", "Translate,OptimizationHints,MediaRouter,NetworkTimeServiceQuerying," +
		"AutofillServerCommunication,CertificateTransparencyComponentUpdater"},
	{"disable-background-timer-throttling", true},
	{"disable-renderer-backgrounding", true},
	{"disable-backgrounding-occluded-windows", true},
	{"hide-scrollbars", true},
	{"force-color-profile", "srgb"},
	{"mute-audio", true},
	{"password-store", "basic"},
}

// findChromium returns the browser to run ($SHARDD_CHROMIUM, or def), or
// skips or fails the test.
func findChromium(t testing.TB, def string) string {
	t.Helper()
	if p := os.Getenv(EnvChromium); p != "" {
		if !isExecutable(p) {
			t.Fatalf("browsertest: %s=%s is not an executable file", EnvChromium, p)
		}
		return p
	}
	if isExecutable(def) {
		return def
	}
	msg := fmt.Sprintf("browsertest: no browser at %s: install it with "+
		"`apt-get update && apt-get install -y --no-install-recommends chromium`, "+
		"or set %s to a Chromium binary", def, EnvChromium)
	if os.Getenv(EnvRequire) == "1" {
		t.Fatalf("%s (%s=1, so this is a failure, not a skip)", msg, EnvRequire)
	}
	t.Skipf("%s; set %s=1 to make this a failure", msg, EnvRequire)
	return ""
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// startBrowser starts the browser and opens its first tab, and starts
// collecting the page's errors before any page loads. The first action on a
// chromedp context binds the browser's life to that context, so it runs on
// the context with no deadline.
func (s *session) startBrowser() error {
	if err := chromedp.Do(s.base); err != nil {
		return err
	}
	return chromedp.Listen(s.base, s.onEvent)
}

// onEvent runs in chromedp's read loop for the tab: it must return fast and
// must not call the browser.
func (s *session) onEvent(ev any) {
	var msg string
	switch ev := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if ev.Type != runtime.ConsoleAPICalledTypeError && ev.Type != runtime.ConsoleAPICalledTypeAssert {
			return
		}
		msg = "console." + string(ev.Type) + ": " + argsText(ev.Args) + stackPlace(ev.StackTrace)
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg = "exception: " + d.Text
		if d.Exception != nil && d.Exception.Description != "" {
			first, _, _ := strings.Cut(d.Exception.Description, "\n")
			msg += " " + first
		}
		if d.URL != "" {
			msg += fmt.Sprintf(" (%s:%d:%d)", d.URL, d.LineNumber+1, d.ColumnNumber+1)
		} else {
			msg += stackPlace(d.StackTrace)
		}
	case *network.EventRequestWillBeSent:
		if u := ev.Request.URL; !loopbackURL(u) {
			s.mu.Lock()
			s.pageOffHost = append(s.pageOffHost, u)
			s.mu.Unlock()
		}
		return
	case *log.EventEntryAdded:
		e := ev.Entry
		if e.Level != log.EntryLevelError {
			return
		}
		msg = "browser " + string(e.Source) + " error: " + e.Text
		if e.URL != "" {
			msg += " (" + e.URL + ")"
		}
	default:
		return
	}
	s.mu.Lock()
	s.console = append(s.console, msg)
	s.mu.Unlock()
}

// loopbackURL reports whether a request for u stays on this machine: a
// loopback address or localhost, or a URL that needs no network.
func loopbackURL(u string) bool {
	p, err := url.Parse(u)
	if err != nil {
		return false
	}
	switch p.Scheme {
	case "http", "https", "ws", "wss":
	default:
		return p.Scheme != "ftp" // data:, blob:, about:, chrome:, ...
	}
	h := p.Hostname()
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

func argsText(args []*runtime.RemoteObject) string {
	parts := make([]string, 0, len(args))
	for _, a := range args {
		switch {
		case a.Type == runtime.RemoteObjectTypeString:
			var v string
			if err := jsonv2.Unmarshal(a.Value, &v); err != nil {
				v = string(a.Value)
			}
			parts = append(parts, v)
		case a.Description != "":
			parts = append(parts, a.Description)
		case len(a.Value) > 0:
			parts = append(parts, string(a.Value))
		default:
			parts = append(parts, string(a.Type))
		}
	}
	return strings.Join(parts, " ")
}

func stackPlace(st *runtime.StackTrace) string {
	if st == nil || len(st.CallFrames) == 0 {
		return ""
	}
	f := st.CallFrames[0]
	return fmt.Sprintf(" (%s:%d:%d)", f.URL, f.LineNumber+1, f.ColumnNumber+1)
}

// ConsoleErrors returns the errors that the pages of the browser reported
// since it started: console.error and console.assert calls, uncaught
// exceptions and unhandled rejections, and the browser's error log entries
// (such as a resource that failed to load). It first makes a round trip to
// the page, so every error that the browser reported before the call is in
// the list.
func ConsoleErrors(t testing.TB, ctx context.Context) []string {
	t.Helper()
	s := sessionOf(t, ctx)
	// chromedp calls onEvent for an event before it returns the answer to a
	// command sent after it.
	rctx, cancel := context.WithTimeout(s.base, StepTimeout)
	defer cancel()
	if _, err := chromedp.Run(rctx, chromedp.Evaluate[int]("0")); err != nil {
		t.Fatalf("browsertest: reading the console: %v", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.console...)
}

// NoConsoleErrors fails the test (without stopping it) for each error in
// [ConsoleErrors].
func NoConsoleErrors(t testing.TB, ctx context.Context) {
	t.Helper()
	for _, e := range ConsoleErrors(t, ctx) {
		t.Errorf("browser console: %s", e)
	}
}

// Do runs chromedp actions in order on the browser of ctx, all within
// [StepTimeout], and fails the test on an error, saying which action failed.
func Do(t testing.TB, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, StepTimeout)
	defer cancel()
	for i, step := range steps {
		if err := chromedp.Do(sctx, step); err != nil {
			t.Fatalf("browser: action %d of %d (all within %v): %v", i+1, len(steps), StepTimeout, err)
		}
	}
}

// Run runs one chromedp action that returns a value, within [StepTimeout],
// and fails the test on an error.
func Run[T any](t testing.TB, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, StepTimeout)
	defer cancel()
	v, err := chromedp.Run(sctx, a)
	if err != nil {
		t.Fatalf("browser (within %v): %v", StepTimeout, err)
	}
	return v
}

// Screenshot saves a PNG of the whole page (not only the viewport) of the
// browser of ctx as <test name>-<name>.png in $SHARDD_SCREENSHOTS, or in a
// temporary directory of the test, and returns its path. It logs the path.
func Screenshot(t testing.TB, ctx context.Context, name string) string {
	t.Helper()
	dir := os.Getenv(EnvScreenshots)
	if dir == "" {
		dir = t.TempDir()
	}
	path, err := saveScreenshot(ctx, dir, t.Name(), name)
	if err != nil {
		t.Fatalf("browsertest: screenshot %q: %v", name, err)
	}
	t.Logf("browsertest: screenshot %s", path)
	return path
}

func saveScreenshot(ctx context.Context, dir, test, name string) (string, error) {
	sctx, cancel := context.WithTimeout(ctx, StepTimeout)
	defer cancel()
	png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100)) // 100: PNG
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, fileName(test)+"-"+fileName(name)+".png")
	return path, os.WriteFile(path, png, 0o644)
}

// fileName makes s safe as a file name: subtests have slashes in their
// names.
func fileName(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '_'
	}, s)
}

// failureArtifacts logs what helps to see why a test failed: a screenshot
// that outlives the test, the page's errors and the browser's output.
func (s *session) failureArtifacts() {
	t := s.t
	dir := os.Getenv(EnvScreenshots)
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "shardd-screenshots-"); err != nil {
			t.Logf("browsertest: no failure screenshot: %v", err)
			return
		}
	}
	if path, err := saveScreenshot(s.base, dir, t.Name(), "failure"); err != nil {
		t.Logf("browsertest: no failure screenshot: %v", err)
	} else {
		t.Logf("browsertest: the page when the test failed: %s", path)
	}
	s.mu.Lock()
	for _, e := range s.console {
		t.Logf("browsertest: browser console: %s", e)
	}
	s.mu.Unlock()
	if out := s.output.String(); out != "" {
		t.Logf("browsertest: browser output:\n%s", out)
	}
}

// startProxy starts the listener that is the browser's proxy, and also the
// address of its Google account and component update services (which try
// at start-up, whatever the flags), and returns its address. It answers
// 403 to every request, and records the URL of the proxy requests.
func (s *session) startProxy(t testing.TB) string {
	t.Helper()
	// 127.0.0.2, not 127.0.0.1: Chromium isolates the origin of its account
	// service (gaia-url) from other sites, and must not do that to the
	// test's servers on 127.0.0.1.
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatalf("browsertest: proxy listener: %v", err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.Method == http.MethodConnect:
				s.proxyHit("https://" + r.Host) // no more than the host
			case r.URL.IsAbs():
				s.proxyHit(r.URL.String())
			}
			http.Error(w, "browsertest: only the loopback is reachable from a test", http.StatusForbidden)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go srv.Serve(ln) // returns ErrServerClosed at the cleanup
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

func (s *session) proxyHit(u string) {
	s.mu.Lock()
	s.proxied = append(s.proxied, u)
	s.mu.Unlock()
}

// checkGone fails the test if a process of the browser is still alive,
// and kills it. The browser's helpers (zygotes, renderers, the GPU and
// network services) are in its process group; the crash handlers are not
// (they detach), but have the test's directory on their command line.
func (s *session) checkGone(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		pids := s.processes()
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Errorf("browsertest: browser processes %v were alive 5s after the browser closed; killed them", pids)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// processes returns the live processes of the browser: those in its
// process group, and those with its directory on their command line.
// Zombies are dead and not listed: Chromium's orphans are reaped by init,
// which may take a while.
func (s *session) processes() []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...; comm may hold spaces and parens.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		if pgrp, _ := strconv.Atoi(f[2]); s.pgid != 0 && pgrp == s.pgid {
			pids = append(pids, pid)
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && mentions(cmdline, s.dataDir) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// mentions reports whether an argument of cmdline (NUL-separated) holds
// the path dir, or a path under it.
func mentions(cmdline []byte, dir string) bool {
	for arg := range bytes.SplitSeq(cmdline, []byte{0}) {
		for a := string(arg); ; {
			i := strings.Index(a, dir)
			if i < 0 {
				break
			}
			if rest := a[i+len(dir):]; rest == "" || rest[0] == '/' {
				return true
			}
			a = a[i+1:]
		}
	}
	return false
}

// tailBuffer keeps the last max bytes written to it. chromedp writes the
// browser's stdout and stderr to it from its own goroutine.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, p...)
	if over := len(b.b) - b.max; over > 0 {
		b.b = append(b.b[:0], b.b[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.b)
}
