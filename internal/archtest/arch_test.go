// Package archtest keeps the package dependency arrows of docs/design.md
// honest.
package archtest

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/shardd/shardd"

// deps returns the packages pkg depends on, directly or not.
func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", module+"/"+pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

func TestDependencyDirection(t *testing.T) {
	tests := []struct {
		pkg     string
		denied  []string // import path prefixes the package must not reach
		allowed []string // packages among the denied that it may reach
	}{
		// Strategies are pure: standard library only.
		{"pkg/shard", []string{module + "/", "go.etcd.io", "github.com", "gopkg.in"}, nil},
		{"pkg/schedule", []string{module + "/", "go.etcd.io", "gopkg.in"}, nil},
		{"pkg/selector", []string{module + "/", "go.etcd.io", "github.com", "gopkg.in"}, nil},
		// The step scheduler under the engine and the runtime: standard
		// library only.
		{"pkg/steps", []string{module + "/", "go.etcd.io", "github.com", "gopkg.in", "golang.org"}, nil},
		// Run logs are files: standard library and golang.org/x/sys only,
		// with the checks of who may have written a file (pkg/trust,
		// standard library only).
		{"pkg/runlog", []string{module + "/", "go.etcd.io", "github.com", "gopkg.in"}, []string{module + "/pkg/trust"}},
		{"pkg/trust", []string{module + "/", "go.etcd.io", "github.com", "gopkg.in", "golang.org"}, nil},
		{"pkg/config", []string{module + "/pkg/coord", module + "/pkg/embedetcd", "go.etcd.io", module + "/cmd"}, nil},
		// The runtime never uses the operator client, nor the operator
		// client the runtime: they share only the keyspace.
		{"pkg/coord", []string{module + "/cmd", module + "/pkg/embedetcd", "go.etcd.io/etcd/server", module + "/pkg/coord/admin"}, nil},
		{"pkg/coord/admin", []string{module + "/cmd", module + "/pkg/coord", module + "/pkg/engine", module + "/pkg/api", module + "/pkg/console", "go.etcd.io/etcd/server"},
			[]string{module + "/pkg/coord/keyspace"}},
		// The keyspace is keys and values: no etcd, no I/O, nothing of
		// shardd above the definitions it stores.
		{"pkg/coord/keyspace", []string{module + "/", "go.etcd.io", "google.golang.org"}, []string{module + "/pkg/config", module + "/pkg/schedule", module + "/pkg/selector", module + "/pkg/shard", module + "/pkg/runner"}},
		// Authentication knows tokens, sessions and requests: nothing of
		// the cluster, of etcd, or of the handlers it guards (see also
		// TestAuthImports).
		{"pkg/auth", []string{module + "/cmd", module + "/pkg/coord", module + "/pkg/api", module + "/pkg/console", module + "/pkg/engine", module + "/pkg/embedetcd", module + "/pkg/runlog", "go.etcd.io", "google.golang.org"}, nil},
		// The console acts through the API's endpoints, not its code;
		// both ask pkg/auth who is calling.
		{"pkg/console", []string{module + "/pkg/api", module + "/cmd"}, nil},
	}
	for _, tt := range tests {
		for _, d := range deps(t, tt.pkg) {
			if d == module+"/"+tt.pkg || slices.Contains(tt.allowed, d) {
				continue
			}
			for _, denied := range tt.denied {
				if strings.HasPrefix(d, denied) {
					t.Errorf("%s depends on %s", tt.pkg, d)
				}
			}
		}
	}
}

// pkg/auth imports the standard library and pkg/config (a token's name
// follows the rule of a job's name), nothing else.
func TestAuthImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{join .Imports " "}}`, module+"/pkg/auth").Output()
	if err != nil {
		t.Fatalf("go list pkg/auth: %v", err)
	}
	for _, imp := range strings.Fields(string(out)) {
		std := !strings.Contains(strings.SplitN(imp, "/", 2)[0], ".")
		if !std && imp != module+"/pkg/config" {
			t.Errorf("pkg/auth imports %s; it may import the standard library and pkg/config only", imp)
		}
	}
}

// Only pkg/coord, the runtime, and pkg/coord/admin, the operator client (and
// test helpers), talk to etcd through its client.
func TestOnlyCoordImportsEtcdClient(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"/...").Output()
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{module + "/pkg/coord": true, module + "/pkg/coord/admin": true, module + "/internal/etcdtest": true}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, "go.etcd.io/etcd/client/v3") && !allowed[fields[0]] {
				t.Errorf("%s imports %s; only pkg/coord and pkg/coord/admin may", fields[0], imp)
			}
		}
	}
}
