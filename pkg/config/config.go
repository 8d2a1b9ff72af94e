// Package config loads and validates shardd job definitions.
//
// A config is one YAML file, or a directory whose *.yaml and *.yml files are
// read in name order (conf.d style). Each file holds a `jobs:` list and an
// optional `defaults:` block that applies to that file's jobs unless a job
// sets the field itself:
//
//	defaults:
//	  timeZone: Europe/Berlin
//	  failover: true
//	jobs:
//	  - name: orders
//	    cron: "0/5 * * * * ?"
//	    shardingTotalCount: 3
//	    shardingItemParameters: "0=Beijing,1=Shanghai,2=Guangzhou"
//	    script: ["/usr/local/bin/sync-orders"]
//
// Field names follow ElasticJob's so that its users recognise them. Loading is
// strict: unknown fields are errors, and every problem of every file is
// reported at once, each naming the file, line, job and field:
//
//	jobs.yaml:14: job "orders": shardingTotalCount must be >= 1, got 0
//
// Defaults are applied in this order: the built-in defaults (DefaultJob), then
// the file's defaults block, then the job's own fields.
package config

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/schedule"
	"github.com/shardd/shardd/pkg/selector"
	"github.com/shardd/shardd/pkg/shard"
)

// Config is a validated set of jobs.
type Config struct {
	// Jobs sorted by name.
	Jobs []*Job
	// Files that were read, in order.
	Files []string
}

// Job returns the job called name, or nil.
func (c *Config) Job(name string) *Job {
	i := sort.Search(len(c.Jobs), func(i int) bool { return c.Jobs[i].Name >= name })
	if i < len(c.Jobs) && c.Jobs[i].Name == name {
		return c.Jobs[i]
	}
	return nil
}

// Job is one job definition. The YAML names are ElasticJob's where it has one.
type Job struct {
	Name        string `yaml:"name" json:"name"`
	Description string `yaml:"description" json:"description,omitempty"`
	// Cron is the schedule (see package schedule): one expression or a
	// list of them, whose fires are all the job's (a time two give fires
	// once). Empty means the job runs only when triggered by hand.
	Cron CronList `yaml:"cron" json:"cron,omitempty"`
	// TimeZone is an IANA zone name in which Cron is read. Default UTC, so
	// that hosts with different local zones agree on fire times.
	TimeZone               string         `yaml:"timeZone" json:"timeZone"`
	ShardingTotalCount     int            `yaml:"shardingTotalCount" json:"shardingTotalCount"`
	ShardingItemParameters ItemParameters `yaml:"shardingItemParameters" json:"shardingItemParameters,omitempty"`
	JobParameter           string         `yaml:"jobParameter" json:"jobParameter,omitempty"`
	// Strategy is a shard strategy name; jobShardingStrategyType is accepted as an alias.
	Strategy string `yaml:"strategy" alias:"jobShardingStrategyType" json:"strategy"`
	Failover bool   `yaml:"failover" json:"failover"`
	// Misfire is Overlap's ElasticJob alias: true is bufferOne, false skip.
	Misfire          bool `yaml:"misfire" json:"misfire"`
	MonitorExecution bool `yaml:"monitorExecution" json:"monitorExecution"`
	Disabled         bool `yaml:"disabled" json:"disabled"`
	Overwrite        bool `yaml:"overwrite" json:"overwrite"`
	// MaxTimeDiffSeconds is the clock skew against etcd this host tolerates; -1 disables the check.
	MaxTimeDiffSeconds int `yaml:"maxTimeDiffSeconds" json:"maxTimeDiffSeconds"`
	// ReconcileIntervalMinutes bounds how long the leader may go without re-checking the shard map.
	ReconcileIntervalMinutes int `yaml:"reconcileIntervalMinutes" json:"reconcileIntervalMinutes"`
	// Timeout bounds one execution of one item; 0 means no limit.
	Timeout Duration `yaml:"timeout" json:"timeout"`
	// Retries is how many times a failed execution is tried again: a
	// script that failed, a hook that met a network error or a 5xx (not a
	// 4xx, a timeout or a kill). RetryBackoff is the wait before the first
	// retry; it doubles with each retry, up to MaxRetryBackoff.
	Retries      int      `yaml:"retries" json:"retries"`
	RetryBackoff Duration `yaml:"retryBackoff" json:"retryBackoff"`
	// FixedDelay, instead of Cron, schedules each item's next fire at its
	// previous run's end plus the delay (the first at its record's
	// beginning), from the item's record in etcd.
	FixedDelay Duration `yaml:"fixedDelay" json:"fixedDelay,omitempty"`
	// ClusterConcurrency, when > 0, caps the items of this job running at
	// once over the whole cluster (slots fenced in etcd; the items that
	// waited longest get them first).
	ClusterConcurrency int `yaml:"clusterConcurrency" json:"clusterConcurrency,omitempty"`
	// PauseAfterFailures, when > 0, disables the job after that many of
	// its fires in a row failed (an item of each ended FAILED or KILLED),
	// until an operator enables it.
	PauseAfterFailures int `yaml:"pauseAfterFailures" json:"pauseAfterFailures,omitempty"`
	// Overlap says what happens to a fire of an item whose previous run
	// is still going (Overlap* constants; "" is misfire's); BufferLimit
	// bounds the pending fires of OverlapBufferAll (0: the default).
	Overlap     string `yaml:"overlap" json:"overlap,omitempty"`
	BufferLimit int    `yaml:"bufferLimit" json:"bufferLimit,omitempty"`
	// CatchUpWindow is how old a missed fire may be and still run; 0: the
	// instance's default (max(1m, 3 x session TTL)).
	CatchUpWindow Duration `yaml:"catchUpWindow" json:"catchUpWindow,omitempty"`
	// Jitter starts each (item, fire) at a deterministic offset in
	// [0, Jitter) after its fire, the same on every instance.
	Jitter Duration `yaml:"jitter" json:"jitter,omitempty"`
	// ActiveFrom and ActiveUntil bound the schedule: an RFC 3339 time, or
	// a date in the job's zone (ActiveUntil's whole day included).
	ActiveFrom  string `yaml:"activeFrom" json:"activeFrom,omitempty"`
	ActiveUntil string `yaml:"activeUntil" json:"activeUntil,omitempty"`
	// ExcludeCalendars names calendars whose days the job does not run:
	// their fires are recorded skipped, reason calendar. Calendars holds
	// them (a file's top-level calendars that the job names are copied
	// here, so that they are part of its definition).
	ExcludeCalendars []string             `yaml:"excludeCalendars" json:"excludeCalendars,omitempty"`
	Calendars        map[string]*Calendar `yaml:"calendars" json:"calendars,omitempty"`
	// MaxConcurrency caps the items of this job running at once on one instance; 0 means no cap.
	MaxConcurrency int `yaml:"maxConcurrency" json:"maxConcurrency"`

	// Exactly one of Script and HTTP is set.
	Script *Script `yaml:"script" json:"script,omitempty"`
	HTTP   *HTTP   `yaml:"http" json:"http,omitempty"`

	// OnFailure is told about every run that failed after its retries.
	OnFailure *OnFailure `yaml:"onFailure" json:"onFailure,omitempty"`
	// Listeners run once per instance per fire, around its items.
	Listeners *Listeners `yaml:"listeners" json:"listeners,omitempty"`
	// LogRetention bounds the run logs (each run's whole output, kept on the
	// host that ran it); zero fields take the defaults (see package runlog).
	LogRetention LogRetention `yaml:"logRetention" json:"logRetention"`

	// DependsOn names the jobs whose completed fires fire this one (see
	// docs/design.md, Dependencies): each parent fire whose every item
	// succeeded fires this job once. A job with DependsOn may have a Cron
	// too. The parents must be defined wherever this job is.
	DependsOn []string `yaml:"dependsOn" json:"dependsOn,omitempty"`
	// Dataflow, with Streaming, makes one run of an item repeat its work
	// while the work says it processed data and more may remain (see
	// Dataflow). Nil or Streaming false: each run does its work once.
	Dataflow *Dataflow `yaml:"dataflow" json:"dataflow,omitempty"`
	// Instances chooses which instances run the job (see Instances); nil:
	// every instance that has it (a file job) or accepts it (an applied one).
	Instances *Instances `yaml:"instances" json:"instances,omitempty"`

	// Set by Load from the fields above.
	Schedule schedule.Schedule `yaml:"-" json:"-"` // nil when Cron is empty
	// Exclusion is the calendars of ExcludeCalendars.
	Exclusion schedule.Exclusion `yaml:"-" json:"-"`
	Location  *time.Location     `yaml:"-" json:"-"`
	Shard     shard.Strategy     `yaml:"-" json:"-"`
	// Pos is where the job is defined.
	Pos Pos `yaml:"-" json:"-"`
	// dependsOnLine is the line of DependsOn, for errors found across jobs.
	dependsOnLine int
	// hash is Hash, computed once the parsers return the Job (seal).
	hash string
}

// Pos is a place in a config file.
type Pos struct {
	File string
	Line int
}

func (p Pos) String() string { return fmt.Sprintf("%s:%d", p.File, p.Line) }

// Script is work run as a child process.
type Script struct {
	// Command is the program: an argv list run directly, or a string run by /bin/sh -c.
	Command Command           `yaml:"command" json:"command"`
	Env     map[string]string `yaml:"env" json:"env,omitempty"`
	Workdir string            `yaml:"workdir" json:"workdir,omitempty"`
	// ContextArg appends ElasticJob's shardingContext JSON as the last
	// argument, for scripts migrated from ElasticJob.
	ContextArg bool `yaml:"contextArg" json:"contextArg,omitempty"`
}

// Command is an argv list (Argv) or a shell string (Shell); exactly one is set.
type Command struct {
	Argv  []string `json:"argv,omitempty"`
	Shell string   `json:"shell,omitempty"`
}

// HTTP is work done by calling an HTTP hook.
type HTTP struct {
	URL     string            `yaml:"url" json:"url"`
	Method  string            `yaml:"method" json:"method"`
	Headers map[string]string `yaml:"headers" json:"headers,omitempty"`
	// Body is sent as is; when empty, the execution context is sent as JSON.
	Body    string   `yaml:"body" json:"body,omitempty"`
	Timeout Duration `yaml:"timeout" json:"timeout"`
	// SuccessCodes are the statuses that count as success; empty means any 2xx.
	SuccessCodes []int `yaml:"successCodes" json:"successCodes,omitempty"`
	// FollowRedirects follows redirects to the URL's origin only; by
	// default a 3xx answer is the result (a failure unless in SuccessCodes).
	FollowRedirects bool `yaml:"followRedirects" json:"followRedirects,omitempty"`
	// TLS verifies the server with a CA bundle and presents a client certificate.
	TLS *TLSFiles `yaml:"tls" json:"tls,omitempty"`
}

// TLSFiles name PEM files.
type TLSFiles struct {
	CA   string `yaml:"ca" json:"ca,omitempty"`
	Cert string `yaml:"cert" json:"cert,omitempty"`
	Key  string `yaml:"key" json:"key,omitempty"`
}

// OnFailure says whom to tell about a failed run, besides the log.
type OnFailure struct {
	// Webhook receives a JSON POST; Format shapes it for a chat's incoming
	// webhook: json (default: the whole record plus "text"), slack,
	// dingtalk or wechat.
	Webhook string `yaml:"webhook" json:"webhook,omitempty"`
	Format  string `yaml:"format" json:"format,omitempty"`
	// Command runs with the run's context and result in SHARDD_* variables.
	Command *Command `yaml:"command" json:"command,omitempty"`
}

// Listeners are commands run around each fire, once per instance that
// runs items of it: Before before its first item starts, After once its
// items of that fire have finished. Both get SHARDD_JOB, SHARDD_FIRE_TIME,
// SHARDD_INSTANCE and SHARDD_ITEMS (comma-separated).
type Listeners struct {
	Before *Command `yaml:"before" json:"before,omitempty"`
	After  *Command `yaml:"after" json:"after,omitempty"`
}

// LogRetention bounds a job's run logs on each instance: none older than
// MaxAge, at most MaxBytesPerRun for one run's log (0: the smaller of
// DefaultLogMaxBytesPerRun and MaxTotalBytes), at most MaxTotalBytes of
// disk for the job's finished logs; the oldest go first.
type LogRetention struct {
	MaxAge         Duration `yaml:"maxAge" json:"maxAge"`
	MaxBytesPerRun ByteSize `yaml:"maxBytesPerRun" json:"maxBytesPerRun"`
	MaxTotalBytes  ByteSize `yaml:"maxTotalBytes" json:"maxTotalBytes"`
}

// Dataflow is ElasticJob's DATAFLOW job type for scripts and hooks: a
// streaming run repeats its work while the work reports "more" (a script's
// exit status MoreExitCode, a hook's 2xx answer {"more": true}), and stops
// when the work reports done (exit 0, or no "more"), fails, the job's map
// is about to change, the instance loses the item, or a limit is reached.
type Dataflow struct {
	Streaming bool `yaml:"streaming" json:"streaming"`
	// MaxIterations and MaxDuration bound one streaming run; 0 takes the
	// defaults. A job's timeout bounds each iteration.
	MaxIterations int      `yaml:"maxIterations" json:"maxIterations,omitempty"`
	MaxDuration   Duration `yaml:"maxDuration" json:"maxDuration,omitempty"`
	// MoreExitCode is the exit status with which a script says it processed
	// data and more may remain; 0 takes the default (100).
	MoreExitCode int `yaml:"moreExitCode" json:"moreExitCode,omitempty"`
}

// Instances chooses the instances that run a job by their labels
// (`shardd run --label role=db`).
type Instances struct {
	// Selector is a label selector in Kubernetes' syntax (package
	// selector): "role=db,zone in (a,b)". Only instances whose labels match
	// it become members of the job.
	Selector string `yaml:"selector" json:"selector"`

	// Parsed is Selector, set by the parsers.
	Parsed selector.Selector `yaml:"-" json:"-"`
}

// Eligible reports whether an instance with labels may run j: j has no
// selector, or its selector matches them.
func (j *Job) Eligible(labels map[string]string) bool {
	return j.Instances == nil || j.Instances.Parsed.Matches(labels)
}

// Bounds of the dependency graph: a parent fire triggers its children in
// one etcd transaction, within etcd's default limit of 128 operations
// (a guard per parent of each child, a write or two per child).
const (
	MaxDependsOn = 4
	MaxChildren  = 30
)

// Defaults of Dataflow.
const (
	DefaultDataflowMaxIterations = 1000
	DefaultDataflowMaxDuration   = Duration(time.Hour)
	DefaultDataflowMoreExitCode  = 100
)

// Defaults of LogRetention.
const (
	DefaultLogMaxAge         = Duration(7 * 24 * time.Hour)
	DefaultLogMaxBytesPerRun = ByteSize(16 << 20)
	DefaultLogMaxTotalBytes  = ByteSize(256 << 20)
	// MinLogBytesPerRun leaves a run log room for its header, its end and
	// some output.
	MinLogBytesPerRun = 16 << 10
)

// ByteSize is a size in bytes, written as a number of bytes or with a unit:
// 512KiB, 16MiB, 1GiB (powers of 1024), or 500KB, 10MB, 1GB (powers of 1000).
type ByteSize int64

var byteUnits = []struct {
	suffix string
	factor int64
}{ // longest suffixes first
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1},
}

// ParseByteSize reads a ByteSize.
func ParseByteSize(s string) (ByteSize, error) {
	num, factor := strings.TrimSpace(s), int64(1)
	for _, u := range byteUnits {
		if strings.HasSuffix(num, u.suffix) {
			num, factor = strings.TrimSpace(strings.TrimSuffix(num, u.suffix)), u.factor
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size: write bytes, or a whole number with KiB, MiB, GiB, TiB, KB, MB, GB or TB", s)
	}
	if n > math.MaxInt64/factor {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return ByteSize(n * factor), nil
}

// String writes the size with the largest binary unit that divides it.
func (b ByteSize) String() string {
	for _, u := range []struct {
		suffix string
		factor int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if b != 0 && int64(b)%u.factor == 0 {
			return strconv.FormatInt(int64(b)/u.factor, 10) + u.suffix
		}
	}
	return strconv.FormatInt(int64(b), 10) + "B"
}

// MarshalText writes the size like "16MiB".
func (b ByteSize) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// UnmarshalText reads a size like "16MiB" or "1048576".
func (b *ByteSize) UnmarshalText(text []byte) error {
	v, err := ParseByteSize(string(text))
	*b = v
	return err
}

// Duration is a time.Duration written like "30s" in YAML and JSON; "7d"
// (whole days) is read too.
type Duration time.Duration

// String returns the duration as time.Duration formats it.
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText writes the duration like "1m30s".
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads a duration like "1m30s".
func (d *Duration) UnmarshalText(b []byte) error {
	if days, ok := strings.CutSuffix(string(b), "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n >= 0 && n <= 100*365 {
			*d = Duration(time.Duration(n) * 24 * time.Hour)
			return nil
		}
	}
	v, err := time.ParseDuration(string(b))
	*d = Duration(v)
	return err
}

// Built-in defaults.
const (
	DefaultTimeZone                 = "UTC"
	DefaultMaxTimeDiffSeconds       = -1
	DefaultReconcileIntervalMinutes = 10
	DefaultHTTPMethod               = "POST"
	DefaultHTTPTimeout              = Duration(30 * time.Second)
	DefaultRetryBackoff             = Duration(time.Second)
	MaxRetryBackoff                 = Duration(5 * time.Minute)
	// MaxShardingTotalCount bounds the items of one job, so that its shard
	// map stays well inside etcd's request size limit.
	MaxShardingTotalCount = 10000
	// MaxJobParameter and MaxItemParameter bound the parameters, which
	// reach scripts in environment variables: SHARDD_CONTEXT holds both,
	// JSON-escaped, and one variable may not exceed 128 KiB on Linux.
	MaxJobParameter  = 16 << 10
	MaxItemParameter = 4 << 10
	// MaxNameLength bounds job names, which are etcd key segments.
	MaxNameLength = 128
)

// DefaultJob returns a job with every built-in default set.
func DefaultJob() Job {
	return Job{
		TimeZone:           DefaultTimeZone,
		ShardingTotalCount: 1,
		// Strategy "": none named; validateSharding picks (shard.DefaultFor).
		Misfire:                  true,
		MonitorExecution:         true,
		MaxTimeDiffSeconds:       DefaultMaxTimeDiffSeconds,
		ReconcileIntervalMinutes: DefaultReconcileIntervalMinutes,
		RetryBackoff:             DefaultRetryBackoff,
		// MaxBytesPerRun 0: the smaller of its default and MaxTotalBytes.
		LogRetention: LogRetention{MaxAge: DefaultLogMaxAge, MaxTotalBytes: DefaultLogMaxTotalBytes},
	}
}

// Load reads path, a YAML file or a directory of them, and validates every
// job. The error, if any, joins every problem found (see Error).
func Load(path string) (*Config, error) {
	return load(path, &loader{})
}

// LoadWithoutEnv is Load without the check that the environment variables
// http.headers name (${API_TOKEN}) are set: for linting job files where the
// hooks' secrets are not (`shardd validate --no-env` in CI). A daemon loads
// with Load: a hook would otherwise send an empty secret.
func LoadWithoutEnv(path string) (*Config, error) {
	return load(path, &loader{noEnv: true})
}

func load(path string, l *loader) (*Config, error) {
	files, err := configFiles(path)
	if err != nil {
		return nil, err
	}
	datas := make([][]byte, len(files))
	for i, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			l.errs = append(l.errs, err)
			continue
		}
		datas[i] = data
		l.preReadCalendars(f, data)
	}
	for i, f := range files {
		if datas[i] != nil {
			l.file(f, datas[i])
		}
	}
	return l.finish(files)
}

// Parse loads one file's content; name is used in error messages.
func Parse(name string, data []byte) (*Config, error) {
	var l loader
	l.file(name, data)
	return l.finish([]string{name})
}

// ErrNoFiles: a config directory without job files.
var ErrNoFiles = errors.New("no job files")

// ParseWithoutEnv is Parse without the check that the environment
// variables http.headers name are set (see LoadWithoutEnv): for
// definitions applied through etcd, whose secrets are the running hosts'.
func ParseWithoutEnv(name string, data []byte) (*Config, error) {
	l := loader{noEnv: true}
	l.file(name, data)
	return l.finish([]string{name})
}

func configFiles(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if !st.IsDir() {
		return []string{path}, nil
	}
	files, err := Files(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("config: directory %s has no *.yaml or *.yml files: %w", path, ErrNoFiles)
	}
	return files, nil
}

// Files lists the config files of directory dir, in the order Load reads
// them: its *.yaml and *.yml files, except hidden files and editors' lock,
// backup and swap files (.#jobs.yaml, #jobs.yaml#, jobs.yaml~, .jobs.yaml.swp),
// which appear while someone edits a file and must not break a reload.
func Files(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		name := e.Name()
		if IgnoredFile(name) || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		files = append(files, filepath.Join(dir, name))
	}
	sort.Strings(files)
	return files, nil
}

// IgnoredFile reports whether a file name in a config directory is skipped:
// a hidden file or an editor's lock, backup or swap file.
func IgnoredFile(name string) bool {
	return strings.HasPrefix(name, ".") || strings.HasPrefix(name, "#") || strings.HasSuffix(name, "~") ||
		strings.HasSuffix(name, ".swp") || strings.HasSuffix(name, ".swx")
}

// Error is one problem in a config file.
type Error struct {
	File string
	Line int
	Job  string // empty for problems outside a job
	Msg  string // starts with the field name where there is one
}

func (e *Error) Error() string {
	pos := e.File
	if e.Line > 0 {
		pos = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	if e.Job != "" {
		return fmt.Sprintf("%s: job %s: %s", pos, e.Job, e.Msg)
	}
	return fmt.Sprintf("%s: %s", pos, e.Msg)
}

// Errors returns the individual problems joined in err by Load or Parse.
func Errors(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

func (l *loader) finish(files []string) (*Config, error) {
	l.checkDuplicates()
	l.checkDependencies()
	if len(l.errs) > 0 {
		sort.SliceStable(l.errs, func(i, j int) bool {
			a, aok := l.errs[i].(*Error)
			b, bok := l.errs[j].(*Error)
			if !aok || !bok {
				return !aok && bok
			}
			return a.File < b.File || a.File == b.File && a.Line < b.Line
		})
		return nil, errors.Join(l.errs...)
	}
	sort.Slice(l.jobs, func(i, j int) bool { return l.jobs[i].Name < l.jobs[j].Name })
	for _, j := range l.jobs {
		j.seal()
	}
	return &Config{Jobs: l.jobs, Files: files}, nil
}
