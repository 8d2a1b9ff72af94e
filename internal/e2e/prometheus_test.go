package e2e

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
)

// A real Prometheus (Debian's, installed by .ci/run) scrapes a 2-instance
// cluster; a query through its HTTP API shows the run counter rising, and
// promtool accepts the exposition.
func TestPrometheusScrapesTheCluster(t *testing.T) {
	parallel(t)
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not installed (.ci/run installs Debian's prometheus package)")
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not installed")
	}
	dir := t.TempDir()
	e := startEtcd(t)
	cfg := writeConfig(t, "ticks:2")
	// writeConfig's jobs have no cron; give this one a schedule.
	b, _ := os.ReadFile(cfg)
	os.WriteFile(cfg, []byte(strings.Replace(string(b), "    script:", "    cron: \"@every 1s\"\n    script:", 1)), 0o644)
	addrs := []string{etcdtest.FreeAddr(t), etcdtest.FreeAddr(t)}
	startShardd(t, e, "a", cfg, "--listen", addrs[0])
	startShardd(t, e, "b", cfg, "--listen", addrs[1])

	promCfg := filepath.Join(dir, "prometheus.yml")
	os.WriteFile(promCfg, []byte(fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
  - job_name: shardd
    static_configs: [{targets: [%q, %q]}]
`, addrs[0], addrs[1])), 0o644)
	web := etcdtest.FreeAddr(t)
	cmd := exec.Command(prom, "--config.file="+promCfg, "--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+web)
	logf, _ := os.Create(filepath.Join(dir, "prometheus.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("prometheus log:\n%s", b)
		}
	})

	query := func(q string) (float64, bool) {
		resp, err := httpGetQuiet("http://" + web + "/api/v1/query?query=" + url.QueryEscape(q))
		if err != nil {
			return 0, false
		}
		var r struct {
			Status string
			Data   struct {
				Result []struct {
					Value []any
				}
			}
		}
		if json.Unmarshal(resp, &r) != nil || r.Status != "success" || len(r.Data.Result) == 0 {
			return 0, false
		}
		v, err := strconv.ParseFloat(fmt.Sprint(r.Data.Result[0].Value[1]), 64)
		return v, err == nil
	}
	var first float64
	etcdtest.Eventually(t, 60*time.Second, "Prometheus to scrape runs from both instances", func() bool {
		n, ok := query(`count(shardd_items_owned{shardd_job="ticks"} == 1)`)
		v, ok2 := query(`sum(shardd_runs_total{shardd_job="ticks",result="success"})`)
		first = v
		return ok && ok2 && n == 2 && v > 0
	})
	etcdtest.Eventually(t, 30*time.Second, "the run counter to rise", func() bool {
		v, ok := query(`sum(shardd_runs_total{shardd_job="ticks",result="success"})`)
		return ok && v >= first+4
	})
	if v, ok := query(`count(up{job="shardd"} == 1)`); !ok || v != 2 {
		t.Errorf("up targets: %v", v)
	}

	body, err := httpGetQuiet("http://" + addrs[0] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	check := exec.Command(promtool, "check", "metrics")
	check.Stdin = strings.NewReader(string(body))
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s", err, out)
	}
}
