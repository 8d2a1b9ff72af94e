package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/shardd/shardd/internal/browsertest"
	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// The definition editor in a real browser, for a define login: a new job
// with a typo shows the problem at its line (the line marked, a click
// selects it); fixed, its check shows what saving creates; saved, it runs;
// an edit shows its diff and, saved, changes what runs; a rollback from the
// version list brings the first definition back.
func TestDefinitionEditorInABrowser(t *testing.T) {
	parallel(t)
	dir := t.TempDir()
	e := startEtcd(t)
	etcd := e.client()
	empty := filepath.Join(dir, "empty.yaml")
	os.WriteFile(empty, []byte("jobs: []\n"), 0o644)
	tokens := filepath.Join(dir, "tokens")
	os.WriteFile(tokens, []byte("alice write "+aliceSecret+"\ndana define "+defineSecret+"\n"), 0o600)
	api := etcdtest.FreeAddr(t)
	startShardd(t, e, "a", empty, "--accept-applied", "--label", "role=worker", "--listen", api, "--api-token-file", tokens)
	base := "http://" + api
	ledger := filepath.Join(dir, "ledger")
	job := func(version, typo string) string {
		return "jobs:\n  - name: etl\n    cron: \"* * * * * ?\"\n    shardingTotal" + typo + ": 2\n" +
			"    instances:\n      selector: \"role=worker\"\n" +
			"    script: [/bin/sh, -c, 'echo " + version + " $SHARDD_ITEM >> " + ledger + "']\n"
	}
	ran := func(version string) func() bool {
		return func() bool {
			data, _ := os.ReadFile(ledger)
			lines := strings.Split(strings.TrimSpace(string(data)), "\n")
			return len(lines) > 0 && strings.HasPrefix(lines[len(lines)-1], version+" ")
		}
	}

	ctx := browsertest.New(t, browsertest.WithTimeout(3*time.Minute), browsertest.WithWindowSize(1280, 1000))
	d := acceptDialogs(t, ctx)
	browsertest.Do(t, ctx,
		chromedp.Navigate(base+"/login"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), defineSecret),
		chromedp.Click(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#who")),
		chromedp.Navigate(base+"/jobs"),
		chromedp.WaitVisible(chromedp.CSS("#new-job")), // no job yet: no table of them
		chromedp.Click(chromedp.CSS("#new-job")),
		chromedp.WaitVisible(chromedp.CSS("#def-yaml")),
	)

	// A typo: the problem at line 4, the line marked in the gutter, and a
	// click on it selects that line in the text.
	browsertest.Do(t, ctx,
		chromedp.SetValue(chromedp.CSS("#def-yaml"), job("v1", "Cont")),
		chromedp.Click(chromedp.CSS("#def-check")),
	)
	problems := waitText(t, ctx, "#def-problems", "line 4", 10*time.Second)
	if !strings.Contains(problems, "unknown field shardingTotalCont (did you mean shardingTotalCount?)") {
		t.Errorf("problems: %q", problems)
	}
	if cls := browsertest.Run(t, ctx, chromedp.Evaluate[string](`document.getElementById("line-4").className`)); cls != "bad-line" {
		t.Errorf("gutter line 4 has class %q, want bad-line", cls)
	}
	browsertest.Do(t, ctx, chromedp.Click(chromedp.CSS("#def-problems button.line")))
	if sel := browsertest.Run(t, ctx, chromedp.Evaluate[string](`(() => { const t = document.getElementById("def-yaml"); return t.value.slice(t.selectionStart, t.selectionEnd); })()`)); sel != "    shardingTotalCont: 2" {
		t.Errorf("the problem's line button selected %q, want line 4", sel)
	}
	if disabled := browsertest.Run(t, ctx, chromedp.Evaluate[bool](`document.getElementById("def-save").disabled`)); !disabled {
		t.Error("Save is enabled for a text with problems")
	}
	browsertest.Screenshot(t, ctx, "editor-problem")

	// Fixed: the check shows what saving creates; saving runs it.
	browsertest.Do(t, ctx,
		chromedp.SetValue(chromedp.CSS("#def-yaml"), job("v1", "Count")),
		chromedp.Click(chromedp.CSS("#def-check")),
	)
	waitText(t, ctx, "#flash", "would be created", 10*time.Second)
	if diff := text(t, ctx, "#def-diff"); !strings.Contains(diff, "shardingTotalCount") || !strings.Contains(diff, "instances.selector") {
		t.Errorf("the diff of a new job: %q", diff)
	}
	browsertest.Do(t, ctx, chromedp.Click(chromedp.CSS("#def-save")))
	browsertest.Do(t, ctx, chromedp.WaitVisible(chromedp.CSS("#versions")))
	waitText(t, ctx, "#flash", "saved as version 1", 10*time.Second)
	if q := d.last(); !strings.Contains(q, "Save job etl?") {
		t.Errorf("the save's confirmation asked %q", q)
	}
	etcdtest.Eventually(t, 20*time.Second, "etl to run v1", ran("v1"))

	// An edit: its diff first, then saved, what runs changes.
	text2 := job("v2", "Count")
	browsertest.Do(t, ctx,
		chromedp.SetValue(chromedp.CSS("#def-yaml"), text2),
		chromedp.Click(chromedp.CSS("#def-check")),
	)
	waitText(t, ctx, "#flash", "would be updated", 10*time.Second)
	diff := text(t, ctx, "#def-diff tbody")
	if !strings.Contains(diff, "script.command") || !strings.Contains(diff, "echo v1") || !strings.Contains(diff, "echo v2") || strings.Contains(diff, "cron") {
		t.Errorf("the edit's diff: %q, want script.command only", diff)
	}
	browsertest.Screenshot(t, ctx, "editor-diff")
	browsertest.Do(t, ctx, chromedp.Click(chromedp.CSS("#def-save")))
	waitText(t, ctx, "#flash", "saved as version 2", 10*time.Second)
	etcdtest.Eventually(t, 20*time.Second, "etl to run v2", ran("v2"))

	// Roll back from the version list.
	browsertest.Do(t, ctx, chromedp.WaitVisible(chromedp.CSS("#version-1 button.rollback")), chromedp.Click(chromedp.CSS("#version-1 button.rollback")))
	waitText(t, ctx, "#flash", "rollback, now version 3", 10*time.Second)
	if q := d.last(); !strings.Contains(q, "Roll job etl back to version 1?") {
		t.Errorf("the rollback's confirmation asked %q", q)
	}
	etcdtest.Eventually(t, 20*time.Second, "etl to run v1 again", ran("v1"))
	def, err := admin.New(etcd, keyspace.NewKeys("")).Definition(context.Background(), "etl")
	if err != nil || def.Registered.Version != 3 || def.Registered.By != "token:dana" || !strings.Contains(def.Job.Script.Command.Argv[2], "echo v1") {
		t.Errorf("registered after the rollback: %+v, %v", def, err)
	}
	waitPage(t, ctx, "#versions", "rollback to 1", 10*time.Second)
	browsertest.Screenshot(t, ctx, "editor-versions")
	// The checks' 422s are the browser's only errors.
	for _, msg := range browsertest.ConsoleErrors(t, ctx) {
		if !strings.Contains(msg, "422") {
			t.Errorf("browser console: %s", msg)
		}
	}
}
