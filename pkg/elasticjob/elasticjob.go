// Package elasticjob converts ElasticJob job configurations into shardd
// job definitions (shardd import): the Spring Boot starter's YAML
// (elasticjob.jobs.<name>, camelCase or kebab-case keys) and the job
// configs its registry keeps (/<namespace>/<job>/config: the YAML of
// ElasticJob 3's JobConfigurationPOJO, or ElasticJob-Lite 2's JSON).
//
// Each job converts on its own. What converts is a definition that shardd
// validates (the result holds parsed jobs, never text that might not
// parse); what does not is a Note with its reason: a key this package does
// not know, a feature shardd lacks, a value shardd refuses. A Note that is
// Fatal means the job itself was not converted (a Java class job, a script
// job without its command line, a cron shardd cannot read); the others mean
// the job was converted without that key. Nothing is dropped silently.
//
// The mapping (docs/elasticjob.md):
//
//	elasticJobType SCRIPT, props script.command.line   script: {command: argv, contextArg: true}
//	elasticJobType HTTP, props http.*                   http: {url, method, body, timeout, headers: {Content-Type}}
//	cron, timeZone, shardingTotalCount, shardingItemParameters, jobParameter, failover, misfire,
//	monitorExecution, maxTimeDiffSeconds, reconcileIntervalMinutes, jobShardingStrategyType,
//	description, disabled, overwrite                    the same names
//	jobErrorHandlerType DINGTALK / WECHAT + props       onFailure: {webhook, format}
//	no cron                                             a manual-only job
//
// Pure: no I/O. The registry's live readers are the command's.
package elasticjob

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"gopkg.in/yaml.v3"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/selector"
)

// Note is a key (or a whole job) that did not convert, and why.
type Note struct {
	Job    string `json:"job"`
	Key    string `json:"key,omitempty"` // "" for the job as a whole
	Reason string `json:"reason"`
	// Fatal: the job was not converted at all.
	Fatal bool `json:"fatal,omitempty"`
}

func (n Note) String() string {
	switch {
	case n.Fatal:
		return fmt.Sprintf("job %s: not converted: %s", n.Job, n.Reason)
	case n.Key != "":
		return fmt.Sprintf("job %s: %s: not converted: %s", n.Job, n.Key, n.Reason)
	}
	return fmt.Sprintf("job %s: %s", n.Job, n.Reason)
}

// Result is what a conversion gives: the jobs that converted, and the
// notes of what did not.
type Result struct {
	Jobs  []*config.Job
	Notes []Note
}

// Complete reports whether everything converted.
func (r *Result) Complete() bool { return len(r.Notes) == 0 }

// Options adjust a conversion.
type Options struct {
	// TimeZone is the zone of the jobs that name none (ElasticJob then
	// uses the JVM's); "" leaves them in UTC, with a note.
	TimeZone string
	// Selector is the instances.selector of the jobs that get none from
	// their ElasticJob label.
	Selector string
}

// Parse reads an ElasticJob configuration file, whichever of the two kinds
// it is: a Spring Boot application YAML (with elasticjob.jobs), or one job
// config of the registry (jobName, cron, ... at the top). name is the
// file's name, for errors.
func Parse(name string, data []byte, o Options) (*Result, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: not YAML (or JSON): %v", name, err)
	}
	if jobs, ok := springJobs(doc); ok {
		return convertSpring(name, jobs, o)
	}
	if _, ok := lookup(doc, "jobName"); ok {
		return ParseRegistry("", data, o)
	}
	if _, ok := lookup(doc, "elasticjob"); ok {
		return nil, fmt.Errorf("%s: an elasticjob section without jobs (elasticjob.jobs.<name>)", name)
	}
	return nil, fmt.Errorf("%s: neither a Spring Boot configuration with elasticjob.jobs nor a registry job config (with jobName)", name)
}

// ParseRegistry reads one job config as the registry keeps it at
// /<namespace>/<job>/config; job is its name there, used when the config
// has no jobName.
func ParseRegistry(job string, data []byte, o Options) (*Result, error) {
	var raw map[string]any
	if err := yaml.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("job config %s: not YAML (or JSON): %v", job, err)
	}
	if raw == nil {
		return nil, fmt.Errorf("job config %s: empty", job)
	}
	if v, ok := lookup(raw, "jobName"); ok {
		if s := fmt.Sprint(v); s != "" {
			job = s
		}
	}
	if job == "" {
		return nil, errors.New("job config: no jobName")
	}
	r := &Result{}
	r.add(job, raw, o)
	return r, nil
}

// springJobs finds elasticjob.jobs in a Spring Boot configuration (nested,
// or with dotted keys: "elasticjob.jobs").
func springJobs(doc map[string]any) (map[string]any, bool) {
	if ej, ok := lookup(doc, "elasticjob"); ok {
		if m, ok := ej.(map[string]any); ok {
			if jobs, ok := lookup(m, "jobs"); ok {
				jm, ok := jobs.(map[string]any)
				return jm, ok
			}
		}
	}
	if jobs, ok := lookup(doc, "elasticjob.jobs"); ok {
		jm, ok := jobs.(map[string]any)
		return jm, ok
	}
	return nil, false
}

func convertSpring(name string, jobs map[string]any, o Options) (*Result, error) {
	r := &Result{}
	names := make([]string, 0, len(jobs))
	for n := range jobs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, job := range names {
		raw, ok := jobs[job].(map[string]any)
		if !ok {
			r.Notes = append(r.Notes, Note{Job: job, Fatal: true, Reason: fmt.Sprintf("its configuration is a %T, not a mapping of keys", jobs[job])})
			continue
		}
		r.add(job, raw, o)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s: elasticjob.jobs has no job", name)
	}
	return r, nil
}

// normalize makes the spellings of a key equal: camelCase, kebab-case,
// snake_case and any case (Spring's relaxed binding).
func normalize(k string) string {
	var b strings.Builder
	for _, r := range k {
		if r != '-' && r != '_' {
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String()
}

// lookup finds key in m under any spelling normalize equates.
func lookup(m map[string]any, key string) (any, bool) {
	want := normalize(key)
	for k, v := range m {
		if normalize(k) == want {
			return v, true
		}
	}
	return nil, false
}

// known are the keys of an ElasticJob job config, as ElasticJob names them
// (3.x's JobConfigurationPOJO and the Spring Boot starter's, and
// ElasticJob-Lite 2's JSON).
var known = []string{
	"jobName", "elasticJobClass", "elasticJobType", "jobBootstrapBeanName", "cron", "timeZone", "shardingTotalCount",
	"shardingItemParameters", "jobParameter", "monitorExecution", "failover", "misfire", "maxTimeDiffSeconds",
	"reconcileIntervalMinutes", "jobShardingStrategyType", "jobExecutorServiceHandlerType", "jobErrorHandlerType",
	"jobListenerTypes", "jobExtraConfigurations", "description", "props", "disabled", "overwrite", "label", "staticSharding",
	// ElasticJob-Lite 2.x
	"jobClass", "jobType", "scriptCommandLine", "jobShardingStrategyClass", "jobProperties", "monitorPort", "streamingProcess",
}

// dropped are keys with no shardd equivalent, and why.
var dropped = map[string]string{
	"jobBootstrapBeanName":          "a Spring bean name for triggering the job by hand; in shardd, shardd trigger JOB (or the API) runs it",
	"jobExecutorServiceHandlerType": "shardd runs each item in a process of its own; maxConcurrency caps how many run at once on a host",
	"jobListenerTypes":              "ElasticJob's listeners are Java classes; shardd's listeners.before/after are commands: write them by hand",
	"jobExtraConfigurations":        "extra Java configurations (tracing data sources and the like); shardd keeps every run's record and log itself",
	"staticSharding":                "shardd's leader rewrites the map on every membership change; there is no static sharding",
	"monitorPort":                   "ElasticJob-Lite 2's dump port; shardd status and the console show a job's state",
	"streamingProcess":              "a Java dataflow job's setting; a script's dataflow.streaming is shardd's",
}

// strategies maps ElasticJob's sharding strategy names and 2.x classes to
// shardd's.
var strategies = map[string]string{
	"AVG_ALLOCATION": "AVG_ALLOCATION", "ODEVITY": "ODEVITY", "ROUND_ROBIN": "ROUND_ROBIN",
	"io.elasticjob.lite.api.strategy.impl.AverageAllocationJobShardingStrategy":                                        "AVG_ALLOCATION",
	"io.elasticjob.lite.api.strategy.impl.OdevitySortByNameJobShardingStrategy":                                        "ODEVITY",
	"io.elasticjob.lite.api.strategy.impl.RotateServerByNameJobShardingStrategy":                                       "ROUND_ROBIN",
	"com.dangdang.ddframe.job.lite.api.strategy.impl.AverageAllocationJobShardingStrategy":                             "AVG_ALLOCATION",
	"com.dangdang.ddframe.job.lite.api.strategy.impl.OdevitySortByNameJobShardingStrategy":                             "ODEVITY",
	"com.dangdang.ddframe.job.lite.api.strategy.impl.RotateServerByNameJobShardingStrategy":                            "ROUND_ROBIN",
	"org.apache.shardingsphere.elasticjob.infra.handler.sharding.impl.AverageAllocationJobShardingStrategy":            "AVG_ALLOCATION",
	"org.apache.shardingsphere.elasticjob.infra.handler.sharding.impl.OdevitySortByNameJobShardingStrategy":            "ODEVITY",
	"org.apache.shardingsphere.elasticjob.infra.handler.sharding.impl.RoundRobinByNameJobShardingStrategy":             "ROUND_ROBIN",
	"org.apache.shardingsphere.elasticjob.kernel.internal.sharding.strategy.type.AverageAllocationJobShardingStrategy": "AVG_ALLOCATION",
}

// job is one job's conversion in progress: the shardd fields, in the
// order a file writes them, and the notes.
type job struct {
	name   string
	fields []field
	notes  []Note
}

type field struct {
	key   string // shardd's
	from  string // ElasticJob's key, for a note if shardd refuses the value
	value any
}

func (j *job) set(key, from string, v any) { j.fields = append(j.fields, field{key, from, v}) }

func (j *job) note(key, format string, args ...any) {
	j.notes = append(j.notes, Note{Job: j.name, Key: key, Reason: fmt.Sprintf(format, args...)})
}

func (j *job) fatal(format string, args ...any) {
	j.notes = append(j.notes, Note{Job: j.name, Fatal: true, Reason: fmt.Sprintf(format, args...)})
}

// add converts the job name's config raw and adds the job (or the notes
// of why it did not convert) to r.
func (r *Result) add(name string, raw map[string]any, o Options) {
	j := &job{name: name}
	if err := config.CheckName(name); err != nil {
		clean := strings.Map(func(c rune) rune {
			if unicode.IsLetter(c) || unicode.IsDigit(c) || c == '-' || c == '_' || c == '.' {
				return c
			}
			return '-'
		}, strings.TrimLeft(name, "."))
		if config.CheckName(clean) != nil {
			j.fatal("its name %v", err)
			r.Notes = append(r.Notes, j.notes...)
			return
		}
		j.note("jobName", "the name %v: the job is %s here", err, clean)
		j.name = clean
	}
	keys := map[string]string{} // normalized -> the key as written
	for k := range raw {
		keys[normalize(k)] = k
	}
	get := func(key string) (any, bool) {
		k, ok := keys[normalize(key)]
		if !ok {
			return nil, false
		}
		return raw[k], true
	}
	for _, k := range slices.Sorted(maps.Keys(raw)) {
		if idx := slices.IndexFunc(known, func(kn string) bool { return normalize(kn) == normalize(k) }); idx < 0 {
			if near, ok := config.Nearest(k, known); ok {
				// A misspelled key would be converted as if absent (one
				// item for shardingTotalCont): the job is left out.
				j.notes = append(j.notes, Note{Job: j.name, Key: k, Fatal: true, Reason: fmt.Sprintf("unknown key %s (did you mean %s?): fix it and import again", k, near)})
			} else {
				j.note(k, "unknown key")
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(dropped)) {
		if v, ok := get(k); ok && !empty(v) && !off(k, v) {
			j.note(k, "%s", dropped[k])
		}
	}
	rawProps, _ := get("props")
	props := flatten(rawProps)
	jobProps, _ := get("jobProperties") // 2.x
	for k, v := range flatten(jobProps) {
		props[k] = v
	}
	used := map[string]bool{}

	j.set("name", "jobName", j.name)
	if v, ok := get("description"); ok && !empty(v) {
		j.set("description", "description", fmt.Sprint(v))
	}
	if v, ok := get("cron"); ok && !empty(v) {
		j.set("cron", "cron", fmt.Sprint(v))
	}
	tzv, hasZone := get("timeZone")
	if !hasZone || empty(tzv) {
		if o.TimeZone != "" {
			tzv, hasZone = o.TimeZone, true
		} else if v, ok := get("cron"); ok && !empty(v) {
			j.note("timeZone", "none given: ElasticJob read the cron in the JVM's zone, shardd reads it in UTC; give shardd import --time-zone ZONE (Asia/Shanghai, say), or timeZone in the output")
		}
	}
	if v := tzv; hasZone && !empty(v) {
		if tz, err := zone(fmt.Sprint(v)); err != nil {
			j.notes = append(j.notes, Note{Job: j.name, Key: "timeZone", Fatal: true, Reason: err.Error() + " (in another zone its fires would come at the wrong hours)"})
		} else {
			j.set("timeZone", "timeZone", tz)
		}
	}
	for _, k := range []string{"shardingTotalCount", "maxTimeDiffSeconds", "reconcileIntervalMinutes"} {
		if v, ok := get(k); ok && !empty(v) {
			if n, err := toInt(v); err != nil {
				j.note(k, "%v", err)
			} else {
				j.set(k, k, n)
			}
		}
	}
	for _, k := range []string{"shardingItemParameters", "jobParameter"} {
		if v, ok := get(k); ok && !empty(v) {
			j.set(k, k, fmt.Sprint(v))
		}
	}
	for _, k := range []string{"failover", "misfire", "monitorExecution", "disabled", "overwrite"} {
		if v, ok := get(k); ok && !empty(v) {
			if b, err := toBool(v); err != nil {
				j.note(k, "%v", err)
			} else {
				j.set(k, k, b)
			}
		}
	}
	strategyKey := "jobShardingStrategyType"
	s, ok := get(strategyKey)
	if !ok || empty(s) {
		strategyKey = "jobShardingStrategyClass"
		s, ok = get(strategyKey)
	}
	if ok && !empty(s) {
		if mapped, ok := strategies[fmt.Sprint(s)]; ok {
			j.set("strategy", strategyKey, mapped)
		} else {
			j.note(strategyKey, "strategy %q has no shardd equivalent (shardd's: AVG_ALLOCATION, ODEVITY, ROUND_ROBIN, CONSISTENT_HASH, ...); the default is used", fmt.Sprint(s))
		}
	}

	// ElasticJob's label routes the job to the servers of that label:
	// shardd's selector of the label "label" (shardd run --label label=L).
	if v, ok := get("label"); ok && !empty(v) {
		if sel := "label=" + fmt.Sprint(v); validSelector(sel) {
			j.set("instances", "label", map[string]any{"selector": sel})
		} else {
			j.notes = append(j.notes, Note{Job: j.name, Key: "label", Fatal: true, Reason: fmt.Sprintf("%q is not a label value shardd's selectors take (letters, digits, '-', '_', '.')", fmt.Sprint(v))})
		}
	} else if o.Selector != "" {
		j.set("instances", "--selector", map[string]any{"selector": o.Selector})
	}

	j.work(get, props, used)
	j.errorHandler(get, props, used)
	if v, ok := props["streaming.process"]; ok {
		used["streaming.process"] = true
		if b, _ := strconv.ParseBool(v); b {
			j.note("props.streaming.process", "a Java dataflow job's streaming; a script or hook streams with dataflow: {streaming: true} (set it by hand)")
		}
	}
	knownProps := []string{"script.command.line", "http.uri", "http.method", "http.data", "http.connect.timeout.milliseconds", "http.read.timeout.milliseconds",
		"http.content.type", "dingtalk.webhook", "dingtalk.keyword", "dingtalk.secret", "wechat.webhook", "streaming.process"}
	for _, k := range slices.Sorted(maps.Keys(props)) {
		if used[k] {
			continue
		}
		if near, ok := config.Nearest(k, knownProps); ok && near != k {
			j.notes = append(j.notes, Note{Job: j.name, Key: "props." + k, Fatal: true, Reason: fmt.Sprintf("unknown property (did you mean %s?): fix it and import again", near)})
			continue
		}
		j.note("props."+k, "a property shardd does not know")
	}
	def := j.parse()
	r.Notes = append(r.Notes, j.notes...)
	if def != nil {
		r.Jobs = append(r.Jobs, def)
	}
}

// work converts the job's type and its props into script or http.
func (j *job) work(get func(string) (any, bool), props map[string]string, used map[string]bool) {
	typ := ""
	if v, ok := get("elasticJobType"); ok && !empty(v) {
		typ = strings.ToUpper(fmt.Sprint(v))
	} else if v, ok := get("jobType"); ok && !empty(v) { // 2.x
		typ = strings.ToUpper(fmt.Sprint(v))
	}
	class := ""
	for _, k := range []string{"elasticJobClass", "jobClass"} {
		if v, ok := get(k); ok && !empty(v) {
			class = fmt.Sprint(v)
		}
	}
	line, hasLine := props["script.command.line"]
	if v, ok := get("scriptCommandLine"); ok && !empty(v) { // 2.x
		line, hasLine = fmt.Sprint(v), true
	}
	if typ == "" {
		switch {
		case hasLine:
			typ = "SCRIPT"
		case props["http.uri"] != "":
			typ = "HTTP"
		}
	}
	switch {
	case typ == "SCRIPT":
		used["script.command.line"] = true
		if !hasLine || strings.TrimSpace(line) == "" {
			j.fatal("a SCRIPT job without props script.command.line: there is no command to run")
			return
		}
		argv, err := splitCommandLine(line)
		if err != nil {
			j.fatal("props script.command.line %q: %v", line, err)
			return
		}
		// ElasticJob appends the sharding context JSON as the last
		// argument: so does contextArg.
		j.set("script", "props.script.command.line", map[string]any{"command": argv, "contextArg": true})
	case typ == "HTTP":
		j.http(props, used)
	case class != "":
		j.fatal("a Java class job (%s): shardd runs scripts and HTTP hooks; call the class's work from a script or an HTTP endpoint, and define that job", class)
	case typ != "":
		j.fatal("a %s job without a script or HTTP work: shardd runs scripts and HTTP hooks", typ)
	default:
		j.fatal("no work: neither elasticJobType SCRIPT (props script.command.line) nor HTTP (props http.uri), nor a class")
	}
}

func (j *job) http(props map[string]string, used map[string]bool) {
	for _, k := range []string{"http.uri", "http.method", "http.data", "http.connect.timeout.milliseconds", "http.read.timeout.milliseconds", "http.content.type"} {
		used[k] = true
	}
	uri := props["http.uri"]
	if uri == "" {
		j.fatal("an HTTP job without props http.uri")
		return
	}
	h := map[string]any{"url": uri}
	method := strings.ToUpper(props["http.method"])
	if method == "" {
		method = "GET"
		j.note("props.http.method", "none given (ElasticJob requires one): GET is written, say which by hand")
	}
	h["method"] = method
	if d := props["http.data"]; d != "" {
		h["body"] = d
	}
	// ElasticJob's defaults: 3 s to connect, 5 s to read.
	total := 0 * time.Millisecond
	for k, def := range map[string]int{"http.connect.timeout.milliseconds": 3000, "http.read.timeout.milliseconds": 5000} {
		ms := def
		if v := props[k]; v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				j.note("props."+k, "%q is not a positive number of milliseconds; ElasticJob's default %d is used", v, def)
			} else {
				ms = n
			}
		}
		total += time.Duration(ms) * time.Millisecond
	}
	h["timeout"] = total.String() // shardd bounds the whole call: connecting and reading
	if ct := props["http.content.type"]; ct != "" {
		h["headers"] = map[string]any{"Content-Type": ct}
	}
	j.set("http", "props.http.uri", h)
}

// errorHandler converts jobErrorHandlerType (and 2.x's
// job_exception_handler) into onFailure.
func (j *job) errorHandler(get func(string) (any, bool), props map[string]string, used map[string]bool) {
	typ := ""
	if v, ok := get("jobErrorHandlerType"); ok && !empty(v) {
		typ = strings.ToUpper(fmt.Sprint(v))
	}
	if _, ok := props["job_exception_handler"]; ok { // 2.x: a class, noted unless the default
		used["job_exception_handler"] = true
	}
	if v := props["job_exception_handler"]; v != "" && !strings.HasSuffix(v, ".DefaultJobExceptionHandler") {
		j.note("jobProperties.job_exception_handler", "a Java exception handler (%s); shardd records every failure, and onFailure (a webhook or a command) tells someone", v)
	}
	if _, ok := props["executor_service_handler"]; ok { // 2.x
		used["executor_service_handler"] = true
	}
	if v := props["executor_service_handler"]; v != "" && !strings.HasSuffix(v, ".DefaultExecutorServiceHandler") {
		j.note("jobProperties.executor_service_handler", "a Java executor (%s); shardd runs each item in a process of its own", v)
	}
	for _, p := range []string{"dingtalk.", "wechat.", "email."} {
		for k := range props {
			if strings.HasPrefix(k, p) {
				used[k] = true
			}
		}
	}
	switch typ {
	case "", "LOG":
		// shardd logs and records every failure.
	case "IGNORE", "THROW":
		j.note("jobErrorHandlerType", "%s: shardd records and logs every failure; nothing else to convert", typ)
	case "DINGTALK", "WECHAT":
		format := strings.ToLower(typ)
		url := props[format+".webhook"]
		if url == "" {
			j.note("jobErrorHandlerType", "%s without props %s.webhook: no webhook to call", typ, format)
			return
		}
		j.set("onFailure", "props."+format+".webhook", map[string]any{"webhook": url, "format": format})
		if props["dingtalk.secret"] != "" && typ == "DINGTALK" {
			j.note("props.dingtalk.secret", "shardd does not sign its DingTalk messages, nor carry a keyword in them: switch the robot's security to an IP allowlist")
		}
		if props["dingtalk.keyword"] != "" && typ == "DINGTALK" {
			j.note("props.dingtalk.keyword", "shardd's message does not carry a keyword: switch the robot's security to an IP allowlist")
		}
		for _, k := range []string{"connectTimeoutMilliseconds", "readTimeoutMilliseconds"} {
			if props[format+"."+k] != "" {
				j.note("props."+format+"."+k, "shardd bounds its webhook calls itself (30 s)")
			}
		}
	case "EMAIL":
		j.note("jobErrorHandlerType", "EMAIL: shardd does not send mail; onFailure.command can (with mail(1), say), or a webhook to a mail gateway")
	default:
		j.note("jobErrorHandlerType", "%q is not one of ElasticJob's handlers shardd converts (LOG, IGNORE, THROW, DINGTALK, WECHAT, EMAIL)", typ)
	}
}

// parse renders the job's fields as a job file and parses it: what it
// returns validates. A field shardd refuses is dropped, with its problem
// as a note, unless the job cannot do without it (its work, its name).
func (j *job) parse() *config.Job {
	if slices.ContainsFunc(j.notes, func(n Note) bool { return n.Fatal }) {
		return nil
	}
	for range len(j.fields) + 1 {
		m := &yaml.Node{Kind: yaml.MappingNode}
		for _, f := range j.fields {
			var v yaml.Node
			v.Encode(f.value)
			m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: f.key}, &v)
		}
		doc := map[string]any{"jobs": []*yaml.Node{m}}
		text, err := yaml.Marshal(doc)
		if err != nil {
			j.fatal("cannot be written as YAML: %v", err)
			return nil
		}
		c, err := config.ParseWithoutEnv(j.name, text)
		if err == nil {
			return c.Jobs[0]
		}
		// Drop the field of the first problem and try again.
		problems := config.Errors(err)
		msg := problems[0].Error()
		var ce *config.Error
		if errors.As(problems[0], &ce) {
			msg = ce.Msg
		}
		idx := slices.IndexFunc(j.fields, func(f field) bool {
			return strings.HasPrefix(msg, f.key+" ") || strings.HasPrefix(msg, f.key+".") || strings.HasPrefix(msg, f.key+":")
		})
		if idx < 0 || slices.Contains([]string{"name", "script", "http", "cron", "shardingTotalCount"}, j.fields[idx].key) {
			from := ""
			if idx >= 0 {
				from = j.fields[idx].from
			}
			j.notes = append(j.notes, Note{Job: j.name, Key: from, Fatal: true, Reason: "shardd refuses it: " + msg})
			return nil
		}
		j.note(j.fields[idx].from, "shardd refuses it: %s", msg)
		j.fields = slices.Delete(j.fields, idx, idx+1)
	}
	return nil
}

// Zone converts a Java time zone ID (ElasticJob's timeZone) into the IANA
// name shardd takes; an error says why it cannot.
func Zone(id string) (string, error) { return zone(id) }

// zone converts a Java time zone ID into an IANA name: IANA names as they
// are, GMT+08:00 (or UTC+8) as the fixed zone Etc/GMT-8.
func zone(id string) (string, error) {
	if _, err := time.LoadLocation(id); err == nil && id != "" && id != "Local" {
		return id, nil
	}
	u := strings.ToUpper(strings.TrimSpace(id))
	for _, p := range []string{"GMT", "UTC"} {
		rest, ok := strings.CutPrefix(u, p)
		if !ok || rest == "" {
			continue
		}
		sign := rest[0]
		if sign != '+' && sign != '-' {
			break
		}
		hh, mm, _ := strings.Cut(rest[1:], ":")
		h, err1 := strconv.Atoi(hh)
		m := 0
		var err2 error
		if mm != "" {
			m, err2 = strconv.Atoi(mm)
		}
		if err1 != nil || err2 != nil || h > 14 {
			break
		}
		if m != 0 {
			return "", fmt.Errorf("%s is %d minutes off a whole hour, which no IANA fixed zone is: give the region's zone (Asia/Kolkata, say) by hand", id, m)
		}
		if h == 0 {
			return "UTC", nil
		}
		// IANA's Etc zones have POSIX signs: Etc/GMT-8 is 8 hours east.
		flip := map[byte]byte{'+': '-', '-': '+'}[sign]
		return fmt.Sprintf("Etc/GMT%c%d", flip, h), nil
	}
	return "", fmt.Errorf("%q is not a time zone shardd knows (an IANA name such as Asia/Shanghai, or GMT+08:00)", id)
}

// splitCommandLine splits a command line as Apache Commons Exec's
// CommandLine.parse does (ElasticJob's script runner): at spaces, with
// double or single quotes around an argument that has spaces; no shell.
func splitCommandLine(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	in := rune(0)
	had := false
	for _, r := range s {
		switch {
		case in != 0 && r == in:
			in = 0
		case in != 0:
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			in, had = r, true
		case r == ' ' || r == '\t':
			if cur.Len() > 0 || had {
				out = append(out, cur.String())
				cur.Reset()
				had = false
			}
		default:
			cur.WriteRune(r)
		}
	}
	if in != 0 {
		return nil, fmt.Errorf("a quote (%c) that does not end", in)
	}
	if cur.Len() > 0 || had {
		out = append(out, cur.String())
	}
	if len(out) == 0 {
		return nil, errors.New("no command")
	}
	return out, nil
}

// flatten turns props (a mapping, nested or with dotted keys) into dotted
// keys and their values as text.
func flatten(v any) map[string]string {
	out := map[string]string{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch m := v.(type) {
		case map[string]any:
			for k, vv := range m {
				key := k
				if prefix != "" {
					key = prefix + "." + k
				}
				walk(key, vv)
			}
		case nil:
			if prefix != "" {
				out[prefix] = ""
			}
		default:
			out[prefix] = fmt.Sprint(m)
		}
	}
	walk("", v)
	return out
}

// off reports whether v, a dropped key's value, is its "off" (ElasticJob
// writes staticSharding: false, monitorPort: -1 into every config): no
// note is due.
func off(key string, v any) bool {
	switch fmt.Sprint(v) {
	case "false", "-1", "0":
		return true
	case "CPU": // jobExecutorServiceHandlerType's default
		return key == "jobExecutorServiceHandlerType"
	}
	return false
}

func validSelector(s string) bool {
	_, err := selector.Parse(s)
	return err == nil
}

func empty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return strings.TrimSpace(x) == ""
	case []any:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	}
	return false
}

func toInt(v any) (int, error) {
	switch x := v.(type) {
	case int:
		return x, nil
	case float64:
		if x == float64(int(x)) {
			return int(x), nil
		}
	case string:
		if n, err := strconv.Atoi(strings.TrimSpace(x)); err == nil {
			return n, nil
		}
	}
	return 0, fmt.Errorf("%v is not a whole number", v)
}

func toBool(v any) (bool, error) {
	switch x := v.(type) {
	case bool:
		return x, nil
	case string:
		if b, err := strconv.ParseBool(strings.TrimSpace(x)); err == nil {
			return b, nil
		}
	}
	return false, fmt.Errorf("%v is not true or false", v)
}
