// Package schedule parses the cron expressions of shardd jobs into schedules.
//
// It accepts what ElasticJob, XXL-JOB and Unix users write, and maps each onto
// robfig/cron v3 without changing its meaning:
//
//	6 or 7 fields   Quartz: sec min hour day-of-month month day-of-week [year]
//	                day-of-week 1-7 = SUN-SAT (as in Quartz), "?" for "no value";
//	                the year may only be "*" or "?"
//	5 fields        Unix: min hour day-of-month month day-of-week, 0-6 = SUN-SAT
//	@every 30s      every 30 seconds, aligned to multiples of the interval since
//	                the Unix epoch, so that every host computes the same fire times
//	@hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually
//
// Quartz features that robfig cannot express (L, W, #, a concrete year, both
// day-of-month and day-of-week given) are rejected with an error saying so:
// an expression is never silently read differently from how Quartz reads it.
//
// A Schedule is a pure function of time: Next takes the time to start from.
package schedule

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// Schedule gives the fire times of a job.
type Schedule interface {
	// Next returns the first fire time strictly after t, or the zero time if
	// there is none within five years.
	Next(t time.Time) time.Time
}

// ErrSyntax wraps every parse error.
var ErrSyntax = errors.New("schedule: invalid cron expression")

var (
	quartzParser = cron.NewParser(cron.Second | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)
	unixParser   = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)
)

// reference is the fixed time from which Parse checks that a schedule fires at all.
var reference = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// Parse parses expr, whose wall-clock fields are read in loc (UTC if nil).
// Errors name what is wrong and wrap ErrSyntax.
func Parse(expr string, loc *time.Location) (Schedule, error) {
	if loc == nil {
		loc = time.UTC
	}
	s, err := parse(strings.TrimSpace(expr), loc)
	if err != nil {
		return nil, fmt.Errorf("%w %q: %s", ErrSyntax, expr, err)
	}
	if s.Next(reference).IsZero() {
		return nil, fmt.Errorf("%w %q: it never fires", ErrSyntax, expr)
	}
	return s, nil
}

func parse(expr string, loc *time.Location) (Schedule, error) {
	if expr == "" {
		return nil, errors.New("empty")
	}
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return nil, errors.New("a time zone prefix is not allowed here; set the job's timeZone instead")
	}
	if strings.HasPrefix(expr, "@") {
		return parseDescriptor(expr, loc)
	}
	fields := strings.Fields(expr)
	switch len(fields) {
	case 5:
		if err := checkUnix(fields); err != nil {
			return nil, err
		}
		s, err := unixParser.Parse(strings.Join(fields, " "))
		return withLocation(s, namedField(unixParser, unixFieldNames, fields, fields, err))(loc)
	case 6, 7:
		converted, err := quartzToRobfig(fields)
		if err != nil {
			return nil, err
		}
		s, err := quartzParser.Parse(strings.Join(converted, " "))
		return withLocation(s, namedField(quartzParser, quartzFieldNames, fields, converted, err))(loc)
	default:
		return nil, fmt.Errorf("%d fields; want 6 or 7 (Quartz: sec min hour day-of-month month day-of-week [year]), 5 (Unix: min hour day-of-month month day-of-week) or a descriptor like @every 30s", len(fields))
	}
}

// withLocation sets loc on a robfig schedule, and trims robfig's error text.
func withLocation(s cron.Schedule, err error) func(*time.Location) (Schedule, error) {
	return func(loc *time.Location) (Schedule, error) {
		if err != nil {
			return nil, err
		}
		spec, ok := s.(*cron.SpecSchedule)
		if !ok {
			return nil, fmt.Errorf("unexpected schedule type %T", s)
		}
		spec.Location = loc
		return spec, nil
	}
}

func parseDescriptor(expr string, loc *time.Location) (Schedule, error) {
	if rest, ok := strings.CutPrefix(expr, "@every"); ok {
		rest = strings.TrimSpace(rest)
		d, err := time.ParseDuration(rest)
		if err != nil {
			return nil, fmt.Errorf("@every needs a duration like 30s or 5m, got %q", rest)
		}
		if d < time.Second || d%time.Second != 0 {
			return nil, fmt.Errorf("@every needs a whole number of seconds >= 1s, got %s", d)
		}
		return Every(d), nil
	}
	switch expr {
	case "@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly":
		s, err := unixParser.Parse(expr)
		return withLocation(s, err)(loc)
	case "@reboot":
		return nil, errors.New("@reboot is not supported: shardd fires by the clock")
	}
	return nil, fmt.Errorf("unknown descriptor %s (want @every <duration>, @hourly, @daily, @midnight, @weekly, @monthly, @yearly or @annually)", expr)
}

// Every fires at every multiple of a whole number of seconds since the Unix
// epoch: @every 1m fires at :00 of every minute on every host.
type Every time.Duration

// Next returns the first multiple of the interval strictly after t.
func (e Every) Next(t time.Time) time.Time {
	sec := int64(time.Duration(e) / time.Second)
	u := t.Unix() // floor of t in seconds
	k := u / sec
	if u < 0 && u%sec != 0 {
		k-- // floor division for times before 1970
	}
	return time.Unix((k+1)*sec, 0).In(t.Location())
}

// Seq returns the sequence number of fire in s, for the strategies that
// rotate per fire: consecutive fires get consecutive numbers, and every host
// computes the same number for the same fire. For @every it counts intervals
// since the Unix epoch; for cron expressions it counts the fires since the
// start of fire's day in the schedule's time zone (so it restarts daily, as
// XXL-JOB's round-robin counter does). fire should be a fire time of s.
func Seq(s Schedule, fire time.Time) int64 {
	if e, ok := s.(Every); ok {
		return fire.Unix() / int64(time.Duration(e)/time.Second)
	}
	loc := fire.Location()
	if spec, ok := s.(*cron.SpecSchedule); ok && spec.Location != nil {
		loc = spec.Location
	}
	local := fire.In(loc)
	t := time.Date(local.Year(), local.Month(), local.Day(), 0, 0, 0, 0, loc).Add(-time.Nanosecond)
	var n int64
	for t = s.Next(t); !t.IsZero() && t.Before(fire); t = s.Next(t) {
		n++
	}
	return n
}

var (
	quartzFieldNames = []string{"second", "minute", "hour", "day-of-month", "month", "day-of-week", "year"}
	unixFieldNames   = []string{"minute", "hour", "day-of-month", "month", "day-of-week"}
	domSpecial       = regexp.MustCompile(`^(L|LW|L-\d+|\d+W)$`)
	dowLast          = regexp.MustCompile(`^(?i)([0-9]+|[a-z]{3})?L$`)
	dowNumber        = regexp.MustCompile(`^\d+$`)
)

var (
	robfigAbove    = regexp.MustCompile(`^end of range \((-?\d+)\) above maximum \((\d+)\)`)
	robfigBelow    = regexp.MustCompile(`^beginning of range \((-?\d+)\) below minimum \((\d+)\)`)
	robfigNotInt   = regexp.MustCompile(`^failed to parse int from ([^:]*)`)
	robfigStepZero = regexp.MustCompile(`^step of range should be a positive number`)
)

// namedField words a robfig parse error (err, of fields converted from
// the fields as written) with the field at fault: "hour "25": 25 is above
// the maximum 23", not "end of range (25) above maximum (23): 25". It
// finds the field by parsing each one alone, the others set to "*".
func namedField(p cron.Parser, names, written, converted []string, err error) error {
	if err == nil {
		return nil
	}
	for i := range converted {
		probe := make([]string, len(converted))
		for j := range probe {
			probe[j] = "*"
		}
		probe[i] = converted[i]
		_, ferr := p.Parse(strings.Join(probe, " "))
		if ferr == nil {
			continue
		}
		msg := ferr.Error()
		switch {
		case robfigAbove.MatchString(msg):
			m := robfigAbove.FindStringSubmatch(msg)
			msg = fmt.Sprintf("%s is above the maximum %s", m[1], m[2])
		case robfigBelow.MatchString(msg):
			m := robfigBelow.FindStringSubmatch(msg)
			msg = fmt.Sprintf("%s is below the minimum %s", m[1], m[2])
		case robfigNotInt.MatchString(msg):
			msg = fmt.Sprintf("%q is not a number or a name", robfigNotInt.FindStringSubmatch(msg)[1])
		case robfigStepZero.MatchString(msg):
			msg = "a step (/n) must be a positive number"
		}
		return fmt.Errorf("%s %q: %s", names[i], written[i], msg)
	}
	return err
}

// checkUnix rejects Quartz-only syntax in a 5-field expression.
func checkUnix(fields []string) error {
	if strings.ContainsAny(fields[2]+fields[4], "LW#") {
		return errors.New("L, W and # are Quartz features that shardd does not support")
	}
	return nil
}

// quartzToRobfig checks the Quartz fields (6, or 7 with a year) for features
// robfig lacks and returns the 6 robfig fields, with day-of-week numbers
// moved from Quartz's 1-7 (SUN-SAT) to robfig's 0-6.
func quartzToRobfig(fields []string) ([]string, error) {
	if len(fields) == 7 {
		if y := fields[6]; y != "*" && y != "?" {
			return nil, fmt.Errorf("year %q: a concrete year is a Quartz feature shardd does not support; use * or drop the field", y)
		}
		fields = fields[:6]
	}
	dom, dow := fields[3], fields[5]
	for _, part := range strings.Split(dom, ",") {
		if domSpecial.MatchString(strings.ToUpper(part)) {
			return nil, fmt.Errorf("day-of-month %q: L (last day) and W (nearest weekday) are Quartz features shardd does not support", part)
		}
	}
	if restricted(dom) && restricted(dow) {
		return nil, fmt.Errorf("day-of-month %q and day-of-week %q are both given; Quartz needs ? in one of them", dom, dow)
	}
	newDow, err := quartzDow(dow)
	if err != nil {
		return nil, err
	}
	out := append([]string(nil), fields...)
	out[5] = newDow
	for i, f := range out {
		if strings.Contains(f, "?") && f != "?" {
			return nil, fmt.Errorf("%s %q: ? must stand alone", quartzFieldNames[i], f)
		}
	}
	return out, nil
}

func restricted(field string) bool { return field != "*" && field != "?" }

// quartzDow rewrites a Quartz day-of-week field for robfig.
func quartzDow(field string) (string, error) {
	parts := strings.Split(field, ",")
	for i, part := range parts {
		if strings.Contains(part, "#") {
			return "", fmt.Errorf("day-of-week %q: # (nth weekday of the month) is a Quartz feature shardd does not support", part)
		}
		if dowLast.MatchString(part) {
			return "", fmt.Errorf("day-of-week %q: L (last weekday of the month) is a Quartz feature shardd does not support", part)
		}
		rng, step, hasStep := strings.Cut(part, "/")
		lo, hi, isRange := strings.Cut(rng, "-")
		var err error
		if lo, err = quartzDowValue(lo); err != nil {
			return "", err
		}
		if isRange {
			if hi, err = quartzDowValue(hi); err != nil {
				return "", err
			}
			rng = lo + "-" + hi
		} else {
			rng = lo
		}
		if hasStep {
			rng += "/" + step
		}
		parts[i] = rng
	}
	return strings.Join(parts, ","), nil
}

// quartzDowValue maps one Quartz day-of-week value (1-7 = SUN-SAT) to robfig's (0-6).
func quartzDowValue(v string) (string, error) {
	if !dowNumber.MatchString(v) {
		return v, nil // *, ?, a name like MON, or something robfig will reject
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 7 {
		return "", fmt.Errorf("day-of-week %s: Quartz numbers days 1-7 (1 = SUN)", v)
	}
	return strconv.Itoa(n - 1), nil
}
