package schedule

import (
	"encoding/binary"
	"hash/fnv"
	"math/bits"
	"time"

	"github.com/robfig/cron/v3"
)

// Counting fires without enumerating them.
//
// A job down for a year with a schedule of every second has 31.5 million
// missed fires; the engine needs the latest of them and how many there were
// (docs/policies.md), not each one. Count and Latest give both in time that
// grows with the days of the span, not with its fires:
//
//   - @every: arithmetic on multiples of the interval.
//   - A cron expression (or a Union of them, a job's list of crons, all in
//     the job's zone): away from the zone's changes of offset, an instant
//     fires exactly when its reading matches the expression, so the fires of
//     a span are the matching readings of its reading span, counted per day
//     as the product of the matching seconds, minutes and hours (per day
//     class for a Union: which members match the day). Around each change of
//     offset, within its shift plus an hour on either side, where the rules
//     for skipped and repeated readings apply, the fires are enumerated with
//     Next, so that Count agrees with Next by construction.
//   - A Window: the count of its schedule in the span clipped to the window.
//   - Any other Schedule: enumeration.
//
// Latest searches with Next alone (doubling, then bisecting), so it takes
// the same rules everywhere: about a hundred calls of Next whatever the span.

// Count returns how many fires s has in (after, upTo].
func Count(s Schedule, after, upTo time.Time) int64 {
	if !upTo.After(after) {
		return 0
	}
	switch v := s.(type) {
	case Every:
		sec := int64(time.Duration(v) / time.Second)
		return floorDiv(upTo.Unix(), sec) - floorDiv(after.Unix(), sec)
	case *cronSchedule:
		return newCounter([]*cronSchedule{v}, v).count(after, upTo)
	case Union:
		if c := unionCounter(v); c != nil {
			return c.count(after, upTo)
		}
	case Window:
		a, b := v.clip(after, upTo)
		return Count(v.S, a, b)
	}
	return enumerate(s, after, upTo)
}

// Latest returns the latest fire of s in (after, upTo], or the zero time if
// there is none.
func Latest(s Schedule, after, upTo time.Time) time.Time {
	first := s.Next(after)
	if first.IsZero() || first.After(upTo) {
		return time.Time{}
	}
	if e, ok := s.(Every); ok {
		sec := int64(time.Duration(e) / time.Second)
		return time.Unix(floorDiv(upTo.Unix(), sec)*sec, 0).In(upTo.Location())
	}
	// lo has a fire in (lo, upTo]; hi has none in (hi, upTo]. The latest
	// fire is Next of the largest such lo.
	lo, hi := after, upTo
	for d := time.Second; ; d *= 2 {
		x := upTo.Add(-d)
		if !x.After(after) || d > 1<<60 {
			break
		}
		if n := s.Next(x); !n.IsZero() && !n.After(upTo) {
			lo = x
			break
		}
		hi = x
	}
	for hi.Sub(lo) > time.Nanosecond {
		mid := lo.Add(hi.Sub(lo) / 2)
		if n := s.Next(mid); !n.IsZero() && !n.After(upTo) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return s.Next(lo)
}

// enumerate counts the fires of s in (after, upTo] one by one.
func enumerate(s Schedule, after, upTo time.Time) int64 {
	var n int64
	for f := s.Next(after); !f.IsZero() && !f.After(upTo); f = s.Next(f) {
		n++
	}
	return n
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// counter counts the fires of cron members in one zone.
type counter struct {
	specs []*cron.SpecSchedule
	loc   *time.Location
	next  Schedule // the schedule whose fires these are, for the changes of offset
	full  map[uint64]int64
}

func newCounter(members []*cronSchedule, s Schedule) *counter {
	c := &counter{loc: members[0].loc, next: s, full: map[uint64]int64{}}
	for _, m := range members {
		c.specs = append(c.specs, m.match)
	}
	return c
}

// unionCounter returns a counter for u when its members are cron
// expressions in one zone (a job's list), else nil.
func unionCounter(u Union) *counter {
	if len(u) == 0 || len(u) > 64 {
		return nil
	}
	members := make([]*cronSchedule, 0, len(u))
	for _, s := range u {
		c, ok := s.(*cronSchedule)
		if !ok || (len(members) > 0 && c.loc != members[0].loc) {
			return nil
		}
		members = append(members, c)
	}
	return newCounter(members, u)
}

// margin is how far around a change of offset, beyond its shift, fires are
// enumerated rather than counted.
const margin = time.Hour

// count returns the fires in (a, b]: arithmetic on readings between the
// changes of offset, enumeration around them.
func (c *counter) count(a, b time.Time) int64 {
	type zone struct{ from, to time.Time }
	var zones []zone
	for p := periodAt(c.loc, a.Add(-lookback)); !p.end.IsZero() && p.end.Before(b.Add(lookback)); {
		q := p.next(c.loc)
		if shift := q.off - p.off; shift != 0 {
			shift = max(shift, -shift)
			z := zone{p.end.Add(-shift - margin), p.end.Add(shift + margin)}
			if n := len(zones); n > 0 && !z.from.After(zones[n-1].to) {
				zones[n-1].to = z.to
			} else {
				zones = append(zones, z)
			}
		}
		p = q
	}
	var n int64
	cur := a
	for _, z := range zones {
		if !z.to.After(cur) {
			continue
		}
		if z.from.After(cur) {
			end := minTime(z.from, b)
			n += c.readings(cur, end, periodAt(c.loc, end).off)
			cur = end
		}
		if !cur.Before(b) {
			return n
		}
		end := minTime(z.to, b)
		n += enumerate(c.next, cur, end)
		cur = end
		if !cur.Before(b) {
			return n
		}
	}
	if cur.Before(b) {
		n += c.readings(cur, b, periodAt(c.loc, b).off)
	}
	return n
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

const daySeconds = 24 * 60 * 60

// readings counts the matching readings in (a+off, b+off]: the fires of
// (a, b] where the zone's offset is off throughout.
func (c *counter) readings(a, b time.Time, off time.Duration) int64 {
	ra, rb := a.UTC().Add(off), b.UTC().Add(off)
	da, db := day(ra), day(rb)
	if da.Equal(db) {
		return c.inDay(c.dayMask(da), tod(ra), tod(rb))
	}
	n := c.inDay(c.dayMask(da), tod(ra), daySeconds-1)
	for d := da.AddDate(0, 0, 1); d.Before(db); d = d.AddDate(0, 0, 1) {
		mask := c.dayMask(d)
		if mask == 0 {
			continue
		}
		full, ok := c.full[mask]
		if !ok {
			full = c.inDay(mask, -1, daySeconds-1)
			c.full[mask] = full
		}
		n += full
	}
	return n + c.inDay(c.dayMask(db), -1, tod(rb))
}

// day is the date of reading r, as its midnight.
func day(r time.Time) time.Time {
	y, m, d := r.Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}

// tod is the whole seconds of r's time of day: a fire at a whole second T
// is after r exactly when T > tod(r), and at or before it when T <= tod(r).
func tod(r time.Time) int {
	h, m, s := r.Clock()
	return h*3600 + m*60 + s
}

const starBit = 1 << 63

// dayMask has a bit for each member whose month and day fields match the
// date d (robfig's rule: both day fields must match when either is a
// wildcard, else either).
func (c *counter) dayMask(d time.Time) uint64 {
	var mask uint64
	for i, s := range c.specs {
		if 1<<uint(d.Month())&s.Month == 0 {
			continue
		}
		dom := 1<<uint(d.Day())&s.Dom != 0
		dow := 1<<uint(d.Weekday())&s.Dow != 0
		if s.Dom&starBit != 0 || s.Dow&starBit != 0 {
			if dom && dow {
				mask |= 1 << i
			}
		} else if dom || dow {
			mask |= 1 << i
		}
	}
	return mask
}

// inDay counts the times of day T, whole seconds in (lo, hi], that a
// member in mask matches.
func (c *counter) inDay(mask uint64, lo, hi int) int64 {
	if mask == 0 || hi <= lo {
		return 0
	}
	var n int64
	for h := 0; h < 24; h++ {
		hs := h * 3600
		if hs+3599 <= lo || hs > hi {
			continue
		}
		for m := 0; m < 60; m++ {
			ms := hs + m*60
			if ms+59 <= lo || ms > hi {
				continue
			}
			var secs uint64
			for i, s := range c.specs {
				if mask&(1<<i) != 0 && s.Hour&(1<<uint(h)) != 0 && s.Minute&(1<<uint(m)) != 0 {
					secs |= s.Second
				}
			}
			secs &^= starBit
			if k := lo - ms; k >= 0 {
				secs &^= 1<<uint(k+1) - 1 // seconds 0..k are not after lo
			}
			if k := hi - ms; k < 59 {
				secs &= 1<<uint(k+1) - 1 // seconds above k are after hi
			}
			n += int64(bits.OnesCount64(secs))
		}
	}
	return n
}

// Window bounds a schedule to the instants from From to Until, both
// included (a zero bound: none): a job's activeFrom and activeUntil. The
// fires outside it do not exist.
type Window struct {
	S           Schedule
	From, Until time.Time
}

// Next returns the schedule's first fire strictly after t that lies in the
// window, or the zero time.
func (w Window) Next(t time.Time) time.Time {
	if !w.From.IsZero() && t.Before(w.From) {
		t = w.From.Add(-time.Nanosecond).In(t.Location())
	}
	n := w.S.Next(t)
	if n.IsZero() || (!w.Until.IsZero() && n.After(w.Until)) {
		return time.Time{}
	}
	return n
}

// clip narrows (a, b] to the window.
func (w Window) clip(a, b time.Time) (time.Time, time.Time) {
	if !w.From.IsZero() && a.Before(w.From) {
		a = w.From.Add(-time.Nanosecond)
	}
	if !w.Until.IsZero() && b.After(w.Until) {
		b = w.Until
	}
	return a, b
}

// JitterOffset is when, after fire, item's run of job starts under a jitter
// (docs/policies.md): a hash of the three in [0, jitter), whole
// milliseconds, the same on every instance, so that a run that moves to
// another instance keeps its time.
func JitterOffset(job string, item int, fire time.Time, jitter time.Duration) time.Duration {
	ms := uint64(jitter / time.Millisecond)
	if ms == 0 {
		return 0
	}
	h := fnv.New64a()
	var b [8]byte
	h.Write([]byte(job))
	binary.BigEndian.PutUint64(b[:], uint64(item))
	h.Write(b[:])
	binary.BigEndian.PutUint64(b[:], uint64(fire.Unix())) // whole seconds: the fires of cron and @every are
	h.Write(b[:])
	return time.Duration(h.Sum64()%ms) * time.Millisecond
}
