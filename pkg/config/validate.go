package config

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/shardd/shardd/pkg/schedule"
	"github.com/shardd/shardd/pkg/selector"
	"github.com/shardd/shardd/pkg/shard"
)

// validate checks j, reporting every problem through s at the line of the
// field at fault, and sets the derived fields. Fields that failed to decode
// (f.failed) are not judged again. It reports whether j is valid.
func validate(s scope, j *Job, f *fields) bool {
	before := len(s.l.errs)
	bad := func(field, format string, args ...any) {
		parent, _, _ := strings.Cut(field, ".")
		if f.failed[field] || f.failed[parent] {
			return
		}
		line, ok := f.line[field]
		if !ok {
			line = f.line[""]
		}
		s.errorf(line, format, args...)
	}

	if err := CheckName(j.Name); err != nil {
		bad("name", "name %s", err)
	}
	validateSchedule(j, bad)
	validatePolicies(j, f, bad)
	validateSharding(j, bad)
	validateParameters(j, bad)
	validateLimits(j, bad)
	validateLogRetention(&j.LogRetention, bad)
	validateDependsOn(j, bad)
	j.dependsOnLine = f.line["dependsOn"]
	if j.Dataflow != nil {
		validateDataflow(j, f, bad)
	}
	validateWork(j, bad)
	if j.OnFailure != nil {
		validateOnFailure(j.OnFailure, bad)
	}
	if j.Listeners != nil {
		validateListeners(j.Listeners, bad)
	}
	if j.Instances != nil {
		validateInstances(j.Instances, bad)
	}
	return len(s.l.errs) == before
}

// badFunc reports a problem of field (a YAML path such as
// "logRetention.maxAge"; "" for the job itself) at its line.
type badFunc func(field, format string, args ...any)

// validateSchedule checks timeZone and cron, and sets j.Location and
// j.Schedule.
func validateSchedule(j *Job, bad badFunc) {
	loc, err := time.LoadLocation(j.TimeZone)
	if err != nil || j.TimeZone == "" || j.TimeZone == "Local" {
		bad("timeZone", "timeZone %q is not an IANA time zone name like UTC or Asia/Shanghai", j.TimeZone)
		loc = time.UTC
	}
	j.Location = loc
	switch {
	case len(j.Cron) == 1:
		sched, err := schedule.Parse(j.Cron[0], loc)
		if err != nil {
			bad("cron", "cron %s", strings.TrimPrefix(err.Error(), schedule.ErrSyntax.Error()+" "))
		}
		j.Schedule = sched
	case len(j.Cron) > MaxCrons:
		bad("cron", "cron has %d expressions; at most %d", len(j.Cron), MaxCrons)
	case len(j.Cron) > 1:
		var u schedule.Union
		ok := true
		for i, expr := range j.Cron {
			sched, err := schedule.Parse(expr, loc)
			switch {
			case err != nil:
				bad("cron", "cron[%d] %s", i, strings.TrimPrefix(err.Error(), schedule.ErrSyntax.Error()+" "))
				ok = false
			case strings.HasPrefix(strings.TrimSpace(expr), "@every"):
				bad("cron", "cron[%d] %q: @every cannot be one of several crons (its fires count from the epoch, not from the clock); use one @every, or cron expressions", i, expr)
				ok = false
			case slices.Contains(j.Cron[:i], expr):
				bad("cron", "cron[%d] %q is given twice", i, expr)
				ok = false
			}
			u = append(u, sched)
		}
		if ok {
			j.Schedule = u
		}
	case j.Cron != nil:
		bad("cron", "cron is an empty list; leave cron out for a job run only by hand")
	}
}

// validateSharding checks strategy, shardingTotalCount and the items of
// shardingItemParameters, and sets j.Shard.
func validateSharding(j *Job, bad badFunc) {
	if j.Strategy == "" {
		j.Strategy = shard.DefaultFor(j.ShardingTotalCount)
	}
	strategy, err := shard.Lookup(j.Strategy)
	if err != nil {
		bad("strategy", "unknown strategy %s", strings.TrimPrefix(err.Error(), shard.ErrUnknown.Error()+": "))
	}
	j.Shard = strategy

	switch {
	case j.ShardingTotalCount < 1:
		bad("shardingTotalCount", "shardingTotalCount must be >= 1, got %d", j.ShardingTotalCount)
	case j.ShardingTotalCount > MaxShardingTotalCount:
		bad("shardingTotalCount", "shardingTotalCount must be <= %d, got %d", MaxShardingTotalCount, j.ShardingTotalCount)
	case j.Strategy == shard.Broadcast && j.ShardingTotalCount != 1:
		bad("shardingTotalCount", "shardingTotalCount must not be set with strategy BROADCAST, which runs one item per instance (got %d)", j.ShardingTotalCount)
	}
	if j.Strategy != shard.Broadcast && j.ShardingTotalCount >= 1 {
		for _, item := range j.ShardingItemParameters.Items() {
			if item >= j.ShardingTotalCount {
				bad("shardingItemParameters", "shardingItemParameters item %d is out of range: items are 0..%d (shardingTotalCount %d)", item, j.ShardingTotalCount-1, j.ShardingTotalCount)
				break
			}
		}
	}
}

// validateParameters checks jobParameter and shardingItemParameters
// against what an environment variable can carry.
func validateParameters(j *Job, bad badFunc) {
	// Parameters reach scripts in environment variables, twice (their own
	// and in SHARDD_CONTEXT): one variable may not exceed 128 KiB on Linux,
	// and none may hold a NUL byte.
	if len(j.JobParameter) > MaxJobParameter {
		bad("jobParameter", "jobParameter is %d bytes; at most %d (it is passed in environment variables)", len(j.JobParameter), MaxJobParameter)
	}
	if strings.ContainsRune(j.JobParameter, 0) {
		bad("jobParameter", "jobParameter contains a NUL byte, which no environment variable can carry")
	}
	for _, item := range j.ShardingItemParameters.Items() {
		v := j.ShardingItemParameters[item]
		if len(v) > MaxItemParameter {
			bad("shardingItemParameters", "shardingItemParameters item %d is %d bytes; at most %d (it is passed in environment variables)", item, len(v), MaxItemParameter)
			break
		}
		if strings.ContainsRune(v, 0) {
			bad("shardingItemParameters", "shardingItemParameters item %d contains a NUL byte, which no environment variable can carry", item)
			break
		}
	}
}

// validateLimits checks the numbers and durations that bound a job's runs.
func validateLimits(j *Job, bad badFunc) {
	if j.MaxTimeDiffSeconds < -1 {
		bad("maxTimeDiffSeconds", "maxTimeDiffSeconds must be -1 (off) or >= 0, got %d", j.MaxTimeDiffSeconds)
	}
	if j.ReconcileIntervalMinutes < 1 {
		bad("reconcileIntervalMinutes", "reconcileIntervalMinutes must be >= 1, got %d", j.ReconcileIntervalMinutes)
	}
	if j.Timeout < 0 {
		bad("timeout", "timeout must be >= 0 (0 = no limit), got %s", j.Timeout)
	}
	if j.RetryBackoff < 0 || j.RetryBackoff > MaxRetryBackoff {
		bad("retryBackoff", "retryBackoff must be between 0 and %s, got %s", MaxRetryBackoff, j.RetryBackoff)
	}
	if j.Retries < 0 {
		bad("retries", "retries must be >= 0, got %d", j.Retries)
	}
	if j.MaxConcurrency < 0 {
		bad("maxConcurrency", "maxConcurrency must be >= 0 (0 = no limit), got %d", j.MaxConcurrency)
	}
}

// validateLogRetention checks r, and sets its default maxBytesPerRun.
func validateLogRetention(r *LogRetention, bad badFunc) {
	if r.MaxBytesPerRun == 0 {
		r.MaxBytesPerRun = min(DefaultLogMaxBytesPerRun, r.MaxTotalBytes)
	}
	switch {
	case r.MaxAge <= 0:
		bad("logRetention.maxAge", "logRetention.maxAge must be > 0, got %s", r.MaxAge)
	case r.MaxTotalBytes < MinLogBytesPerRun:
		bad("logRetention.maxTotalBytes", "logRetention.maxTotalBytes must be at least %s, got %s", ByteSize(MinLogBytesPerRun), r.MaxTotalBytes)
	case r.MaxBytesPerRun < MinLogBytesPerRun:
		bad("logRetention.maxBytesPerRun", "logRetention.maxBytesPerRun must be at least %s, got %s", ByteSize(MinLogBytesPerRun), r.MaxBytesPerRun)
	case r.MaxBytesPerRun > r.MaxTotalBytes:
		bad("logRetention.maxBytesPerRun", "logRetention.maxBytesPerRun (%s) must be at most logRetention.maxTotalBytes (%s)", r.MaxBytesPerRun, r.MaxTotalBytes)
	}
}

// validateDependsOn checks the names of dependsOn.
func validateDependsOn(j *Job, bad badFunc) {
	if len(j.DependsOn) > MaxDependsOn {
		bad("dependsOn", "dependsOn names %d jobs; at most %d are allowed (a child waits for a fresh fire of each)", len(j.DependsOn), MaxDependsOn)
	}
	seen := map[string]bool{}
	for _, parent := range j.DependsOn {
		switch err := CheckName(parent); {
		case err != nil:
			bad("dependsOn", "dependsOn: job name %v", err)
		case parent == j.Name:
			bad("dependsOn", "dependsOn names the job itself: a job cannot wait for its own fires")
		case seen[parent]:
			bad("dependsOn", "dependsOn names %s twice", parent)
		}
		seen[parent] = true
	}
}

// validateDataflow checks j.Dataflow against j (its fields set, f), and
// sets its defaults.
func validateDataflow(j *Job, f *fields, bad badFunc) {
	d := j.Dataflow
	_, moreSet := f.line["dataflow.moreExitCode"]
	for _, field := range []string{"maxIterations", "maxDuration", "moreExitCode"} {
		if _, set := f.line["dataflow."+field]; set && !d.Streaming {
			bad("dataflow."+field, "dataflow.%s has no effect without dataflow.streaming: true (each run does its work once)", field)
		}
	}
	switch {
	case moreSet && d.MoreExitCode == 0:
		bad("dataflow.moreExitCode", "dataflow.moreExitCode 0 is the status that means done; the one that means more must differ: 1 to 255 (default %d)", DefaultDataflowMoreExitCode)
	case moreSet && j.HTTP != nil:
		bad("dataflow.moreExitCode", "dataflow.moreExitCode is for scripts; a hook says \"more\" by answering 2xx with {\"more\": true}")
	}
	if d.MaxIterations == 0 {
		d.MaxIterations = DefaultDataflowMaxIterations
	}
	if d.MaxDuration == 0 {
		d.MaxDuration = DefaultDataflowMaxDuration
	}
	if d.MoreExitCode == 0 {
		d.MoreExitCode = DefaultDataflowMoreExitCode
	}
	switch {
	case d.MaxIterations < 0:
		bad("dataflow.maxIterations", "dataflow.maxIterations must be >= 1 (0 = the default, %d), got %d", DefaultDataflowMaxIterations, d.MaxIterations)
	case d.MaxDuration < 0:
		bad("dataflow.maxDuration", "dataflow.maxDuration must be > 0 (0 = the default, %s), got %s", DefaultDataflowMaxDuration, d.MaxDuration)
	case d.MoreExitCode < 1 || d.MoreExitCode > 255:
		bad("dataflow.moreExitCode", "dataflow.moreExitCode must be an exit status from 1 to 255 (0 means done), got %d", d.MoreExitCode)
	case j.Retries > 0 && d.Streaming && d.MoreExitCode == 1:
		bad("dataflow.moreExitCode", "dataflow.moreExitCode 1 is the usual failure status: with retries it would be taken for more data; choose another (the default is %d)", DefaultDataflowMoreExitCode)
	}
}

// validateInstances parses the selector into in.Parsed.
func validateInstances(in *Instances, bad badFunc) {
	if strings.TrimSpace(in.Selector) == "" {
		bad("instances", "instances.selector is empty: give a label selector (role=db,zone in (a,b)), or leave instances out for every instance")
		return
	}
	sel, err := selector.Parse(in.Selector)
	if err != nil {
		bad("instances.selector", "instances.selector: %v", err)
		return
	}
	in.Parsed = sel
}

// validateWork checks that j does one kind of work, script or http, and
// that one.
func validateWork(j *Job, bad badFunc) {
	switch {
	case j.Script == nil && j.HTTP == nil:
		bad("", "no work: set script or http")
	case j.Script != nil && j.HTTP != nil:
		bad("http", "script and http are both set; a job does one kind of work")
	case j.Script != nil:
		validateScript(j.Script, bad)
	default:
		validateHTTP(j.HTTP, bad)
	}
}

// validateOnFailure checks onFailure.
func validateOnFailure(of *OnFailure, bad badFunc) {
	if of.Webhook == "" && of.Command == nil {
		bad("onFailure", "onFailure needs a webhook or a command")
	}
	if of.Webhook != "" {
		if u, err := url.Parse(of.Webhook); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("onFailure.webhook", "onFailure.webhook %q is not an http:// or https:// URL", of.Webhook)
		}
	}
	if !slices.Contains([]string{"", "json", "slack", "dingtalk", "wechat"}, of.Format) {
		bad("onFailure.format", "onFailure.format %q is not one of json, slack, dingtalk, wechat", of.Format)
	}
	if of.Command != nil && of.Command.Shell == "" && len(of.Command.Argv) == 0 {
		bad("onFailure.command", "onFailure.command is empty")
	}
}

// validateListeners checks listeners.
func validateListeners(ls *Listeners, bad badFunc) {
	for name, c := range map[string]*Command{"before": ls.Before, "after": ls.After} {
		if c != nil && c.Shell == "" && (len(c.Argv) == 0 || c.Argv[0] == "") {
			bad("listeners."+name, "listeners.%s is empty", name)
		}
	}
}

func validateScript(sc *Script, bad badFunc) {
	switch {
	case sc.Command.Shell == "" && len(sc.Command.Argv) == 0:
		bad("script.command", "script.command is empty")
	case sc.Command.Shell == "" && sc.Command.Argv[0] == "":
		bad("script.command", "script.command: the program (first argument) is empty")
	case sc.Command.Shell != "" && strings.TrimSpace(sc.Command.Shell) == "":
		bad("script.command", "script.command is blank")
	}
	for k := range sc.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			bad("script.env", "script.env name %q is not a valid environment variable name", k)
		}
		if strings.HasPrefix(k, "SHARDD_") {
			bad("script.env", "script.env %s: names starting with SHARDD_ are set by shardd", k)
		}
	}
}

var httpMethods = []string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

func validateHTTP(h *HTTP, bad badFunc) {
	if h.Method == "" {
		h.Method = DefaultHTTPMethod
	}
	if h.Timeout == 0 {
		h.Timeout = DefaultHTTPTimeout
	}
	u, err := url.Parse(h.URL)
	switch {
	case h.URL == "":
		bad("http.url", "http.url is required")
	case err != nil:
		bad("http.url", "http.url %q is malformed: %v", h.URL, errors.Unwrap(err))
	case u.Scheme != "http" && u.Scheme != "https":
		bad("http.url", "http.url %q must start with http:// or https://", h.URL)
	case u.Host == "":
		bad("http.url", "http.url %q has no host", h.URL)
	}
	if !slices.Contains(httpMethods, h.Method) {
		bad("http.method", "http.method %q is not one of %s", h.Method, strings.Join(httpMethods, ", "))
	}
	if h.Timeout < 0 {
		bad("http.timeout", "http.timeout must be > 0, got %s", h.Timeout)
	}
	for name := range h.Headers {
		if name == "" || strings.ContainsAny(name, " \t\r\n:") {
			bad("http.headers", "http.headers name %q is not a valid header name", name)
		}
	}
	for _, code := range h.SuccessCodes {
		if code < 100 || code > 599 {
			bad("http.successCodes", "http.successCodes: %d is not an HTTP status (100-599)", code)
		}
	}
}

// CheckName reports whether name can be a job name: 1 to 128 bytes of
// letters, digits, '-', '_' and '.', not starting with '.', so that it is one
// safe etcd key segment and one safe path segment in the API.
func CheckName(name string) error {
	switch {
	case name == "":
		return errors.New("is required")
	case len(name) > MaxNameLength:
		return fmt.Errorf("is %d bytes long; the limit is %d", len(name), MaxNameLength)
	case !utf8.ValidString(name):
		return errors.New("is not valid UTF-8")
	case name[0] == '.':
		return fmt.Errorf("%q must not start with '.'", name)
	}
	for _, r := range name {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '-' && r != '_' && r != '.' {
			return fmt.Errorf("%q has %q; use letters, digits, '-', '_' and '.'", name, r)
		}
	}
	return nil
}

// checkDependencies reports, across all files, the parents that no job
// defines (naming the nearest) and the cycles of dependsOn, each once,
// naming its path: a -> b -> a.
func (l *loader) checkDependencies() {
	byName := map[string]*Job{}
	defined := map[string]bool{} // valid or not: an invalid parent has its own errors
	var names []string
	for _, j := range l.jobs {
		byName[j.Name] = j
	}
	for _, n := range l.named {
		if !defined[n.name] {
			defined[n.name] = true
			names = append(names, n.name)
		}
	}
	children := map[string][]string{}
	for _, j := range l.jobs {
		for _, p := range j.DependsOn {
			children[p] = append(children[p], j.Name)
			if defined[p] {
				continue
			}
			msg := fmt.Sprintf("dependsOn names %s, which no job defines", p)
			if near, ok := Nearest(p, names); ok {
				msg += fmt.Sprintf(" (did you mean %s?)", near)
			}
			l.errs = append(l.errs, &Error{File: j.Pos.File, Line: j.depLine(), Job: strconv.Quote(j.Name), Msg: msg})
		}
	}
	for _, p := range slices.Sorted(maps.Keys(children)) {
		if j := byName[p]; j != nil && j.FixedDelay > 0 {
			l.errs = append(l.errs, &Error{File: j.Pos.File, Line: j.Pos.Line, Job: strconv.Quote(p),
				Msg: fmt.Sprintf("%s depends on this job, whose fixedDelay gives each item its own fires: none is a fire of the whole job to complete; give it a cron", strings.Join(children[p], ", "))})
		}
		if kids := children[p]; len(kids) > MaxChildren && byName[p] != nil {
			j := byName[p]
			l.errs = append(l.errs, &Error{File: j.Pos.File, Line: j.Pos.Line, Job: strconv.Quote(p),
				Msg: fmt.Sprintf("%d jobs depend on this one (%s); at most %d may: a fire triggers them all in one etcd transaction", len(kids), strings.Join(kids, ", "), MaxChildren)})
		}
	}
	// Depth-first search; a back edge is a cycle. Jobs in sorted order, so
	// that the same files always report the same cycle the same way.
	const (
		unseen = iota
		open
		done
	)
	state := map[string]int{}
	var path []string
	var visit func(name string)
	visit = func(name string) {
		state[name] = open
		path = append(path, name)
		j := byName[name]
		for _, p := range j.DependsOn {
			switch {
			case byName[p] == nil:
			case state[p] == open:
				cycle := append(slices.Clone(path[slices.Index(path, p):]), p)
				l.errs = append(l.errs, &Error{File: j.Pos.File, Line: j.depLine(), Job: strconv.Quote(j.Name),
					Msg: "dependsOn makes a cycle: " + strings.Join(cycle, " -> ") + " (each waits for the next's fires; none would ever fire)"})
			case state[p] == unseen:
				visit(p)
			}
		}
		path = path[:len(path)-1]
		state[name] = done
	}
	valid := make([]string, 0, len(byName))
	for n := range byName {
		valid = append(valid, n)
	}
	slices.Sort(valid)
	for _, n := range valid {
		if state[n] == unseen {
			visit(n)
		}
	}
}

// depLine is the line of the job's dependsOn, else of the job.
func (j *Job) depLine() int {
	if j.dependsOnLine > 0 {
		return j.dependsOnLine
	}
	return j.Pos.Line
}

// checkDuplicates reports job names defined more than once, across all files.
func (l *loader) checkDuplicates() {
	first := map[string]Pos{}
	for _, j := range l.named {
		if prev, ok := first[j.name]; ok {
			l.errs = append(l.errs, &Error{File: j.pos.File, Line: j.pos.Line, Job: strconv.Quote(j.name), Msg: "name is defined twice; first at " + prev.String()})
			continue
		}
		first[j.name] = j.pos
	}
}
