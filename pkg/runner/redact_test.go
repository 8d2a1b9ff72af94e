package runner

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode"
)

func TestRedact(t *testing.T) {
	inner := fmt.Errorf("%w: GET with Bearer tok-123456 failed", ErrKilled)
	res := redact(Result{Output: "auth=Bearer tok-123456, token tok-123456, abc", Err: inner}, newRedactor([]string{"tok-123456", "abc"}))
	if res.Output != "auth=Bearer [redacted], token [redacted], abc" {
		t.Errorf("output %q", res.Output)
	}
	if res.Err.Error() != "runner: killed: GET with Bearer [redacted] failed" || !errors.Is(res.Err, ErrKilled) {
		t.Errorf("err %q (still ErrKilled: %v)", res.Err, errors.Is(res.Err, ErrKilled))
	}
	if got := redact(Result{Output: "x"}, newRedactor(nil)); got.Output != "x" {
		t.Errorf("no secrets: %q", got.Output)
	}
}

// each applies enc to every byte of s.
func each(s string, enc func(c byte) string) string {
	var b strings.Builder
	for i := range len(s) {
		b.WriteString(enc(s[i]))
	}
	return b.String()
}

// A secret echoed in any of the common encodings is redacted whole.
func TestRedactEncodings(t *testing.T) {
	const secret = "s3cr3t-T0ken/with+chars&<>"
	goJSON, _ := json.Marshal(secret)
	b64 := func(e *base64.Encoding) string { return e.EncodeToString([]byte(secret)) }
	for _, tc := range []struct{ name, echo string }{
		{"as sent", secret},
		{"upper-cased", strings.ToUpper(secret)},
		{"lower-cased", strings.ToLower(secret)},
		{"query-escaped", url.QueryEscape(secret)},
		{"path-escaped", url.PathEscape(secret)},
		{"percent-encoded, every byte, lower hex", each(secret, func(c byte) string { return fmt.Sprintf("%%%02x", c) })},
		{"percent-encoded, every byte, upper hex", each(secret, func(c byte) string { return fmt.Sprintf("%%%02X", c) })},
		{"form-encoded space", url.QueryEscape("a secret with spaces")},
		{"Go's JSON (\\u0026, \\u003c)", strings.Trim(string(goJSON), `"`)},
		{"JSON with \\/ (PHP, Ruby)", strings.ReplaceAll(strings.Trim(string(goJSON), `"`), "/", `\/`)},
		{"JSON \\u00XX, every byte", each(secret, func(c byte) string { return fmt.Sprintf(`\u%04x`, c) })},
		{"JSON \\u00XX, every byte, upper hex", each(secret, func(c byte) string { return fmt.Sprintf(`\u%04X`, c) })},
		{"JavaScript \\xXX", each(secret, func(c byte) string { return fmt.Sprintf(`\x%02x`, c) })},
		{"HTML-escaped", html.EscapeString(secret)},
		{"HTML decimal references", each(secret, func(c byte) string { return fmt.Sprintf("&#%d;", c) })},
		{"HTML hex references", each(secret, func(c byte) string { return fmt.Sprintf("&#x%X;", c) })},
		{"HTML named references", strings.NewReplacer("/", "&sol;", "+", "&plus;", "&", "&amp;", "<", "&lt;", ">", "&gt;", "-", "&#45").Replace(secret)},
		{"hex", hex.EncodeToString([]byte(secret))},
		{"hex, upper", strings.ToUpper(hex.EncodeToString([]byte(secret)))},
		{"base64", b64(base64.StdEncoding)},
		{"base64 without padding", b64(base64.RawStdEncoding)},
		{"base64 URL", b64(base64.URLEncoding)},
		{"base64 URL without padding", b64(base64.RawURLEncoding)},
		{"base64 in JSON with \\/", strings.ReplaceAll(b64(base64.StdEncoding), "/", `\/`)},
		{"base64, percent-encoded", url.QueryEscape(b64(base64.StdEncoding))},
		{"JSON in a JSON string (\\/, \\u0026)", func() string {
			j, _ := json.Marshal(strings.ReplaceAll(strings.Trim(string(goJSON), `"`), "/", `\/`))
			return strings.Trim(string(j), `"`)
		}()},
		{"percent-encoded twice", url.QueryEscape(url.QueryEscape(secret))},
		{"percent-encoded JSON escapes", url.PathEscape(each(secret, func(c byte) string { return fmt.Sprintf(`\u%04x`, c) }))},
		{"HTML-escaped references", html.EscapeString(each(secret, func(c byte) string { return fmt.Sprintf("&#%d;", c) }))},
		{"mixed: JSON, percent, HTML and case by turns", func() string {
			var b strings.Builder
			for i := range len(secret) {
				switch c := secret[i]; i % 4 {
				case 0:
					fmt.Fprintf(&b, `\u%04x`, c)
				case 1:
					fmt.Fprintf(&b, "%%%02X", c)
				case 2:
					fmt.Fprintf(&b, "&#%d;", c)
				default:
					b.WriteString(strings.ToUpper(string(c)))
				}
			}
			return b.String()
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			secrets := []string{secret, "a secret with spaces"}
			text := `{"echo": "` + tc.echo + `", "n": 1}`
			if got, want := newRedactor(secrets).String(text), `{"echo": "[redacted]", "n": 1}`; got != want {
				t.Errorf("echo %s\n got %s\nwant %s", tc.echo, got, want)
			}
		})
	}
}

// A secret a hook wrote inside a longer base64 text (Basic credentials,
// a token in a JSON document it encoded) is redacted at any alignment, in
// either alphabet: what is left are the characters that also encode the
// bytes around it, at most 4 of its bits at each end.
func TestRedactBase64Inside(t *testing.T) {
	const secret = "ghp_R4nd0mT0kenValue42"
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		for before := range 6 {
			for _, after := range []string{"", "x", "yz", "\n}"} {
				pre := strings.Repeat("u", before) + ":"
				text := enc.EncodeToString([]byte(pre + secret + after))
				got := newRedactor([]string{secret}).String(text)
				i := strings.Index(got, redactedMark)
				if i < 0 {
					t.Errorf("%q at %d: not redacted: %s", pre+secret+after, len(pre)%3, got)
					continue
				}
				// Left: the characters of pre, and the one mixing its last bits
				// with the secret's first. Right: the same for after, and padding.
				left, right := got[:i], strings.TrimRight(got[i+len(redactedMark):], "=")
				if max := (len(pre)*8+5)/6 + 1; len(left) > max {
					t.Errorf("%q: %d characters left before the mark, want at most %d: %s", pre+secret+after, len(left), max, got)
				}
				if max := (len(after)*8+5)/6 + 1; len(right) > max {
					t.Errorf("%q: %d characters left after the mark, want at most %d: %s", pre+secret+after, len(right), max, got)
				}
			}
		}
	}
}

// A non-ASCII secret is found in its escapes of bytes (percent), of UTF-16
// units (JSON) and of code points (HTML).
func TestRedactNonASCII(t *testing.T) {
	const secret = "pässwörd-😀-ß1"
	j, _ := json.Marshal(secret)
	ascii := strings.Trim(fmt.Sprintf("%+q", secret), `"`) // \u00e4 ... \U0001f600
	surrogates := ""
	for _, r := range secret {
		switch {
		case r > 0xffff:
			r -= 0x10000
			surrogates += fmt.Sprintf(`\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		case r > 0x7f:
			surrogates += fmt.Sprintf(`\u%04x`, r)
		default:
			surrogates += string(r)
		}
	}
	var refs strings.Builder
	for _, r := range secret {
		fmt.Fprintf(&refs, "&#x%x;", r)
	}
	for _, echo := range []string{string(j), url.QueryEscape(secret), surrogates, refs.String()} {
		if got := newRedactor([]string{secret}).String("<" + echo + ">"); got != "<[redacted]>" && got != `<"[redacted]">` {
			t.Errorf("%s: %s (%s)", echo, got, ascii)
		}
	}
}

func TestRedactCut(t *testing.T) {
	const secret = "s3cr3t-T0ken/with+chars&<>"
	r := newRedactor([]string{secret})
	for _, tc := range []struct{ text, want string }{
		{"xxxxBearer s3cr", "xxxxBearer [redacted]"},
		{"xxxxBearer S3CR3T-T0", "xxxxBearer [redacted]"},
		{"xxxxBearer s3cr3t-T0ken%2Fwi", "xxxxBearer [redacted]"},
		{"xxxxBearer s3cr3t-T0ken%2", "xxxxBearer [redacted]"},    // inside an escape
		{"xxxxBearer s3cr3t-T0ken\\u00", "xxxxBearer [redacted]"}, // inside an escape
		{"xxxxBearer s3cr3t-T0ken&#x2", "xxxxBearer [redacted]"},  // inside an escape
		{"xxxxBearer " + hex.EncodeToString([]byte(secret))[:9], "xxxxBearer [redacted]"},
		{"no secret here", "no secret here"},
	} {
		if got := r.Cut(tc.text); got != tc.want {
			t.Errorf("Cut(%q) = %q, want %q", tc.text, got, tc.want)
		}
		if tc.text != tc.want && r.String(tc.text) != tc.text {
			t.Errorf("String(%q) = %q: a start of a secret is redacted only at a cut", tc.text, r.String(tc.text))
		}
	}
	// The longest start of any form is taken: here the text also ends in
	// "c", the first byte of the secret's base64 form, which is longer.
	const key = "sk-live-abcdefghijklmnopqrstuvwxyz0123456789"
	if got := newRedactor([]string{key}).Cut("Bearer sk-live-abc"); got != "Bearer [redacted]" {
		t.Errorf("a secret cut after a byte that starts another form: %q", got)
	}
}

func TestRedactOverlapsAndShortSecrets(t *testing.T) {
	// A secret that contains another is replaced whole, in either order.
	for _, secrets := range [][]string{{"tok1", "tok1-LONGSECRET"}, {"tok1-LONGSECRET", "tok1"}} {
		if got := newRedactor(secrets).String("token=tok1-LONGSECRET"); got != "token=[redacted]" {
			t.Errorf("secrets %q: %q", secrets, got)
		}
	}
	// Shorter than minSecret: left alone, as ordinary text would be.
	if got := newRedactor([]string{"abc", ""}).String("abc ABC 616263"); got != "abc ABC 616263" {
		t.Errorf("short secrets: %q", got)
	}
	// A backslash, percent or ampersand of the secret itself.
	for _, s := range []string{`C:\new\u0041%41&amp;`, "100%25&#38;x"} {
		if got := newRedactor([]string{s}).String("[" + s + "]"); got != "[[redacted]]" {
			t.Errorf("secret %q as itself: %q", s, got)
		}
	}
	// Pathological: a text of escapes against a secret of escape bytes
	// ends in bounded time.
	s := strings.Repeat(`\`, 40)
	text := strings.Repeat(`\\`, 10000)
	if got := newRedactor([]string{s}).String(text); !strings.Contains(got, redactedMark) {
		t.Errorf("a secret of backslashes in a text of escaped backslashes: not redacted (%d bytes)", len(got))
	}
}

// The char-wise encoders of FuzzRedact: each writes c in one way.
var charEncoders = []func(c byte) string{
	func(c byte) string { return string(c) },
	func(c byte) string { return string(unicode.ToUpper(rune(c))) },
	func(c byte) string { return string(unicode.ToLower(rune(c))) },
	func(c byte) string { return fmt.Sprintf("%%%02x", c) },
	func(c byte) string { return fmt.Sprintf("%%%02X", c) },
	func(c byte) string { return fmt.Sprintf(`\u%04x`, c) },
	func(c byte) string { return fmt.Sprintf(`\u%04X`, c) },
	func(c byte) string { return fmt.Sprintf(`\x%02x`, c) },
	func(c byte) string { return fmt.Sprintf("&#%d;", c) },
	func(c byte) string { return fmt.Sprintf("&#x%x;", c) },
	func(c byte) string { return html.EscapeString(string(c)) },
	func(c byte) string {
		if c == '/' {
			return `\/`
		}
		b, _ := json.Marshal(string(c))
		return string(b[1 : len(b)-1])
	},
}

// FuzzRedact: a printable ASCII secret, each of its characters written in
// one of the encodings redaction knows (chosen by seed), between any texts,
// is never left whole in the result; Cut never panics either.
func FuzzRedact(f *testing.F) {
	f.Add("s3cr3t-T0ken/with+chars&<>", "before ", " after", uint64(1))
	f.Add("tok1-LONGSECRET", `{"a":"`, `"}`, uint64(42))
	f.Add(`\\\\%%%%&&&&`, `\`, "%", uint64(7))
	f.Fuzz(func(t *testing.T, secret, before, after string, seed uint64) {
		if len(secret) < minSecret || len(secret) > 64 {
			return
		}
		for i := range len(secret) {
			if secret[i] < ' ' || secret[i] > '~' {
				return
			}
		}
		rng := rand.New(rand.NewPCG(seed, seed>>7))
		var echo strings.Builder
		for i := range len(secret) {
			echo.WriteString(charEncoders[rng.IntN(len(charEncoders))](secret[i]))
		}
		r := newRedactor([]string{secret})
		text := before + echo.String() + after
		got := strings.ReplaceAll(r.String(text), redactedMark, "\x00")
		if strings.Contains(got, echo.String()) {
			t.Errorf("secret %q written %q: left in %q", secret, echo.String(), got)
		}
		if !strings.Contains(got, "\x00") {
			t.Errorf("secret %q written %q: nothing redacted in %q", secret, echo.String(), got)
		}
		r.Cut(text)
		r.Cut(before)
	})
}

// A hook that echoes its ${VAR} header in other encodings than it was
// sent in gets none of them into the run's output, its run log or its
// error.
func TestHTTPHookRedactsEchoedEncodings(t *testing.T) {
	const secret = "tok/3nc0ded+Value&1"
	t.Setenv("HOOK_KEY", secret)
	var echoes []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		j, _ := json.Marshal(got)
		echoes = []string{
			strings.ReplaceAll(string(j[1:len(j)-1]), "/", `\/`), // PHP's json_encode
			hex.EncodeToString([]byte(got)),
			strings.ToUpper(got),
			html.EscapeString(got),
			url.QueryEscape(got),
			base64.RawURLEncoding.EncodeToString([]byte("user:" + got)),
		}
		w.WriteHeader(500)
		fmt.Fprintf(w, `{"error": "bad token", "seen": ["%s"]}`, strings.Join(echoes, `", "`))
	}))
	defer srv.Close()
	h, _ := NewHTTP(HTTP{URL: srv.URL, Method: "POST", Headers: map[string]string{"Authorization": "Bearer ${HOOK_KEY}"}, Timeout: 5 * time.Second}, TLSFiles{})
	sink := &memSink{}
	c := ctxFixture
	c.Output = sink
	res := h.Run(context.Background(), c)
	if res.OK || len(echoes) == 0 {
		t.Fatalf("the hook was not called, or succeeded: %+v", res)
	}
	for _, got := range []string{res.Output, sink.out.String(), fmt.Sprint(res.Err)} {
		if n := strings.Count(got, redactedMark); n != 0 && n != len(echoes) {
			t.Errorf("%d of %d echoes redacted: %s", n, len(echoes), got)
		}
		for _, e := range echoes {
			if strings.Contains(got, e) {
				t.Errorf("the echo %s is recorded: %s", e, got)
			}
		}
	}
}

// A secret is redacted as it was sent: Go trims the spaces around a
// header's value when it writes the request, so a ${VAR} whose value ends
// (or begins) with white space, as a value read from a file or pasted
// often does, reaches the hook without it, and the hook's echo is the
// secret without it.
func TestHTTPHookRedactsASecretAsSent(t *testing.T) {
	const secret = "s3cr3t-t0ken-value"
	t.Setenv("HOOK_KEY", secret+" ")
	var echo string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		echo = r.Header.Get("X-Key")
		w.WriteHeader(403)
		fmt.Fprintf(w, `{"error": "bad key %s"}`, echo)
	}))
	defer srv.Close()
	h, _ := NewHTTP(HTTP{URL: srv.URL, Method: "POST", Headers: map[string]string{"X-Key": "${HOOK_KEY}"}, Timeout: 5 * time.Second}, TLSFiles{})
	sink := &memSink{}
	c := ctxFixture
	c.Output = sink
	res := h.Run(context.Background(), c)
	if echo != secret {
		t.Fatalf("the hook got %q, want %q (Go trims a header's value)", echo, secret)
	}
	for _, got := range []string{res.Output, sink.out.String(), fmt.Sprint(res.Err)} {
		if strings.Contains(got, secret) {
			t.Errorf("the secret, as sent, is recorded: %s", got)
		}
	}
}
