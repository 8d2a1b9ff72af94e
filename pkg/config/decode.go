package config

import (
	"bytes"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/shardd/shardd/pkg/runner"
)

// loader collects the jobs and the problems of every file it is given.
type loader struct {
	errs []error
	jobs []*Job
	// named are the jobs with a valid name, valid or not otherwise: a
	// name defined twice is reported whatever else is wrong.
	named []namedAt
	// noEnv skips checkEnv (LoadWithoutEnv).
	noEnv bool
	// calendars are the calendars defined at the top of the files, by
	// name; calendarsRead the files whose calendars were read (Load reads
	// every file's before any job, so that a job may name another file's).
	calendars     map[string]calendarAt
	calendarsRead map[string]bool
}

// calendarAt is a calendar defined at the top of a file.
type calendarAt struct {
	cal *Calendar
	pos Pos
}

// readCalendars reads the calendars mapping n of file, once per file.
func (l *loader) readCalendars(file string, n *yaml.Node) {
	if l.calendarsRead[file] {
		return
	}
	if l.calendarsRead == nil {
		l.calendarsRead, l.calendars = map[string]bool{}, map[string]calendarAt{}
	}
	l.calendarsRead[file] = true
	fs := scope{l: l, file: file}
	n = resolve(n)
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		fs.errorf(n.Line, "calendars must be a mapping of calendar names to their dates, got %s", kindName(n))
		return
	}
	for _, kv := range pairs(n) {
		name := kv.key.Value
		if err := CheckName(name); err != nil {
			fs.errorf(kv.key.Line, "calendar name %s", err)
			continue
		}
		if prev, dup := l.calendars[name]; dup {
			fs.errorf(kv.key.Line, "calendar %q is defined twice (first at %s)", name, prev.pos)
			continue
		}
		var c Calendar
		prefix := "calendars." + name + "."
		f := &fields{line: map[string]int{"": kv.key.Line}, failed: map[string]bool{}}
		before := len(l.errs)
		decodeStruct(fs, resolve(kv.value), reflect.ValueOf(&c).Elem(), prefix, f)
		// Checked here, at its own lines, whether a job names it or not.
		c.parse(name, time.UTC, prefix, func(field, format string, args ...any) {
			line, ok := f.line[field]
			if !ok {
				line = kv.key.Line
			}
			if !f.failed[field] {
				fs.errorf(line, format, args...)
			}
		})
		c.checked = len(l.errs) == before
		l.calendars[name] = calendarAt{&c, Pos{File: file, Line: kv.key.Line}}
	}
}

// preReadCalendars reads the calendars of a file before the jobs of any
// file are decoded; the file's problems are reported when it is read.
func (l *loader) preReadCalendars(file string, data []byte) {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
		return
	}
	if root := resolve(doc.Content[0]); root.Kind == yaml.MappingNode {
		for _, kv := range pairs(root) {
			if kv.key.Value == "calendars" {
				l.readCalendars(file, kv.value)
			}
		}
	}
}

type namedAt struct {
	name string
	pos  Pos
}

// scope is where a problem is reported: a file and, inside it, a job.
type scope struct {
	l    *loader
	file string
	job  string
}

func (s scope) errorf(line int, format string, args ...any) {
	s.l.errs = append(s.l.errs, &Error{File: s.file, Line: line, Job: s.job, Msg: fmt.Sprintf(format, args...)})
}

// notInDefaults are job fields a defaults block may not set, with the reason.
var notInDefaults = map[string]string{
	"name":                   "every job needs its own name",
	"cron":                   "each job has its own schedule",
	"description":            "it describes one job",
	"shardingItemParameters": "they depend on each job's items",
	"script":                 "each job has its own work",
	"http":                   "each job has its own work",
	"calendars":              "define calendars at the top of the file, beside jobs, and name them in excludeCalendars",
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// problemLine finds the line of a YAML syntax error. For some errors
// ("did not find expected key", "... '-' indicator") yaml.v3 reports where
// the enclosing block starts (line 1 for a bad indent on line 4); the first
// line whose addition makes the document fail with the same message is
// where the problem is.
func problemLine(data []byte, msg string, line int) int {
	if !strings.HasPrefix(msg, "did not find expected") {
		return line
	}
	lines := bytes.SplitAfter(data, []byte("\n"))
	for k := line; k <= len(lines); k++ {
		var doc yaml.Node
		err := yaml.Unmarshal(bytes.Join(lines[:k], nil), &doc)
		if err != nil && strings.HasSuffix(err.Error(), msg) {
			return k
		}
	}
	return line
}

func (l *loader) file(name string, data []byte) {
	fs := scope{l: l, file: name}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		msg, line := strings.TrimPrefix(err.Error(), "yaml: "), 0
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			line, _ = strconv.Atoi(m[1])
			msg = err.Error()[len(m[0]):]
			line = problemLine(data, msg, line)
		}
		fs.errorf(line, "%s", msg)
		return
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return // an empty file defines no jobs
	}
	root := resolve(doc.Content[0])
	if root.Kind != yaml.MappingNode {
		fs.errorf(root.Line, "want a mapping with jobs (and calendars or defaults), got %s", kindName(root))
		return
	}
	var defaults, jobs *yaml.Node
	for _, kv := range pairs(root) {
		switch kv.key.Value {
		case "defaults":
			defaults = kv.value
		case "jobs":
			jobs = kv.value
		case "calendars":
			l.readCalendars(name, kv.value)
		default:
			fs.errorf(kv.key.Line, "unknown field %q (want calendars, defaults or jobs)", kv.key.Value)
		}
	}
	if defaults != nil {
		if defaults.Kind != yaml.MappingNode && !isNull(defaults) {
			fs.errorf(defaults.Line, "defaults must be a mapping of job fields, got %s", kindName(defaults))
			defaults = nil
		} else {
			// Check the block once; errors are reported here, not per job.
			for _, kv := range pairs(defaults) {
				if why, ok := notInDefaults[kv.key.Value]; ok {
					fs.errorf(kv.key.Line, "defaults: %s cannot be set in defaults: %s", kv.key.Value, why)
				}
			}
			d := DefaultJob()
			decodeStruct(fs, defaults, reflect.ValueOf(&d).Elem(), "defaults.", nil)
		}
	}
	if jobs == nil || isNull(jobs) {
		return
	}
	if jobs.Kind != yaml.SequenceNode {
		fs.errorf(jobs.Line, "jobs must be a list of jobs, got %s", kindName(jobs))
		return
	}
	for i, n := range jobs.Content {
		l.job(name, i, resolve(n), defaults)
	}
}

// job decodes one entry of a jobs list on top of the defaults, then validates it.
func (l *loader) job(file string, index int, n, defaults *yaml.Node) {
	js := scope{l: l, file: file, job: fmt.Sprintf("#%d", index+1)}
	if n.Kind != yaml.MappingNode {
		js.errorf(n.Line, "want a mapping of job fields, got %s", kindName(n))
		return
	}
	for _, kv := range pairs(n) {
		if kv.key.Value == "name" && kv.value.Kind == yaml.ScalarNode && kv.value.Value != "" {
			js.job = strconv.Quote(kv.value.Value)
		}
	}
	j := DefaultJob()
	if defaults != nil {
		// Problems in defaults were reported once by file; ignore them here.
		decodeStruct(scope{l: &loader{}, file: file}, defaults, reflect.ValueOf(&j).Elem(), "", nil)
	}
	f := &fields{line: map[string]int{"": n.Line}, failed: map[string]bool{}}
	before := len(l.errs)
	decodeStruct(js, n, reflect.ValueOf(&j).Elem(), "", f)
	j.Pos = Pos{File: file, Line: n.Line}
	l.nameCalendars(js, &j, f)
	if CheckName(j.Name) == nil {
		l.named = append(l.named, namedAt{j.Name, j.Pos})
	}
	if validate(js, &j, f) && (l.noEnv || checkEnv(js, &j, f)) && len(l.errs) == before {
		l.jobs = append(l.jobs, &j)
	}
}

// nameCalendars copies into j the file calendars its excludeCalendars
// names, so that they are part of its definition.
func (l *loader) nameCalendars(s scope, j *Job, f *fields) {
	for _, name := range j.ExcludeCalendars {
		at, ok := l.calendars[name]
		if !ok {
			if near, found := Nearest(name, slices.Sorted(maps.Keys(l.calendars))); found {
				s.errorf(f.line["excludeCalendars"], "excludeCalendars: no calendar %q (did you mean %s?)", name, near)
				j.ExcludeCalendars = slices.DeleteFunc(slices.Clone(j.ExcludeCalendars), func(n string) bool { return n == name })
			}
			continue // validateCalendars reports a name no calendar has
		}
		if !at.cal.checked {
			s.errorf(f.line["excludeCalendars"], "excludeCalendars: calendar %q has problems (at %s)", name, at.pos)
		}
		if _, own := j.Calendars[name]; own {
			s.errorf(f.line["calendars."+name], "calendars.%s is also defined at the top of %s; keep one", name, at.pos)
			continue
		}
		if j.Calendars == nil {
			j.Calendars = map[string]*Calendar{}
		}
		j.Calendars[name] = at.cal
	}
}

// checkEnv reports the environment variables that http.headers name
// (${API_TOKEN}) and that are not set: a hook would otherwise send an empty
// secret. It applies to a host's own files only (a definition registered by
// another host is checked where it runs, by the runner), and not to a job
// its definition disables: it sends nothing until an edit enables it, and
// the reload of that edit checks again.
func checkEnv(s scope, j *Job, f *fields) bool {
	if j.HTTP == nil || j.Disabled {
		return true
	}
	ok := true
	names := make([]string, 0, len(j.HTTP.Headers))
	for name := range j.HTTP.Headers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if _, missing := runner.ExpandEnv(j.HTTP.Headers[name]); len(missing) > 0 {
			line, found := f.line["http.headers"]
			if !found {
				line = f.line[""]
			}
			s.errorf(line, "http.headers %s: ${%s} is not set in shardd's environment", name, missing[0])
			ok = false
		}
	}
	return ok
}

// fields records, by field path ("timeout", "http.url"; "" is the job), the
// line where each field was set and which fields failed to decode.
type fields struct {
	line   map[string]int
	failed map[string]bool
}

// fail marks path as not decoded, so that validation does not judge its value.
func (f *fields) fail(path string) {
	if f != nil {
		f.failed[path] = true
	}
}

// nodeDecoder is implemented by field types that read a YAML node themselves.
// The error's text follows the field name in the message.
type nodeDecoder interface {
	decodeNode(n *yaml.Node) error
}

// shorthander is implemented by struct types that may also be written as a
// non-mapping value, which then fills the named field.
type shorthander interface {
	shorthandField() string
}

var (
	durationType    = reflect.TypeOf(Duration(0))
	byteSizeType    = reflect.TypeOf(ByteSize(0))
	nodeDecoderType = reflect.TypeOf((*nodeDecoder)(nil)).Elem()
	shorthanderType = reflect.TypeOf((*shorthander)(nil)).Elem()
)

// decodeStruct decodes mapping n into the struct v strictly: every key must
// be a field (by yaml tag or alias tag), and every problem is reported with
// its line. prefix is the path of v ("" or "http."). f, if not nil, records
// the fields set and failed.
func decodeStruct(s scope, n *yaml.Node, v reflect.Value, prefix string, f *fields) {
	t := v.Type()
	if n.Kind != yaml.MappingNode {
		if reflect.PointerTo(t).Implements(shorthanderType) {
			field := v.Addr().Interface().(shorthander).shorthandField()
			decodeField(s, n, fieldByTag(v, field), prefix+field, f)
			return
		}
		f.fail(strings.TrimSuffix(prefix, "."))
		s.errorf(n.Line, "%s must be a mapping, got %s", strings.TrimSuffix(prefix, "."), kindName(n))
		return
	}
	set := map[string]*yaml.Node{} // field name -> key node that set it
	for _, kv := range pairs(n) {
		key := kv.key.Value
		idx, name := lookupField(t, key)
		if idx < 0 {
			s.errorf(kv.key.Line, "%s", unknownField(t, prefix, key))
			continue
		}
		if prev, dup := set[name]; dup {
			if prev.Value == key {
				s.errorf(kv.key.Line, "%s%s is set twice (first at line %d)", prefix, key, prev.Line)
			} else {
				s.errorf(kv.key.Line, "%s%s and %s%s are the same field; set only one", prefix, prev.Value, prefix, key)
			}
			continue
		}
		set[name] = kv.key
		if f != nil {
			f.line[prefix+name] = kv.key.Line
		}
		decodeField(s, kv.value, v.Field(idx), prefix+name, f)
	}
}

func decodeField(s scope, n *yaml.Node, v reflect.Value, path string, f *fields) {
	n = resolve(n)
	bad := func(format string, args ...any) {
		f.fail(path)
		s.errorf(n.Line, format, args...)
	}
	if v.Kind() == reflect.Pointer && v.Type().Elem().Kind() == reflect.Struct {
		if isNull(n) {
			v.SetZero()
			return
		}
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		v = v.Elem()
	}
	if reflect.PointerTo(v.Type()).Implements(nodeDecoderType) {
		if err := v.Addr().Interface().(nodeDecoder).decodeNode(n); err != nil {
			bad("%s %s", path, err)
		}
		return
	}
	if v.Kind() == reflect.Struct && v.Type() != durationType {
		decodeStruct(s, n, v, path+".", f)
		return
	}
	if v.Kind() == reflect.Map && v.Type().Key().Kind() == reflect.String && v.Type().Elem().Kind() == reflect.Pointer && v.Type().Elem().Elem().Kind() == reflect.Struct {
		decodeStructMap(s, n, v, path, f)
		return
	}
	if v.Type() == durationType {
		var d Duration
		if n.Kind != yaml.ScalarNode || d.UnmarshalText([]byte(n.Value)) != nil {
			bad("%s must be a duration like 30s, 1m30s, or whole days like 7d, got %s", path, describe(n))
			return
		}
		v.SetInt(int64(d))
		return
	}
	if v.Type() == byteSizeType {
		b, err := ParseByteSize(n.Value)
		if n.Kind != yaml.ScalarNode || err != nil {
			bad("%s must be a size like 1048576, 512KiB or 16MiB, got %s", path, describe(n))
			return
		}
		v.SetInt(int64(b))
		return
	}
	if v.Kind() == reflect.String && n.Kind == yaml.ScalarNode && n.Tag != "!!null" {
		v.SetString(n.Value) // numbers and booleans are kept as written
		return
	}
	target := reflect.New(v.Type())
	if err := n.Decode(target.Interface()); err != nil {
		bad("%s must be %s, got %s", path, typeName(v.Type()), describe(n))
		return
	}
	if v.Kind() == reflect.Map && !v.IsNil() && !target.Elem().IsNil() {
		for _, k := range target.Elem().MapKeys() { // merge over defaults
			v.SetMapIndex(k, target.Elem().MapIndex(k))
		}
		return
	}
	v.Set(target.Elem())
}

// decodeStructMap decodes mapping n, of names to mappings of fields (a
// job's calendars), into the map v strictly, each entry as decodeStruct
// does (its path is path.name).
func decodeStructMap(s scope, n *yaml.Node, v reflect.Value, path string, f *fields) {
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		f.fail(path)
		s.errorf(n.Line, "%s must be a mapping of names to their fields, got %s", path, kindName(n))
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	for _, kv := range pairs(n) {
		e := reflect.New(v.Type().Elem().Elem())
		if f != nil {
			f.line[path+"."+kv.key.Value] = kv.key.Line
		}
		decodeStruct(s, resolve(kv.value), e.Elem(), path+"."+kv.key.Value+".", f)
		v.SetMapIndex(reflect.ValueOf(kv.key.Value), e)
	}
}

// lookupField finds the field of t whose yaml tag or alias tag is key, and
// returns its index and canonical (yaml tag) name.
func lookupField(t reflect.Type, key string) (int, string) {
	for i := 0; i < t.NumField(); i++ {
		tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]
		if tag == "" || tag == "-" {
			continue
		}
		if tag == key || t.Field(i).Tag.Get("alias") == key {
			return i, tag
		}
	}
	return -1, ""
}

func fieldByTag(v reflect.Value, name string) reflect.Value {
	i, _ := lookupField(v.Type(), name)
	return v.Field(i)
}

// unknownField words the error for key, suggesting the field (or alias)
// nearest to it by edit distance, case aside, when one is near enough.
func unknownField(t reflect.Type, prefix, key string) string {
	var names, candidates []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if tag == "" || tag == "-" {
			continue
		}
		names = append(names, tag)
		candidates = append(candidates, tag)
		if alias := f.Tag.Get("alias"); alias != "" {
			candidates = append(candidates, alias)
		}
	}
	if best, ok := Nearest(key, candidates); ok {
		return fmt.Sprintf("unknown field %s%s (did you mean %s?)", prefix, key, best)
	}
	if hint, ok := foreignFields[strings.ToLower(key)]; ok && t == reflect.TypeFor[Job]() {
		return fmt.Sprintf("unknown field %s%s: shardd's is %s", prefix, key, hint)
	}
	return fmt.Sprintf("unknown field %s%s (known: %s)", prefix, key, strings.Join(names, ", "))
}

// foreignFields are other schedulers' job fields (Kubernetes CronJob,
// XXL-JOB, dkron, Nomad), by their lower-cased names, with what says the
// same here: the README's "Coming from XXL-JOB or Kubernetes CronJob".
var foreignFields = map[string]string{
	"schedule":                "cron (Kubernetes' schedule)",
	"scheduleconf":            "cron (XXL-JOB's scheduleConf)",
	"crons":                   "cron, which takes a list",
	"concurrencypolicy":       "overlap (Kubernetes' Forbid is overlap: skip, Replace is overlap: replace)",
	"executorblockstrategy":   "overlap (XXL-JOB's SERIAL_EXECUTION is bufferAll, DISCARD_LATER is skip, COVER_EARLY is replace)",
	"blockstrategy":           "overlap (XXL-JOB's SERIAL_EXECUTION is bufferAll, DISCARD_LATER is skip, COVER_EARLY is replace)",
	"startingdeadlineseconds": "catchUpWindow (a duration, like 5m)",
	"misfirestrategy":         "catchUpWindow (XXL-JOB's DO_NOTHING is a short one, like 10s; FIRE_ONCE_NOW a long one, like 30d)",
	"suspend":                 "disabled",
	"activedeadlineseconds":   "timeout (a duration, like 10m)",
	"executortimeout":         "timeout (a duration, like 10m)",
	"backofflimit":            "retries",
	"executorfailretrycount":  "retries",
	"childjobid":              "dependsOn, set on the child (it names its parents)",
	"starts_at":               "activeFrom",
	"expires_at":              "activeUntil",
}

// Nearest returns the candidate nearest to name by edit distance, case
// aside, when one is near enough to be a typo of it ("did you mean"): at
// most a third of the shorter name's letters apart (at least 1), or the
// only candidate that name (3 letters or more) begins.
func Nearest(name string, candidates []string) (string, bool) {
	best, bestDist := "", 0
	for _, c := range candidates {
		if d := editDistance(strings.ToLower(name), strings.ToLower(c)); best == "" || d < bestDist {
			best, bestDist = c, d
		}
	}
	if best != "" && bestDist <= max(1, min(len(name), len(best))/3) {
		return best, true
	}
	// A unique prefix of at least 3 letters: "retr" for retries.
	var prefixed []string
	for _, c := range candidates {
		if len(name) >= 3 && strings.HasPrefix(strings.ToLower(c), strings.ToLower(name)) {
			prefixed = append(prefixed, c)
		}
	}
	if len(prefixed) == 1 {
		return prefixed[0], true
	}
	return best, false
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

type pair struct{ key, value *yaml.Node }

// pairs lists the key/value pairs of mapping n, with YAML merge keys (<<)
// expanded: merged pairs come first, so the mapping's own keys win.
func pairs(n *yaml.Node) []pair {
	return mergedPairs(n, map[*yaml.Node]bool{})
}

// mergedPairs is pairs; merges of a mapping into itself (through aliases)
// are skipped, since its own keys are already there.
func mergedPairs(n *yaml.Node, visiting map[*yaml.Node]bool) []pair {
	n = resolve(n)
	if visiting[n] {
		return nil
	}
	visiting[n] = true
	defer delete(visiting, n)
	var merged, own []pair
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Tag == "!!merge" {
			v = resolve(v)
			srcs := []*yaml.Node{v}
			if v.Kind == yaml.SequenceNode {
				srcs = v.Content
			}
			for _, src := range srcs {
				merged = append(merged, mergedPairs(src, visiting)...)
			}
			continue
		}
		own = append(own, pair{k, v})
	}
	if len(merged) == 0 {
		return own
	}
	out := own
	have := map[string]bool{}
	for _, p := range own {
		have[p.key.Value] = true
	}
	for _, p := range merged {
		if !have[p.key.Value] {
			have[p.key.Value] = true
			out = append(out, p)
		}
	}
	return out
}

func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return describe(n)
	}
	return "nothing"
}

// describe shows a node in an error message.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		if isNull(n) {
			return "nothing"
		}
		v := n.Value
		if len(v) > 60 {
			v = v[:57] + "..."
		}
		return strconv.Quote(v)
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return "nothing"
}

func typeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int64, reflect.Int32:
		return "an integer"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "a list of " + strings.TrimPrefix(strings.TrimPrefix(typeName(t.Elem()), "an "), "a ") + "s"
	case reflect.Map:
		return "a mapping of " + strings.TrimPrefix(typeName(t.Key()), "a ") + "s to " + strings.TrimPrefix(typeName(t.Elem()), "a ") + "s"
	}
	return t.String()
}
