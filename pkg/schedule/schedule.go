// Package schedule parses the cron expressions of shardd jobs into schedules.
//
// It accepts what ElasticJob, XXL-JOB and Unix users write, and matches
// times as robfig/cron v3 would, without changing their meaning:
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
//
// # Time zones and daylight saving
//
// A cron expression names wall-clock times (readings of a clock: a date and
// a time of day) in the job's time zone. Where the zone's UTC offset changes
// (a daylight-saving transition, or a zone changing its standard time), some
// readings happen twice (the clocks go back over them) and some never happen
// (the clocks jump over them). Which instants fire is decided as vixie cron
// does, by what the expression means:
//
//   - A schedule follows the clock when its second, minute or hour field
//     is a wildcard: "*", or a step or range over the whole field ("*/n",
//     "0/n", "0-59/n", "0-23") that matches more than one value. Such a
//     schedule names a rhythm, not a time: it fires at every instant at
//     which the clock shows a matching reading, so it fires twice for a
//     reading the clocks show twice, and not at all for one they skip.
//     "0 0 * * * ?" fires at each real hour's :00, both 02:00s of a
//     fall-back night in Berlin, and no 02:00 on the spring-forward night
//     (01:00 CET, then 03:00 CEST: one real hour apart); "0 0/30 * * * ?"
//     fires every real 30 minutes across both.
//   - Every other schedule is fixed-time ("0 15 2 * * ?", "0 0 2,14 * * ?",
//     "0 0,30 1 * * ?", "5/15" with a fixed hour, @daily): each matching
//     reading fires once, at the first instant at which the clock shows
//     that reading or a later one. A reading shown twice fires the first
//     time only; a reading skipped fires at the instant the clocks jump
//     (the first instant after the gap: 02:15 on a night that jumps from
//     02:00 CET to 03:00 CEST fires at 03:00 CEST). Several readings in one
//     gap fire once between them, and a skipped reading whose jump lands on
//     a matching reading fires with it, once. So a job with one time a day
//     fires exactly once for every local calendar day, transition days
//     included, in every zone and for every size of shift (Lord_Howe's 30
//     minutes too): on that day, or, where the clocks jump over the end of
//     the day (America/Nuuk goes from Saturday 23:00 -02 to Sunday 00:00
//     -01), at the jump, the first instant of the next day.
//
// Quartz's "0/30" is "*/30": in the minute field both make a wildcard, so
// "0 0/30 1 * * ?" (every 30 minutes during 01:00-01:59) follows the clock
// and fires four times on a night that shows 01:00-01:59 twice, where the
// fixed-time "0 0,30 1 * * ?" fires twice. "0 0 */2 * * ?" follows the
// clock; "0 0 2/12 * * ?" (02:00 and 14:00) is fixed-time, since its step
// does not start at the field's first value. A seconds step ("0/10 15 2 * *
// ?") is a wildcard as a minutes step is; a Unix expression's seconds are a
// fixed 0. The day-of-month, month and day-of-week fields never make a
// schedule follow the clock. @every counts real seconds; no transition
// changes it.
//
// Fires are strictly increasing and every fire f satisfies Next(f-1ns) == f:
// callers enumerate fires between two times by calling Next from the last
// one (misfire counts, previews, the ledger's checks), with no duplicate and
// no stall at a gap. Changes describes what the transitions in a span do to
// a schedule, for previews.
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
	unixParser   = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)
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
		if err := namedField(unixParser, unixFieldNames, fields, fields, err); err != nil {
			return nil, err
		}
		return newCron(s, loc, wildcard(fields[0], 59) || wildcard(fields[1], 23))
	case 6, 7:
		converted, err := quartzToRobfig(fields)
		if err != nil {
			return nil, err
		}
		s, err := quartzParser.Parse(strings.Join(converted, " "))
		if err := namedField(quartzParser, quartzFieldNames, fields, converted, err); err != nil {
			return nil, err
		}
		return newCron(s, loc, wildcard(converted[0], 59) || wildcard(converted[1], 59) || wildcard(converted[2], 23))
	default:
		return nil, fmt.Errorf("%d fields; want 6 or 7 (Quartz: sec min hour day-of-month month day-of-week [year]), 5 (Unix: min hour day-of-month month day-of-week) or a descriptor like @every 30s", len(fields))
	}
}

// descriptors are the Unix expressions of the descriptors other than @every.
var descriptors = map[string]string{
	"@yearly":   "0 0 1 1 *",
	"@annually": "0 0 1 1 *",
	"@monthly":  "0 0 1 * *",
	"@weekly":   "0 0 * * 0",
	"@daily":    "0 0 * * *",
	"@midnight": "0 0 * * *",
	"@hourly":   "0 * * * *",
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
	if unix, ok := descriptors[expr]; ok {
		return parse(unix, loc)
	}
	if expr == "@reboot" {
		return nil, errors.New("@reboot is not supported: shardd fires by the clock")
	}
	return nil, fmt.Errorf("unknown descriptor %s (want @every <duration>, @hourly, @daily, @midnight, @weekly, @monthly, @yearly or @annually)", expr)
}

// wildcard reports whether a second, minute or hour field (robfig's
// syntax, its values 0-max) makes a schedule follow the clock: one of its
// terms is "*" or a step or range over the whole field, matching more
// than one value ("*", "*/15", "0/15", "0-59/15", "0-23"; not "5/15",
// "0-30/15" or "*/60").
func wildcard(field string, max int) bool {
	for _, term := range strings.Split(field, ",") {
		rng, step, hasStep := strings.Cut(term, "/")
		n := 1
		if hasStep {
			var err error
			if n, err = strconv.Atoi(step); err != nil || n < 1 {
				continue
			}
		}
		lo, hi := 0, max
		if rng != "*" && rng != "?" {
			a, b, isRange := strings.Cut(rng, "-")
			var err1, err2 error
			lo, err1 = strconv.Atoi(a)
			switch {
			case isRange:
				hi, err2 = strconv.Atoi(b)
			case !hasStep:
				hi = lo
			}
			if err1 != nil || err2 != nil {
				continue
			}
		}
		if lo == 0 && hi == max && n <= max {
			return true
		}
	}
	return false
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
	if w, ok := s.(Window); ok {
		s = w.S // the window's bounds do not renumber a day's fires
	}
	if e, ok := s.(Every); ok {
		return fire.Unix() / int64(time.Duration(e)/time.Second)
	}
	loc := fire.Location()
	if c, ok := s.(*cronSchedule); ok {
		loc = c.loc
	}
	if u, ok := s.(Union); ok && u.location() != nil {
		loc = u.location()
	}
	local := fire.In(loc)
	// The day starts at the first instant whose reading is its 00:00 or
	// later (where midnight is skipped, when the clocks jump).
	t := firstShowing(loc, time.Date(local.Year(), local.Month(), local.Day(), 0, 0, 0, 0, time.UTC)).Add(-time.Nanosecond)
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
