package engine

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// lines returns the lines of a file the test's scripts append to.
func lines(path string) []string {
	b, _ := os.ReadFile(path)
	return strings.Fields(strings.ReplaceAll(string(b), " ", "_"))
}

// An operator's kill stops the run's process at once, records it
// KILLED/operator with who asked, and the run is not failed over although
// the job says failover: true.
func TestKillStopsTheRunAndIsNotFailedOver(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	dir := t.TempDir()
	starts, pidFile := filepath.Join(dir, "starts"), filepath.Join(dir, "pid")
	script := `echo $SHARDD_FENCE >> ` + starts + `; echo $$ > ` + pidFile + `; sleep 30; echo done >> ` + starts
	node := instance(t, srv, "a", "jobs:\n  - name: long\n    failover: true\n    script: "+etcdtest.YAMLQuote(script)+"\n")
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 10*time.Second, "the instance's map", func() bool {
		v, _ := node.View("long")
		return v.Map != nil && len(v.Map.ItemsOf("a")) == 1
	})
	if _, err := admin.New(cli, keys).Kill(ctx, admin.KillRequest{Job: "long", By: "token:alice"}); !errors.Is(err, admin.ErrRefused) || !strings.Contains(err.Error(), "nothing to kill") {
		t.Fatalf("kill with nothing running: %v, want refused, nothing to kill", err)
	}
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "long", By: "test"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "the run to start", func() bool { return len(lines(pidFile)) == 1 })
	pid, _ := strconv.Atoi(lines(pidFile)[0])
	if _, err := admin.New(cli, keys).Kill(ctx, admin.KillRequest{Job: "long", Items: []int{3}, By: "token:alice"}); !errors.Is(err, admin.ErrBadTarget) {
		t.Fatalf("kill of item 3 of a 1-item job: %v, want a bad target", err)
	}
	k, err := admin.New(cli, keys).Kill(ctx, admin.KillRequest{Job: "long", Items: []int{0}, By: "token:alice"})
	if err != nil {
		t.Fatal(err)
	}
	if len(k.Runs) != 1 || k.Runs[0].Instance != "a" || k.Runs[0].Fence == 0 {
		t.Fatalf("kill asked for %+v, want item 0's run on a", k.Runs)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := admin.New(cli, keys).WaitKill(wctx, "long", k.Kill)
	if err != nil {
		t.Fatalf("the killed run did not end: %v", err)
	}
	if res[0].State != keyspace.StateKilled || res[0].Reason != keyspace.ReasonOperator || !strings.Contains(res[0].Error, "token:alice") {
		t.Fatalf("killed run ended %+v, want KILLED/operator by token:alice", res[0])
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("the script (pid %d) outlived its kill: %v", pid, err)
	}
	st, err := node.ReadItem(ctx, "long", 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Record.KilledBy != "token:alice" || st.Record.Fence != k.Runs[0].Fence {
		t.Errorf("record %+v, want killed by token:alice with the run's fence", st.Record)
	}
	// Ten sweeps later (100 ms each), nothing ran it again.
	time.Sleep(time.Second)
	if got := lines(starts); len(got) != 1 {
		t.Errorf("runs after the kill: %v, want only the killed one (a killed run is not failed over)", got)
	}
}

// A trigger's parameter reaches the run; --fire re-runs a past scheduled
// fire as MANUAL with a fence of its own, without moving the item's
// watermark; triggers are served one by one, in order; bad fires and
// parameters are refused with what is wrong.
func TestTriggerParamAndRerunFire(t *testing.T) {
	srv := etcdtest.Shared(t)
	out := filepath.Join(t.TempDir(), "runs")
	t.Setenv("OUT", out)
	// Daily at 03:00 UTC: no scheduled fire comes during the test.
	script := `printf '%s|%s|%s|%s|%s\n' "$SHARDD_SOURCE" "$SHARDD_FIRE_TIME" "$SHARDD_FENCE" "$SHARDD_TRIGGER_PARAMETER" "$SHARDD_CONTEXT" >> "$OUT"`
	node := instance(t, srv, "a", "jobs:\n  - name: daily\n    cron: '0 0 3 * * ?'\n    script: "+etcdtest.YAMLQuote(script)+"\n")
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 10*time.Second, "the item's record to begin", func() bool {
		st, err := node.ReadItem(ctx, "daily", 0)
		return err == nil && st.Record != nil
	})
	before, _ := node.ReadItem(ctx, "daily", 0)
	now := time.Now().UTC()
	// The latest 03:00 at least two hours ago: the times an hour after it,
	// which the cases below must find off the schedule, are past too.
	last := time.Date(now.Year(), now.Month(), now.Day(), 3, 0, 0, 0, time.UTC)
	if last.Add(2 * time.Hour).After(now) {
		last = last.AddDate(0, 0, -1)
	}
	for _, tt := range []struct {
		name string
		req  admin.TriggerRequest
		want string
	}{
		{"not a fire", admin.TriggerRequest{Fire: last.Add(30 * time.Minute).Format(time.RFC3339)}, "is not a fire of job \"daily\""},
		{"future fire", admin.TriggerRequest{Fire: last.AddDate(0, 0, 2).Format(time.RFC3339)}, "is in the future"},
		{"not a time", admin.TriggerRequest{Fire: "yesterday"}, "want RFC 3339"},
		{"NUL in the parameter", admin.TriggerRequest{Param: "a\x00b"}, "NUL"},
		{"parameter too long", admin.TriggerRequest{Param: strings.Repeat("x", admin.MaxTriggerParam+1)}, "at most"},
	} {
		tt.req.Job = "daily"
		_, err := admin.New(cli, keys).Trigger(ctx, tt.req)
		if !errors.Is(err, admin.ErrBadTarget) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want a bad target saying %q", tt.name, err, tt.want)
		}
	}
	// The previous and next fires are named for a time off the schedule.
	_, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "daily", Fire: last.Add(time.Hour).Format("2006-01-02 15:04")})
	if err == nil || !strings.Contains(err.Error(), "previous "+last.Format(time.RFC3339)) {
		t.Errorf("a fire an hour off: %v, want the previous fire %s named", err, last.Format(time.RFC3339))
	}

	first, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "daily", Fire: last.Format("2006-01-02 15:04:05"), Param: "re-run: day 1", By: "token:bob"})
	if err != nil {
		t.Fatal(err)
	}
	if !first.Rerun.Equal(last) {
		t.Errorf("trigger's rerun %s, want %s", first.Rerun, last)
	}
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "daily", Param: "second"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "both triggers to run", func() bool { return len(lines(out)) == 2 })
	b, _ := os.ReadFile(out)
	runs := strings.Split(strings.TrimSpace(string(b)), "\n")
	f0 := strings.SplitN(runs[0], "|", 5)
	f1 := strings.SplitN(runs[1], "|", 5)
	if f0[0] != "MANUAL" || f0[1] != last.Format(time.RFC3339) || f0[3] != "re-run: day 1" {
		t.Errorf("first run %q, want MANUAL for fire %s with parameter \"re-run: day 1\"", runs[0], last.Format(time.RFC3339))
	}
	var rc struct {
		TriggerParameter string `json:"triggerParameter"`
	}
	if err := json.Unmarshal([]byte(f0[4]), &rc); err != nil || rc.TriggerParameter != "re-run: day 1" {
		t.Errorf("SHARDD_CONTEXT %s: triggerParameter %q (%v), want the parameter", f0[4], rc.TriggerParameter, err)
	}
	if f1[0] != "MANUAL" || f1[3] != "second" || f1[1] == f0[1] || f1[2] <= f0[2] {
		t.Errorf("second run %q after %q: want MANUAL now with parameter \"second\" and a later fence", runs[1], runs[0])
	}
	after, err := node.ReadItem(ctx, "daily", 0)
	if err != nil {
		t.Fatal(err)
	}
	if !after.Record.Watermark().Equal(before.Record.Watermark()) {
		t.Errorf("watermark moved from %s to %s: a manual re-run must not account for scheduled fires", before.Record.Watermark(), after.Record.Watermark())
	}
	// The script's line is written before its run ends; its outcome
	// record follows.
	var params []string
	etcdtest.Eventually(t, 10*time.Second, "both runs' records", func() bool {
		recs, err := admin.New(cli, keys).Records(ctx, "daily")
		if err != nil {
			t.Fatal(err)
		}
		params = params[:0]
		for _, r := range recs {
			if r.Source == keyspace.SourceManual {
				params = append(params, r.Param)
			}
		}
		return len(params) == 2
	})
	if strings.Join(params, ",") != "re-run: day 1,second" && strings.Join(params, ",") != "second,re-run: day 1" {
		t.Errorf("history keeps parameters %q, want both runs'", params)
	}
}

// A failed run leaves the job's last failure in etcd, which a later
// success does not erase: the console counts failures in the last hour
// from it, not from the items' latest runs.
func TestLastFailureOutlivesALaterSuccess(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	flag := filepath.Join(t.TempDir(), "fail")
	os.WriteFile(flag, nil, 0o644)
	script := `if [ -e ` + flag + ` ]; then echo "upstream timeout: bank API 504" >&2; exit 3; fi; echo fine`
	node := instance(t, srv, "a", "jobs:\n  - name: flaky\n    script: "+etcdtest.YAMLQuote(script)+"\n")
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	etcdtest.Eventually(t, 10*time.Second, "the instance's map", func() bool {
		v, _ := node.View("flaky")
		return v.Map != nil && len(v.Map.ItemsOf("a")) == 1
	})
	runs := func() admin.JobRuns {
		rs, err := admin.New(cli, keys).JobRuns(ctx, []string{"flaky"})
		if err != nil {
			t.Fatal(err)
		}
		return rs["flaky"]
	}
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "flaky"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "the failure", func() bool { r := runs(); return r.LastFailure != nil })
	failure := *runs().LastFailure
	if failure.State != keyspace.StateFailed || failure.ExitCode != 3 || !strings.Contains(failure.Output, "bank API 504") {
		t.Errorf("last failure %+v", failure)
	}
	os.Remove(flag)
	if _, err := admin.New(cli, keys).Trigger(ctx, admin.TriggerRequest{Job: "flaky"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "the success", func() bool { return runs().Records[0].State == keyspace.StateDone })
	if r := runs(); r.LastFailure == nil || r.LastFailure.Fence != failure.Fence {
		t.Errorf("after a success, the last failure is %+v, want the failed run (fence %d)", r.LastFailure, failure.Fence)
	}
}
