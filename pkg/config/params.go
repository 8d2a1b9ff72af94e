package config

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// ItemParameters maps shard items to their parameter.
type ItemParameters map[int]string

// ParseItemParameters parses ElasticJob's shardingItemParameters string,
// "0=Beijing,1=Shanghai,2=Guangzhou": comma-separated item=value pairs,
// spaces around items and values trimmed. A value runs to the next comma, so
// it may contain "=" but not ","; for values with commas use the YAML
// mapping form. An empty string means no parameters.
func ParseItemParameters(s string) (ItemParameters, error) {
	out := ItemParameters{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(part, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || v == "" {
			return nil, fmt.Errorf("%q is not item=value (want like \"0=Beijing,1=Shanghai\")", strings.TrimSpace(part))
		}
		item, err := strconv.Atoi(k)
		if err != nil || item < 0 {
			return nil, fmt.Errorf("item %q in %q is not a non-negative integer", k, strings.TrimSpace(part))
		}
		if _, dup := out[item]; dup {
			return nil, fmt.Errorf("item %d is given twice", item)
		}
		out[item] = v
	}
	return out, nil
}

// String formats p in ElasticJob's form, items ascending.
func (p ItemParameters) String() string {
	var b strings.Builder
	for i, item := range p.Items() {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d=%s", item, p[item])
	}
	return b.String()
}

// Items returns the items that have a parameter, ascending.
func (p ItemParameters) Items() []int {
	items := make([]int, 0, len(p))
	for item := range p {
		items = append(items, item)
	}
	sort.Ints(items)
	return items
}

// decodeNode reads the ElasticJob string form or a YAML mapping of item to value.
func (p *ItemParameters) decodeNode(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		if isNull(n) {
			*p = nil
			return nil
		}
		v, err := ParseItemParameters(n.Value)
		if err != nil {
			return err
		}
		*p = v
		return nil
	case yaml.MappingNode:
		out := ItemParameters{}
		for _, kv := range pairs(n) {
			item, err := strconv.Atoi(kv.key.Value)
			if err != nil || item < 0 {
				return fmt.Errorf("key %q is not a non-negative item number", kv.key.Value)
			}
			if _, dup := out[item]; dup {
				return fmt.Errorf("item %d is given twice", item)
			}
			if kv.value.Kind != yaml.ScalarNode {
				return fmt.Errorf("item %d: value must be a string, got %s", item, kindName(kv.value))
			}
			out[item] = kv.value.Value
		}
		*p = out
		return nil
	}
	return fmt.Errorf("must be a string like \"0=a,1=b\" or a mapping of item to value, got %s", kindName(n))
}

// decodeNode reads an argv list or a shell string.
func (c *Command) decodeNode(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		if isNull(n) {
			return errors.New("is empty")
		}
		*c = Command{Shell: n.Value}
		return nil
	case yaml.SequenceNode:
		argv := make([]string, 0, len(n.Content))
		for _, a := range n.Content {
			a = resolve(a)
			if a.Kind != yaml.ScalarNode || isNull(a) {
				return fmt.Errorf("argument %d must be a string, got %s", len(argv), kindName(a))
			}
			argv = append(argv, a.Value)
		}
		*c = Command{Argv: argv}
		return nil
	}
	return fmt.Errorf("must be an argv list or a shell string, got %s", kindName(n))
}

// shorthandField lets `script: [argv...]` and `script: "shell string"` stand for `script: {command: ...}`.
func (*Script) shorthandField() string { return "command" }
