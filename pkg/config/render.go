package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Rendering a definition back into the YAML a file (or shardd apply)
// accepts, and comparing two definitions field by field. Both work on a
// definition's canonical JSON (Job.JSON), in its fields' order, written
// the way a file writes them: a command as a list or a string, item
// parameters as "0=a,1=b", and the fields that hold their default left out.

// YAML renders jobs as a file of job definitions ("jobs:" and a list):
// parsed again, each job has the same Hash.
func YAML(jobs ...*Job) []byte {
	list := &yaml.Node{Kind: yaml.SequenceNode}
	for _, j := range jobs {
		list.Content = append(list.Content, j.yamlNode())
	}
	doc := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{scalar("jobs"), list}}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		panic(fmt.Sprintf("config: render %d jobs: %v", len(jobs), err)) // a node tree of scalars always encodes
	}
	return b.Bytes()
}

// yamlNode is j as a YAML mapping, without the fields the parser would
// give the same value anyway (defaults, and what it derives: a strategy
// for the item count, a run log's bound from the total).
func (j *Job) yamlNode() *yaml.Node {
	d := DefaultJob()
	defaults := fieldMap(d.JSON())
	n := &yaml.Node{Kind: yaml.MappingNode}
	for _, f := range orderedFields(j.JSON()) {
		switch {
		case f.key == "overwrite" && string(f.value) == "false":
			continue
		case f.key != "name" && f.key != "overwrite" && defaults[f.key] != nil && bytes.Equal(defaults[f.key], f.value):
			continue
		}
		n.Content = append(n.Content, scalar(f.key), valueNode(f.key, f.value))
	}
	if len(j.DependsOn) == 0 { // a child alone does not parse: its parents are elsewhere
		minimize(n, n, j.Hash())
	}
	return n
}

// minimize drops each field of m (a mapping within root, the job's) whose
// absence leaves the job's hash as it is, depth first.
func minimize(root, m *yaml.Node, hash string) {
	for i := 0; i+1 < len(m.Content); {
		key, val := m.Content[i], m.Content[i+1]
		if m == root && (key.Value == "name" || key.Value == "overwrite") {
			i += 2
			continue
		}
		if val.Kind == yaml.MappingNode {
			minimize(root, val, hash)
		}
		m.Content = append(m.Content[:i:i], m.Content[i+2:]...)
		if sameHash(root, hash) {
			continue // dropped
		}
		m.Content = append(m.Content[:i], append([]*yaml.Node{key, val}, m.Content[i:]...)...)
		i += 2
	}
}

// sameHash reports whether the job mapping root parses to a job of hash.
func sameHash(root *yaml.Node, hash string) bool {
	doc := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{scalar("jobs"), {Kind: yaml.SequenceNode, Content: []*yaml.Node{root}}}}
	b, err := yaml.Marshal(doc)
	if err != nil {
		return false
	}
	c, err := ParseWithoutEnv("render", b)
	return err == nil && len(c.Jobs) == 1 && c.Jobs[0].Hash() == hash
}

type field struct {
	key   string
	value json.RawMessage
}

// orderedFields are the members of a JSON object, in their order.
func orderedFields(obj []byte) []field {
	dec := json.NewDecoder(bytes.NewReader(obj))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil
	}
	var out []field
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return out
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return out
		}
		out = append(out, field{key: t.(string), value: v})
	}
	return out
}

func fieldMap(obj []byte) map[string]json.RawMessage {
	m := map[string]json.RawMessage{}
	for _, f := range orderedFields(obj) {
		m[f.key] = f.value
	}
	return m
}

// valueNode is the YAML of a field's JSON value; key is its name (a
// command is written as a file writes it, item parameters as a string).
func valueNode(key string, v json.RawMessage) *yaml.Node {
	v = bytes.TrimSpace(v)
	switch {
	case len(v) > 0 && v[0] == '{':
		fs := orderedFields(v)
		if c, ok := commandValue(fs); ok {
			return c
		}
		if key == "shardingItemParameters" {
			if p, ok := itemParams(fs); ok {
				return scalar(p)
			}
		}
		n := &yaml.Node{Kind: yaml.MappingNode}
		if key == "env" || key == "headers" {
			n.Style = 0
		}
		for _, f := range fs {
			n.Content = append(n.Content, scalar(f.key), valueNode(f.key, f.value))
		}
		return n
	case len(v) > 0 && v[0] == '[':
		var items []json.RawMessage
		json.Unmarshal(v, &items)
		n := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
		for _, it := range items {
			if bytes.HasPrefix(bytes.TrimSpace(it), []byte("{")) {
				n.Style = 0
			}
			n.Content = append(n.Content, valueNode("", it))
		}
		return n
	case len(v) > 0 && v[0] == '"':
		var s string
		json.Unmarshal(v, &s)
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
	default: // numbers, booleans, null
		return &yaml.Node{Kind: yaml.ScalarNode, Value: string(v)}
	}
}

// commandValue is a Command ({"argv": [...]} or {"shell": "..."}) as a file
// writes it: a list, or a string.
func commandValue(fs []field) (*yaml.Node, bool) {
	if len(fs) != 1 {
		return nil, false
	}
	switch fs[0].key {
	case "argv":
		var argv []string
		if json.Unmarshal(fs[0].value, &argv) != nil {
			return nil, false
		}
		n := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
		for _, a := range argv {
			n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: a})
		}
		return n, true
	case "shell":
		var s string
		if json.Unmarshal(fs[0].value, &s) != nil {
			return nil, false
		}
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}, true
	}
	return nil, false
}

// itemParams writes {"0": "a", "1": "b"} as "0=a,1=b", by item; false
// when a value would not read back from that form (a comma, spaces at its
// ends): the mapping form is written then.
func itemParams(fs []field) (string, bool) {
	type kv struct {
		item int
		val  string
	}
	var all []kv
	for _, f := range fs {
		i, _ := strconv.Atoi(f.key)
		var s string
		json.Unmarshal(f.value, &s)
		if s == "" || strings.Contains(s, ",") || strings.TrimSpace(s) != s {
			return "", false
		}
		all = append(all, kv{i, s})
	}
	slices.SortFunc(all, func(a, b kv) int { return a.item - b.item })
	parts := make([]string, len(all))
	for i, p := range all {
		parts[i] = strconv.Itoa(p.item) + "=" + p.val
	}
	return strings.Join(parts, ","), true
}

func scalar(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: s} }

// FieldChange is one difference between two definitions of a job: the
// field's path (as a file names it: "script.command", "logRetention.maxAge")
// and its values, as YAML would write them ("" when absent).
type FieldChange struct {
	Field string `json:"field"`
	Old   string `json:"old"`
	New   string `json:"new"`
}

func (c FieldChange) String() string {
	switch {
	case c.Old == "":
		return fmt.Sprintf("%s: + %s", c.Field, c.New)
	case c.New == "":
		return fmt.Sprintf("%s: - %s", c.Field, c.Old)
	}
	return fmt.Sprintf("%s: %s -> %s", c.Field, c.Old, c.New)
}

// Diff lists what changes from a to b, field by field, in b's field order
// (then a's fields b lacks); nil a: every field of b is new. Overwrite is
// left out, as in Hash.
func Diff(a, b *Job) []FieldChange {
	var old, cur []leaf
	if a != nil {
		old = leaves("", a.JSON())
	}
	if b != nil {
		cur = leaves("", b.JSON())
	}
	oldAt := map[string]string{}
	for _, l := range old {
		oldAt[l.path] = l.text
	}
	seen := map[string]bool{}
	var out []FieldChange
	for _, l := range cur {
		seen[l.path] = true
		if o := oldAt[l.path]; o != l.text {
			out = append(out, FieldChange{l.path, o, l.text})
		}
	}
	for _, l := range old {
		if !seen[l.path] {
			out = append(out, FieldChange{l.path, l.text, ""})
		}
	}
	return out
}

type leaf struct{ path, text string }

// leaves flattens a definition's JSON into fields and their values as
// YAML writes them; commands, item parameters and lists are one field each.
func leaves(prefix string, obj []byte) []leaf {
	var out []leaf
	for _, f := range orderedFields(obj) {
		if f.key == "overwrite" {
			continue
		}
		path := f.key
		if prefix != "" {
			path = prefix + "." + f.key
		}
		v := bytes.TrimSpace(f.value)
		if len(v) > 0 && v[0] == '{' {
			fs := orderedFields(v)
			if _, ok := commandValue(fs); !ok {
				out = append(out, leaves(path, v)...)
				continue
			}
		}
		out = append(out, leaf{path, inlineYAML(valueNode(f.key, v))})
	}
	return out
}

// inlineYAML writes a value node on one line.
func inlineYAML(n *yaml.Node) string {
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		n.Style = yaml.FlowStyle
	}
	b, err := yaml.Marshal(n)
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}
