package config

import (
	"strings"
	"testing"
)

// What YAML renders parses again into the same definitions, for every job
// of the example file and of the tests' good file (every field there is).
func TestYAMLRoundTrips(t *testing.T) {
	for _, path := range []string{"../../jobs.example.yaml", "testdata/good.yaml"} {
		c, err := LoadWithoutEnv(path)
		if err != nil {
			t.Fatal(err)
		}
		out := YAML(c.Jobs...)
		again, err := ParseWithoutEnv("rendered.yaml", out)
		if err != nil {
			t.Fatalf("%s: the rendered YAML does not parse: %v\n%s", path, err, out)
		}
		if len(again.Jobs) != len(c.Jobs) {
			t.Fatalf("%s: %d jobs rendered, %d parsed", path, len(c.Jobs), len(again.Jobs))
		}
		for i, j := range c.Jobs {
			if got := again.Jobs[i]; got.Hash() != j.Hash() {
				t.Errorf("%s: job %s: rendered and parsed again, it differs: %v\n%s", path, j.Name, Diff(j, got), YAML(j))
			}
		}
	}
}

// Defaults are left out; a command is written as a file writes it.
func TestYAMLIsWhatAFileWouldSay(t *testing.T) {
	c, err := Parse("t.yaml", []byte("jobs:\n  - name: a\n    cron: \"0 * * * * ?\"\n    shardingTotalCount: 2\n    shardingItemParameters: \"1=b,0=a\"\n    script: [/bin/echo, hi]\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := string(YAML(c.Jobs...))
	for _, want := range []string{"name: a\n", "shardingTotalCount: 2\n", "shardingItemParameters: 0=a,1=b\n", "command: [/bin/echo, hi]\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("rendered YAML lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{"misfire", "retries", "timeZone", "overwrite"} {
		if strings.Contains(got, unwanted) {
			t.Errorf("rendered YAML has %s, at its default:\n%s", unwanted, got)
		}
	}
}

func TestDiff(t *testing.T) {
	parse := func(fields string) *Job {
		c, err := Parse("t.yaml", []byte("jobs:\n  - name: a\n    "+strings.ReplaceAll(fields, "\n", "\n    ")+"\n"))
		if err != nil {
			t.Fatal(err)
		}
		return c.Jobs[0]
	}
	base := parse("cron: \"0 * * * * ?\"\nscript: [/bin/true]")
	tests := []struct {
		name string
		a, b *Job
		want []string
	}{
		{"same", base, parse("cron: \"0 * * * * ?\"\nscript: [/bin/true]"), nil},
		{"a scalar", base, parse("cron: \"0 */5 * * * ?\"\nscript: [/bin/true]"), []string{`cron: 0 * * * * ? -> 0 */5 * * * ?`}},
		{"a command", base, parse("cron: \"0 * * * * ?\"\nscript: [/bin/false, x]"), []string{`script.command: [/bin/true] -> [/bin/false, x]`}},
		{"a field added", base, parse("cron: \"0 * * * * ?\"\nscript: {command: [/bin/true], env: {A: b}}"), []string{`script.env.A: + b`}},
		{"a field removed", parse("cron: \"0 * * * * ?\"\nscript: [/bin/true]\ninstances: {selector: role=db}"), base, []string{`instances.selector: - role=db`}},
		{"new job", nil, base, []string{"name: + a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			for _, c := range Diff(tt.a, tt.b) {
				got = append(got, c.String())
			}
			if tt.name == "new job" {
				if len(got) == 0 || got[0] != tt.want[0] {
					t.Errorf("got %q, want it to start with %q", got, tt.want)
				}
				return
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}
