package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/embedetcd"
	"github.com/shardd/shardd/pkg/history"
	"github.com/shardd/shardd/pkg/runlog"
	"github.com/shardd/shardd/pkg/schedule"
)

// shardd runs the command line args and returns exit code, stdout and stderr.
func shardd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return sharddAt(t, time.Time{}, args...)
}

// sharddAt runs shardd with its clock at now (zero: the real clock).
func sharddAt(t *testing.T, now time.Time, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	e := &env{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }}
	if !now.IsZero() {
		e.now = func() time.Time { return now }
	}
	code := run(args, e)
	return code, out.String(), errOut.String()
}

func TestPlanJSON(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--strategy", "AVG_ALLOCATION", "--job", "x", "--total", "9", "--instances", "host0,host1,host2"}, `{"host0":[0,1,2],"host1":[3,4,5],"host2":[6,7,8]}`},
		{[]string{"--job", "x", "--total", "8", "--instances", "host0,host1,host2"}, `{"host0":[0,1,6],"host1":[2,3,7],"host2":[4,5]}`},
		{[]string{"--job", "x", "--total", "10", "--instances", "host0,host1,host2"}, `{"host0":[0,1,2,9],"host1":[3,4,5],"host2":[6,7,8]}`},
		// Instances are taken in the order given, not sorted.
		{[]string{"--job", "x", "--total", "8", "--instances", "c,a,b"}, `{"a":[2,3,7],"b":[4,5],"c":[0,1,6]}`},
		{[]string{"--job", "x", "--total", "2", "--instances", "a,b,c"}, `{"a":[0],"b":[1],"c":[]}`},
		{[]string{"--strategy", "ROUND_ROBIN", "--job", "hello", "--total", "3", "--instances", "a,b,c"}, `{"a":[2],"b":[0],"c":[1]}`},
		{[]string{"--strategy", "ROUND", "--job", "a", "--fire-seq", "1", "--instances", "a,b,c"}, `{"a":[],"b":[],"c":[0]}`},
		{[]string{"--strategy", "BROADCAST", "--job", "a", "--instances", "a,b"}, `{"a":[0],"b":[1]}`},
	}
	for _, tt := range tests {
		code, out, errOut := shardd(t, append(append([]string{"plan"}, tt.args...), "-o", "json")...)
		if code != 0 || out != tt.want+"\n" {
			t.Errorf("plan %v = %d %q (stderr %q), want %s", tt.args, code, out, errOut, tt.want)
		}
	}
}

func TestPlanTable(t *testing.T) {
	code, out, _ := shardd(t, "plan", "--job", "x", "--total", "8", "--instances", "host0,host1,host2")
	want := "INSTANCE  COUNT  ITEMS\nhost0     3      0,1,6\nhost1     3      2,3,7\nhost2     2      4,5\n"
	if code != 0 || out != want {
		t.Errorf("got %d\n%s\nwant\n%s", code, out, want)
	}
}

func TestPlanConfig(t *testing.T) {
	t.Setenv("HOOK_TOKEN", "s3cret") // good.yaml's hook header names it
	code, out, errOut := shardd(t, "plan", "--config", "../../pkg/config/testdata/good.yaml", "--instances", "a,b,c", "-o", "json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got map[string]map[string][]int
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("not one JSON object: %v\n%s", err, out)
	}
	if want := map[string][]int{"a": {0}, "b": {1}, "c": {2}}; !reflect.DeepEqual(got["orders"], want) {
		t.Errorf("orders = %v, want %v", got["orders"], want)
	}
	if len(got) != 4 {
		t.Errorf("%d jobs, want 4", len(got))
	}

	code, out, _ = shardd(t, "plan", "--config", "../../pkg/config/testdata/good.yaml", "--instances", "a,b,c")
	if code != 0 || !strings.Contains(out, "a         1      0=Beijing") {
		t.Errorf("table does not show item parameters:\n%s", out)
	}
}

func TestPlanUsageErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--job", "x"}, "--instances: at least one instance id is required"},
		{[]string{"--job", "x", "--instances", "a,,b"}, `empty instance id in "a,,b"`},
		{[]string{"--job", "x", "--instances", "a,b,a"}, `instance "a" given twice`},
		{[]string{"--instances", "a"}, "--job is required"},
		{[]string{"--job", "x", "--instances", "a", "--total", "0"}, "total must be >= 1, got 0"},
		{[]string{"--job", "x", "--instances", "a", "-o", "yaml"}, "-o must be table or json"},
		{[]string{"--job", "x", "--instances", "a", "--fire-time", "tomorrow"}, "--fire-time: want RFC 3339"},
		{[]string{"--nope"}, "shardd plan: flag provided but not defined: --nope (shardd plan --help lists the flags)"},
		{[]string{"--job", "x", "--instances", "a", "extra"}, `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		code, _, errOut := shardd(t, append([]string{"plan"}, tt.args...)...)
		if code != exitUsage || !strings.Contains(errOut, tt.want) {
			t.Errorf("plan %v = %d, stderr %q; want %d and %q", tt.args, code, errOut, exitUsage, tt.want)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Setenv("HOOK_TOKEN", "s3cret") // good.yaml's hook header names it
	code, out, _ := shardd(t, "validate", "--config", "../../pkg/config/testdata/good.yaml")
	if code != 0 || !strings.Contains(out, "4 job(s) in 1 file(s), valid") {
		t.Errorf("good config: %d %q", code, out)
	}

	bad := filepath.Join(t.TempDir(), "jobs.yaml")
	os.WriteFile(bad, []byte("jobs:\n  - name: orders\n    shardingTotalCount: 0\n    cron: nope\n    script: [/bin/true]\n"), 0o644)
	code, _, errOut := shardd(t, "validate", "--config", bad)
	if code != exitFailure {
		t.Errorf("bad config exit %d, want %d", code, exitFailure)
	}
	for _, want := range []string{
		bad + `:3: job "orders": shardingTotalCount must be >= 1, got 0`,
		bad + `:4: job "orders": cron "nope"`,
		"2 problem(s) in " + bad,
	} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}

	if code, _, errOut := shardd(t, "validate"); code != exitUsage || !strings.Contains(errOut, "a config PATH is required") {
		t.Errorf("validate without a path: %d %q", code, errOut)
	}

	// The path as an argument, flags after it; the next fires in the job's zone.
	good := filepath.Join(t.TempDir(), "jobs.yaml")
	os.WriteFile(good, []byte("jobs:\n  - name: noon\n    cron: \"0 0 12 ? * 2\"\n    timeZone: Asia/Shanghai\n    script: [/bin/true]\n"), 0o644)
	code, out, errOut = shardd(t, "validate", good)
	if code != 0 || !strings.Contains(out, "noon (0 0 12 ? * 2, Asia/Shanghai): next Mon ") || !strings.Contains(out, "12:00:00 CST") {
		t.Errorf("validate PATH: %d %q %q", code, out, errOut)
	}

	// A hook's secret that is not set: refused, unless --no-env (CI lint).
	hook := filepath.Join(t.TempDir(), "hook.yaml")
	os.WriteFile(hook, []byte("jobs:\n  - name: ping\n    cron: \"@every 1m\"\n    http:\n      url: http://127.0.0.1:9/\n      headers:\n        Authorization: Bearer ${SHARDD_TEST_UNSET_TOKEN}\n"), 0o644)
	if code, _, errOut := shardd(t, "validate", hook); code != exitFailure || !strings.Contains(errOut, "${SHARDD_TEST_UNSET_TOKEN} is not set") {
		t.Errorf("validate of a hook whose secret is not set: %d %q", code, errOut)
	}
	if code, out, errOut := shardd(t, "validate", "--no-env", hook); code != 0 || !strings.Contains(out, "1 job(s) in 1 file(s), valid") {
		t.Errorf("validate --no-env: %d %q %q", code, out, errOut)
	}

	// A config without jobs is not valid for run.
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(empty, []byte("jobs: []\n"), 0o644)
	if code, _, errOut := shardd(t, "validate", empty); code != exitFailure || !strings.Contains(errOut, "0 jobs") {
		t.Errorf("validate of an empty config: %d %q", code, errOut)
	}
}

// Flags may come before or after positional arguments; "--" ends them.
func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		pos  []string
		item string
	}{
		{[]string{"job", "--item", "2"}, []string{"job"}, "2"},
		{[]string{"--item", "2", "job"}, []string{"job"}, "2"},
		{[]string{"--item=2", "a", "b"}, []string{"a", "b"}, "2"},
		{[]string{"a", "--", "--item", "b"}, []string{"a", "--item", "b"}, ""},
		{[]string{}, nil, ""},
	} {
		fs := newFlagSet(&env{stderr: io.Discard}, "history")
		item := fs.String("item", "", "")
		pos, err := parseArgs(fs, tc.args)
		if err != nil || !reflect.DeepEqual(pos, tc.pos) || *item != tc.item {
			t.Errorf("parseArgs(%q) = %q, item %q, %v; want %q, item %q", tc.args, pos, *item, err, tc.pos, tc.item)
		}
	}
}

// The operator commands take only connection flags from the environment:
// the variables shardd sets for a job's scripts are not theirs.
func TestOperatorCommandsIgnoreJobEnvironment(t *testing.T) {
	var out, errOut bytes.Buffer
	vars := map[string]string{"SHARDD_ITEM": "2", "SHARDD_INSTANCE": "a", "SHARDD_ETCD": "http://127.0.0.1:1"}
	code := run([]string{"disable", "j", "--timeout", "300ms"}, &env{stdout: &out, stderr: &errOut, getenv: func(k string) string { return vars[k] }})
	// It reached for SHARDD_ETCD (nothing listens there) and did not
	// complain that --item and --instance exclude each other.
	if code != exitFailure || strings.Contains(errOut.String(), "exclude") || !strings.Contains(errOut.String(), "http://127.0.0.1:1") {
		t.Errorf("exit %d, stderr %q", code, errOut.String())
	}
}

// A command does not wait out --timeout for an etcd that cannot answer:
// it says why as soon as it knows.
func TestCommandGivesUpOnAnUnreachableEtcd(t *testing.T) {
	var out, errOut bytes.Buffer
	start := time.Now()
	code := run([]string{"status", "--etcd", "http://127.0.0.1:1", "--timeout", "60s"},
		&env{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }})
	if took := time.Since(start); code != exitFailure || took > 30*time.Second ||
		!strings.Contains(errOut.String(), "nothing answers at 127.0.0.1:1") {
		t.Errorf("exit %d after %s (--timeout 60s), stderr %q", code, took.Round(time.Millisecond), errOut.String())
	}
}

// A --timeout that leaves no time at all is refused as a usage error, not
// reported as etcd not answering.
func TestNonPositiveTimeoutIsRefused(t *testing.T) {
	for _, v := range []string{"0", "-1s"} {
		var out, errOut bytes.Buffer
		code := run([]string{"status", "--etcd", "http://127.0.0.1:1", "--timeout", v},
			&env{stdout: &out, stderr: &errOut, getenv: func(string) string { return "" }})
		if code != exitUsage || !strings.Contains(errOut.String(), "--timeout must be positive") {
			t.Errorf("--timeout %s: exit %d, stderr %q", v, code, errOut.String())
		}
	}
}

func TestCommandLine(t *testing.T) {
	if code, out, _ := shardd(t, "version"); code != 0 || !strings.HasPrefix(out, "shardd ") {
		t.Errorf("version: %d %q", code, out)
	}
	if code, out, _ := shardd(t, "help"); code != 0 || !strings.Contains(out, "validate") || !strings.Contains(out, "plan") {
		t.Errorf("help: %d %q", code, out)
	}
	if code, _, _ := shardd(t); code != exitUsage {
		t.Errorf("no command: exit %d, want %d", code, exitUsage)
	}
	if code, _, errOut := shardd(t, "plan", "--help"); code != 0 || !strings.Contains(errOut, "shardd plan --strategy S") {
		t.Errorf("plan --help: %d %q", code, errOut)
	}
	if code, _, errOut := shardd(t, "frobnicate"); code != exitUsage || !strings.Contains(errOut, `unknown command "frobnicate"`) || strings.Contains(errOut, "did you mean") {
		t.Errorf("unknown command: %d %q", code, errOut)
	}
	if code, _, errOut := shardd(t, "statsu"); code != exitUsage || !strings.Contains(errOut, `unknown command "statsu" (did you mean status?)`) {
		t.Errorf("a command's typo: %d %q", code, errOut)
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	good := "../../jobs.example.yaml"
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("jobs:\n  - name: x\n    shardingTotalCount: 0\n    script: [/bin/true]\n"), 0o644)
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	os.WriteFile(empty, []byte("# nothing yet\n"), 0o644)
	tests := []struct {
		args []string
		env  map[string]string
		code int
		want string
	}{
		{[]string{}, nil, exitUsage, "--config is required"},
		{[]string{"--config", good, "--ttl", "1s"}, nil, exitUsage, "--ttl must be a whole number of seconds >= 2s, got 1s"},
		{[]string{"--config", good, "--ttl", "2500ms"}, nil, exitUsage, "--ttl must be a whole number of seconds"},
		{[]string{"--config", good, "--name", "a/b"}, nil, exitUsage, `--name "a/b" has '/'`},
		{[]string{"--config", good}, map[string]string{"SHARDD_TTL": "1s"}, exitUsage, "--ttl must be a whole number of seconds >= 2s, got 1s"},
		{[]string{"--config", good}, map[string]string{"SHARDD_TTL": "soon"}, exitUsage, `SHARDD_TTL="soon"`},
		{[]string{"--config", good, "--log-format", "xml"}, nil, exitUsage, "--log-format: want text or json"},
		{[]string{"--config", bad}, nil, exitFailure, "shardingTotalCount must be >= 1, got 0"},
		{[]string{"--config", empty}, nil, exitFailure, "defines no jobs; shardd run needs at least one"},
	}
	for _, tt := range tests {
		var out, errOut bytes.Buffer
		getenv := func(k string) string { return tt.env[k] }
		code := run(append([]string{"run"}, tt.args...), &env{stdout: &out, stderr: &errOut, getenv: getenv})
		if code != tt.code || !strings.Contains(errOut.String(), tt.want) {
			t.Errorf("run %v (env %v) = %d, stderr %q; want %d and %q", tt.args, tt.env, code, errOut.String(), tt.code, tt.want)
		}
	}
}

func TestEnvName(t *testing.T) {
	for flag, want := range map[string]string{"etcd": "SHARDD_ETCD", "etcd-ca": "SHARDD_ETCD_CA", "data-dir": "SHARDD_DATA_DIR"} {
		if got := envName(flag); got != want {
			t.Errorf("envName(%q) = %q, want %q", flag, got, want)
		}
	}
}

// History says why a run failed or was not run, and labels a hook's HTTP
// status as such.
func TestHistoryTable(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var b bytes.Buffer
	var rows []history.Run
	for _, rec := range []keyspace.ItemRecord{
		{Item: 0, Fire: t0, Instance: "a", Fence: 4711, Attempt: 1, Source: "NORMAL", Start: t0, End: t0.Add(time.Second), State: "FAILED", ExitCode: 3, Error: "exit status 3", Output: "boom\n"},
		{Item: 1, Fire: t0, Instance: "a", Attempt: 1, Source: "NORMAL", Start: t0, End: t0.Add(5 * time.Second), State: "KILLED", Reason: "timeout", ExitCode: -1, Error: "killed: timeout after 5s"},
		{Item: 2, Fire: t0, Instance: "b", Attempt: 1, Source: "MANUAL", Start: t0, End: t0, State: "FAILED", ExitCode: -1, HTTPStatus: 503, Error: "HTTP 503"},
		{Item: 3, Fire: t0, Instance: "b", State: "SKIPPED", Reason: "disabled", ExitCode: -1, Skipped: 2},
		{Item: 3, Fire: t0, Instance: "b", State: "SKIPPED", Reason: "calendar", ExitCode: -1, Excluded: 3},
		{Item: 4, Fire: t0, Instance: "b", Attempt: 1, Source: "NORMAL", Start: t0, End: t0, State: "FAILED", ExitCode: 127, Error: "exit status 127", Output: "/bin/sh: 1: /opt/jobs/etl.sh: not found\n"},
		{Item: 5, Fire: t0, Instance: "b", Attempt: 1, Source: "NORMAL", Start: t0, End: t0, State: "FAILED", ExitCode: 1, Error: "exit status 1", Output: "col\tumn \x1b[31mred\x1b[0m ünïcödé " + strings.Repeat("é", 80)},
	} {
		rows = append(rows, history.FromRecord(rec))
	}
	// A run from its log alone, retried: its stderr's last line, its tries.
	retried := history.Run{ItemRecord: keyspace.ItemRecord{Item: 6, Fire: t0, Instance: "c", Fence: 4800, Attempt: 1, Source: "NORMAL", Start: t0, End: t0.Add(3 * time.Second),
		State: "FAILED", ExitCode: 3, Error: "exit status 3", LastLine: "db timeout for AMER"}, Tries: []runlog.Try{{Start: t0, Finish: t0.Add(time.Second)}, {Start: t0.Add(2 * time.Second), Finish: t0.Add(3 * time.Second)}}}
	// A hook refused: its status and the answer's start, not its URL.
	hook := history.FromRecord(keyspace.ItemRecord{Item: 7, Fire: t0, Instance: "c", Attempt: 1, Source: "NORMAL", Start: t0, End: t0, State: "FAILED", ExitCode: -1, HTTPStatus: 503,
		Error: "POST https://hooks.example.com/a/very/long/path/that/fills/the/cell: status 503: queue full", Output: "queue full"})
	rows = append(rows[:6], retried, hook, rows[6])
	writeHistory(&b, rows)
	out := b.String()
	for _, want := range []string{"status 503: queue full", "FAILED (2 tries)", "db timeout for AMER", "RESULT", "CODE", "FENCE", " 4711 ", "FAILED  ", "exit 3", "boom", "KILLED/timeout", "killed: timeout after 5s", "http 503", "SKIPPED/disabled", "SKIPPED/calendar", "3 calendar", "/opt/jobs/etl.sh: not found"} {
		if !strings.Contains(out, want) {
			t.Errorf("history lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "exit 503") || strings.Contains(out, "exit -1") {
		t.Errorf("an HTTP status or a missing exit code shown as an exit code:\n%s", out)
	}
	if strings.Contains(out, "exit status") {
		t.Errorf("the error column repeats the exit code instead of the output's last line:\n%s", out)
	}
	// Every row has as many columns as the header: no tab or escape in a
	// cell, no cut rune.
	lines := strings.Split(strings.TrimSpace(out), "\n")
	row := lines[len(lines)-1]
	if strings.ContainsAny(row, "\t\x1b") || !utf8.ValidString(row) || !strings.HasSuffix(row, "é...") {
		t.Errorf("last row not one clean line cut at 60 runes: %q", row)
	}
	header := lines[0]
	if want, got := utf8.RuneCountInString(header[:strings.Index(header, "ERROR/OUTPUT")]), utf8.RuneCountInString(row[:strings.Index(row, "col")]); got != want {
		t.Errorf("last row's output starts at column %d, the header's at %d:\n%s", got, want, out)
	}
}

// JSON logs give durations as strings with a unit, not nanoseconds.
func TestJSONLogDurations(t *testing.T) {
	var b bytes.Buffer
	lf := logFlags{format: "json", level: "info"}
	log, err := lf.logger(&env{stderr: &b})
	if err != nil {
		t.Fatal(err)
	}
	log.Info("x", "in", 1500*time.Millisecond)
	if !strings.Contains(b.String(), `"in":"1.5s"`) {
		t.Errorf("log line %s", b.String())
	}
}

func TestClientOptionsFindTheEmbeddedCertificate(t *testing.T) {
	withCerts := t.TempDir()
	f, err := embedetcd.EnsureTLS(withCerts, []string{"127.0.0.1"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(f.Endpoint, []byte("https://127.0.0.1:2379\n"), 0o644)
	elsewhere := t.TempDir() // an embedded etcd on another port
	g, _ := embedetcd.EnsureTLS(elsewhere, []string{"127.0.0.1"}, time.Now())
	os.WriteFile(g.Endpoint, []byte("https://127.0.0.1:24010\n"), 0o644)
	without := t.TempDir()
	tests := []struct {
		name          string
		f             etcdFlags
		endpoints     []string
		dir           string
		wantEndpoints string
		wantCert      bool
		wantErr       string
	}{
		{"the embedded default, certificate found", etcdFlags{}, nil, withCerts, "https://127.0.0.1:2379", true, ""},
		{"the embedded etcd elsewhere: its recorded URL", etcdFlags{}, nil, elsewhere, "https://127.0.0.1:24010", true, ""},
		{"the embedded default, no certificate", etcdFlags{}, nil, without, "", false, "no embedded etcd client certificate"},
		{"--etcd the embedded etcd's URL", etcdFlags{}, []string{"https://127.0.0.1:2379"}, withCerts, "https://127.0.0.1:2379", true, ""},
		{"--etcd the embedded etcd's URL with a slash", etcdFlags{}, []string{"https://127.0.0.1:2379/"}, withCerts, "https://127.0.0.1:2379/", true, ""},
		{"--etcd the embedded etcd and another: not for the other", etcdFlags{}, []string{"https://127.0.0.1:2379", "https://127.0.0.1:2380"}, withCerts, "https://127.0.0.1:2379,https://127.0.0.1:2380", false, ""},
		{"--etcd another https endpoint: never the embedded certificate", etcdFlags{}, []string{"https://127.0.0.1:2380"}, withCerts, "https://127.0.0.1:2380", false, ""},
		{"--etcd https elsewhere, no data dir: the system's roots", etcdFlags{}, []string{"https://etcd1:2379"}, without, "https://etcd1:2379", false, ""},
		{"--etcd http: never a certificate", etcdFlags{}, []string{"http://127.0.0.1:2379"}, withCerts, "http://127.0.0.1:2379", false, ""},
		{"explicit TLS flags win", etcdFlags{ca: "/etc/ca.pem"}, []string{"https://127.0.0.1:2379"}, withCerts, "https://127.0.0.1:2379", false, ""},
	}
	for _, tt := range []struct {
		endpoints []string
		wantErr   string // "" for none
	}{
		{[]string{"127.0.0.1:25371"}, "--etcd 127.0.0.1:25371: give the scheme: https://127.0.0.1:25371"},
		{[]string{"https://127.0.0.1:2379", "etcd2:2379"}, "--etcd etcd2:2379: give the scheme"},
		{[]string{"tcp://etcd1:2379"}, "--etcd tcp://etcd1:2379: the scheme is https://"},
		{[]string{"https://"}, "--etcd https://: no address after the scheme"},
		{[]string{"http://127.0.0.1:2379", "unix:///run/etcd.sock"}, ""},
	} {
		_, err := (&etcdFlags{}).clientOptions(tt.endpoints, without, true)
		var ee *exitError
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%v: %v", tt.endpoints, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%v: err %v, want %q", tt.endpoints, err, tt.wantErr)
		case tt.wantErr != "" && (!errors.As(err, &ee) || ee.code != exitUsage):
			t.Errorf("%v: err %v is not a usage error", tt.endpoints, err)
		}
	}
	for _, tt := range tests {
		o, err := tt.f.clientOptions(tt.endpoints, tt.dir, true)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "--data-dir") {
				t.Errorf("%s: err %v, want %q naming --data-dir", tt.name, err, tt.wantErr)
			}
		case err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case strings.Join(o.Endpoints, ",") != tt.wantEndpoints:
			t.Errorf("%s: endpoints %v, want %s", tt.name, o.Endpoints, tt.wantEndpoints)
		case tt.wantCert != (o.CertFile == embedetcd.Files(tt.dir).ClientCert):
			t.Errorf("%s: cert %q, want the data dir's: %v", tt.name, o.CertFile, tt.wantCert)
		}
	}

	// A tls directory others can write is never used.
	os.Chmod(f.Dir, 0o777)
	if _, err := (&etcdFlags{}).clientOptions(nil, withCerts, false); err == nil || !errors.Is(err, embedetcd.ErrNotTrusted) {
		t.Errorf("a world-writable tls dir: %v, want ErrNotTrusted", err)
	}
	os.Chmod(f.Dir, 0o700)
	// One of another user's: trusted when named (root reading the systemd
	// unit's /var/lib/shardd), not when found in the working directory.
	if os.Geteuid() == 0 {
		if err := os.Chown(f.Dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := (&etcdFlags{}).clientOptions(nil, withCerts, true); !errors.Is(err, embedetcd.ErrNotTrusted) {
			t.Errorf("another user's tls dir found implicitly: %v, want ErrNotTrusted", err)
		}
		if _, err := (&etcdFlags{}).clientOptions(nil, withCerts, false); err != nil {
			t.Errorf("another user's tls dir named: %v", err)
		}
	}
}

// plan and validate show the dependency graph of a config.
func TestPlanAndValidateShowDependencies(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jobs.yaml")
	os.WriteFile(path, []byte(`jobs:
  - name: extract
    cron: "0 0 2 * * ?"
    shardingTotalCount: 2
    script: "true"
  - name: rates
    cron: "0 0 * * * ?"
    script: "true"
  - name: load
    dependsOn: [extract]
    script: "true"
  - name: report
    dependsOn: [load, rates]
    cron: "0 0 6 * * ?"
    script: "true"
`), 0o644)
	code, out, errOut := shardd(t, "plan", "--config", path, "--instances", "a,b")
	if code != 0 {
		t.Fatalf("plan: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"dependencies:", "extract -> load  (load runs after each successful fire of extract)",
		"load, rates -> report  (report runs when each of load, rates has a new successful fire)"} {
		if !strings.Contains(out, want) {
			t.Errorf("plan output lacks %q:\n%s", want, out)
		}
	}
	code, out, errOut = shardd(t, "validate", "--config", path)
	if code != 0 {
		t.Fatalf("validate: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"load: no cron; runs after each successful fire of extract, or when triggered", "report (0 0 6 * * ?, UTC): next", "; also runs when each of load, rates has a new successful fire"} {
		if !strings.Contains(out, want) {
			t.Errorf("validate output lacks %q:\n%s", want, out)
		}
	}
}

// validate and plan print the fires around a daylight-saving change as
// they will run, and say what each change of the next year does to a job.
func TestValidateShowsDSTChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jobs.yaml")
	os.WriteFile(path, []byte(`jobs:
  - name: nightly
    cron: "0 15 2 * * ?"
    timeZone: Europe/Berlin
    script: "true"
  - name: hourly
    cron: "0 0 * * * ?"
    timeZone: Europe/Berlin
    script: "true"
  - name: noon
    cron: "0 0 12 * * ?"
    timeZone: Europe/Berlin
    script: "true"
  - name: howe
    cron: "0 45 1 * * ?"
    timeZone: Australia/Lord_Howe
    script: "true"
`), 0o644)
	now := time.Date(2026, 10, 23, 12, 0, 0, 0, time.UTC)
	want := `  hourly (0 0 * * * ?, Europe/Berlin): next Fri 2026-10-23 15:00:00 CEST, Fri 2026-10-23 16:00:00 CEST, Fri 2026-10-23 17:00:00 CEST
    DST: clocks go back Sun 2026-10-25 03:00 CEST -> 02:00 CET: 02:00:00 comes twice; fires both times: 02:00:00 CEST, 02:00:00 CET
    DST: clocks jump Sun 2027-03-28 02:00 CET -> 03:00 CEST: 02:00:00 does not exist; no fire for it (the schedule follows the clock)
  howe (0 45 1 * * ?, Australia/Lord_Howe): next Sat 2026-10-24 01:45:00 +11, Sun 2026-10-25 01:45:00 +11, Mon 2026-10-26 01:45:00 +11
    DST: clocks go back Sun 2027-04-04 02:00 +11 -> 01:30 +1030: 01:45:00 comes twice; fires the first time only: 01:45:00 +11; the second (+1030) is skipped
  nightly (0 15 2 * * ?, Europe/Berlin): next Sat 2026-10-24 02:15:00 CEST, Sun 2026-10-25 02:15:00 CEST, Mon 2026-10-26 02:15:00 CET
    DST: clocks go back Sun 2026-10-25 03:00 CEST -> 02:00 CET: 02:15:00 comes twice; fires the first time only: 02:15:00 CEST; the second (CET) is skipped
    DST: clocks jump Sun 2027-03-28 02:00 CET -> 03:00 CEST: 02:15:00 does not exist; fires when the clocks jump: 03:00:00 CEST
  noon (0 0 12 * * ?, Europe/Berlin): next Sat 2026-10-24 12:00:00 CEST, Sun 2026-10-25 12:00:00 CET, Mon 2026-10-26 12:00:00 CET
`
	code, out, errOut := sharddAt(t, now, "validate", path)
	if code != 0 || !strings.HasSuffix(out, "valid\n"+want) {
		t.Errorf("validate: exit %d %s; output\n%s\nwant it to end with\n%s", code, errOut, out, want)
	}
	code, out, errOut = sharddAt(t, now, "plan", "--config", path, "--instances", "a")
	if code != 0 || !strings.Contains(out, "next fires:\n"+want) {
		t.Errorf("plan: exit %d %s; output\n%s\nwant it to have\n%s", code, errOut, out, want)
	}
}

// plan --config with --label: a job's selector takes only the instances it
// matches, and says which.
func TestPlanSelector(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "jobs.yaml")
	os.WriteFile(path, []byte("jobs:\n  - name: etl\n    shardingTotalCount: 2\n    instances: {selector: \"role=db\"}\n    script: [/bin/true]\n  - name: other\n    script: [/bin/true]\n"), 0o644)
	code, out, errOut := shardd(t, "plan", "--config", path, "--instances", "a,b,c", "--label", "a:role=db", "--label", "c:role=db", "-o", "json")
	var got map[string]map[string][]int
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil {
		t.Fatalf("exit %d: %s %s", code, out, errOut)
	}
	if _, ok := got["etl"]["b"]; ok || len(got["etl"]["a"])+len(got["etl"]["c"]) != 2 {
		t.Errorf("etl's plan %v: want its 2 items on a and c only", got["etl"])
	}
	if len(got["other"]) != 3 {
		t.Errorf("other's plan %v: want every instance (no selector)", got["other"])
	}
	if code, out, _ := shardd(t, "plan", "--config", path, "--instances", "a,b,c", "--label", "a:role=db"); code != 0 || !strings.Contains(out, "instances.selector role=db matches: a\n") {
		t.Errorf("plan's table: %d\n%s", code, out)
	}
	if code, _, errOut := shardd(t, "plan", "--config", path, "--instances", "a,b", "--label", "x:role=db"); code != exitUsage || !strings.Contains(errOut, "x is not one of --instances") {
		t.Errorf("a label of an unknown instance: %d %s", code, errOut)
	}
}

// validate and plan show the policies' effect on the next fires: those a
// calendar excludes, the jitter offsets of the next fire's items (the
// ones every instance computes), the active window.
func TestValidateShowsPolicies(t *testing.T) {
	path := filepath.Join(t.TempDir(), "jobs.yaml")
	os.WriteFile(path, []byte(`calendars:
  weekends:
    weekdays: [SAT, SUN]
jobs:
  - name: settle
    cron: ["0 0 2 * * ?", "0 0 14 * * ?"]
    shardingTotalCount: 2
    jitter: 30s
    activeUntil: 2027-06-30
    excludeCalendars: [weekends]
    script: "true"
`), 0o644)
	now := time.Date(2027, 1, 1, 12, 0, 0, 0, time.UTC) // a Friday
	fire := time.Date(2027, 1, 1, 14, 0, 0, 0, time.UTC)
	want := fmt.Sprintf(`  settle (0 0 2 * * ?; 0 0 14 * * ?, UTC): next Fri 2027-01-01 14:00:00 UTC, Sat 2027-01-02 02:00:00 UTC (excluded: calendar weekends), Sat 2027-01-02 14:00:00 UTC (excluded: calendar weekends)
    jitter 30s: the next fire's items start at item 0 +%s, item 1 +%s
    active - to 2027-06-30
`, schedule.JitterOffset("settle", 0, fire, 30*time.Second), schedule.JitterOffset("settle", 1, fire, 30*time.Second))
	for _, args := range [][]string{{"validate", path}, {"plan", "--config", path, "--instances", "a"}} {
		code, out, errOut := sharddAt(t, now, args...)
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("%s: exit %d %s; output\n%s\nwant it to have\n%s", args[0], code, errOut, out, want)
		}
	}
	// On a Saturday every fire shown is excluded: the first that runs is
	// shown too. A window that ended says so.
	os.WriteFile(path, []byte(`calendars:
  weekends:
    weekdays: [SAT, SUN]
jobs:
  - name: settle
    cron: ["0 0 2 * * ?", "0 0 14 * * ?"]
    excludeCalendars: [weekends]
    script: "true"
  - name: over
    cron: "@hourly"
    activeUntil: 2020-01-01
    script: "true"
`), 0o644)
	_, out, _ := sharddAt(t, time.Date(2027, 1, 2, 3, 0, 0, 0, time.UTC), "validate", path)
	for _, w := range []string{"first not excluded: Mon 2027-01-04 02:00:00 UTC", "over (@hourly, UTC): next never: activeUntil 2020-01-01 has passed"} {
		if !strings.Contains(out, w) {
			t.Errorf("validate lacks %q:\n%s", w, out)
		}
	}
}
