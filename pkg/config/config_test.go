package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestLoadGood(t *testing.T) {
	t.Setenv("HOOK_TOKEN", "s3cret") // good.yaml's hook header names it
	c, err := Load("testdata/good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, j := range c.Jobs {
		names = append(names, j.Name)
	}
	if want := []string{"hook", "invoices", "manual-only", "orders"}; !reflect.DeepEqual(names, want) {
		t.Fatalf("jobs = %v, want %v (sorted)", names, want)
	}

	orders := c.Job("orders")
	if orders.ShardingTotalCount != 3 || orders.ShardingItemParameters[2] != "Guangzhou" || orders.JobParameter != "full" {
		t.Errorf("orders = %+v", orders)
	}
	if orders.TimeZone != "Asia/Shanghai" || !orders.Failover || orders.Timeout != Duration(5*time.Minute) {
		t.Errorf("orders did not take the defaults block: %+v", orders)
	}
	if !orders.Misfire || !orders.MonitorExecution || orders.MaxTimeDiffSeconds != -1 || orders.ReconcileIntervalMinutes != 10 || orders.Strategy != "AVG_ALLOCATION" {
		t.Errorf("orders did not take the built-in defaults: %+v", orders)
	}
	if got := orders.Script.Command.Argv; !reflect.DeepEqual(got, []string{"/usr/local/bin/sync-orders", "--region", "eu"}) {
		t.Errorf("orders argv = %q", got)
	}
	if orders.Script.Env["LOG_LEVEL"] != "info" || orders.Script.Workdir != "/var/lib/orders" {
		t.Errorf("orders script = %+v", orders.Script)
	}
	if !orders.Script.ContextArg || orders.OnFailure.Format != "slack" || orders.Listeners.Before.Argv[0] != "/usr/local/bin/orders-lock" || orders.Listeners.After.Shell == "" {
		t.Errorf("orders extras: %+v %+v %+v", orders.Script, orders.OnFailure, orders.Listeners)
	}
	if orders.Schedule == nil || orders.Location.String() != "Asia/Shanghai" || orders.Pos.Line != 7 {
		t.Errorf("orders derived fields: schedule %v, location %v, pos %v", orders.Schedule, orders.Location, orders.Pos)
	}

	inv := c.Job("invoices")
	if inv.Strategy != "ODEVITY" || inv.Shard.Name() != "ODEVITY" {
		t.Errorf("jobShardingStrategyType alias not applied: %q", inv.Strategy)
	}
	if inv.Failover {
		t.Error("invoices: job's failover: false did not override the defaults block")
	}
	if inv.Script.Command.Shell != "echo item $SHARDD_ITEM" || inv.ShardingItemParameters[0] != "a,b" {
		t.Errorf("invoices = %+v", inv.Script)
	}

	hook := c.Job("hook")
	if hook.HTTP.Method != "PUT" || hook.HTTP.Timeout != Duration(10*time.Second) || !reflect.DeepEqual(hook.HTTP.SuccessCodes, []int{200, 202}) {
		t.Errorf("hook = %+v", hook.HTTP)
	}
	if hook.HTTP.TLS == nil || hook.HTTP.TLS.CA != "/etc/shardd/hooks-ca.pem" || hook.OnFailure.Command.Argv[0] != "/usr/local/bin/page-oncall" {
		t.Errorf("hook extras: %+v %+v", hook.HTTP.TLS, hook.OnFailure)
	}
	if hook.TimeZone != "UTC" {
		t.Errorf("hook timeZone %q: the job's own value must win over defaults", hook.TimeZone)
	}
	if m := c.Job("manual-only"); m.Schedule != nil || m.TimeZone != "Asia/Shanghai" {
		t.Errorf("manual-only = %+v", m)
	}
	if c.Job("nope") != nil {
		t.Error("Job(nope) != nil")
	}
}

// Each bad file holds one realistic mistake; the error must name the file,
// the line, the job and the field, with the bad value.
func TestLoadBad(t *testing.T) {
	tests := []struct {
		file string
		want string
	}{
		{"bad-cron", `bad-cron.bad.yaml:3: job "orders": cron "0 0 25 * * ?": hour "25": 25 is above the maximum 23`},
		{"bad-indent", `bad-indent.bad.yaml:4: did not find expected '-' indicator`},
		{"unknown-field-typo", `unknown-field-typo.bad.yaml:4: job "orders": unknown field shardingItemParameter (did you mean shardingItemParameters?)`},
		{"unknown-alias-typo", `unknown-alias-typo.bad.yaml:3: job "orders": unknown field jobShardingStrategy (did you mean jobShardingStrategyType?)`},
		{"param-too-big", `param-too-big.bad.yaml:4: job "orders": jobParameter is 17408 bytes; at most 16384 (it is passed in environment variables)`},
		{"param-nul", `param-nul.bad.yaml:5: job "orders": jobParameter contains a NUL byte, which no environment variable can carry`},
		{"header-env", `header-env.bad.yaml:5: job "hook": http.headers Authorization: ${SHARDD_TEST_UNSET_TOKEN} is not set in shardd's environment`},
		{"retry-backoff", `retry-backoff.bad.yaml:3: job "orders": retryBackoff must be between 0 and 5m0s, got 1h0m0s`},
		{"quartz-last-day", `quartz-last-day.bad.yaml:3: job "month-end": cron "0 0 23 L * ?": day-of-month "L": L (last day) and W (nearest weekday) are Quartz features shardd does not support`},
		{"quartz-year", `quartz-year.bad.yaml:3: job "once": cron "0 0 12 1 1 ? 2027": year "2027": a concrete year`},
		{"unknown-field", `unknown-field.bad.yaml:4: job "orders": unknown field shardingTotalcount (did you mean shardingTotalCount?)`},
		{"unknown-top-level", `unknown-top-level.bad.yaml:1: unknown field "job" (want calendars, defaults or jobs)`},
		{"duplicate-name", `duplicate-name.bad.yaml:4: job "orders": name is defined twice; first at testdata/duplicate-name.bad.yaml:2`},
		{"script-and-http", `script-and-http.bad.yaml:4: job "orders": script and http are both set`},
		{"no-work", `no-work.bad.yaml:2: job "orders": no work: set script or http`},
		{"total-zero", `total-zero.bad.yaml:3: job "orders": shardingTotalCount must be >= 1, got 0`},
		{"param-out-of-range", `param-out-of-range.bad.yaml:4: job "orders": shardingItemParameters item 3 is out of range: items are 0..2 (shardingTotalCount 3)`},
		{"param-repeated", `param-repeated.bad.yaml:4: job "orders": shardingItemParameters item 1 is given twice`},
		{"param-malformed", `param-malformed.bad.yaml:4: job "orders": shardingItemParameters "0:Beijing" is not item=value`},
		{"bad-timezone", `bad-timezone.bad.yaml:3: job "orders": timeZone "Mars/Olympus_Mons" is not an IANA time zone name`},
		{"negative-timeout", `negative-timeout.bad.yaml:3: job "orders": timeout must be >= 0 (0 = no limit), got -5s`},
		{"bad-duration", `bad-duration.bad.yaml:3: job "orders": timeout must be a duration like 30s, 1m30s, or whole days like 7d, got "30"`},
		{"log-retention", `log-retention.bad.yaml:5: job "orders": logRetention.maxTotalBytes must be a size like 1048576, 512KiB or 16MiB, got "lots"`},
		{"log-retention-small", `log-retention-small.bad.yaml:4: job "orders": logRetention.maxTotalBytes must be at least 16KiB, got 0B`},
		{"log-retention-order", `log-retention-order.bad.yaml:4: job "orders": logRetention.maxBytesPerRun (1GiB) must be at most logRetention.maxTotalBytes (256MiB)`},
		{"malformed-url", `malformed-url.bad.yaml:4: job "hook": http.url "http//missing-colon/run" must start with http:// or https://`},
		{"name-with-slash", `name-with-slash.bad.yaml:2: job "billing/eu": name "billing/eu" has '/'`},
		{"unknown-strategy", `unknown-strategy.bad.yaml:3: job "orders": unknown strategy "AVERAGE" (one of AVG_ALLOCATION, BROADCAST,`},
		{"strategy-and-alias", `strategy-and-alias.bad.yaml:4: job "orders": strategy and jobShardingStrategyType are the same field; set only one`},
		{"broadcast-total", `broadcast-total.bad.yaml:4: job "cache-warm": shardingTotalCount must not be set with strategy BROADCAST`},
		{"defaults-name", `defaults-name.bad.yaml:2: defaults: script cannot be set in defaults`},
		{"deps-cycle", `deps-cycle.bad.yaml:6: job "transform": dependsOn makes a cycle: extract -> load -> transform -> extract (each waits for the next's fires; none would ever fire)`},
		{"deps-unknown", `deps-unknown.bad.yaml:6: job "mail": dependsOn names reprot, which no job defines (did you mean report?)`},
		{"deps-self", `deps-self.bad.yaml:3: job "report": dependsOn names the job itself: a job cannot wait for its own fires`},
		{"dataflow-exit", `dataflow-exit.bad.yaml:6: job "drain": dataflow.moreExitCode must be an exit status from 1 to 255 (0 means done), got 300`},
		{"dataflow-iterations", `dataflow-iterations.bad.yaml:6: job "drain": dataflow.maxIterations must be >= 1 (0 = the default, 1000), got -1`},
		{"deps-many", `deps-many.bad.yaml:8: job "child": dependsOn names 5 jobs; at most 4 are allowed (a child waits for a fresh fire of each)`},
		{"dataflow-zero", `dataflow-zero.bad.yaml:6: job "drain": dataflow.moreExitCode 0 is the status that means done; the one that means more must differ: 1 to 255 (default 100)`},
		{"dataflow-nostream", `dataflow-nostream.bad.yaml:5: job "drain": dataflow.maxIterations has no effect without dataflow.streaming: true (each run does its work once)`},
		{"dataflow-http", `dataflow-http.bad.yaml:6: job "drain": dataflow.moreExitCode is for scripts; a hook says "more" by answering 2xx with {"more": true}`},
		{"dataflow-unknown", `dataflow-unknown.bad.yaml:5: job "drain": unknown field dataflow.streming (did you mean streaming?)`},
		{"wrong-type", `wrong-type.bad.yaml:3: job "orders": failover must be true or false, got "sometimes"`},
		{"http-method", `http-method.bad.yaml:5: job "hook": http.method "FETCH" is not one of GET, POST, PUT, PATCH, DELETE`},
		{"duplicate-key", `duplicate-key.bad.yaml:4: job "orders": cron is set twice (first at line 3)`},
		{"missing-name", `missing-name.bad.yaml:2: job #1: name is required`},
		{"selector", `selector.bad.yaml:5: job "orders": instances.selector: selector "role=db,zone in (a,b", at 21: want , or ) in the values`},
		{"selector-empty", `selector-empty.bad.yaml:4: job "orders": instances.selector is empty`},
		{"success-code", `success-code.bad.yaml:5: job "hook": http.successCodes: 999 is not an HTTP status`},
		{"syntax", `syntax.bad.yaml:3: mapping values are not allowed in this context`},
		{"onfailure-format", `onfailure-format.bad.yaml:6: job "orders": onFailure.format "teams" is not one of json, slack, dingtalk, wechat`},
		{"onfailure-empty", `onfailure-empty.bad.yaml:4: job "orders": onFailure needs a webhook or a command`},
	}
	seen := map[string]bool{}
	for _, tt := range tests {
		seen[tt.file+".bad.yaml"] = true
		t.Run(tt.file, func(t *testing.T) {
			c, err := Load(filepath.Join("testdata", tt.file+".bad.yaml"))
			if err == nil {
				t.Fatalf("loaded %d jobs, want error %q", len(c.Jobs), tt.want)
			}
			errs := Errors(err)
			if len(errs) != 1 {
				t.Errorf("%d errors, want 1:\n%v", len(errs), err)
			}
			if !strings.Contains(errs[0].Error(), tt.want) {
				t.Errorf("error:\n  %s\nwant it to contain:\n  %s", errs[0], tt.want)
			}
		})
	}
	files, _ := filepath.Glob("testdata/*.bad.yaml")
	for _, f := range files {
		if !seen[filepath.Base(f)] {
			t.Errorf("%s has no expected error in this test", f)
		}
	}
}

func TestLoadReportsEveryProblem(t *testing.T) {
	const data = `
jobs:
  - name: a
    shardingTotalCount: 0
    timeout: -1s
    script: [/bin/true]
  - name: b
    cron: "nope"
    retries: -2
  - name: a
    script: [/bin/true]
`
	_, err := Parse("jobs.yaml", []byte(data))
	got := []string{}
	for _, e := range Errors(err) {
		got = append(got, e.Error())
	}
	want := []string{
		`jobs.yaml:4: job "a": shardingTotalCount must be >= 1, got 0`,
		`jobs.yaml:5: job "a": timeout must be >= 0 (0 = no limit), got -1s`,
		`jobs.yaml:7: job "b": no work: set script or http`,
		`jobs.yaml:8: job "b": cron "nope": 1 fields; want 6 or 7`,
		`jobs.yaml:9: job "b": retries must be >= 0, got -2`,
		`jobs.yaml:10: job "a": name is defined twice; first at jobs.yaml:3`, // though the first is invalid
	}
	if len(got) != len(want) {
		t.Fatalf("got %d errors, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("error %d = %q, want prefix %q", i, got[i], want[i])
		}
	}
}

func TestLoadDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("10-orders.yaml", "defaults: {failover: true}\njobs:\n  - name: orders\n    script: [/bin/true]\n")
	write("20-hooks.yml", "jobs:\n  - name: hook\n    http: {url: 'http://127.0.0.1:1/'}\n")
	write("README.md", "not yaml: [")
	// Editors' files beside the real ones are skipped: a dangling lock
	// symlink (Emacs), a backup, a swap file, a hidden file.
	if err := os.Symlink("user@host.1234:1700000000", filepath.Join(dir, ".#10-orders.yaml")); err != nil {
		t.Fatal(err)
	}
	write("#10-orders.yaml#", "not yaml: [")
	write("10-orders.yaml~", "not yaml: [")
	write(".10-orders.yaml.swp", "not yaml: [")
	write(".hidden.yaml", "jobs:\n  - name: hidden\n    script: [/bin/true]\n")
	c, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Jobs) != 2 || len(c.Files) != 2 {
		t.Fatalf("jobs %d, files %v", len(c.Jobs), c.Files)
	}
	if !c.Job("orders").Failover || c.Job("hook").Failover {
		t.Error("a file's defaults block must apply to that file only")
	}

	write("30-dup.yaml", "jobs:\n  - name: orders\n    script: [/bin/false]\n")
	_, err = Load(dir)
	if err == nil || !strings.Contains(err.Error(), `30-dup.yaml:2: job "orders": name is defined twice; first at `+filepath.Join(dir, "10-orders.yaml")+":3") {
		t.Errorf("duplicate across files: %v", err)
	}

	if _, err := Load(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no *.yaml or *.yml files") {
		t.Errorf("empty directory: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: %v", err)
	}
}

func TestYAMLAnchorsAndMergeKeys(t *testing.T) {
	const data = `
jobs:
  - &base
    name: one
    failover: true
    script: [/bin/true]
  - <<: *base
    name: two
`
	c, err := Parse("jobs.yaml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if two := c.Job("two"); two == nil || !two.Failover || two.Script.Command.Argv[0] != "/bin/true" {
		t.Errorf("merge key not applied: %+v", two)
	}
}

func TestMergeKeyCycleIsNoHang(t *testing.T) {
	c, err := Parse("jobs.yaml", []byte("jobs:\n  - &a\n    name: x\n    script: [/bin/true]\n    <<: *a\n"))
	if err != nil || c.Job("x") == nil {
		t.Fatalf("self-merge: %v", err)
	}
}

func TestParseItemParameters(t *testing.T) {
	tests := []struct {
		in      string
		want    ItemParameters
		wantErr string
	}{
		{"", ItemParameters{}, ""},
		{"0=Beijing,1=Shanghai,2=Guangzhou", ItemParameters{0: "Beijing", 1: "Shanghai", 2: "Guangzhou"}, ""},
		{" 0 = A , 1 = B ", ItemParameters{0: "A", 1: "B"}, ""},
		{"0=a=b", ItemParameters{0: "a=b"}, ""},
		{"0=$(touch /tmp/pwned); rm -rf ~", ItemParameters{0: "$(touch /tmp/pwned); rm -rf ~"}, ""},
		{"0=", nil, `"0=" is not item=value`},
		{"0=a,,1=b", nil, `"" is not item=value`},
		{"x=a", nil, `item "x" in "x=a" is not a non-negative integer`},
		{"-1=a", nil, "not a non-negative integer"},
		{"1=a,1=b", nil, "item 1 is given twice"},
	}
	for _, tt := range tests {
		got, err := ParseItemParameters(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseItemParameters(%q) error = %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseItemParameters(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"orders", "Orders_2.eu-west", "订单同步", strings.Repeat("a", 128)} {
		if err := CheckName(ok); err != nil {
			t.Errorf("CheckName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a/b", ".hidden", "..", "with space", strings.Repeat("a", 129), "a\x00b", "semi;colon"} {
		if err := CheckName(bad); err == nil {
			t.Errorf("CheckName(%q) = nil, want error", bad)
		}
	}
}

func TestExampleConfigIsValid(t *testing.T) {
	c, err := Load("../../jobs.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Jobs) < 3 {
		t.Errorf("jobs.example.yaml has %d jobs", len(c.Jobs))
	}
	var script, hook, single bool
	for _, j := range c.Jobs {
		script = script || j.Script != nil && j.ShardingTotalCount > 1 && len(j.ShardingItemParameters) > 0
		hook = hook || j.HTTP != nil
		single = single || j.Strategy == "FIRST"
	}
	if !script || !hook || !single {
		t.Errorf("example lacks a sharded script job (%v), an HTTP hook (%v) or a single-owner job (%v)", script, hook, single)
	}
}

func TestJobJSONRoundTrip(t *testing.T) {
	t.Setenv("HOOK_TOKEN", "s3cret") // good.yaml's hook header names it
	c, err := Load("testdata/good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range c.Jobs {
		back, err := ParseJobJSON("etcd", j.JSON())
		if err != nil {
			t.Fatalf("%s: %v\n%s", j.Name, err, j.JSON())
		}
		if back.Hash() != j.Hash() || string(back.JSON()) != string(j.JSON()) {
			t.Errorf("%s: round trip changed the job:\n%s\n%s", j.Name, j.JSON(), back.JSON())
		}
		if (back.Schedule == nil) != (j.Schedule == nil) || back.Location.String() != j.Location.String() || back.Shard.Name() != j.Shard.Name() {
			t.Errorf("%s: derived fields not set", j.Name)
		}
	}
	if c.Job("orders").Hash() == c.Job("invoices").Hash() {
		t.Error("different jobs, same hash")
	}
	for _, bad := range []struct{ data, want string }{
		{`{`, "not a job definition"},
		{`{"name":"x","bogus":1,"script":{"command":{"argv":["/bin/true"]}}}`, `unknown field "bogus"`},
		{`{"name":"x","shardingTotalCount":0,"script":{"command":{"argv":["/bin/true"]}}}`, `etcd: job "x": shardingTotalCount must be >= 1, got 0`},
		{`{"name":"x"} {}`, "data after the JSON object"},
	} {
		if _, err := ParseJobJSON("etcd", []byte(bad.data)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ParseJobJSON(%s) = %v, want %q", bad.data, err, bad.want)
		}
	}
}

func TestParseByteSize(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want ByteSize
		err  bool
	}{
		{"1048576", 1 << 20, false}, {"512KiB", 512 << 10, false}, {"16MiB", 16 << 20, false}, {"2GiB", 2 << 30, false},
		{"10MB", 10e6, false}, {"1 GB", 1e9, false}, {"0", 0, false}, {"7B", 7, false},
		{"", 0, true}, {"lots", 0, true}, {"-1", 0, true}, {"1.5MiB", 0, true}, {"9999999999TiB", 0, true}, {"16mib", 0, true},
	} {
		got, err := ParseByteSize(tt.in)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("ParseByteSize(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.err)
		}
		if err == nil {
			if back, _ := ParseByteSize(got.String()); back != got {
				t.Errorf("%q: String %q reads back as %d", tt.in, got.String(), back)
			}
		}
	}
}

func TestLogRetentionDefaultsAndOverrides(t *testing.T) {
	c, err := Parse("t.yaml", []byte(`
defaults:
  logRetention: {maxAge: 2d}
jobs:
  - name: a
    script: [/bin/true]
  - name: b
    logRetention: {maxBytesPerRun: 1MiB, maxTotalBytes: 100MB}
    script: [/bin/true]
  - name: c
    logRetention: {maxTotalBytes: 1MiB}
    script: [/bin/true]
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]LogRetention{
		"a": {MaxAge: Duration(48 * time.Hour), MaxBytesPerRun: DefaultLogMaxBytesPerRun, MaxTotalBytes: DefaultLogMaxTotalBytes},
		"b": {MaxAge: Duration(48 * time.Hour), MaxBytesPerRun: 1 << 20, MaxTotalBytes: 100e6},
		"c": {MaxAge: Duration(48 * time.Hour), MaxBytesPerRun: 1 << 20, MaxTotalBytes: 1 << 20}, // alone: per run follows
	}
	for _, j := range c.Jobs {
		if j.LogRetention != want[j.Name] {
			t.Errorf("job %s: logRetention %+v, want %+v", j.Name, j.LogRetention, want[j.Name])
		}
	}
}

func FuzzParseByteSize(f *testing.F) {
	for _, s := range []string{"1", "16MiB", "10 GB", "x", "-3KiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := ParseByteSize(s)
		if err != nil {
			return
		}
		if b < 0 {
			t.Fatalf("%q parsed as negative %d", s, b)
		}
		if back, err := ParseByteSize(b.String()); err != nil || back != b {
			t.Fatalf("%q = %d, written %q, read back %d (%v)", s, b, b.String(), back, err)
		}
	})
}

// Nearest suggests a near name (a typo) or the only name a prefix begins,
// and nothing for a name that is neither.
func TestNearest(t *testing.T) {
	fields := []string{"timeout", "retries", "retryBackoff", "script", "shardingTotalCount", "cron"}
	for _, tc := range []struct {
		name, want string
	}{
		{"timout", "timeout"},                   // one letter left out
		{"retrys", "retries"},                   // two letters apart in seven
		{"Script", "script"},                    // case aside
		{"shardingTotal", "shardingTotalCount"}, // the only one it begins
		{"retr", ""},                            // begins two: no guess
		{"cmd", ""},                             // nothing near
		{"cro", "cron"},                         // one letter left out of a short one
		{"xyz", ""},
	} {
		got, ok := Nearest(tc.name, fields)
		if !ok {
			got = ""
		}
		if got != tc.want {
			t.Errorf("Nearest(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A child may have its own cron beside its parents; dataflow's zero fields
// take the defaults; a diamond (two paths to one parent) is no cycle.
func TestDependenciesAndDataflow(t *testing.T) {
	c, err := Parse("jobs.yaml", []byte(`jobs:
  - name: extract
    cron: "0 0 1 * * ?"
    shardingTotalCount: 4
    script: [/bin/true]
  - name: clean
    dependsOn: [extract]
    script: [/bin/true]
  - name: enrich
    dependsOn: [extract]
    script: [/bin/true]
  - name: load
    cron: "0 0 12 * * ?"
    dependsOn: [clean, enrich]
    script: [/bin/true]
    dataflow: {streaming: true, maxDuration: 10m}
`))
	if err != nil {
		t.Fatal(err)
	}
	load := c.Job("load")
	if load == nil || load.Schedule == nil || strings.Join(load.DependsOn, ",") != "clean,enrich" {
		t.Fatalf("load: %+v", load)
	}
	if d := load.Dataflow; d == nil || !d.Streaming || d.MaxIterations != DefaultDataflowMaxIterations || d.MaxDuration != Duration(10*time.Minute) || d.MoreExitCode != 100 {
		t.Errorf("dataflow %+v", load.Dataflow)
	}
	if c.Job("extract").Dataflow != nil {
		t.Error("a job without dataflow got one")
	}
}

// A job that names no strategy gets AVG_ALLOCATION when it has several
// items and ROUND_ROBIN when it has one (one-item jobs spread by name);
// a named strategy is kept, from the job or from the file's defaults.
func TestDefaultStrategyByItemCount(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "jobs.yaml")
	os.WriteFile(path, []byte(`jobs:
  - {name: one, script: "true"}
  - {name: four, shardingTotalCount: 4, script: "true"}
  - {name: named, strategy: AVG_ALLOCATION, script: "true"}
`), 0o644)
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, j := range c.Jobs {
		got[j.Name] = j.Strategy + "/" + j.Shard.Name()
	}
	want := map[string]string{"one": "ROUND_ROBIN/ROUND_ROBIN", "four": "AVG_ALLOCATION/AVG_ALLOCATION", "named": "AVG_ALLOCATION/AVG_ALLOCATION"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("strategies %v, want %v", got, want)
	}
	os.WriteFile(path, []byte("defaults:\n  strategy: AVG_ALLOCATION\njobs:\n  - {name: one, script: \"true\"}\n"), 0o644)
	if c, err := Load(path); err != nil || c.Jobs[0].Strategy != "AVG_ALLOCATION" {
		t.Errorf("a strategy from defaults: %v, %v", c, err)
	}
}
