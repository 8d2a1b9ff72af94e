package schedule

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// from is a Thursday.
var from = time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)

func nexts(s Schedule, t time.Time, n int) []time.Time {
	var out []time.Time
	for i := 0; i < n; i++ {
		t = s.Next(t)
		out = append(out, t)
	}
	return out
}

func TestParse(t *testing.T) {
	shanghai, err := time.LoadLocation("Asia/Shanghai")
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		expr string
		loc  *time.Location
		want []string // the first fires after `from`
	}{
		// Quartz, as ElasticJob and XXL-JOB users write it.
		{"0/5 * * * * ?", nil, []string{"2026-01-01T10:00:05Z", "2026-01-01T10:00:10Z"}},
		{"0 0 2 * * ?", nil, []string{"2026-01-02T02:00:00Z", "2026-01-03T02:00:00Z"}},
		{"0 0 2 * * ? *", nil, []string{"2026-01-02T02:00:00Z"}},
		{"0 30 9 ? * MON-FRI", nil, []string{"2026-01-02T09:30:00Z", "2026-01-05T09:30:00Z"}},
		// Quartz day-of-week numbers: 2 = MON, 6 = FRI, 1 = SUN.
		{"0 0 2 ? * 2", nil, []string{"2026-01-05T02:00:00Z"}},
		{"0 0 2 ? * 2-6", nil, []string{"2026-01-02T02:00:00Z", "2026-01-05T02:00:00Z"}},
		{"0 0 2 ? * 1,7", nil, []string{"2026-01-03T02:00:00Z", "2026-01-04T02:00:00Z"}},
		{"0 0 2 ? * 1/3", nil, []string{"2026-01-03T02:00:00Z", "2026-01-04T02:00:00Z", "2026-01-07T02:00:00Z"}}, // SUN, WED, SAT
		{"0 0 0 1 * ?", nil, []string{"2026-02-01T00:00:00Z"}},
		{"0 0 2 * * ?", shanghai, []string{"2026-01-01T18:00:00Z"}},
		// Unix, 5 fields: 1 = MON.
		{"*/15 * * * *", nil, []string{"2026-01-01T10:15:00Z", "2026-01-01T10:30:00Z"}},
		{"0 2 * * 1", nil, []string{"2026-01-05T02:00:00Z"}},
		// Descriptors.
		{"@every 30s", nil, []string{"2026-01-01T10:00:30Z", "2026-01-01T10:01:00Z"}},
		{"@every 7s", nil, []string{"2026-01-01T10:00:01Z", "2026-01-01T10:00:08Z"}}, // 1767261601 = 7 * 252465943
		{"@hourly", nil, []string{"2026-01-01T11:00:00Z"}},
		{"@daily", shanghai, []string{"2026-01-01T16:00:00Z"}},
	}
	for _, tt := range tests {
		s, err := Parse(tt.expr, tt.loc)
		if err != nil {
			t.Errorf("Parse(%q): %v", tt.expr, err)
			continue
		}
		got := nexts(s, from, len(tt.want))
		for i, w := range tt.want {
			if !got[i].Equal(at(w)) {
				t.Errorf("Parse(%q) fire %d = %s, want %s", tt.expr, i, got[i].UTC().Format(time.RFC3339), w)
			}
		}
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct{ expr, want string }{
		{"", "empty"},
		{"* * *", "3 fields"},
		{"0 0 0 L * ?", "L (last day) and W (nearest weekday) are Quartz features"},
		{"0 0 0 15W * ?", "L (last day) and W (nearest weekday)"},
		{"0 0 0 LW * ?", "L (last day)"},
		{"0 0 0 ? * 6L", "L (last weekday of the month)"},
		{"0 0 0 ? * FRIL", "L (last weekday of the month)"},
		{"0 0 0 ? * 6#3", "# (nth weekday of the month)"},
		{"0 0 0 * * ? 2027", "a concrete year"},
		{"0 0 0 1 * MON", "both given"},
		{"0 0 0 ? * 0", "Quartz numbers days 1-7"},
		{"0 0 0 ? * 8", "Quartz numbers days 1-7"},
		{"0 0 2 ? * 1?", "? must stand alone"},
		{"60 * * * * ?", `second "60": 60 is above the maximum 59`},
		{"0 0 25 * * ?", `hour "25": 25 is above the maximum 23`},
		{"0 0 1-25 * * ?", `hour "1-25": 25 is above the maximum 23`},
		{"0 0 0 0 * ?", `day-of-month "0": 0 is below the minimum 1`},
		{"0 0 0 ? 13 *", `month "13": 13 is above the maximum 12`},
		{"0 0 0 ? x *", `month "x": "x" is not a number or a name`},
		{"0 25 * * *", `hour "25": 25 is above the maximum 23`},
		{"*/0 * * * *", `minute "*/0"`},
		{"0 0 0 30 2 ?", "never fires"},
		{"0 0 L * *", "Quartz features"},
		{"@every 1.5s", "whole number of seconds"},
		{"@every 500ms", "whole number of seconds"},
		{"@every soon", "needs a duration"},
		{"@reboot", "not supported"},
		{"@fortnightly", "unknown descriptor"},
		{"CRON_TZ=UTC 0 * * * *", "set the job's timeZone"},
	}
	for _, tt := range tests {
		_, err := Parse(tt.expr, nil)
		if err == nil {
			t.Errorf("Parse(%q) succeeded, want error containing %q", tt.expr, tt.want)
			continue
		}
		if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) error = %q, want it to contain %q", tt.expr, err, tt.want)
		}
	}
}

func TestEveryAlignsToEpoch(t *testing.T) {
	s := Every(10 * time.Second)
	for _, tt := range []struct{ in, want int64 }{{0, 10}, {9, 10}, {10, 20}, {-1, 0}, {-10, 0}, {-11, -10}} {
		if got := s.Next(time.Unix(tt.in, 0)).Unix(); got != tt.want {
			t.Errorf("Next(%d) = %d, want %d", tt.in, got, tt.want)
		}
	}
	if got := s.Next(time.Unix(9, 999_999_999)).Unix(); got != 10 {
		t.Errorf("Next(9.999999999) = %d, want 10", got)
	}
}

func TestSeqIsConsecutive(t *testing.T) {
	for _, expr := range []string{"0/5 * * * * ?", "0 */7 * * * ?", "@every 45s", "0 0 * * * ?"} {
		s, err := Parse(expr, nil)
		if err != nil {
			t.Fatal(err)
		}
		fire := s.Next(from)
		prev := Seq(s, fire)
		for i := 0; i < 50; i++ {
			next := s.Next(fire)
			seq := Seq(s, next)
			if seq != prev+1 && next.YearDay() == fire.YearDay() {
				t.Fatalf("%s: Seq(%s) = %d after Seq(%s) = %d", expr, next, seq, fire, prev)
			}
			fire, prev = next, seq
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, seed := range []string{"0/5 * * * * ?", "0 0 2 ? * 2-6", "@every 30s", "*/15 * * * *", "0 0 0 L * ?", "0 0 0 ? * 6#3"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		s, err := Parse(expr, nil)
		if err != nil {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("Parse(%q) error %v does not wrap ErrSyntax", expr, err)
			}
			return
		}
		// A parsed schedule must move forward.
		next := s.Next(from)
		if !next.IsZero() && !next.After(from) {
			t.Fatalf("Parse(%q).Next(%s) = %s, not after", expr, from, next)
		}
	})
}

// FuzzNext checks what every caller that enumerates fires relies on, in
// zones with 1-hour, 30-minute, 2-hour and midnight transitions: fires
// strictly increase, each within five years of the one before, each is
// found again from just before it, and each shows a matching reading or,
// for a fixed-time schedule, is the jump over one.
func FuzzNext(f *testing.F) {
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "Asia/Beirut", "Pacific/Chatham", "Antarctica/Troll"}
	locs := make([]*time.Location, len(zones))
	for i, z := range zones {
		loc, err := time.LoadLocation(z)
		if err != nil {
			f.Fatal(err)
		}
		locs[i] = loc
	}
	berlinFallBack := time.Date(2026, 10, 24, 22, 0, 0, 0, time.UTC).Unix()
	for _, seed := range []struct {
		expr string
		zone uint8
		t    int64
	}{
		{"0 15 2 * * ?", 1, berlinFallBack}, {"0 0 * * * ?", 1, berlinFallBack}, {"0 0/30 1 7 11 ?", 2, time.Date(2027, 11, 6, 0, 0, 0, 0, time.UTC).Unix()},
		{"0 0 2 * * ?", 3, time.Date(2026, 4, 4, 0, 0, 0, 0, time.UTC).Unix()}, {"0 0 0 * * ?", 4, time.Date(2026, 9, 5, 0, 0, 0, 0, time.UTC).Unix()},
		{"0 15 2 28 3 ?", 1, time.Date(2026, 3, 29, 0, 0, 0, 0, time.UTC).Unix()}, {"*/7 * * * * ?", 6, 0}, {"0 30 1 * * ?", 7, time.Date(2026, 3, 28, 0, 0, 0, 0, time.UTC).Unix()},
		{"0 0 0 29 2 ?", 5, 0}, {"@every 90s", 1, berlinFallBack},
	} {
		f.Add(seed.expr, seed.zone, seed.t)
	}
	const span = 100 * 366 * 24 * 3600 // starts from 2026 to about 2126
	f.Fuzz(func(t *testing.T, expr string, zone uint8, start int64) {
		loc := locs[int(zone)%len(locs)]
		s, err := Parse(expr, loc)
		if err != nil {
			return
		}
		prev := time.Unix(from.Unix()+(start%span+span)%span, 0)
		for range 20 {
			fire := s.Next(prev)
			if fire.IsZero() {
				return
			}
			if !fire.After(prev) || fire.Sub(prev) > 5*366*24*time.Hour+48*time.Hour {
				t.Fatalf("%q in %s: Next(%s) = %s", expr, loc, prev.Format(time.RFC3339), fire.Format(time.RFC3339))
			}
			if again := s.Next(fire.Add(-time.Nanosecond)); !again.Equal(fire) {
				t.Fatalf("%q in %s: fire %s, but Next of just before it is %s", expr, loc, fire.Format(time.RFC3339), again.Format(time.RFC3339))
			}
			if c, ok := s.(*cronSchedule); ok && !c.matches(fire) && (c.follow || !c.jumpsOverMatch(fire)) {
				t.Fatalf("%q in %s: fire %s matches no reading", expr, loc, fire.In(loc).Format(time.RFC3339))
			}
			prev = fire
		}
	})
}

// matches reports whether the reading at fire matches c.
func (c *cronSchedule) matches(fire time.Time) bool {
	r := periodAt(c.loc, fire).reading(fire)
	return c.match.Next(r.Add(-time.Nanosecond)).Equal(r)
}

// jumpsOverMatch reports whether the clocks jump at fire over a reading
// that matches c.
func (c *cronSchedule) jumpsOverMatch(fire time.Time) bool {
	before, after := periodAt(c.loc, fire.Add(-time.Nanosecond)), periodAt(c.loc, fire)
	lo, hi := before.reading(fire), after.reading(fire)
	r := c.match.Next(lo.Add(-time.Nanosecond))
	return !r.IsZero() && r.Before(hi)
}

func TestFollowsTheClockOfParsedSchedules(t *testing.T) {
	for expr, want := range map[string]bool{
		"0 0 * * * ?":    true, // hourly
		"0 0/30 * * * ?": true,
		"@every 10s":     true,
		"0 15 2 * * ?":   false, // daily at a fixed time
		"0 0,30 1 * * ?": false,
	} {
		s, err := Parse(expr, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := FollowsTheClock(s); got != want {
			t.Errorf("FollowsTheClock(%q) = %v, want %v", expr, got, want)
		}
	}
}
