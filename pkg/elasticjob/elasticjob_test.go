package elasticjob

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/shardd/shardd/pkg/config"
)

func parseFile(t *testing.T, name string) *Result {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	r, err := Parse(name, data, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func jobOf(t *testing.T, r *Result, name string) *config.Job {
	t.Helper()
	for _, j := range r.Jobs {
		if j.Name == name {
			return j
		}
	}
	t.Fatalf("job %s not converted; notes: %v", name, r.Notes)
	return nil
}

func notesOf(r *Result, job string) []string {
	var out []string
	for _, n := range r.Notes {
		if n.Job == job {
			out = append(out, n.String())
		}
	}
	return out
}

// Every mapped field of the Spring Boot starter's configuration, camelCase
// and kebab-case, and every refusal, each with its reason.
func TestSpringBoot(t *testing.T) {
	r := parseFile(t, "application.yaml")
	s := jobOf(t, r, "settleScript")
	if s.Cron.String() != "0/5 * * * * ?" || s.TimeZone != "Etc/GMT-8" || s.ShardingTotalCount != 3 || s.ShardingItemParameters.String() != "0=Beijing,1=Shanghai,2=Guangzhou" ||
		s.JobParameter != "full" || !s.Failover || s.Misfire || s.MonitorExecution || s.MaxTimeDiffSeconds != 30 || s.ReconcileIntervalMinutes != 5 ||
		s.Strategy != "ODEVITY" || s.Description != "settle the day's orders" || s.Disabled || !s.Overwrite {
		t.Errorf("settleScript: %s", s.JSON())
	}
	if s.Script == nil || !slices.Equal(s.Script.Command.Argv, []string{"/opt/jobs/settle.sh", "--mode", "full day"}) || !s.Script.ContextArg {
		t.Errorf("settleScript's script: %+v", s.Script)
	}
	if s.OnFailure == nil || s.OnFailure.Format != "dingtalk" || s.OnFailure.Webhook != "https://oapi.dingtalk.com/robot/send?access_token=abc" {
		t.Errorf("settleScript's onFailure: %+v", s.OnFailure)
	}
	if got := notesOf(r, "settleScript"); len(got) != 1 || !strings.Contains(got[0], "props.dingtalk.secret: not converted: shardd does not sign") {
		t.Errorf("settleScript's notes: %q", got)
	}

	h := jobOf(t, r, "notify-http")
	if h.HTTP == nil || h.HTTP.URL != "http://hooks.internal:8080/notify" || h.HTTP.Method != "POST" || h.HTTP.Body != "source=elasticjob" ||
		h.HTTP.Timeout != config.Duration(10e9) || h.HTTP.Headers["Content-Type"] != "application/x-www-form-urlencoded" {
		t.Errorf("notify-http's http: %+v", h.HTTP)
	}
	if h.TimeZone != "Asia/Shanghai" || h.ShardingTotalCount != 2 || h.OnFailure == nil || h.OnFailure.Format != "wechat" || h.Instances == nil || h.Instances.Selector != "label=edge" {
		t.Errorf("notify-http: %s", h.JSON())
	}
	if got := notesOf(r, "notify-http"); len(got) != 0 { // its label is a selector, its method given
		t.Errorf("notify-http's notes: %q", got)
	}

	m := jobOf(t, r, "manualScript")
	if len(m.Cron) > 0 || m.Schedule != nil {
		t.Errorf("a job without cron: %s, want manual-only", m.JSON())
	}
	if got := notesOf(r, "manualScript"); len(got) != 1 || !strings.Contains(got[0], "jobBootstrapBeanName: not converted: a Spring bean name") {
		t.Errorf("manualScript's notes: %q", got)
	}

	tz := "timeZone: not converted: none given: ElasticJob read the cron in the JVM's zone, shardd reads it in UTC"
	want := map[string][]string{
		"javaSimple":   {"job javaSimple: not converted: a Java class job (org.example.job.SpringBootSimpleJob)", "job javaSimple: " + tz},
		"badCron":      {"job badCron: not converted: shardd refuses it: cron \"0 0 23 L * ?\"", "job badCron: " + tz},
		"halfHourZone": {"job halfHourZone: not converted: GMT+05:30 is 30 minutes off a whole hour"},
		"typos": {
			"job typos: not converted: unknown key shardingTotalCont (did you mean shardingTotalCount?)",
			"job typos: not converted: unknown property (did you mean script.command.line?)",
			"job typos: jobExecutorServiceHandlerType: not converted: shardd runs each item in a process of its own",
			"job typos: jobErrorHandlerType: not converted: EMAIL: shardd does not send mail",
			"job typos: " + tz,
		},
	}
	for job, w := range want {
		got := notesOf(r, job)
		for _, line := range w {
			if !slices.ContainsFunc(got, func(g string) bool { return strings.HasPrefix(g, line) }) {
				t.Errorf("%s: no note %q in %q", job, line, got)
			}
		}
		if len(got) != len(w) {
			t.Errorf("%s: notes %q, want %d", job, got, len(w))
		}
	}
	for _, j := range []string{"javaSimple", "badCron", "halfHourZone", "typos"} {
		if slices.ContainsFunc(r.Jobs, func(c *config.Job) bool { return c.Name == j }) {
			t.Errorf("%s converted, though it could not be", j)
		}
	}
	if r.Complete() {
		t.Error("Complete with notes")
	}
	// --time-zone: the jobs without a zone get it, without a note; and
	// --selector, the jobs without an ElasticJob label.
	data, _ := os.ReadFile("testdata/application.yaml")
	r2, err := Parse("application.yaml", data, Options{TimeZone: "Asia/Shanghai", Selector: "role=batch"})
	if err != nil {
		t.Fatal(err)
	}
	if j := jobOf(t, r2, "manualScript"); j.TimeZone != "Asia/Shanghai" || j.Instances == nil || j.Instances.Selector != "role=batch" {
		t.Errorf("with --time-zone and --selector: %s", j.JSON())
	}
	if got := notesOf(r2, "typos"); slices.ContainsFunc(got, func(g string) bool { return strings.Contains(g, "none given") }) {
		t.Errorf("with --time-zone, still a zone note: %q", got)
	}
	// What converted is what shardd validate accepts.
	if _, err := config.ParseWithoutEnv("out.yaml", config.YAML(r.Jobs...)); err != nil {
		t.Errorf("the converted YAML does not validate: %v", err)
	}
}

// The registry's job configs: ElasticJob 3's YAML, ElasticJob-Lite 2's JSON.
func TestRegistryConfigs(t *testing.T) {
	r := parseFile(t, "registry-config.yaml")
	j := jobOf(t, r, "scriptElasticJob")
	if !r.Complete() || j.Strategy != "ROUND_ROBIN" || !j.Failover || j.ShardingTotalCount != 3 || j.Script.Command.Argv[0] != "/opt/jobs/demo.sh" || j.TimeZone != "Asia/Shanghai" {
		t.Errorf("3.x registry config: %s; notes %v", j.JSON(), r.Notes)
	}
	r = parseFile(t, "registry-config-2x.json")
	j = jobOf(t, r, "legacyScript")
	if j.Strategy != "ROUND_ROBIN" || j.Cron.String() != "0 0/10 * * * ?" || j.Script.Command.Argv[0] != "/opt/jobs/legacy.sh" || !j.Overwrite {
		t.Errorf("2.x registry config: %s", j.JSON())
	}
	if got := notesOf(r, "legacyScript"); len(got) != 1 || !strings.Contains(got[0], "timeZone") {
		t.Errorf("2.x notes: %q, want the zone's only (monitorPort -1 and the default handlers are off: no note)", got)
	}
}

func TestZone(t *testing.T) {
	for in, want := range map[string]string{"GMT+08:00": "Etc/GMT-8", "GMT-5": "Etc/GMT+5", "UTC+0": "UTC", "gmt+8": "Etc/GMT-8", "Europe/Berlin": "Europe/Berlin"} {
		if got, err := zone(in); err != nil || got != want {
			t.Errorf("zone(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"GMT+05:30", "CTT", "GMT+15", ""} {
		if got, err := zone(in); err == nil {
			t.Errorf("zone(%q) = %q, want an error", in, got)
		}
	}
}

func TestSplitCommandLine(t *testing.T) {
	for in, want := range map[string][]string{
		`/bin/echo a b`:     {"/bin/echo", "a", "b"},
		`run "a b" 'c d' e`: {"run", "a b", "c d", "e"},
		`x ""`:              {"x", ""},
		"  spaced\tout  ":   {"spaced", "out"},
		`echo "it's" fine`:  {"echo", "it's", "fine"},
	} {
		if got, err := splitCommandLine(in); err != nil || !slices.Equal(got, want) {
			t.Errorf("splitCommandLine(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{``, `a "b`, `   `} {
		if _, err := splitCommandLine(in); err == nil {
			t.Errorf("splitCommandLine(%q): want an error", in)
		}
	}
}

// Whatever the input, Parse returns an error or jobs that validate, and a
// job it does not convert has a fatal note.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"application.yaml", "registry-config.yaml", "registry-config-2x.json"} {
		data, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("jobName: x\nprops: {script.command.line: '\"'}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Parse("fuzz", data, Options{TimeZone: "Asia/Shanghai"})
		if err != nil {
			return
		}
		for _, j := range r.Jobs {
			if _, err := config.ParseJobJSON("out", j.JSON()); err != nil {
				t.Fatalf("converted job %s does not validate: %v", j.Name, err)
			}
		}
	})
}
