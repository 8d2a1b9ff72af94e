package schedule

import (
	"fmt"
	"strings"
	"time"
)

// A Change is a change of the UTC offset of a schedule's time zone (a
// daylight-saving transition) that skips or repeats readings the schedule
// matches, with the fires it leaves for them.
type Change struct {
	// At is the instant of the change, in the zone: the first instant with
	// the new offset.
	At time.Time
	// Before is At read with the old offset: the reading from which the
	// clocks jump or go back (02:00 CET for a jump to 03:00 CEST).
	Before time.Time
	// Forward: the clocks jump forward over readings; else they go back
	// and show readings a second time.
	Forward bool
	// Readings are the readings of the schedule that the change skips or
	// repeats, earliest first, as UTC times whose fields are the reading
	// (at most maxReadings; More counts the others).
	Readings []time.Time
	More     int
	// Fires are the schedule's fires for those readings, in the zone, as
	// Next gives them: for a jump, the instant of the jump for a fixed-time
	// schedule, none for one that follows the clock; for a step back, the
	// first instant of each reading, and also the second where the
	// schedule follows the clock.
	Fires []time.Time
	// Follows: the schedule follows the clock (see the package doc).
	Follows bool
}

// maxReadings bounds a Change's Readings, maxFires the fires its String
// lists.
const (
	maxReadings = 3
	maxFires    = 6
)

// Changes returns the changes of offset in (from, to] that skip or repeat
// a reading of s, earliest first. A schedule that is not a cron
// expression (@every) has none.
func Changes(s Schedule, from, to time.Time) []Change {
	if u, ok := s.(Union); ok {
		return u.changes(from, to)
	}
	if w, ok := s.(Window); ok {
		return Changes(w.S, from, to)
	}
	c, ok := s.(*cronSchedule)
	if !ok {
		return nil
	}
	var out []Change
	p := periodAt(c.loc, from)
	for range maxPeriods {
		if p.end.IsZero() || p.end.After(to) {
			break
		}
		next := p.next(c.loc)
		if ch, ok := c.change(p, next); ok {
			out = append(out, ch)
		}
		p = next
	}
	return out
}

// change describes the change from period p to next, if it skips or
// repeats a reading of c.
func (c *cronSchedule) change(p, next period) (Change, bool) {
	at := next.start
	shift := next.off - p.off
	ch := Change{At: at.In(c.loc), Before: at.In(time.FixedZone(p.name, int(p.off/time.Second))), Forward: shift > 0, Follows: c.follow}
	// The readings skipped, [at+old, at+new), or repeated, [at+new, at+old).
	lo, hi := p.reading(at), next.reading(at)
	if shift < 0 {
		lo, hi = hi, lo
	}
	n := 0
	for r := c.match.Next(lo.Add(-time.Nanosecond)); !r.IsZero() && r.Before(hi); r = c.match.Next(r) {
		if n++; n <= maxReadings {
			ch.Readings = append(ch.Readings, r)
		} else if n > 100000 {
			break
		}
	}
	if n == 0 {
		return Change{}, false
	}
	ch.More = n - len(ch.Readings)
	// The fires for them, as Next gives them: at the jump, or at the
	// instants showing the repeated readings.
	switch {
	case shift > 0 && !c.follow:
		if f := c.Next(at.Add(-time.Nanosecond)); f.Equal(at) {
			ch.Fires = []time.Time{f.In(c.loc)}
		}
	case shift < 0:
		for f := c.Next(at.Add(shift - time.Nanosecond)); !f.IsZero() && f.Before(at.Add(-shift)); f = c.Next(f) {
			ch.Fires = append(ch.Fires, f.In(c.loc))
		}
	}
	return ch, true
}

// String says what the change does to the schedule's fires, e.g.
// "clocks go back Sun 2026-10-25 03:00 CEST -> 02:00 CET: 02:15:00 comes
// twice; fires the first time only: 02:15:00 CEST; the second (CET) is skipped".
func (c Change) String() string {
	var b strings.Builder
	verb := "go back"
	if c.Forward {
		verb = "jump"
	}
	fmt.Fprintf(&b, "clocks %s %s -> %s: ", verb, c.Before.Format("Mon 2006-01-02 15:04 MST"), c.At.Format("15:04 MST"))
	readings := make([]string, len(c.Readings))
	for i, r := range c.Readings {
		readings[i] = r.Format("15:04:05")
	}
	b.WriteString(strings.Join(readings, ", "))
	if c.More > 0 {
		fmt.Fprintf(&b, " and %d more", c.More)
	}
	one := len(c.Readings) == 1 && c.More == 0
	var fires []string
	for _, f := range c.Fires {
		if len(fires) == maxFires {
			break
		}
		if f.Format(time.DateOnly) != c.Before.Format(time.DateOnly) {
			fires = append(fires, f.Format("Mon 15:04:05 MST"))
		} else {
			fires = append(fires, f.Format("15:04:05 MST"))
		}
	}
	list := strings.Join(fires, ", ")
	if more := len(c.Fires) - len(fires); more > 0 {
		list += fmt.Sprintf(" and %d more", more)
	}
	switch {
	case c.Forward && c.Follows:
		b.WriteString(pick(one, " does not exist; no fire for it", " do not exist; no fire for them"))
		b.WriteString(" (the schedule follows the clock)")
	case c.Forward:
		b.WriteString(pick(one, " does not exist; fires when the clocks jump: ", " do not exist; fire once when the clocks jump: "))
		b.WriteString(list)
	case c.Follows:
		b.WriteString(pick(one, " comes twice; fires both times: ", " come twice; fire both times: "))
		b.WriteString(list)
	default:
		b.WriteString(pick(one, " comes twice; fires the first time only: ", " come twice; fire the first time only: "))
		b.WriteString(list)
		fmt.Fprintf(&b, "; the second (%s) is skipped", c.At.Format("MST"))
	}
	return b.String()
}

func pick(one bool, singular, plural string) string {
	if one {
		return singular
	}
	return plural
}
