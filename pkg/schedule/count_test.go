package schedule

import (
	"fmt"
	"testing"
	"time"
)

// countCases are schedules and zones whose changes of offset exercise the
// counter: DST both ways, a 30-minute shift, a jump over midnight, a
// skipped day, a Union of a fixed-time and a clock-following member.
var countCases = []struct{ expr, zone string }{
	{"0 0 2 * * ?", "Europe/Berlin"},
	{"0 30 2 * * ?", "Europe/Berlin"},
	{"0 0/15 * * * ?", "Europe/Berlin"},
	{"0 0 * * * ?", "Australia/Lord_Howe"},
	{"0 15,45 2 * * ?", "Australia/Lord_Howe"},
	{"0 0 0 * * ?", "America/Nuuk"},
	{"0 0 12 * * ?", "Pacific/Apia"},
	{"0 0 9 ? * MON-FRI", "America/New_York"},
	{"0 0 9 1,15 * ?", "America/New_York"},
	{"*/7 * 1-3 * * ?", "America/New_York"},
	{"5 4 * * 0", "UTC"},
	{"0 0 2 * * ?|0 0/30 * * * ?", "Europe/Berlin"},
	{"0 0 2 * * ?|0 0 2,14 * * ?", "Asia/Shanghai"},
	{"@every 7s", "UTC"},
	{"@every 1h", "Europe/Berlin"},
}

func parseCase(t testing.TB, expr, zone string) Schedule {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	var u Union
	for _, e := range splitBar(expr) {
		s, err := Parse(e, loc)
		if err != nil {
			t.Fatal(err)
		}
		u = append(u, s)
	}
	if len(u) == 1 {
		return u[0]
	}
	return u
}

func splitBar(s string) []string {
	var out []string
	for {
		i := 0
		for i < len(s) && s[i] != '|' {
			i++
		}
		out = append(out, s[:i])
		if i == len(s) {
			return out
		}
		s = s[i+1:]
	}
}

// Count and Latest agree with enumeration by Next over spans that cross the
// zones' changes of offset, from instants on and off the fires.
func TestCountAndLatestAgreeWithNext(t *testing.T) {
	t.Parallel()
	starts := []time.Time{
		time.Date(2026, 3, 28, 23, 59, 59, 500, time.UTC),
		time.Date(2026, 10, 24, 0, 0, 0, 0, time.UTC),
		time.Date(2011, 12, 28, 13, 0, 0, 0, time.UTC), // Apia skips 30 December 2011
		time.Date(2026, 4, 4, 12, 0, 0, 0, time.UTC),   // Lord Howe goes back 30 minutes
		time.Date(2023, 3, 24, 0, 0, 1, 0, time.UTC),   // Nuuk jumps over midnight
	}
	spans := []time.Duration{time.Second, 90 * time.Minute, 26 * time.Hour, 9 * 24 * time.Hour, 40 * 24 * time.Hour}
	for _, c := range countCases {
		s := parseCase(t, c.expr, c.zone)
		for _, from := range starts {
			for _, span := range spans {
				to := from.Add(span)
				want, wantLast := int64(0), time.Time{}
				for f := s.Next(from); !f.IsZero() && !f.After(to); f = s.Next(f) {
					want, wantLast = want+1, f
				}
				if got := Count(s, from, to); got != want {
					t.Errorf("%s in %s: Count(%s, +%s) = %d, Next enumerates %d", c.expr, c.zone, from.Format(time.RFC3339Nano), span, got, want)
				}
				if got := Latest(s, from, to); !got.Equal(wantLast) {
					t.Errorf("%s in %s: Latest(%s, +%s) = %s, Next enumerates to %s", c.expr, c.zone, from.Format(time.RFC3339Nano), span, got, wantLast)
				}
			}
		}
	}
}

// A year of every second is counted, not walked: the wedge a peer hits
// at 100 missed fires is 31,536,000 fires here, each one counted.
func TestCountAYearOfSeconds(t *testing.T) {
	t.Parallel()
	berlin, _ := time.LoadLocation("Europe/Berlin")
	s, _ := Parse("* * * * * ?", berlin)
	from := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	to := from.AddDate(1, 0, 0)
	if got, want := Count(s, from, to), int64(365*24*3600); got != want {
		t.Fatalf("Count over 2026 = %d, want %d (a clock-following schedule counts real seconds)", got, want)
	}
	daily, _ := Parse("0 30 2 * * ?", berlin)
	if got := Count(daily, from, to); got != 365 {
		t.Fatalf("a fixed-time daily schedule over 2026 fires %d times, want 365 (once per local day, DST nights included)", got)
	}
	if got, want := Latest(s, from, to), to; !got.Equal(want) {
		t.Fatalf("Latest = %s, want %s", got, want)
	}
}

func TestWindow(t *testing.T) {
	t.Parallel()
	hourly, _ := Parse("0 0 * * * ?", time.UTC)
	from := time.Date(2027, 1, 1, 10, 0, 0, 0, time.UTC)
	w := Window{S: hourly, From: from, Until: from.Add(3 * time.Hour)}
	var got []string
	for f := w.Next(from.Add(-48 * time.Hour)); !f.IsZero(); f = w.Next(f) {
		got = append(got, f.Format("15:04"))
	}
	if fmt.Sprint(got) != "[10:00 11:00 12:00 13:00]" {
		t.Fatalf("fires %v, want 10:00 to 13:00 (both bounds included)", got)
	}
	if n := Count(w, from.Add(-48*time.Hour), from.Add(48*time.Hour)); n != 4 {
		t.Fatalf("Count = %d, want 4", n)
	}
	if l := Latest(w, from.Add(-48*time.Hour), from.Add(48*time.Hour)); !l.Equal(from.Add(3 * time.Hour)) {
		t.Fatalf("Latest = %s, want 13:00", l)
	}
}

// FuzzCount checks Count and Latest against enumeration for any schedule,
// zone and span (at most a few days, so that enumerating stays quick).
func FuzzCount(f *testing.F) {
	for i, c := range countCases {
		f.Add(c.expr, c.zone, int64(1774742399+i*86400), uint32(3600*(i+1)))
	}
	zones := []string{"UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Pacific/Apia", "America/Nuuk", "Asia/Kolkata"}
	f.Fuzz(func(t *testing.T, expr, zone string, from int64, span uint32) {
		loc, err := time.LoadLocation(zone)
		if err != nil {
			loc, _ = time.LoadLocation(zones[int(uint(len(zone)))%len(zones)])
		}
		var u Union
		for _, e := range splitBar(expr) {
			s, err := Parse(e, loc)
			if err != nil {
				return
			}
			u = append(u, s)
		}
		if len(u) > 4 {
			return
		}
		var s Schedule = u
		if len(u) == 1 {
			s = u[0]
		}
		a := time.Unix(from%(1<<34), from%1e9).In(loc) // within 1970-2514
		b := a.Add(time.Duration(span%(4*86400)) * time.Second)
		want, last := int64(0), time.Time{}
		for f := s.Next(a); !f.IsZero() && !f.After(b); f = s.Next(f) {
			if want++; want > 400000 {
				return // too many to enumerate here
			}
			last = f
		}
		if got := Count(s, a, b); got != want {
			t.Fatalf("%q in %s: Count(%s, %s) = %d, Next enumerates %d", expr, loc, a.Format(time.RFC3339Nano), b.Format(time.RFC3339Nano), got, want)
		}
		if got := Latest(s, a, b); !got.Equal(last) {
			t.Fatalf("%q in %s: Latest(%s, %s) = %s, want %s", expr, loc, a.Format(time.RFC3339Nano), b.Format(time.RFC3339Nano), got, last)
		}
	})
}

func TestJitterOffset(t *testing.T) {
	t.Parallel()
	fire := time.Date(2027, 1, 1, 9, 0, 0, 0, time.UTC)
	seen := map[time.Duration]bool{}
	for item := range 200 {
		d := JitterOffset("settle", item, fire, 30*time.Second)
		if d < 0 || d >= 30*time.Second || d%time.Millisecond != 0 {
			t.Fatalf("item %d: offset %s, want whole milliseconds in [0, 30s)", item, d)
		}
		if d != JitterOffset("settle", item, fire.In(time.FixedZone("x", 3600)), 30*time.Second) {
			t.Fatal("the offset depends on the fire's zone: instances would disagree")
		}
		seen[d/time.Second] = true
	}
	if len(seen) < 20 {
		t.Fatalf("200 items' offsets fall in %d of 30 seconds: not spread", len(seen))
	}
	if JitterOffset("settle", 0, fire, 0) != 0 || JitterOffset("settle", 0, fire, time.Microsecond) != 0 {
		t.Fatal("no jitter must be no offset")
	}
	if JitterOffset("settle", 0, fire, time.Hour) == JitterOffset("settle", 0, fire.Add(time.Hour), time.Hour) &&
		JitterOffset("settle", 0, fire.Add(2*time.Hour), time.Hour) == JitterOffset("settle", 0, fire.Add(3*time.Hour), time.Hour) {
		t.Fatal("every fire gets the same offset")
	}
}
