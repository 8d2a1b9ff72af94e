package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
)

// status says how each job's runs go, beside its map: a job whose every
// run fails is FAILING (with how many in a row, and the line it wrote),
// one whose item runs now says where and since when, a healthy one is OK;
// --failing and --running keep those jobs.
func TestStatusShowsHealth(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	e := startEtcd(t)
	cfg := filepath.Join(dir, "jobs.yaml")
	os.WriteFile(cfg, []byte(`jobs:
  - name: fails
    cron: "@every 1s"
    script: 'echo "db timeout for AMER" >&2; exit 3'
  - name: long
    cron: "@every 1s"
    script: 'sleep 60'
  - name: fine
    cron: "@every 1s"
    script: 'true'
`), 0o644)
	startShardd(t, e, "a", cfg, "--label", "role=db,zone=a")
	var st admin.ClusterStatus
	health := map[string]*admin.Health{}
	etcdtest.Eventually(t, 20*time.Second, "the jobs' health", func() bool {
		_, out, _ := logsCLI(t, e, nil, "status", "-o", "json")
		if json.Unmarshal([]byte(out), &st) != nil {
			return false
		}
		for _, j := range st.Jobs {
			health[j.Name] = j.Health
		}
		h := health["fails"]
		return h != nil && h.State == admin.HealthFailing && h.Failing[0].InARow >= 2 && health["long"] != nil && len(health["long"].Running) == 1 &&
			health["fine"] != nil && !health["fine"].LastSuccess.IsZero()
	})
	if len(st.Instances) != 1 || st.Instances[0].Labels["role"] != "db" || st.Instances[0].Labels["zone"] != "a" {
		t.Errorf("the instance's labels: %+v", st.Instances)
	}
	if h := health["fine"]; h.State != admin.HealthOK {
		t.Errorf("fine: %+v", h)
	}
	if r := health["long"].Running[0]; r.Instance != "a" || r.Fence == 0 || r.Since.IsZero() {
		t.Errorf("long's run: %+v", r)
	}
	code, out, _ := logsCLI(t, e, nil, "status")
	for _, want := range []string{"HEALTH", "role=db,zone=a", "FAILING 1/1", "failing: item 0, its last ", "FAILED since", "db timeout for AMER", "running: item 0 on a, since ", "last success: "} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("status: no %q (exit %d):\n%s", want, code, out)
		}
	}
	only := func(flag string) []string {
		var got admin.ClusterStatus
		_, out, _ := logsCLI(t, e, nil, "status", flag, "-o", "json")
		json.Unmarshal([]byte(out), &got)
		var names []string
		for _, j := range got.Jobs {
			names = append(names, j.Name)
		}
		return names
	}
	if got := only("--failing"); len(got) != 1 || got[0] != "fails" {
		t.Errorf("status --failing: %v", got)
	}
	if got := only("--running"); len(got) != 1 || got[0] != "long" {
		t.Errorf("status --running: %v", got)
	}
}
