package runner

import (
	"encoding/base64"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// Redaction: the values of a hook's ${VAR} headers are secrets, and a hook
// that echoes its request, or an error that quotes it, must not put them
// in what shardd records of the run (the output tail and error, in the
// log, the history and the API; the run log). A hook may echo a secret in
// another encoding than it was sent in, so a secret is looked for in every
// form below, and each form under every escaping below, mixed freely
// character by character:
//
//   - forms: the secret itself, in any ASCII case (an upper-cased echo);
//     its hex encoding, in either case; its base64 encoding, standard or
//     URL alphabet, padded or not, alone or inside a longer base64 text at
//     any of the three byte alignments (then the characters that also
//     encode the bytes around it are not part of the form);
//   - escapes of each character: JSON and JavaScript (\/, \", \\, \n, ...,
//     \u00XX in either case, surrogate pairs, \xXX), percent-encoding (%XX
//     in either case, + for a space) and HTML character references
//     (&#NN;, &#xHH;, and the named ones of ASCII characters, &amp;,
//     &sol;, ...); and each of these escaped once more by any of them (JSON
//     in a JSON string: \\/, \\u0026; %252F; %5Cu002F; &amp;#47;).
//
// What it cannot find: a secret shorter than minSecret bytes (it is not
// looked for: it would redact ordinary text), escapes three deep, an
// encoding of a form other than by escapes (base64 of the hex, hex of the
// base64), base64 broken into lines, other encodings (base32, a hash,
// encryption), a secret cut in parts or echoed in part (only a part at
// the very end of a text that was cut there is redacted), and case
// variants beyond ASCII letters.
//
// The search costs about 20-50 ms a MiB of answer (shardd reads 1 MiB at
// most), up to about 0.5 s for a text made to nearly match a secret at
// every byte.

// minSecret is the shortest secret looked for.
const minSecret = 4

// redactedMark replaces what is redacted.
const redactedMark = "[redacted]"

// form is one byte string a secret may appear as, once its characters'
// escapes are decoded.
type form struct {
	b    string
	fold bool // ASCII letters match in either case
}

// redactor takes a set of secrets out of texts (see above).
type redactor struct {
	forms []form // longest first: where several match, the longest is taken
	// first[c] says a form may start at a byte c: its first byte (in
	// either case when it folds) or an escape's first byte.
	first [256]bool
}

// newRedactor returns the redactor of secrets; nil redacts nothing.
func newRedactor(secrets []string) *redactor {
	r := &redactor{}
	seen := map[form]bool{}
	add := func(f form) {
		if len(f.b) >= minSecret && !seen[f] {
			seen[f] = true
			r.forms = append(r.forms, f)
		}
	}
	var all []string
	for _, s := range secrets {
		// As sent: Go's HTTP client trims the white space around a
		// header's value, and a hook echoes what it got.
		all = append(all, s)
		if t := strings.TrimSpace(s); t != s {
			all = append(all, t)
		}
	}
	for _, s := range all {
		if len(s) < minSecret {
			continue
		}
		add(form{s, true})
		add(form{hex.EncodeToString([]byte(s)), true})
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			add(form{enc.EncodeToString([]byte(s)), false})
			raw := enc.WithPadding(base64.NoPadding)
			add(form{raw.EncodeToString([]byte(s)), false})
			for align := range 3 { // s after align bytes of a longer text
				e := raw.EncodeToString(append(make([]byte, align), s...))
				skip := []int{0, 2, 3}[align] // characters holding bits of the bytes before
				end := len(e)
				if (align+len(s))%3 != 0 { // the last character holds bits of the bytes after
					end--
				}
				if end > skip {
					add(form{e[skip:end], false})
				}
			}
		}
	}
	if len(r.forms) == 0 {
		return nil
	}
	slices.SortStableFunc(r.forms, func(a, b form) int { return len(b.b) - len(a.b) })
	for _, f := range r.forms {
		c := f.b[0]
		r.first[c] = true
		if f.fold {
			r.first[lower(c)], r.first[upper(c)] = true, true
		}
	}
	for _, c := range []byte(`\%&+`) {
		r.first[c] = true
	}
	return r
}

// String returns s with every secret found replaced by [redacted].
func (r *redactor) String(s string) string { return r.redact(s, false) }

// Cut is String for a text that was cut at its end: the start of a secret
// that ends it is redacted too.
func (r *redactor) Cut(s string) string { return r.redact(s, true) }

func (r *redactor) redact(s string, cut bool) string {
	if r == nil {
		return s
	}
	var out strings.Builder
	done := 0 // s[:done] is in out
	for i := 0; i < len(s); {
		if !r.first[s[i]] {
			i++
			continue
		}
		end, partial := r.matchAt(s, i, cut)
		switch {
		case end > i:
			out.WriteString(s[done:i])
			out.WriteString(redactedMark)
			i, done = end, end
		case partial:
			out.WriteString(s[done:i])
			out.WriteString(redactedMark)
			return out.String()
		default:
			i++
		}
	}
	if done == 0 {
		return s
	}
	out.WriteString(s[done:])
	return out.String()
}

// matchAt returns the end of the longest form found at s[i:] (i when none
// is), and, with cut, whether s ends inside a form begun at i.
func (r *redactor) matchAt(s string, i int, cut bool) (end int, partial bool) {
	// What may start here, to pass over the forms that cannot.
	d1, n1 := unescape(s[i:])
	d2, n2 := unescape2(s[i:])
	for _, f := range r.forms {
		if !matches(s[i:i+1], f.b, f.fold) && !(n1 > 1 && matches(d1, f.b, f.fold)) && !(n2 > 0 && matches(d2, f.b, f.fold)) &&
			!(s[i] == '+' && f.b[0] == ' ') && !(cut && cutEscape(s[i:])) {
			continue
		}
		q := search{s: s, f: f, budget: 16 * (len(f.b) + 1) * (len(f.b) + 1)}
		e, p := q.match(i, 0)
		if e > i {
			return e, false
		}
		partial = partial || (cut && p)
	}
	return i, partial
}

// search matches a form at a place of a text. Where an escape starts, the
// text may be read as the escape, as an escaped escape, or byte by byte;
// the places where every reading failed are remembered, so that a text of
// escapes (\\\\\\) against a secret of their bytes is searched in time
// bounded by the product of their lengths, and the budget bounds it too.
type search struct {
	s      string
	f      form
	budget int
	failed map[[2]int]bool // (j, k) whose search failed, with whether s ended inside f
}

// match matches f.b[k:] at s[j:]: it returns the end of the match in s (-1
// when there is none), and whether s ended (or ends in an escape cut
// short) after a part of f was matched.
func (q *search) match(j, k int) (end int, partial bool) {
	s, f := q.s, q.f
	for k < len(f.b) {
		if q.budget--; q.budget < 0 {
			return -1, false
		}
		if j == len(s) {
			return -1, k > 0
		}
		// The readings of s[j:] that go on matching f: as an escaped
		// escape, as an escape, as its first byte.
		var moves [3]struct{ n, dec int }
		m := 0
		if dec, n := unescape2(s[j:]); n > 0 && matches(dec, f.b[k:], f.fold) {
			moves[m].n, moves[m].dec = n, len(dec)
			m++
		}
		if dec, n := unescape(s[j:]); n > 1 && matches(dec, f.b[k:], f.fold) {
			moves[m].n, moves[m].dec = n, len(dec)
			m++
		}
		if matches(s[j:j+1], f.b[k:], f.fold) || (s[j] == '+' && f.b[k] == ' ') { // + is a form-encoded space too
			moves[m].n, moves[m].dec = 1, 1
			m++
		}
		switch m {
		case 0:
			return -1, k > 0 && cutEscape(s[j:])
		case 1:
			j, k = j+moves[0].n, k+moves[0].dec
			continue
		}
		key := [2]int{j, k}
		if p, seen := q.failed[key]; seen {
			return -1, p
		}
		partial := false
		for _, mv := range moves[:m] {
			e, p := q.match(j+mv.n, k+mv.dec)
			if e >= 0 {
				return e, false
			}
			partial = partial || p
		}
		if q.failed == nil {
			q.failed = map[[2]int]bool{}
		}
		q.failed[key] = partial
		return -1, partial
	}
	return j, false
}

// matches reports whether want starts with got.
func matches(got, want string, fold bool) bool {
	if len(got) > len(want) {
		return false
	}
	if !fold {
		return want[:len(got)] == got
	}
	for i := range len(got) {
		if lower(got[i]) != lower(want[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

func upper(c byte) byte {
	if 'a' <= c && c <= 'z' {
		return c - ('a' - 'A')
	}
	return c
}

// unescape decodes the escape at the start of s, if one starts there: the
// bytes it stands for and its length. Otherwise it returns s's first
// byte, and 1.
func unescape(s string) (string, int) {
	switch {
	case s[0] == '\\' && len(s) >= 2:
		switch c := s[1]; c {
		case 'u':
			u, ok := hexAt(s, 2, 4)
			if !ok {
				break
			}
			r := rune(u)
			if utf16.IsSurrogate(r) {
				if u2, ok := hexAt(s, 8, 4); ok && s[6] == '\\' && s[7] == 'u' {
					if pair := utf16.DecodeRune(r, rune(u2)); pair != utf8.RuneError {
						return string(pair), 12
					}
				}
				return "\uFFFD", 6
			}
			return string(r), 6
		case 'x':
			if b, ok := hexAt(s, 2, 2); ok {
				return string([]byte{byte(b)}), 4
			}
		default:
			if i := strings.IndexByte(`/\"'bfnrt`, c); i >= 0 {
				return (`/\"'` + "\b\f\n\r\t")[i : i+1], 2
			}
		}
	case s[0] == '%':
		if b, ok := hexAt(s, 1, 2); ok {
			return string([]byte{byte(b)}), 3
		}
	case s[0] == '&':
		if dec, n := entity(s); n > 0 {
			return dec, n
		}
	}
	return s[:1], 1
}

// unescape2 decodes an escape that is itself escaped, once (JSON in a
// JSON string, \\/ or \\u0026; a percent-encoded escape, %252F or
// %5Cu002F; an HTML-escaped one, &amp;#47;): the bytes the inner escape
// stands for, and the length of its writing in s; 0 when none starts s.
func unescape2(s string) (string, int) {
	// The inner escape's first byte is escaped itself (%25 for "%", \\
	// for "\"): otherwise it is an escape of one layer, or none.
	if d, n := unescape(s); n < 2 || len(d) != 1 || strings.IndexByte(`\%&`, d[0]) < 0 {
		return "", 0
	}
	var buf [16]byte
	var ends [16]int // ends[i]: where in s the byte inner[i] ends its outer escape, or -1 inside one
	inner, at := buf[:0], ends[:0]
	longest := 12 // the longest inner escape: \uD83D\uDE00; %XX 3, &...; 10
	for j := 0; j < len(s) && len(inner) < longest; {
		dec, n := unescape(s[j:])
		if len(inner)+len(dec) > len(buf) {
			break
		}
		for range len(dec) - 1 {
			at = append(at, -1)
		}
		inner = append(inner, dec...)
		j += n
		at = append(at, j)
		switch {
		case inner[0] == '%':
			longest = 3
		case inner[0] == '&':
			longest = 10
		case len(inner) >= 2 && inner[1] != 'u':
			longest = 4
		}
	}
	dec, m := unescape(string(inner))
	if m < 2 || at[m-1] < 0 {
		return "", 0
	}
	return dec, at[m-1]
}

// hexAt reads the n hex digits of s at i.
func hexAt(s string, i, n int) (uint64, bool) {
	if len(s) < i+n {
		return 0, false
	}
	for _, c := range []byte(s[i : i+n]) {
		if !isHex(c) {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(s[i:i+n], 16, 32)
	return v, err == nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// entities are the named HTML character references of printable ASCII
// characters that encoders write.
var entities = map[string]string{
	"amp": "&", "lt": "<", "gt": ">", "quot": `"`, "apos": "'", "sol": "/", "bsol": `\`, "equals": "=",
	"plus": "+", "colon": ":", "semi": ";", "num": "#", "excl": "!", "percnt": "%", "dollar": "$",
	"lpar": "(", "rpar": ")", "comma": ",", "period": ".", "quest": "?", "commat": "@", "lowbar": "_",
	"hat": "^", "grave": "`", "lcub": "{", "lbrace": "{", "rcub": "}", "rbrace": "}", "lsqb": "[",
	"lbrack": "[", "rsqb": "]", "rbrack": "]", "verbar": "|", "vert": "|", "tilde": "~", "ast": "*",
	"midast": "*", "nbsp": "\u00a0", "hyphen": "\u2010", "dash": "\u2010",
}

// entity decodes the character reference at the start of s (&#NN;,
// &#xHH;, the ; optional, or a named one).
func entity(s string) (string, int) {
	if len(s) > 2 && s[1] == '#' {
		i, base := 2, 10
		if s[2] == 'x' || s[2] == 'X' {
			i, base = 3, 16
		}
		j := i
		for j < len(s) && j < i+7 && (base == 16 && isHex(s[j]) || '0' <= s[j] && s[j] <= '9') {
			j++
		}
		v, err := strconv.ParseUint(s[i:j], base, 32)
		if j == i || err != nil || !utf8.ValidRune(rune(v)) {
			return "", 0
		}
		if j < len(s) && s[j] == ';' {
			j++
		}
		return string(rune(v)), j
	}
	semi := strings.IndexByte(s[:min(len(s), 10)], ';')
	if semi < 2 {
		return "", 0
	}
	if dec, ok := entities[strings.ToLower(s[1:semi])]; ok {
		return dec, semi + 1
	}
	return "", 0
}

// cutEscape reports whether s is the start of an escape cut short by the
// end of the text: "\", "\u00", "%4", "&#x2", "&am".
func cutEscape(s string) bool {
	switch {
	case len(s) == 0:
		return false
	case s[0] == '\\':
		return len(s) == 1 || (s[1] == 'u' && len(s) < 6 && allHex(s[2:])) || (s[1] == 'x' && len(s) < 4 && allHex(s[2:]))
	case s[0] == '%':
		return len(s) < 3 && allHex(s[1:])
	case s[0] == '&':
		return len(s) < 10 && !strings.ContainsAny(s, "; ")
	}
	return false
}

func allHex(s string) bool {
	for _, c := range []byte(s) {
		if !isHex(c) {
			return false
		}
	}
	return true
}
