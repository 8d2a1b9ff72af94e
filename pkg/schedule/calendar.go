package schedule

import (
	"time"
)

// A Calendar is a set of days excluded from a job's schedule (Quartz's
// calendars; a job's excludeCalendars): listed dates, inclusive ranges of
// dates, and days of the week, all read in the calendar's zone. A fire is
// excluded when the day its instant shows in that zone is one of them. An
// excluded fire is still due: the engine records it skipped, reason
// calendar, so that history says why nothing ran that day.
//
// The spans are counted from each day's first instant to the next day's.
// Where a zone's clocks went back over midnight (America/Goose_Bay and
// America/Moncton, 1990-2010: 00:01 back to 23:01), the day before shows a
// second time after the new day began; Excludes judges each instant by
// the day it shows, the counts by day starts, so the counts of such a
// night can be off by the fires of that hour. No zone does this today.
type Calendar struct {
	Name string
	Loc  *time.Location
	// Ranges are inclusive ranges of dates, each a date's midnight in UTC
	// (a civil date, whatever the zone).
	Ranges []DateRange
	// Weekdays has bit 1<<time.Weekday set for each excluded day of the week.
	Weekdays uint8
}

// DateRange is the civil dates From to To, both included.
type DateRange struct{ From, To time.Time }

// DayStart is the first instant of the civil date y-m-d in loc: the first
// that shows its 00:00 or a later reading (where the clocks jump over
// midnight, as in America/Santiago, the instant they jump).
func DayStart(loc *time.Location, y int, m time.Month, d int) time.Time {
	return firstShowing(loc, Date(y, m, d))
}

// Date returns the civil date y-m-d as a DateRange bound.
func Date(y int, m time.Month, d int) time.Time { return time.Date(y, m, d, 0, 0, 0, 0, time.UTC) }

// excludesDate reports whether c excludes the civil date d (a midnight in UTC).
func (c *Calendar) excludesDate(d time.Time) bool {
	if c.Weekdays&(1<<uint(d.Weekday())) != 0 {
		return true
	}
	for _, r := range c.Ranges {
		if !d.Before(r.From) && !d.After(r.To) {
			return true
		}
	}
	return false
}

// dateOf is the civil date t shows in c's zone.
func (c *Calendar) dateOf(t time.Time) time.Time {
	y, m, d := t.In(c.Loc).Date()
	return Date(y, m, d)
}

// dayStart is the first instant of civil date d in c's zone: the first one
// that shows its 00:00 or a later reading (where the clocks jump over
// midnight).
func (c *Calendar) dayStart(d time.Time) time.Time { return firstShowing(c.Loc, d) }

// Exclusion is a job's calendars together: an instant is excluded when any
// of them excludes it.
type Exclusion []*Calendar

// Excludes reports whether t falls on a day one of the calendars excludes.
func (x Exclusion) Excludes(t time.Time) bool {
	for _, c := range x {
		if c.excludesDate(c.dateOf(t)) {
			return true
		}
	}
	return false
}

// ExcludedBy names the first calendar that excludes t, or "".
func (x Exclusion) ExcludedBy(t time.Time) string {
	for _, c := range x {
		if c.excludesDate(c.dateOf(t)) {
			return c.Name
		}
	}
	return ""
}

// maxSpanDays bounds how many days one search for an excluded span walks:
// more than a century. A calendar that excludes every day of the week
// makes one span of that length.
const maxSpanDays = 40000

// spanStart returns the first instant of the excluded span that holds t
// (an excluded instant), or floor if the span began before it.
func (x Exclusion) spanStart(t, floor time.Time) time.Time {
	start := t
	for range maxSpanDays {
		for _, c := range x {
			d := c.dateOf(start)
			if !c.excludesDate(d) {
				continue
			}
			for n := 0; n < maxSpanDays && c.excludesDate(d.AddDate(0, 0, -1)) && c.dayStart(d).After(floor); n++ {
				d = d.AddDate(0, 0, -1)
			}
			if s := c.dayStart(d); s.Before(start) {
				start = s
			}
		}
		if !start.After(floor) {
			return floor
		}
		prev := start.Add(-time.Nanosecond)
		if !x.Excludes(prev) {
			return start
		}
		start = prev // another calendar's span ends where this one begins
	}
	return start
}

// spanEnd returns the first instant after the excluded span that holds t
// (an excluded instant), not later than ceil.
func (x Exclusion) spanEnd(t, ceil time.Time) time.Time {
	end := t
	for range maxSpanDays {
		if !x.Excludes(end) || !end.Before(ceil) {
			break
		}
		for _, c := range x {
			d := c.dateOf(end)
			if !c.excludesDate(d) {
				continue
			}
			for c.excludesDate(d.AddDate(0, 0, 1)) && c.dayStart(d.AddDate(0, 0, 1)).Before(ceil) {
				d = d.AddDate(0, 0, 1)
			}
			if e := c.dayStart(d.AddDate(0, 0, 1)); e.After(end) {
				end = e
			}
		}
	}
	if end.After(ceil) {
		return ceil
	}
	return end
}

// nextExcluded returns the first excluded instant in (after, upTo], or the
// zero time.
func (x Exclusion) nextExcluded(after, upTo time.Time) time.Time {
	first := after.Add(time.Nanosecond)
	if x.Excludes(first) {
		return first
	}
	var best time.Time
	for _, c := range x {
		d := c.dateOf(first)
		for range maxSpanDays {
			d = d.AddDate(0, 0, 1)
			s := c.dayStart(d)
			if s.After(upTo) || (!best.IsZero() && !s.Before(best)) {
				break
			}
			if c.excludesDate(d) {
				best = s
				break
			}
		}
	}
	return best
}

// CountExcluded returns how many fires of s in (after, upTo] the calendars
// exclude, counting each excluded span's fires (Count), not each fire.
func (x Exclusion) CountExcluded(s Schedule, after, upTo time.Time) int64 {
	var n int64
	for t := after; len(x) > 0 && t.Before(upTo); {
		start := x.nextExcluded(t, upTo)
		if start.IsZero() {
			break
		}
		end := x.spanEnd(start, upTo.Add(time.Nanosecond))
		// The span is [start, end): the fires in (start-1ns, end-1ns].
		n += Count(s, start.Add(-time.Nanosecond), end.Add(-time.Nanosecond))
		t = end.Add(-time.Nanosecond)
	}
	return n
}

// LatestIncluded returns the latest fire of s in (after, upTo] that no
// calendar excludes, or the zero time: it steps back over excluded spans,
// not over fires.
func (x Exclusion) LatestIncluded(s Schedule, after, upTo time.Time) time.Time {
	for hi := upTo; hi.After(after); {
		f := Latest(s, after, hi)
		if f.IsZero() || !x.Excludes(f) {
			return f
		}
		hi = x.spanStart(f, after).Add(-time.Nanosecond)
	}
	return time.Time{}
}

// NextIncluded returns the first fire of s in (after, upTo] that no
// calendar excludes, or the zero time, stepping over excluded spans.
func (x Exclusion) NextIncluded(s Schedule, after, upTo time.Time) time.Time {
	for t := after; ; {
		f := s.Next(t)
		if f.IsZero() || f.After(upTo) {
			return time.Time{}
		}
		if !x.Excludes(f) {
			return f
		}
		t = x.spanEnd(f, upTo.Add(time.Nanosecond)).Add(-time.Nanosecond)
		if !t.After(f) {
			t = f
		}
	}
}

// CountIncluded returns how many fires of s in (after, upTo] no calendar
// excludes.
func (x Exclusion) CountIncluded(s Schedule, after, upTo time.Time) int64 {
	return Count(s, after, upTo) - x.CountExcluded(s, after, upTo)
}

// NthIncluded returns the k-th fire (k >= 1) of s after after that no
// calendar excludes, if it is at or before upTo: found by bisecting on
// CountIncluded, not by walking the fires before it.
func (x Exclusion) NthIncluded(s Schedule, after, upTo time.Time, k int64) time.Time {
	if k < 1 || x.CountIncluded(s, after, upTo) < k {
		return time.Time{}
	}
	lo, hi := after, upTo // CountIncluded(lo) < k <= CountIncluded(hi)
	for hi.Sub(lo) > time.Nanosecond {
		mid := lo.Add(hi.Sub(lo) / 2)
		if x.CountIncluded(s, after, mid) >= k {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}
