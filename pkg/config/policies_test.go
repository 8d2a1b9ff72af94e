package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/schedule"
)

const work = "\n    script: [\"/bin/true\"]\n"

func TestPoliciesGood(t *testing.T) {
	t.Parallel()
	c, err := Parse("jobs.yaml", []byte(`calendars:
  holidays-cn:
    timeZone: Asia/Shanghai
    dates: [2027-01-01, "2027-02-10..2027-02-17"]
  weekends:
    weekdays: [SAT, sunday]
jobs:
  - name: settle
    cron: ["0 0 2 * * ?", "0 0 14 * * ?"]
    timeZone: Asia/Shanghai
    overlap: bufferAll
    bufferLimit: 10
    catchUpWindow: 30m
    jitter: 30s
    activeFrom: 2027-01-01
    activeUntil: 2027-06-30
    excludeCalendars: [holidays-cn, weekends]`+work+`  - name: legacy
    cron: "0 0 3 * * ?"
    misfire: false`+work+`  - name: agree
    cron: "0 0 3 * * ?"
    misfire: true
    overlap: bufferOne`+work))
	if err != nil {
		t.Fatal(err)
	}
	j := c.Job("settle")
	if j.OverlapPolicy() != OverlapBufferAll || j.BufferLimitOrDefault() != 10 || !j.Misfire || j.CatchUpWindow != Duration(30*time.Minute) || j.Jitter != Duration(30*time.Second) {
		t.Fatalf("settle's policies: overlap %s, bufferLimit %d, catchUpWindow %s, jitter %s", j.OverlapPolicy(), j.BufferLimitOrDefault(), j.CatchUpWindow, j.Jitter)
	}
	w, ok := j.Schedule.(schedule.Window)
	if !ok {
		t.Fatalf("schedule is %T, want a Window (activeFrom/activeUntil)", j.Schedule)
	}
	if _, ok := w.S.(schedule.Union); !ok {
		t.Fatalf("the window's schedule is %T, want a Union (two crons)", w.S)
	}
	shanghai, _ := time.LoadLocation("Asia/Shanghai")
	if first := j.Schedule.Next(time.Date(2026, 1, 1, 0, 0, 0, 0, shanghai)); !first.Equal(time.Date(2027, 1, 1, 2, 0, 0, 0, shanghai)) {
		t.Fatalf("first fire %s, want 2027-01-01 02:00 in Shanghai (activeFrom)", first)
	}
	if last := schedule.Latest(j.Schedule, time.Date(2027, 6, 1, 0, 0, 0, 0, shanghai), time.Date(2028, 1, 1, 0, 0, 0, 0, shanghai)); !last.Equal(time.Date(2027, 6, 30, 14, 0, 0, 0, shanghai)) {
		t.Fatalf("last fire %s, want 2027-06-30 14:00 (activeUntil's whole day)", last)
	}
	if len(j.Exclusion) != 2 || !j.Exclusion.Excludes(time.Date(2027, 2, 12, 2, 0, 0, 0, shanghai)) || !j.Exclusion.Excludes(time.Date(2027, 1, 3, 2, 0, 0, 0, shanghai)) || j.Exclusion.Excludes(time.Date(2027, 1, 4, 2, 0, 0, 0, shanghai)) {
		t.Fatalf("exclusion %+v: want holidays and weekends (weekends read in the job's zone)", j.Exclusion)
	}
	if legacy := c.Job("legacy"); legacy.OverlapPolicy() != OverlapSkip {
		t.Fatalf("misfire: false is overlap %s, want skip", legacy.OverlapPolicy())
	}
	if agree := c.Job("agree"); agree.OverlapPolicy() != OverlapBufferOne {
		t.Fatalf("overlap %s, want bufferOne", agree.OverlapPolicy())
	}

	// The calendars are part of the definition: JSON carries them, and a
	// definition read back from etcd excludes the same days.
	back, err := ParseJobJSON("etcd", j.JSON())
	if err != nil {
		t.Fatal(err)
	}
	if back.Hash() != j.Hash() || !back.Exclusion.Excludes(time.Date(2027, 2, 12, 2, 0, 0, 0, shanghai)) {
		t.Fatalf("read back: hash %s (want %s), exclusion %+v", back.Hash(), j.Hash(), back.Exclusion)
	}
	if !strings.Contains(string(c.Job("legacy").JSON()), `"cron":"0 0 3 * * ?"`) {
		t.Fatalf("one cron must stay a JSON string (the hash of every existing job depends on it): %s", c.Job("legacy").JSON())
	}
	if !strings.Contains(string(j.JSON()), `"cron":["0 0 2 * * ?","0 0 14 * * ?"]`) {
		t.Fatalf("a list of crons is a JSON list: %s", j.JSON())
	}
	// shardd get's YAML reads back to the same definition.
	again, err := Parse("get.yaml", YAML(j))
	if err != nil {
		t.Fatalf("rendered YAML does not parse: %v\n%s", err, YAML(j))
	}
	if again.Jobs[0].Hash() != j.Hash() {
		t.Fatalf("rendered YAML reads back as another definition:\n%s", YAML(j))
	}
}

// A calendar may be defined in another file of the directory than the jobs
// that name it (conf.d: holidays.yaml beside each team's file).
func TestCalendarsAcrossFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a-jobs.yaml"), []byte("jobs:\n  - name: daily\n    cron: \"0 0 9 * * ?\"\n    excludeCalendars: [holidays]"+work), 0o644)
	os.WriteFile(filepath.Join(dir, "z-holidays.yaml"), []byte("calendars:\n  holidays:\n    dates: [2027-12-25]\n"), 0o644)
	c, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Job("daily").Exclusion.Excludes(time.Date(2027, 12, 25, 9, 0, 0, 0, time.UTC)) {
		t.Fatal("the calendar of another file is not applied")
	}
	os.WriteFile(filepath.Join(dir, "b-dup.yaml"), []byte("calendars:\n  holidays:\n    dates: [2027-12-26]\n"), 0o644)
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), `z-holidays.yaml:2: calendar "holidays" is defined twice (first at `) {
		t.Fatalf("a calendar defined in two files: %v", err)
	}
}

func TestFixedDelay(t *testing.T) {
	t.Parallel()
	c, err := Parse("jobs.yaml", []byte("jobs:\n  - name: sync\n    fixedDelay: 10m"+work))
	if err != nil {
		t.Fatal(err)
	}
	j := c.Job("sync")
	if j.FixedDelay != Duration(10*time.Minute) || j.Schedule != nil || !strings.Contains(string(j.JSON()), `"fixedDelay":"10m0s"`) {
		t.Fatalf("fixedDelay %s, schedule %v, JSON %s", j.FixedDelay, j.Schedule, j.JSON())
	}
	if back, err := ParseJobJSON("etcd", j.JSON()); err != nil || back.Hash() != j.Hash() {
		t.Fatalf("read back: %v", err)
	}
}

func TestPoliciesBad(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, yaml, want string }{
		{"overlap", "jobs:\n  - name: j\n    cron: \"@hourly\"\n    overlap: forbid" + work,
			`jobs.yaml:4: job "j": overlap "forbid" is not one of bufferOne, skip, bufferAll`},
		{"misfire disagrees", "jobs:\n  - name: j\n    cron: \"@hourly\"\n    misfire: true\n    overlap: skip" + work,
			`jobs.yaml:4: job "j": misfire: true disagrees with overlap: skip`},
		{"bufferLimit without bufferAll", "jobs:\n  - name: j\n    cron: \"@hourly\"\n    bufferLimit: 5" + work,
			`jobs.yaml:4: job "j": bufferLimit applies to overlap: bufferAll only (overlap is bufferOne)`},
		{"catchUpWindow", "jobs:\n  - name: j\n    cron: \"@hourly\"\n    catchUpWindow: -1m" + work,
			`jobs.yaml:4: job "j": catchUpWindow must not be negative, got -1m0s`},
		{"jitter over the period", "jobs:\n  - name: j\n    cron: \"0 * * * * ?\"\n    jitter: 1m" + work,
			`jobs.yaml:4: job "j": jitter 1m0s must be shorter than the shortest gap between two fires of the schedule, 1m0s`},
		{"jitter over the gap between two crons' fires, once a year", "jobs:\n  - name: j\n    cron: [\"0 */10 * * * ?\", \"0 5 0 1 6 ?\"]\n    jitter: 8m" + work,
			`jobs.yaml:4: job "j": jitter 8m0s must be shorter than the shortest gap between two fires of the schedule, 5m0s`},
		{"an XXL-JOB block strategy as overlap", "jobs:\n  - name: j\n    cron: \"0 * * * * ?\"\n    overlap: SERIAL_EXECUTION" + work,
			`jobs.yaml:4: job "j": overlap "SERIAL_EXECUTION" is not one of bufferOne, skip, bufferAll, replace (SERIAL_EXECUTION is overlap: bufferAll here)`},
		{"overlap in another case", "jobs:\n  - name: j\n    cron: \"0 * * * * ?\"\n    overlap: BufferAll" + work,
			`(did you mean bufferAll?)`},
		{"Kubernetes' schedule", "jobs:\n  - name: j\n    schedule: \"0 * * * *\"" + work,
			`jobs.yaml:3: job "j": unknown field schedule: shardd's is cron (Kubernetes' schedule)`},
		{"Kubernetes' concurrencyPolicy", "jobs:\n  - name: j\n    cron: \"0 * * * * ?\"\n    concurrencyPolicy: Forbid" + work,
			`unknown field concurrencyPolicy: shardd's is overlap (Kubernetes' Forbid is overlap: skip`},
		{"jitter without cron", "jobs:\n  - name: j\n    jitter: 1s" + work,
			`jobs.yaml:3: job "j": jitter shapes the fires of a cron schedule; this job has none (it runs when triggered: by hand, or by its parents)`},
		{"overlap without cron (a child run by its parents)", "jobs:\n  - name: p\n    cron: \"0 * * * * ?\"\n    script: [/bin/true]\n  - name: j\n    dependsOn: [p]\n    overlap: replace" + work,
			`jobs.yaml:7: job "j": overlap shapes the fires of a cron schedule; this job has none`},
		{"catchUpWindow without cron", "jobs:\n  - name: j\n    catchUpWindow: 5m" + work,
			`jobs.yaml:3: job "j": catchUpWindow shapes the fires of a cron schedule; this job has none`},
		{"activeFrom without cron", "jobs:\n  - name: j\n    activeFrom: 2027-01-01" + work,
			`jobs.yaml:3: job "j": activeFrom shapes the fires of a cron schedule; this job has none`},
		{"activeFrom", "jobs:\n  - name: j\n    cron: \"@hourly\"\n    activeFrom: next monday" + work,
			`jobs.yaml:4: job "j": activeFrom "next monday" is not a time like`},
		{"activeFrom a date that does not exist", "jobs:\n  - name: j\n    cron: \"@hourly\"\n    activeFrom: 2027-02-30" + work,
			`(day out of range)`},
		{"fixedDelay 0s", "jobs:\n  - name: j\n    fixedDelay: 0s" + work,
			`jobs.yaml:3: job "j": fixedDelay must be a whole number of seconds >= 1s, got 0s`},
		{"activeUntil before activeFrom", "jobs:\n  - name: j\n    cron: \"@hourly\"\n    activeFrom: 2027-02-01\n    activeUntil: 2027-01-31" + work,
			`jobs.yaml:5: job "j": activeUntil 2027-01-31 is before activeFrom 2027-02-01`},
		{"no such calendar", "calendars:\n  holidays:\n    dates: [2027-01-01]\njobs:\n  - name: j\n    cron: \"@hourly\"\n    excludeCalendars: [holiday]" + work,
			`jobs.yaml:7: job "j": excludeCalendars: no calendar "holiday"`},
		{"calendar field typo", "calendars:\n  holidays:\n    date: [2027-01-01]\njobs:\n  - name: j\n    cron: \"@hourly\"\n    excludeCalendars: [holidays]" + work,
			`jobs.yaml:3: unknown field calendars.holidays.date (did you mean dates?)`},
		{"calendar date", "calendars:\n  holidays:\n    dates: [2027-13-01]\njobs:\n  - name: j\n    cron: \"@hourly\"\n    excludeCalendars: [holidays]" + work,
			`jobs.yaml:3: calendars.holidays.dates "2027-13-01" is not a date like 2027-01-01`},
		{"an unused calendar is checked too", "calendars:\n  spare:\n    weekdays: [XYZ]\njobs:\n  - name: j\n    cron: \"@hourly\"" + work,
			`jobs.yaml:3: calendars.spare.weekdays "XYZ" is not a day of the week`},
		{"a misspelled calendar name", "calendars:\n  weekend:\n    weekdays: [SAT]\njobs:\n  - name: j\n    cron: \"@hourly\"\n    excludeCalendars: [Weekend]" + work,
			`jobs.yaml:7: job "j": excludeCalendars: no calendar "Weekend" (did you mean weekend?)`},
		{"calendar range backwards", "calendars:\n  holidays:\n    dates: [2027-02-17..2027-02-10]\njobs:\n  - name: j\n    cron: \"@hourly\"\n    excludeCalendars: [holidays]" + work,
			`calendars.holidays.dates "2027-02-17..2027-02-10" ends before it begins`},
		{"calendar weekday", "calendars:\n  holidays:\n    weekdays: [SATURDAYS]\njobs:\n  - name: j\n    cron: \"@hourly\"\n    excludeCalendars: [holidays]" + work,
			`calendars.holidays.weekdays "SATURDAYS" is not a day of the week`},
		{"calendars in defaults", "defaults:\n  calendars:\n    h:\n      dates: [2027-01-01]\njobs:\n  - name: j\n    cron: \"@hourly\"" + work,
			`jobs.yaml:2: defaults: calendars cannot be set in defaults`},
		{"cron list with @every", "jobs:\n  - name: j\n    cron: [\"@every 1m\", \"0 0 2 * * ?\"]" + work,
			`jobs.yaml:3: job "j": cron[0] "@every 1m": @every cannot be one of several crons`},
		{"cron list entry bad", "jobs:\n  - name: j\n    cron: [\"0 0 2 * * ?\", \"0 0 25 * * ?\"]" + work,
			`jobs.yaml:3: job "j": cron[1] "0 0 25 * * ?": hour "25"`},
		{"cron list twice", "jobs:\n  - name: j\n    cron: [\"0 0 2 * * ?\", \"0 0 2 * * ?\"]" + work,
			`cron[1] "0 0 2 * * ?" is given twice`},
		{"fixedDelay with cron", "jobs:\n  - name: j\n    cron: \"@hourly\"\n    fixedDelay: 10m" + work,
			`jobs.yaml:4: job "j": fixedDelay and cron are both set`},
		{"fixedDelay not whole seconds", "jobs:\n  - name: j\n    fixedDelay: 1500ms" + work,
			`jobs.yaml:3: job "j": fixedDelay must be a whole number of seconds >= 1s, got 1.5s`},
		{"fixedDelay with jitter", "jobs:\n  - name: j\n    fixedDelay: 10m\n    jitter: 5s" + work,
			`jobs.yaml:4: job "j": jitter applies to a cron schedule, not to fixedDelay`},
		{"fixedDelay parent", "jobs:\n  - name: p\n    fixedDelay: 10m" + work + "  - name: c\n    dependsOn: [p]" + work,
			`jobs.yaml:2: job "p": c depends on this job, whose fixedDelay gives each item its own fires`},
		{"pauseAfterFailures negative", "jobs:\n  - name: j\n    cron: \"@hourly\"\n    pauseAfterFailures: -1" + work,
			`jobs.yaml:4: job "j": pauseAfterFailures must be between 1 and 1000 (0: never pause), got -1`},
		{"pauseAfterFailures with fixedDelay", "jobs:\n  - name: j\n    fixedDelay: 1m\n    pauseAfterFailures: 3" + work,
			`jobs.yaml:4: job "j": pauseAfterFailures counts failed fires of the whole job; with fixedDelay each item has its own fires`},
		{"clusterConcurrency negative", "jobs:\n  - name: j\n    cron: \"@hourly\"\n    clusterConcurrency: -2" + work,
			`jobs.yaml:4: job "j": clusterConcurrency must be between 1 and 10000 (0: no limit), got -2`},
		{"cron empty list", "jobs:\n  - name: j\n    cron: []" + work,
			`jobs.yaml:3: job "j": cron is an empty list`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse("jobs.yaml", []byte(tt.yaml))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error:\n  %v\nwant it to contain:\n  %s", err, tt.want)
			}
		})
	}
}

// A date names the day's first instant in the job's zone, also where the
// clocks jump over midnight (America/Santiago on 2026-09-06: 00:00 is
// never shown, the day starts at the jump).
func TestActiveReadingInTheJobsZone(t *testing.T) {
	t.Parallel()
	shanghai, _ := time.LoadLocation("Asia/Shanghai")
	got, err := parseActive("2027-01-01 09:30", shanghai, false)
	if err != nil || !got.Equal(time.Date(2027, 1, 1, 9, 30, 0, 0, shanghai)) {
		t.Fatalf("2027-01-01 09:30 in Shanghai: %s, %v", got, err)
	}
}

func TestActiveDatesWhereMidnightIsSkipped(t *testing.T) {
	t.Parallel()
	loc, _ := time.LoadLocation("America/Santiago")
	from, _ := parseActive("2026-09-06", loc, false)
	if got := from.In(loc).Format(time.DateOnly); got != "2026-09-06" {
		t.Errorf("activeFrom 2026-09-06 begins at %s", from.In(loc))
	}
	until, _ := parseActive("2026-09-05", loc, true)
	if got := until.In(loc).Format(time.DateOnly); got != "2026-09-05" || until.Add(time.Nanosecond).In(loc).Format(time.DateOnly) != "2026-09-06" {
		t.Errorf("activeUntil 2026-09-05 ends at %s, want the last instant of that day", until.In(loc))
	}
}

// jitter from defaults reaches the jobs with a cron only: a fixedDelay job
// or one run by hand has no fire to offset, and runs without it (review of
// #30: a fixedDelay job took it).
func TestDefaultJitterOnlyForCronJobs(t *testing.T) {
	t.Parallel()
	c, err := Parse("jobs.yaml", []byte(`defaults: {jitter: 5s, activeFrom: 2027-01-01}
jobs:
  - name: hourly
    cron: "0 0 * * * ?"
    script: [/bin/true]
  - name: delayed
    fixedDelay: 1m
    script: [/bin/true]
  - name: manual
    script: [/bin/true]
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.Job("manual").ActiveFrom == "" {
		t.Error("activeFrom from defaults did not reach the job (it is accepted on a job without a cron, where it does nothing)")
	}
	for name, want := range map[string]time.Duration{"hourly": 5 * time.Second, "delayed": 0, "manual": 0} {
		if got := time.Duration(c.Job(name).Jitter); got != want {
			t.Errorf("job %s: jitter %s, want %s", name, got, want)
		}
	}
}

// A field out of place is one problem, said once: excludeCalendars on a
// fixedDelay job, or on a job run by hand (a new user saw two messages).
func TestCronOnlyFieldSaidOnce(t *testing.T) {
	t.Parallel()
	for _, schedule := range []string{"    fixedDelay: 1m\n", ""} {
		_, err := Parse("jobs.yaml", []byte("calendars:\n  off: {weekdays: [SUN]}\njobs:\n  - name: j\n"+schedule+"    excludeCalendars: [off]\n    script: [/bin/true]\n"))
		if errs := Errors(err); len(errs) != 1 || !strings.Contains(errs[0].Error(), "excludeCalendars") {
			t.Errorf("%q: %d problems, want one about excludeCalendars: %v", schedule, len(errs), err)
		}
	}
}
