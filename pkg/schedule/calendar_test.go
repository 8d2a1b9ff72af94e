package schedule

import (
	"testing"
	"time"
)

func testCalendars(t testing.TB) Exclusion {
	t.Helper()
	shanghai, _ := time.LoadLocation("Asia/Shanghai")
	berlin, _ := time.LoadLocation("Europe/Berlin")
	return Exclusion{
		{Name: "holidays-cn", Loc: shanghai, Ranges: []DateRange{{Date(2027, 1, 1), Date(2027, 1, 1)}, {Date(2027, 2, 10), Date(2027, 2, 17)}}},
		{Name: "weekends-de", Loc: berlin, Weekdays: 1<<time.Saturday | 1<<time.Sunday},
		{Name: "dst-night", Loc: berlin, Ranges: []DateRange{{Date(2027, 3, 28), Date(2027, 3, 28)}}},
	}
}

// CountExcluded and LatestIncluded agree with asking Excludes of each fire.
func TestExclusionAgreesWithEachFire(t *testing.T) {
	t.Parallel()
	x := testCalendars(t)
	starts := []time.Time{
		time.Date(2026, 12, 30, 17, 0, 0, 0, time.UTC),
		time.Date(2027, 2, 9, 15, 59, 59, 999999999, time.UTC),
		time.Date(2027, 3, 26, 0, 0, 0, 0, time.UTC),
	}
	spans := []time.Duration{time.Hour, 30 * time.Hour, 10 * 24 * time.Hour, 60 * 24 * time.Hour}
	for _, c := range countCases {
		s := parseCase(t, c.expr, c.zone)
		for _, from := range starts {
			for _, span := range spans {
				to := from.Add(span)
				var want int64
				var last time.Time
				for f := s.Next(from); !f.IsZero() && !f.After(to); f = s.Next(f) {
					if x.Excludes(f) {
						want++
					} else {
						last = f
					}
				}
				if got := x.CountExcluded(s, from, to); got != want {
					t.Errorf("%s in %s from %s +%s: CountExcluded = %d, each fire says %d", c.expr, c.zone, from.Format(time.RFC3339Nano), span, got, want)
				}
				if got := x.LatestIncluded(s, from, to); !got.Equal(last) {
					t.Errorf("%s in %s from %s +%s: LatestIncluded = %s, each fire says %s", c.expr, c.zone, from.Format(time.RFC3339Nano), span, got, last)
				}
			}
		}
	}
}

func TestExcludes(t *testing.T) {
	t.Parallel()
	x := testCalendars(t)
	tests := []struct {
		at   time.Time
		want bool
	}{
		{time.Date(2026, 12, 31, 15, 59, 59, 0, time.UTC), false}, // 23:59:59 in Shanghai, a Thursday
		{time.Date(2026, 12, 31, 16, 0, 0, 0, time.UTC), true},    // 1 January 00:00 in Shanghai
		{time.Date(2027, 1, 1, 16, 0, 0, 0, time.UTC), false},     // 2 January 00:00 in Shanghai (not listed), Friday 17:00 in Berlin
		{time.Date(2027, 1, 1, 22, 59, 0, 0, time.UTC), false},    // Friday 23:59 in Berlin, Saturday 06:59 in Shanghai (not listed)
		{time.Date(2027, 1, 1, 23, 0, 0, 0, time.UTC), true},      // Saturday 00:00 in Berlin
	}
	for _, tt := range tests {
		if got := x.Excludes(tt.at); got != tt.want {
			t.Errorf("Excludes(%s) = %v, want %v", tt.at, got, tt.want)
		}
	}
	// A calendar of every day: one span, nothing included, all counted.
	all := Exclusion{{Name: "all", Loc: time.UTC, Weekdays: 0x7f}}
	hourly, _ := Parse("0 0 * * * ?", time.UTC)
	from := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	if n := all.CountExcluded(hourly, from, from.AddDate(1, 0, 0)); n != 365*24 {
		t.Fatalf("every day excluded: %d fires excluded in a year, want %d", n, 365*24)
	}
	if f := all.LatestIncluded(hourly, from, from.AddDate(1, 0, 0)); !f.IsZero() {
		t.Fatalf("every day excluded: LatestIncluded = %s, want none", f)
	}
}

func TestNextAndNthIncluded(t *testing.T) {
	t.Parallel()
	x := testCalendars(t)
	for _, c := range countCases {
		s := parseCase(t, c.expr, c.zone)
		from := time.Date(2027, 2, 8, 3, 0, 0, 0, time.UTC)
		to := from.Add(14 * 24 * time.Hour)
		var included []time.Time
		for f := s.Next(from); !f.IsZero() && !f.After(to) && len(included) < 3000; f = s.Next(f) {
			if !x.Excludes(f) {
				included = append(included, f)
			}
		}
		if len(included) == 0 {
			continue
		}
		if got := x.NextIncluded(s, from, to); !got.Equal(included[0]) {
			t.Errorf("%s: NextIncluded = %s, want %s", c.expr, got, included[0])
		}
		for _, k := range []int{1, 2, len(included) / 2, len(included)} {
			if k < 1 {
				continue
			}
			if got := x.NthIncluded(s, from, to, int64(k)); !got.Equal(included[k-1]) {
				t.Errorf("%s: NthIncluded(%d) = %s, want %s", c.expr, k, got, included[k-1])
			}
		}
	}
	empty := Exclusion(nil)
	hourly, _ := Parse("0 0 * * * ?", time.UTC)
	from := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := empty.NthIncluded(hourly, from, from.AddDate(1, 0, 0), 8000); !got.Equal(from.Add(8000 * time.Hour)) {
		t.Fatalf("no calendars: the 8000th hourly fire is %s, want %s", got, from.Add(8000*time.Hour))
	}
}
