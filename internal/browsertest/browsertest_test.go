//go:build linux

package browsertest

import (
	"bytes"
	"fmt"
	"html/template"
	"image"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// formServer is a page with a form that POSTs one text field, and a page
// that shows what was posted. The form page sets an HttpOnly session cookie,
// which the POST must bring back, and a cookie that scripts may read.
type formServer struct {
	*httptest.Server
	mu       sync.Mutex
	received []string // the field of each POST, in order
}

var (
	formPage = template.Must(template.New("form").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>form</title></head>
<body>
<h1>New job</h1>
<form method="post" action="/submit">
  <label for="name">Name</label>
  <input id="name" name="name" type="text" autocomplete="off">
  <button id="send" type="submit">Create</button>
</form>
</body></html>`))
	resultPage = template.Must(template.New("result").Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>created</title></head>
<body>
<p id="result">Created job <strong id="value">{{.}}</strong></p>
</body></html>`))
)

func newFormServer(t *testing.T) *formServer {
	s := &formServer{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "s3cret", Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		http.SetCookie(w, &http.Cookie{Name: "theme", Value: "light", Path: "/", SameSite: http.SameSiteStrictMode})
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		formPage.Execute(w, nil)
	})
	mux.HandleFunc("POST /submit", func(w http.ResponseWriter, r *http.Request) {
		if c, err := r.Cookie("session"); err != nil || c.Value != "s3cret" {
			http.Error(w, "no session", http.StatusForbidden)
			return
		}
		name := r.PostFormValue("name")
		s.mu.Lock()
		s.received = append(s.received, name)
		s.mu.Unlock()
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		resultPage.Execute(w, name)
	})
	// Chromium asks for a favicon; a 404 would be a console error.
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	s.Server = httptest.NewServer(mux) // listens on 127.0.0.1
	t.Cleanup(s.Close)
	return s
}

func (s *formServer) posts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.received...)
}

func TestFormSubmitCookieScreenshot(t *testing.T) {
	srv := newFormServer(t)
	ctx := New(t)

	const job = "nightly-backup <&>"
	Do(t, ctx,
		chromedp.Navigate(srv.URL),
		chromedp.WaitVisible(chromedp.CSS("#name")),
		chromedp.SendKeys(chromedp.CSS("#name"), job),
	)
	if got := Run(t, ctx, chromedp.Value(chromedp.CSS("#name"))); got != job {
		t.Fatalf("the input holds %q after typing, want %q", got, job)
	}
	if got := srv.posts(); len(got) != 0 {
		t.Fatalf("the server got %q before the click", got)
	}
	// WaitVisible fails (after StepTimeout) if the click does not submit.
	Do(t, ctx,
		chromedp.Click(chromedp.CSS("#send")),
		chromedp.WaitVisible(chromedp.CSS("#result")),
	)
	if got := Run(t, ctx, chromedp.Text(chromedp.CSS("#value"))); got != job {
		t.Errorf("the result page shows %q, want %q", got, job)
	}
	if got := srv.posts(); len(got) != 1 || got[0] != job {
		t.Errorf("the server received %q, want one POST of %q", got, job)
	}

	// The session cookie is in the browser, HttpOnly, and out of reach of
	// scripts; the other cookie shows that document.cookie works at all.
	res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	var session *network.Cookie
	for _, c := range res.Cookies {
		if c.Name == "session" {
			session = c
		}
	}
	if session == nil {
		t.Fatalf("no session cookie in the browser; it has %d cookies", len(res.Cookies))
	}
	if !session.HTTPOnly || session.Value != "s3cret" {
		t.Errorf("session cookie: HttpOnly=%v value=%q, want HttpOnly and s3cret", session.HTTPOnly, session.Value)
	}
	doc := Run(t, ctx, chromedp.Evaluate[string]("document.cookie"))
	if strings.Contains(doc, "session") || strings.Contains(doc, "s3cret") {
		t.Errorf("document.cookie = %q: the HttpOnly cookie is readable from scripts", doc)
	}
	if !strings.Contains(doc, "theme=light") {
		t.Errorf("document.cookie = %q, want theme=light in it", doc)
	}

	path := Screenshot(t, ctx, "result")
	checkPNG(t, path)
	NoConsoleErrors(t, ctx)
}

// checkPNG fails unless path is a PNG with something drawn on it: the text
// of the page is dark on white.
func checkPNG(t *testing.T, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg, format, err := image.DecodeConfig(bytes.NewReader(data))
	if err != nil || format != "png" {
		t.Fatalf("%s: format %q, error %v; want a PNG", path, format, err)
	}
	img, err := png.Decode(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b := img.Bounds()
	if b.Dx() == 0 || b.Dy() == 0 || cfg.Width != b.Dx() {
		t.Fatalf("%s: size %v", path, b)
	}
	dark := 0
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if r, g, bl, _ := img.At(x, y).RGBA(); r+g+bl < 3*0x4000 {
				dark++
			}
		}
	}
	if dark == 0 {
		t.Errorf("%s (%dx%d): no dark pixel; the text was not drawn", path, b.Dx(), b.Dy())
	}
	t.Logf("%s: %dx%d PNG, %d bytes, %d dark pixels", path, b.Dx(), b.Dy(), len(data), dark)
}

// TestFullPageScreenshot checks that a screenshot holds the whole page,
// not only the viewport.
func TestFullPageScreenshot(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write([]byte(`<!doctype html><link rel="icon" href="data:,">
<body style="margin:0"><div style="height:2400px;background:#eee">top</div><p id="end">end</p></body>`))
	}))
	t.Cleanup(srv.Close)
	ctx := New(t, WithWindowSize(800, 600))
	Do(t, ctx, chromedp.Navigate(srv.URL), chromedp.WaitReady(chromedp.CSS("#end")))
	path := Screenshot(t, ctx, "long")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cfg, err := png.DecodeConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Width != 800 || cfg.Height < 2400 {
		t.Errorf("screenshot is %dx%d, want 800 wide and the page's 2400+ px tall", cfg.Width, cfg.Height)
	}
	NoConsoleErrors(t, ctx)
}

// TestConsoleErrors checks that the collector sees what NoConsoleErrors is
// meant to catch, so that a page with none is not a vacuous pass.
func TestConsoleErrors(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write([]byte(`<!doctype html><title>errors</title>
<img src="/missing.png" alt="">
<script>
console.log("fine");
console.warn("only a warning");
console.error("boom", 42);
Promise.reject(new Error("rejected"));
setTimeout(() => { throw new TypeError("thrown"); }, 0);
</script>`))
	})
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	ctx := New(t)
	Do(t, ctx, chromedp.Navigate(srv.URL))
	// The timer's exception comes after the load; wait for it in the page.
	Run(t, ctx, chromedp.Poll[bool](`document.readyState === "complete"`))
	Do(t, ctx, chromedp.Evaluate[chromedp.Void](`new Promise(r => setTimeout(r, 50))`, chromedp.EvalAwaitPromise))

	got := strings.Join(ConsoleErrors(t, ctx), "\n")
	for _, want := range []string{"console.error: boom 42", "rejected", "TypeError: thrown", "missing.png"} {
		if !strings.Contains(got, want) {
			t.Errorf("console errors lack %q; they are:\n%s", want, got)
		}
	}
	for _, not := range []string{"fine", "only a warning"} {
		if strings.Contains(got, not) {
			t.Errorf("console errors have %q, which is no error:\n%s", not, got)
		}
	}
}

// TestOffHostBlocked checks that a page cannot reach beyond the loopback:
// the request goes to the package's proxy, which refuses it, and the test
// is told. The name is in .invalid, which no resolver answers, so nothing
// would leave the machine even if the proxy flag were lost.
func TestOffHostBlocked(t *testing.T) {
	ctx := New(t)
	const far = "http://shardd-browsertest.invalid/x"
	Do(t, ctx, chromedp.Navigate(far))
	if body := Run(t, ctx, chromedp.Text(chromedp.CSS("body"))); !strings.Contains(body, "only the loopback is reachable") {
		t.Errorf("the page shows %q, want the proxy's refusal", body)
	}
	s := sessionOf(t, ctx)
	s.mu.Lock()
	page, proxied := s.pageOffHost, s.proxied
	s.pageOffHost, s.proxied = nil, nil // seen here: not for the cleanup
	s.mu.Unlock()
	if !slices.Contains(page, far) {
		t.Errorf("the page's requests off the machine are %q, want %s among them", page, far)
	}
	if !slices.Contains(proxied, far) {
		t.Errorf("the proxy saw %q, want %s among them", proxied, far)
	}
}

// TestBrowserGone checks that every process of the browser is gone when
// the test that started it ends.
func TestBrowserGone(t *testing.T) {
	var s *session
	var pid int
	if !t.Run("browser", func(t *testing.T) {
		ctx := New(t)
		s = sessionOf(t, ctx)
		pid = chromedp.FromContext(ctx).Browser.Process().Pid
		Do(t, ctx, chromedp.Navigate("about:blank"))
		if n := len(s.processes()); n < 3 {
			t.Errorf("%d processes of the browser while it runs; want its main process and its helpers", n)
		}
	}) || s == nil {
		return // no browser (skipped) or none started: nothing to look for
	}
	if pids := s.processes(); len(pids) != 0 {
		t.Errorf("browser processes %v alive after the test", pids)
	}
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
		t.Errorf("the browser's main process %d is still there", pid)
	}
}

// fakeTB records how findChromium ends a test, without ending this one.
type fakeTB struct {
	testing.TB
	skipped, failed string
}

func (f *fakeTB) Helper() {}

func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// TestFindChromium checks the contract CI relies on: a missing browser is
// a skip that says how to install it, and a failure under
// SHARDD_REQUIRE_BROWSER=1.
func TestFindChromium(t *testing.T) {
	find := func(def string) (string, *fakeTB) {
		f := &fakeTB{TB: t}
		var bin string
		done := make(chan struct{})
		go func() {
			defer close(done)
			bin = findChromium(f, def)
		}()
		<-done
		return bin, f
	}
	const missing = "/nonexistent/chromium"
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}

	t.Setenv(EnvChromium, "")
	t.Setenv(EnvRequire, "")
	if _, f := find(missing); f.failed != "" || !strings.Contains(f.skipped, "apt-get update && apt-get install -y --no-install-recommends chromium") {
		t.Errorf("no browser: skipped %q, failed %q; want a skip that says how to install it", f.skipped, f.failed)
	}
	if bin, f := find(self); bin != self || f.skipped+f.failed != "" {
		t.Errorf("browser at the default path: got %q (skipped %q, failed %q)", bin, f.skipped, f.failed)
	}

	t.Setenv(EnvRequire, "1")
	if _, f := find(missing); f.skipped != "" || !strings.Contains(f.failed, "SHARDD_REQUIRE_BROWSER=1") {
		t.Errorf("no browser, SHARDD_REQUIRE_BROWSER=1: skipped %q, failed %q; want a failure", f.skipped, f.failed)
	}

	t.Setenv(EnvRequire, "")
	t.Setenv(EnvChromium, missing)
	if _, f := find(self); f.skipped != "" || !strings.Contains(f.failed, missing) {
		t.Errorf("SHARDD_CHROMIUM names no file: skipped %q, failed %q; want a failure", f.skipped, f.failed)
	}
	t.Setenv(EnvChromium, self)
	if bin, f := find(missing); bin != self || f.skipped+f.failed != "" {
		t.Errorf("SHARDD_CHROMIUM set: got %q (skipped %q, failed %q), want %s", bin, f.skipped, f.failed, self)
	}
}
