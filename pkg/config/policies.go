package config

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/shardd/shardd/pkg/schedule"
)

// The scheduling policies of docs/policies.md: which fires of a job are due
// (several crons, an active window, calendars) and what happens to a due
// fire (overlap, catch-up window, jitter).

// Overlap policies: what happens to a fire of an item whose previous run
// is still going (Job.Overlap).
const (
	// OverlapBufferOne runs the latest such fire when the run ends,
	// standing for the others (misfire: true).
	OverlapBufferOne = "bufferOne"
	// OverlapSkip records them skipped, reason busy (misfire: false).
	OverlapSkip = "skip"
	// OverlapBufferAll runs each of them, in order, up to BufferLimit
	// pending fires; older ones are recorded skipped, reason buffer-full.
	OverlapBufferAll = "bufferAll"
	// OverlapReplace stops the running run (KILLED, reason replaced), then
	// runs the new fire: never both at once.
	OverlapReplace = "replace"
)

var overlapPolicies = []string{OverlapBufferOne, OverlapSkip, OverlapBufferAll, OverlapReplace}

// Bounds of the policies' fields.
const (
	DefaultBufferLimit = 100
	MaxBufferLimit     = 100000
	MaxCrons           = 16
	MaxJitter          = Duration(time.Hour)
	MaxCalendarDates   = 1000
	// MaxPauseAfterFailures bounds pauseAfterFailures.
	MaxPauseAfterFailures = 1000
)

// OverlapPolicy is the job's overlap policy: Overlap, or the one misfire
// stands for when Overlap is not set.
func (j *Job) OverlapPolicy() string {
	switch {
	case j.Overlap != "":
		return j.Overlap
	case j.Misfire:
		return OverlapBufferOne
	}
	return OverlapSkip
}

// BufferLimitOrDefault is how many pending fires overlap bufferAll keeps.
func (j *Job) BufferLimitOrDefault() int {
	if j.BufferLimit > 0 {
		return j.BufferLimit
	}
	return DefaultBufferLimit
}

// CronList is a job's schedule: one cron expression or several. It reads
// and writes one as a plain string, so that a job with one cron has the
// definition (and the hash) it had before lists existed.
type CronList []string

// String shows the expressions, separated by "; ".
func (c CronList) String() string { return strings.Join(c, "; ") }

func (c CronList) MarshalJSON() ([]byte, error) {
	if len(c) == 1 {
		return json.Marshal(c[0])
	}
	return json.Marshal([]string(c))
}

func (c *CronList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*c = nil
		if one != "" {
			*c = CronList{one}
		}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("cron must be a string or a list of strings")
	}
	*c = many
	return nil
}

func (c *CronList) decodeNode(n *yaml.Node) error {
	switch {
	case n.Kind == yaml.ScalarNode && n.Tag != "!!null":
		*c = nil
		if n.Value != "" {
			*c = CronList{n.Value}
		}
		return nil
	case isNull(n):
		*c = nil
		return nil
	case n.Kind == yaml.SequenceNode:
		out := CronList{}
		for _, e := range n.Content {
			e = resolve(e)
			if e.Kind != yaml.ScalarNode || isNull(e) {
				return fmt.Errorf("must be a list of cron expressions, got %s at line %d", kindName(e), e.Line)
			}
			out = append(out, e.Value)
		}
		*c = out
		return nil
	}
	return fmt.Errorf("must be a cron expression or a list of them, got %s", kindName(n))
}

// Calendar is a named set of excluded days (see schedule.Calendar): at the
// top of a file, beside jobs, or in a job's own calendars field.
type Calendar struct {
	// TimeZone in which the dates are read; default the job's.
	TimeZone string `yaml:"timeZone" json:"timeZone,omitempty"`
	// Dates are dates (2027-01-01) and inclusive ranges (2027-02-10..2027-02-17).
	Dates []string `yaml:"dates" json:"dates,omitempty"`
	// Weekdays are days of the week excluded every week: MON ... SUN.
	Weekdays []string `yaml:"weekdays" json:"weekdays,omitempty"`

	// checked: read at the top of a file and found valid there (its
	// problems are reported at its own lines, not again at each job's).
	checked bool
}

var weekdayNames = map[string]time.Weekday{
	"SUN": time.Sunday, "MON": time.Monday, "TUE": time.Tuesday, "WED": time.Wednesday,
	"THU": time.Thursday, "FRI": time.Friday, "SAT": time.Saturday,
}

// parse checks c and returns it as a schedule.Calendar read in c's zone,
// or in def when it names none. Errors name the field under prefix.
func (c *Calendar) parse(name string, def *time.Location, prefix string, bad badFunc) *schedule.Calendar {
	out := &schedule.Calendar{Name: name, Loc: def}
	if c.TimeZone != "" {
		loc, err := time.LoadLocation(c.TimeZone)
		if err != nil || c.TimeZone == "Local" {
			bad(prefix+"timeZone", "%stimeZone %q is not an IANA time zone name like UTC or Asia/Shanghai", prefix, c.TimeZone)
		} else {
			out.Loc = loc
		}
	}
	if len(c.Dates) > MaxCalendarDates {
		bad(prefix+"dates", "%sdates has %d entries; at most %d", prefix, len(c.Dates), MaxCalendarDates)
	}
	for _, d := range c.Dates {
		from, to, isRange := strings.Cut(strings.TrimSpace(d), "..")
		a, err1 := time.Parse(time.DateOnly, strings.TrimSpace(from))
		b := a
		var err2 error
		if isRange {
			b, err2 = time.Parse(time.DateOnly, strings.TrimSpace(to))
		}
		switch {
		case err1 != nil || err2 != nil:
			bad(prefix+"dates", "%sdates %q is not a date like 2027-01-01 or a range like 2027-02-10..2027-02-17", prefix, d)
		case b.Before(a):
			bad(prefix+"dates", "%sdates %q ends before it begins", prefix, d)
		default:
			out.Ranges = append(out.Ranges, schedule.DateRange{From: a, To: b})
		}
	}
	for _, w := range c.Weekdays {
		name := strings.TrimSpace(w)
		day, ok := weekdayNames[strings.ToUpper(name)]
		for _, d := range weekdayNames {
			if strings.EqualFold(name, d.String()) { // the whole name: Saturday
				day, ok = d, true
			}
		}
		if !ok {
			bad(prefix+"weekdays", "%sweekdays %q is not a day of the week (MON, TUE, WED, THU, FRI, SAT, SUN)", prefix, w)
			continue
		}
		out.Weekdays |= 1 << uint(day)
	}
	if len(c.Dates) == 0 && len(c.Weekdays) == 0 {
		bad(prefix+"dates", "%s excludes nothing: give dates, weekdays or both", strings.TrimSuffix(prefix, "."))
	}
	return out
}

// parseActive reads activeFrom or activeUntil: an RFC 3339 time, or a date
// in the job's zone (its first instant for activeFrom; for activeUntil the
// last instant of that day, so that the day is included).
func parseActive(v string, loc *time.Location, until bool) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return t, nil
	}
	for _, layout := range []string{"2006-01-02 15:04:05", "2006-01-02 15:04"} { // a reading in the job's zone
		if t, err := time.ParseInLocation(layout, v, loc); err == nil {
			return t, nil
		}
	}
	d, err := time.Parse(time.DateOnly, v)
	if err != nil {
		why := "is not a time like 2027-01-01T09:00:00+08:00, a reading in the job's zone like 2027-01-01 09:00, or a date like 2027-01-01"
		var pe *time.ParseError
		if errors.As(err, &pe) && pe.Message != "" && len(v) == len(time.DateOnly) {
			why += " (" + strings.TrimPrefix(pe.Message, ": ") + ")"
		}
		return time.Time{}, errors.New(why)
	}
	if until {
		return schedule.DayStart(loc, d.Year(), d.Month(), d.Day()+1).Add(-time.Nanosecond), nil
	}
	return schedule.DayStart(loc, d.Year(), d.Month(), d.Day()), nil
}

// foreignOverlap are other schedulers' overlap policies (Kubernetes'
// concurrencyPolicy, XXL-JOB's block strategies), lower-cased, with
// shardd's.
var foreignOverlap = map[string]string{
	"forbid":           OverlapSkip,
	"discard_later":    OverlapSkip,
	"serial_execution": OverlapBufferAll,
	"serial":           OverlapBufferAll,
	"cover_early":      OverlapReplace,
}

// validatePolicies checks the policies' fields, after validateSchedule
// (which sets j.Location), and wraps j.Schedule in the active window and
// sets j.Exclusion.
func validatePolicies(j *Job, f *fields, bad badFunc) {
	if j.Overlap != "" {
		if !slices.Contains(overlapPolicies, j.Overlap) {
			msg := fmt.Sprintf("overlap %q is not one of %s", j.Overlap, strings.Join(overlapPolicies, ", "))
			if theirs, ok := foreignOverlap[strings.ToLower(j.Overlap)]; ok {
				msg += fmt.Sprintf(" (%s is overlap: %s here)", j.Overlap, theirs)
			} else if near, ok := Nearest(j.Overlap, overlapPolicies); ok {
				msg += fmt.Sprintf(" (did you mean %s?)", near)
			}
			bad("overlap", "%s", msg)
		} else {
			// misfire is overlap's alias: given both, they must agree.
			want := j.Overlap != OverlapSkip
			if _, set := f.line["misfire"]; set && j.Misfire != want {
				bad("misfire", "misfire: %v disagrees with overlap: %s; set only overlap (misfire true is bufferOne, false is skip)", j.Misfire, j.Overlap)
			}
			j.Misfire = want
		}
	}
	switch {
	case j.BufferLimit < 0 || j.BufferLimit > MaxBufferLimit:
		bad("bufferLimit", "bufferLimit must be between 1 and %d, got %d", MaxBufferLimit, j.BufferLimit)
	case j.BufferLimit != 0 && j.OverlapPolicy() != OverlapBufferAll:
		bad("bufferLimit", "bufferLimit applies to overlap: bufferAll only (overlap is %s)", j.OverlapPolicy())
	}
	if j.CatchUpWindow < 0 {
		bad("catchUpWindow", "catchUpWindow must not be negative, got %s", j.CatchUpWindow)
	} else if j.CatchUpWindow != 0 && j.CatchUpWindow < Duration(time.Second) {
		bad("catchUpWindow", "catchUpWindow must be at least 1s, got %s", j.CatchUpWindow)
	}
	switch {
	case j.Jitter < 0 || j.Jitter > MaxJitter:
		bad("jitter", "jitter must be between 0 and %s, got %s", time.Duration(MaxJitter), j.Jitter)
	case j.Jitter > 0 && j.Jitter < Duration(time.Millisecond):
		bad("jitter", "jitter must be at least 1ms, got %s", j.Jitter)
	case j.Jitter > 0 && len(j.Cron) == 0:
		j.Jitter = 0 // no fire to offset (set on the job itself: validateCronOnly says so)
	case j.Jitter > 0 && j.Schedule != nil:
		if gap, _ := shortestGap(j.Schedule, j.Location); gap <= time.Duration(j.Jitter) {
			bad("jitter", "jitter %s must be shorter than the shortest gap between two fires of the schedule, %s (a run would start after the next fire)", j.Jitter, gap)
		}
	}
	var from, until time.Time
	if j.ActiveFrom != "" {
		t, err := parseActive(j.ActiveFrom, j.Location, false)
		if err != nil {
			bad("activeFrom", "activeFrom %q %s", j.ActiveFrom, err)
		}
		from = t
	}
	if j.ActiveUntil != "" {
		t, err := parseActive(j.ActiveUntil, j.Location, true)
		if err != nil {
			bad("activeUntil", "activeUntil %q %s", j.ActiveUntil, err)
		}
		until = t
	}
	if !from.IsZero() && !until.IsZero() && until.Before(from) {
		bad("activeUntil", "activeUntil %s is before activeFrom %s", j.ActiveUntil, j.ActiveFrom)
	}
	if j.Schedule != nil && (!from.IsZero() || !until.IsZero()) {
		j.Schedule = schedule.Window{S: j.Schedule, From: from, Until: until}
	}
	validateCalendars(j, bad)
	validateFixedDelay(j, f, bad)
	validateCronOnly(j, f, bad)
	if j.ClusterConcurrency < 0 || j.ClusterConcurrency > MaxShardingTotalCount {
		bad("clusterConcurrency", "clusterConcurrency must be between 1 and %d (0: no limit), got %d", MaxShardingTotalCount, j.ClusterConcurrency)
	}
	switch {
	case j.PauseAfterFailures < 0 || j.PauseAfterFailures > MaxPauseAfterFailures:
		bad("pauseAfterFailures", "pauseAfterFailures must be between 1 and %d (0: never pause), got %d", MaxPauseAfterFailures, j.PauseAfterFailures)
	case j.PauseAfterFailures > 0 && j.FixedDelay > 0:
		bad("pauseAfterFailures", "pauseAfterFailures counts failed fires of the whole job; with fixedDelay each item has its own fires")
	}
}

// cronOnly are the fields that shape the fires of a cron schedule: on a
// job without one they would do nothing.
var cronOnly = []string{"overlap", "bufferLimit", "catchUpWindow", "jitter", "activeFrom", "activeUntil", "excludeCalendars"}

// validateCronOnly refuses the fields of cronOnly set on a job that has no
// cron (it runs when triggered, by hand or by its parents): they would do
// nothing. From defaults they are left alone, as they do nothing there. A
// fixedDelay job is validateFixedDelay's to judge.
func validateCronOnly(j *Job, f *fields, bad badFunc) {
	if len(j.Cron) > 0 || j.FixedDelay > 0 {
		return
	}
	for _, field := range cronOnly {
		if _, set := f.line[field]; set {
			bad(field, "%s shapes the fires of a cron schedule; this job has none (it runs when triggered: by hand, or by its parents)", field)
		}
	}
}

// validateFixedDelay checks fixedDelay: a schedule of its own, without
// the fields that shape a cron's fires.
func validateFixedDelay(j *Job, f *fields, bad badFunc) {
	if _, set := f.line["fixedDelay"]; set && j.FixedDelay == 0 {
		bad("fixedDelay", "fixedDelay must be a whole number of seconds >= 1s, got 0s (leave it out for a job run only by hand)")
		return
	}
	if j.FixedDelay == 0 {
		return
	}
	switch {
	case j.FixedDelay < Duration(time.Second) || j.FixedDelay%Duration(time.Second) != 0:
		bad("fixedDelay", "fixedDelay must be a whole number of seconds >= 1s, got %s", j.FixedDelay)
	case len(j.Cron) > 0:
		bad("fixedDelay", "fixedDelay and cron are both set; a job has one schedule")
	}
	for _, field := range cronOnly {
		if _, set := f.line[field]; set {
			bad(field, "%s applies to a cron schedule, not to fixedDelay (each run comes a delay after the previous one ends)", field)
		}
	}
}

// shortestGap is the shortest time between two consecutive fires of s over
// a year (2027, a fixed year: the same answer every day), and the later
// fire of that pair. It is the shortest distance between any two of its
// fires, found without walking a year of them:
//   - the first 10,000 fires: a cron expression matches the same times of
//     day on every day it matches, so they show its own gaps;
//   - around each change of the zone's offset, where a day is shorter;
//   - for several crons, each fire of a member with at most 10,000 fires in
//     the year against the nearest fires of the others, the rarest members
//     first, within a budget of lookups (16 crons of 10,000 fires each
//     would take seconds): a rare schedule (once a year) may come minutes
//     before a frequent one's fire.
func shortestGap(s schedule.Schedule, loc *time.Location) (time.Duration, time.Time) {
	const sample, budget = 10000, 200000
	from := time.Date(2027, 1, 1, 0, 0, 0, 0, loc)
	to := from.AddDate(1, 0, 0)
	gap, at := time.Duration(1<<62), time.Time{}
	pair := func(a, b time.Time) {
		if a.After(b) {
			a, b = b, a
		}
		if !a.IsZero() && b.After(a) && b.Sub(a) < gap {
			gap, at = b.Sub(a), b
		}
	}
	walk := func(t time.Time, n int) {
		prev := s.Next(t)
		for i := 0; i < n && !prev.IsZero() && !prev.After(to); i++ {
			next := s.Next(prev)
			pair(prev, next)
			prev = next
		}
	}
	walk(from.Add(-time.Nanosecond), sample)
	for _, c := range schedule.Changes(s, from, to) {
		walk(c.At.Add(-26*time.Hour), 200)
	}
	members, ok := s.(schedule.Union)
	if !ok || gap == time.Duration(1<<62) {
		return gap, at
	}
	counts := make([]int64, len(members))
	order := make([]int, len(members))
	for i, m := range members {
		counts[i], order[i] = schedule.Count(m, from, to), i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(counts[a], counts[b]) })
	lookups := 0
	for _, i := range order {
		m := members[i]
		if counts[i] > sample {
			break // frequent: its own fires are in the sample (and so are the rest's)
		}
		for f := m.Next(from.Add(-time.Nanosecond)); !f.IsZero() && !f.After(to) && lookups < budget; f = m.Next(f) {
			lookups += 1 + 2*len(members)
			pair(f, m.Next(f))
			for k, other := range members {
				if k == i {
					continue
				}
				// The other's fires nearest f: the first after f - gap,
				// and the one after it (when the first is before f).
				n := other.Next(f.Add(-gap))
				if n.Equal(f) {
					n = other.Next(f)
				}
				pair(f, n)
				if n.Before(f) {
					if n = other.Next(n); n.Equal(f) {
						n = other.Next(f)
					}
					pair(f, n)
				}
			}
		}
	}
	return gap, at
}

// validateCalendars checks excludeCalendars against the job's calendars
// (its own, and those of its file that it names, put there by the loader)
// and sets j.Exclusion.
func validateCalendars(j *Job, bad badFunc) {
	seen := map[string]bool{}
	for _, name := range j.ExcludeCalendars {
		switch {
		case seen[name]:
			bad("excludeCalendars", "excludeCalendars names %q twice", name)
			continue
		case j.Calendars[name] == nil:
			bad("excludeCalendars", "excludeCalendars: no calendar %q (calendars are defined at the top of a job file, beside jobs)", name)
			continue
		}
		seen[name] = true
		calBad := bad
		if j.Calendars[name].checked {
			calBad = func(string, string, ...any) {}
		}
		j.Exclusion = append(j.Exclusion, j.Calendars[name].parse(name, j.Location, "calendars."+name+".", calBad))
	}
	for _, name := range slices.Sorted(maps.Keys(j.Calendars)) {
		if !seen[name] {
			bad("calendars", "calendars.%s is not named in excludeCalendars", name)
		}
	}
}
