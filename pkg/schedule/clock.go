package schedule

import (
	"fmt"
	"time"

	"github.com/robfig/cron/v3"
)

// A reading is what a clock shows, a date and a time of day, held as a
// time.Time in UTC whose fields are the reading: readings compare and step
// like times, with no zone to move them. A zone shows reading r at instant
// r - offset, for the offsets it has at that instant.

// cronSchedule is a cron expression read in a time zone, with the package's
// rule for the readings a transition repeats or skips.
type cronSchedule struct {
	match  *cron.SpecSchedule // which readings match; its Location is UTC
	loc    *time.Location
	follow bool // a second, minute or hour field is a wildcard: the schedule follows the clock
}

func newCron(s cron.Schedule, loc *time.Location, follow bool) (Schedule, error) {
	spec, ok := s.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("unexpected schedule type %T", s)
	}
	spec.Location = time.UTC
	return &cronSchedule{match: spec, loc: loc, follow: follow}, nil
}

// lookback bounds how far back Next looks for readings the clocks showed
// before they went back: more than any change of offset.
const lookback = 48 * time.Hour

// maxPeriods bounds the offset periods one Next walks through.
const maxPeriods = 1000

// Next returns the first fire strictly after t, in t's location, or the
// zero time if there is none within five years (see the package doc for
// which instants fire around a transition).
func (s *cronSchedule) Next(t time.Time) time.Time {
	p := periodAt(s.loc, t)
	after := p.reading(t)
	if s.follow {
		// The first instant after t whose reading matches.
		for range maxPeriods {
			r := s.match.Next(after)
			if r.IsZero() {
				return time.Time{}
			}
			if p.shows(r) {
				return p.instant(r).In(t.Location())
			}
			p = p.next(s.loc)
			after = p.reading(p.start).Add(-time.Nanosecond)
		}
		return time.Time{}
	}
	// A reading the clocks have shown before t, in a period before the
	// clocks went back, is not due again.
	for q := p; !q.start.IsZero() && t.Sub(q.start) < lookback; {
		prev := periodAt(s.loc, q.start.Add(-time.Nanosecond))
		if r := prev.reading(q.start).Add(-time.Nanosecond); r.After(after) {
			after = r
		}
		q = prev
	}
	r := s.match.Next(after)
	if r.IsZero() {
		return time.Time{}
	}
	// The first instant after t whose reading is r or later: r's own,
	// or the jump over it.
	for range maxPeriods {
		if p.shows(r) {
			return p.instant(r).In(t.Location())
		}
		p = p.next(s.loc)
		if !p.reading(p.start).Before(r) {
			return p.start.In(t.Location())
		}
	}
	return time.Time{}
}

// period is a span of instants [start, end) in which a zone's offset does
// not change. start is zero if it has no beginning, end if it has no end.
type period struct {
	start, end time.Time
	off        time.Duration
	name       string
}

// periodAt returns the period of loc that holds t. Its bounds are Go's
// (time.Time.ZoneBounds): exact at a change of offset; past a zone's last
// listed transition, where Go computes them from the zone's rule, they may
// also be the start and end of a year, with the same offset on both sides.
func periodAt(loc *time.Location, t time.Time) period {
	l := t.In(loc)
	name, off := l.Zone()
	start, end := l.ZoneBounds()
	if !end.IsZero() && !end.After(t) {
		// Go ends such a year 365 days after its start, even in a leap
		// year: on its last day, the bound is already past. The offset
		// goes on into the next year, to its period's end.
		_, end = end.Add(24 * time.Hour).In(loc).ZoneBounds()
	}
	return period{start: start, end: end, off: time.Duration(off) * time.Second, name: name}
}

// next returns the period that follows p, from p's end: where Go's bounds
// overlap (see periodAt), from the first instant p does not hold.
func (p period) next(loc *time.Location) period {
	n := periodAt(loc, p.end)
	n.start = p.end
	return n
}

// reading is what the clock shows at t, an instant of p.
func (p period) reading(t time.Time) time.Time { return t.UTC().Add(p.off) }

// instant is when p shows reading r.
func (p period) instant(r time.Time) time.Time { return r.Add(-p.off) }

// shows reports whether p shows reading r before it ends; callers know
// that r is not before p's first reading (or the one they start from).
func (p period) shows(r time.Time) bool {
	return p.end.IsZero() || r.Before(p.reading(p.end))
}

// firstShowing returns the first instant at which loc's clocks show
// reading r or a later one: r's first instant, or the instant they jump
// over it.
func firstShowing(loc *time.Location, r time.Time) time.Time {
	// Every instant showing r lies within a day of r read as UTC.
	t := r.Add(-lookback)
	p := periodAt(loc, t)
	if p.reading(t).After(r) {
		return t // not reached: no offset is two days
	}
	for range maxPeriods {
		if p.shows(r) {
			return p.instant(r).In(loc)
		}
		p = p.next(loc)
		if !p.reading(p.start).Before(r) {
			return p.start.In(loc)
		}
	}
	return time.Time{}
}

// Instants returns the instants at which loc's clocks show the reading of
// wall (its date and time of day; its own location is ignored), earliest
// first: one; two where the clocks go back over it; none where they jump
// over it (then jump is the instant they do, when a fixed-time schedule
// fires for it; else jump is zero).
func Instants(loc *time.Location, wall time.Time) (at []time.Time, jump time.Time) {
	if loc == nil {
		loc = time.UTC
	}
	r := time.Date(wall.Year(), wall.Month(), wall.Day(), wall.Hour(), wall.Minute(), wall.Second(), wall.Nanosecond(), time.UTC)
	for p := periodAt(loc, r.Add(-lookback)); ; p = p.next(loc) {
		if u := p.instant(r); !u.Before(p.start) && (p.end.IsZero() || u.Before(p.end)) {
			at = append(at, u.In(loc))
		}
		if p.end.IsZero() || p.end.After(r.Add(lookback)) {
			break
		}
	}
	if len(at) == 0 {
		jump = firstShowing(loc, r)
	}
	return at, jump
}

// FollowsTheClock reports whether s fires at the readings of the clock as
// it is (a wildcard second, minute or hour field, or an @every interval):
// then a time the clocks skip has no fire of its own, and one they show
// twice fires twice. A fixed-time schedule fires a skipped time when the
// clocks jump, and a doubled one the first time only.
func FollowsTheClock(s Schedule) bool {
	switch c := s.(type) {
	case *cronSchedule:
		return c.follow
	case Every:
		return true
	case Window:
		return FollowsTheClock(c.S)
	case Union:
		for _, m := range c {
			if !FollowsTheClock(m) {
				return false
			}
		}
		return len(c) > 0
	}
	return false
}
