package schedule

import (
	"slices"
	"time"
)

// Union is several schedules as one (a job's list of crons, docs/policies.md):
// its fires are every member's, and a time two members produce is one fire.
type Union []Schedule

// Next returns the earliest of the members' next fires strictly after t,
// or the zero time if none has one.
func (u Union) Next(t time.Time) time.Time {
	var best time.Time
	for _, s := range u {
		if n := s.Next(t); !n.IsZero() && (best.IsZero() || n.Before(best)) {
			best = n
		}
	}
	return best
}

// location is the zone the members' readings are in (the first cron
// member's), for Seq's days; nil when no member has one.
func (u Union) location() *time.Location {
	for _, s := range u {
		if c, ok := s.(*cronSchedule); ok {
			return c.loc
		}
	}
	return nil
}

// changes lists the members' changes of offset that skip or repeat one
// of their readings, earliest first: one change of the clocks that touches
// two members is listed for each, with that member's readings and fires.
func (u Union) changes(from, to time.Time) []Change {
	var out []Change
	for _, s := range u {
		out = append(out, Changes(s, from, to)...)
	}
	slices.SortStableFunc(out, func(a, b Change) int { return a.At.Compare(b.At) })
	return out
}
