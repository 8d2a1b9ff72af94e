// Package archtest keeps the package dependency arrows of DESIGN.md honest.
package archtest

import (
	"os/exec"
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
		pkg    string
		denied []string // import path prefixes the package must not reach
	}{
		// Strategies are pure: standard library only.
		{"pkg/shard", []string{module + "/", "go.etcd.io", "github.com", "gopkg.in"}},
		{"pkg/schedule", []string{module + "/", "go.etcd.io", "gopkg.in"}},
		// Run logs are files: standard library only.
		{"pkg/runlog", []string{module + "/", "go.etcd.io", "github.com", "gopkg.in"}},
		{"pkg/config", []string{module + "/pkg/coord", module + "/pkg/embedetcd", "go.etcd.io", module + "/cmd"}},
		{"pkg/coord", []string{module + "/cmd", module + "/pkg/embedetcd", "go.etcd.io/etcd/server"}},
	}
	for _, tt := range tests {
		for _, d := range deps(t, tt.pkg) {
			if d == module+"/"+tt.pkg {
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

// Only pkg/coord (and test helpers) talk to etcd through its client.
func TestOnlyCoordImportsEtcdClient(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"/...").Output()
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{module + "/pkg/coord": true, module + "/internal/etcdtest": true}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, "go.etcd.io/etcd/client/v3") && !allowed[fields[0]] {
				t.Errorf("%s imports %s; only pkg/coord may", fields[0], imp)
			}
		}
	}
}
