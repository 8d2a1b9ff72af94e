// Package selector parses and matches label selectors, in the syntax of
// Kubernetes' (the one operators know):
//
//	role=db                 the label is there, with that value (== too)
//	zone!=c                 it is not (or the label is missing)
//	zone in (a,b)           its value is one of these
//	tier notin (batch)      it is none of these (or the label is missing)
//	gpu                     the label is there, whatever its value
//	!spot                   the label is missing
//
// Requirements are joined by commas, all of which must hold; the empty
// selector matches everything. Keys are an optional DNS-subdomain prefix
// and a slash, then a name of letters, digits, '-', '_' and '.', starting
// and ending with a letter or digit, at most 63 bytes; values are the same
// kind of name, or empty. Errors name the position at fault. No I/O, no
// state: parsing and matching are pure.
package selector

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Op is a requirement's operator.
type Op string

// The operators.
const (
	Equals    Op = "="
	NotEquals Op = "!="
	In        Op = "in"
	NotIn     Op = "notin"
	Exists    Op = "exists"
	NotExists Op = "!"
)

// Requirement is one condition on one label.
type Requirement struct {
	Key    string
	Op     Op
	Values []string // one for Equals and NotEquals, sorted for In and NotIn
}

// Selector is requirements that must all hold.
type Selector []Requirement

// Matches reports whether labels meet r.
func (r Requirement) Matches(labels map[string]string) bool {
	v, has := labels[r.Key]
	switch r.Op {
	case Equals:
		return has && v == r.Values[0]
	case NotEquals:
		return !has || v != r.Values[0]
	case In:
		return has && slices.Contains(r.Values, v)
	case NotIn:
		return !has || !slices.Contains(r.Values, v)
	case Exists:
		return has
	case NotExists:
		return !has
	}
	return false
}

// Matches reports whether labels meet every requirement of s.
func (s Selector) Matches(labels map[string]string) bool {
	for _, r := range s {
		if !r.Matches(labels) {
			return false
		}
	}
	return true
}

// String is s in its canonical form: requirements sorted by key, values
// sorted, single spaces.
func (s Selector) String() string {
	parts := make([]string, len(s))
	for i, r := range s {
		switch r.Op {
		case Equals, NotEquals:
			parts[i] = r.Key + string(r.Op) + r.Values[0]
		case In, NotIn:
			parts[i] = r.Key + " " + string(r.Op) + " (" + strings.Join(r.Values, ",") + ")"
		case Exists:
			parts[i] = r.Key
		case NotExists:
			parts[i] = "!" + r.Key
		}
	}
	return strings.Join(parts, ",")
}

// maxName bounds a name (a key's, without its prefix, or a value).
const maxName = 63

// Parse reads a selector.
func Parse(text string) (Selector, error) {
	p := &parser{s: text}
	var sel Selector
	p.space()
	if p.done() {
		return sel, nil
	}
	for {
		r, err := p.requirement()
		if err != nil {
			return nil, err
		}
		sel = append(sel, r)
		p.space()
		if p.done() {
			break
		}
		if !p.eat(",") {
			return nil, p.errorf("want a comma between requirements")
		}
		p.space()
	}
	sort.SliceStable(sel, func(i, j int) bool { return sel[i].Key < sel[j].Key })
	return sel, nil
}

type parser struct {
	s   string
	pos int
}

func (p *parser) done() bool { return p.pos >= len(p.s) }

func (p *parser) space() {
	for !p.done() && (p.s[p.pos] == ' ' || p.s[p.pos] == '\t') {
		p.pos++
	}
}

func (p *parser) eat(tok string) bool {
	if strings.HasPrefix(p.s[p.pos:], tok) {
		p.pos += len(tok)
		return true
	}
	return false
}

func (p *parser) errorf(format string, a ...any) error {
	return fmt.Errorf("selector %q, at %d: %s", p.s, p.pos+1, fmt.Sprintf(format, a...))
}

// word reads the longest run of name characters (and '/' for keys).
func (p *parser) word(key bool) string {
	start := p.pos
	for !p.done() {
		c := p.s[p.pos]
		if isAlnum(c) || c == '-' || c == '_' || c == '.' || key && c == '/' {
			p.pos++
			continue
		}
		break
	}
	return p.s[start:p.pos]
}

func (p *parser) requirement() (Requirement, error) {
	if p.eat("!") {
		p.space()
		at := p.pos
		key := p.word(true)
		if err := CheckKey(key); err != nil {
			p.pos = at
			return Requirement{}, p.errorf("%v", err)
		}
		return Requirement{Key: key, Op: NotExists}, nil
	}
	at := p.pos
	key := p.word(true)
	if err := CheckKey(key); err != nil {
		p.pos = at
		return Requirement{}, p.errorf("%v", err)
	}
	p.space()
	switch {
	case p.done() || p.s[p.pos] == ',':
		return Requirement{Key: key, Op: Exists}, nil
	case p.eat("!="):
		v, err := p.value()
		return Requirement{Key: key, Op: NotEquals, Values: []string{v}}, err
	case p.eat("=="), p.eat("="):
		v, err := p.value()
		return Requirement{Key: key, Op: Equals, Values: []string{v}}, err
	}
	opAt := p.pos
	switch op := Op(p.word(false)); op {
	case In, NotIn:
		vs, err := p.set()
		return Requirement{Key: key, Op: op, Values: vs}, err
	default:
		p.pos = opAt
		return Requirement{}, p.errorf("want =, ==, !=, in or notin after %q", key)
	}
}

func (p *parser) value() (string, error) {
	p.space()
	at := p.pos
	v := p.word(false)
	if err := CheckValue(v); err != nil {
		p.pos = at
		return "", p.errorf("%v", err)
	}
	return v, nil
}

func (p *parser) set() ([]string, error) {
	p.space()
	if !p.eat("(") {
		return nil, p.errorf("want ( and the values")
	}
	var vs []string
	for {
		p.space()
		at := p.pos
		v := p.word(false)
		if err := checkName("label value", v); err != nil { // a set's values are not empty
			p.pos = at
			return nil, p.errorf("%v", err)
		}
		vs = append(vs, v)
		p.space()
		if p.eat(")") {
			break
		}
		if !p.eat(",") {
			return nil, p.errorf("want , or ) in the values")
		}
	}
	slices.Sort(vs)
	return slices.Compact(vs), nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// checkName checks a name: 1-63 letters, digits, '-', '_', '.', starting
// and ending with a letter or digit.
func checkName(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("want a %s", what)
	case len(s) > maxName:
		return fmt.Errorf("%s %q is longer than %d bytes", what, s, maxName)
	case !isAlnum(s[0]) || !isAlnum(s[len(s)-1]):
		return fmt.Errorf("%s %q must start and end with a letter or digit", what, s)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '-' && c != '_' && c != '.' {
			return fmt.Errorf("%s %q may hold only letters, digits, '-', '_' and '.'", what, s)
		}
	}
	return nil
}

// CheckKey checks a label key: [prefix/]name, the prefix a DNS subdomain
// of at most 253 bytes.
func CheckKey(k string) error {
	prefix, name, slashed := strings.Cut(k, "/")
	if !slashed {
		return checkName("label key", k)
	}
	if prefix == "" || len(prefix) > 253 || strings.Contains(name, "/") {
		return fmt.Errorf("label key %q: want prefix/name, the prefix a DNS name", k)
	}
	for _, part := range strings.Split(prefix, ".") {
		if err := checkName("label key prefix", part); err != nil || strings.Contains(part, "_") {
			return fmt.Errorf("label key %q: its prefix %q is not a DNS name", k, prefix)
		}
	}
	return checkName("label key", name)
}

// CheckValue checks a label value: empty, or a name.
func CheckValue(v string) error {
	if v == "" {
		return nil
	}
	return checkName("label value", v)
}

// ParseLabel reads a label as given to shardd run --label: KEY=VALUE.
func ParseLabel(s string) (key, value string, err error) {
	k, v, ok := strings.Cut(s, "=")
	if !ok {
		return "", "", fmt.Errorf("label %q: want KEY=VALUE", s)
	}
	if err := CheckKey(k); err != nil {
		return "", "", err
	}
	if err := CheckValue(v); err != nil {
		return "", "", err
	}
	return k, v, nil
}
