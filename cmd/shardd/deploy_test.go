package main

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// runFlagNames lists the flags of `shardd run`, from its help.
func runFlagNames(t *testing.T) map[string]bool {
	var out, errOut bytes.Buffer
	if code := run([]string{"run", "--help"}, &env{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}); code != 0 {
		t.Fatalf("run --help: exit %d", code)
	}
	names := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^  -([a-z-]+)`).FindAllStringSubmatch(errOut.String(), -1) {
		names[m[1]] = true
	}
	if len(names) < 10 {
		t.Fatalf("found only %d flags in:\n%s", len(names), errOut.String())
	}
	return names
}

func checkEnv(t *testing.T, where, key string, flags map[string]bool) {
	name, ok := strings.CutPrefix(key, "SHARDD_")
	if !ok {
		return
	}
	flag := strings.ToLower(strings.ReplaceAll(name, "_", "-"))
	if !flags[flag] {
		t.Errorf("%s sets %s, but shardd run has no --%s", where, key, flag)
	}
}

func checkArgs(t *testing.T, where string, args []string) {
	var out bytes.Buffer
	if code := run(append(append([]string(nil), args...), "--help"), &env{stdout: &out, stderr: &out, getenv: func(string) string { return "" }}); code != 0 {
		t.Errorf("%s runs shardd %v, which shardd rejects:\n%s", where, args, out.String())
	}
}

// The deployment files only use commands, flags and variables shardd has.
func TestDeployFilesUseRealFlags(t *testing.T) {
	flags := runFlagNames(t)

	for _, file := range []string{"docker-compose.yml", "docker-compose.embedded.yml"} {
		var compose struct {
			Services map[string]struct {
				Build       any               `yaml:"build"`
				Entrypoint  []string          `yaml:"entrypoint"`
				Command     []string          `yaml:"command"`
				Environment map[string]string `yaml:"environment"`
			} `yaml:"services"`
		}
		b, err := os.ReadFile("../../" + file)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(b, &compose); err != nil {
			t.Fatal(err)
		}
		shardds := 0
		for name, svc := range compose.Services {
			if svc.Build == nil || len(svc.Entrypoint) > 0 { // not shardd run (the embedded file's ca: a shell)
				continue
			}
			shardds++
			checkArgs(t, file+" service "+name, svc.Command)
			for k := range svc.Environment {
				checkEnv(t, file+" service "+name, k, flags)
			}
		}
		if shardds != 3 {
			t.Errorf("%s has %d shardd services, want 3", file, shardds)
		}
	}

	env, err := os.ReadFile("../../systemd/shardd.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(env), "\n") {
		line = strings.TrimPrefix(strings.TrimSpace(line), "#")
		if k, _, ok := strings.Cut(line, "="); ok && !strings.Contains(k, " ") {
			checkEnv(t, "systemd/shardd.env", k, flags)
		}
	}

	docker, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^CMD (\[.*\])$`).FindSubmatch(docker)
	var cmd []string
	if m == nil || json.Unmarshal(m[1], &cmd) != nil {
		t.Fatal("Dockerfile has no CMD in JSON form")
	}
	checkArgs(t, "Dockerfile CMD", cmd)

	unit, err := os.ReadFile("../../systemd/shardd.service")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "ExecStart=/usr/local/bin/shardd run\n") {
		t.Error("the unit does not start `shardd run`")
	}
}
