package schedule

import (
	"fmt"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the zones below on a host without tzdata
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func rfc3339(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The fires around transitions, by the rule of the package doc: a
// fixed-time reading fires once, the first time it is shown, or when the
// clocks jump over it; a schedule with a wildcard second, minute or hour
// fires at every instant the clock shows a matching reading.
func TestNextAroundTransitions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, zone, expr, from string
		want                   []string
	}{
		// Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST, 2026-10-25 03:00 CEST -> 02:00 CET.
		{"daily 02:15 runs once when the clocks go back", "Europe/Berlin", "0 15 2 * * ?", "2026-10-24T00:00:00+02:00",
			[]string{"2026-10-24T02:15:00+02:00", "2026-10-25T02:15:00+02:00", "2026-10-26T02:15:00+01:00"}},
		{"daily 02:15 runs at the jump", "Europe/Berlin", "0 15 2 * * ?", "2026-03-28T00:00:00+01:00",
			[]string{"2026-03-28T02:15:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:15:00+02:00"}},
		{"daily 02:15 from inside the repeated hour", "Europe/Berlin", "0 15 2 * * ?", "2026-10-25T02:05:00+01:00",
			[]string{"2026-10-26T02:15:00+01:00"}},
		{"yearly on a jump date does not skip a year", "Europe/Berlin", "0 15 2 28 3 ?", "2026-03-29T00:00:00+01:00",
			[]string{"2027-03-28T03:00:00+02:00", "2028-03-28T02:15:00+02:00"}},
		{"daily 03:00 also stands for the skipped 02:30", "Europe/Berlin", "0 30 2,3 * * ?", "2026-03-29T00:00:00+01:00",
			[]string{"2026-03-29T03:00:00+02:00", "2026-03-29T03:30:00+02:00", "2026-03-30T02:30:00+02:00"}},
		{"two readings in one gap fire once", "Europe/Berlin", "0 0,30 2 * * ?", "2026-03-29T00:00:00+01:00",
			[]string{"2026-03-29T03:00:00+02:00", "2026-03-30T02:00:00+02:00"}},
		{"hourly runs each real hour when the clocks go back", "Europe/Berlin", "0 0 * * * ?", "2026-10-25T00:30:00+02:00",
			[]string{"2026-10-25T01:00:00+02:00", "2026-10-25T02:00:00+02:00", "2026-10-25T02:00:00+01:00", "2026-10-25T03:00:00+01:00"}},
		{"hourly runs each real hour when the clocks jump", "Europe/Berlin", "0 0 * * * ?", "2026-03-29T00:30:00+01:00",
			[]string{"2026-03-29T01:00:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-29T04:00:00+02:00"}},
		{"@hourly follows the clock", "Europe/Berlin", "@hourly", "2026-10-25T01:30:00+02:00",
			[]string{"2026-10-25T02:00:00+02:00", "2026-10-25T02:00:00+01:00"}},
		{"@daily is fixed-time", "Europe/Berlin", "@daily", "2026-10-24T12:00:00+02:00",
			[]string{"2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00"}},
		{"every 30 minutes, real", "Europe/Berlin", "0 0/30 * * * ?", "2026-10-25T01:45:00+02:00",
			[]string{"2026-10-25T02:00:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-25T02:00:00+01:00", "2026-10-25T02:30:00+01:00", "2026-10-25T03:00:00+01:00"}},
		{"every 2 hours follows the clock back", "Europe/Berlin", "0 0 */2 * * ?", "2026-10-25T00:30:00+02:00",
			[]string{"2026-10-25T02:00:00+02:00", "2026-10-25T02:00:00+01:00", "2026-10-25T04:00:00+01:00"}},
		{"every 2 hours follows the clock forward", "Europe/Berlin", "0 0 */2 * * ?", "2026-03-29T00:30:00+01:00",
			[]string{"2026-03-29T04:00:00+02:00"}},
		{"2/12 is fixed-time", "Europe/Berlin", "0 0 2/12 * * ?", "2026-10-25T00:30:00+02:00",
			[]string{"2026-10-25T02:00:00+02:00", "2026-10-25T14:00:00+01:00"}},
		{"every 15 minutes in a skipped hour: none", "Europe/Berlin", "*/15 2 * * *", "2026-03-28T23:00:00+01:00",
			[]string{"2026-03-30T02:00:00+02:00"}},
		{"seconds step in a repeated minute", "Europe/Berlin", "0/30 15 2 25 10 ?", "2026-10-25T00:00:00+02:00",
			[]string{"2026-10-25T02:15:00+02:00", "2026-10-25T02:15:30+02:00", "2026-10-25T02:15:00+01:00", "2026-10-25T02:15:30+01:00"}},
		// America/New_York: 2027-11-07 02:00 EDT -> 01:00 EST.
		{"every 30 minutes of 01:xx follows the clock", "America/New_York", "0 0/30 1 7 11 ?", "2027-11-06T00:00:00-04:00",
			[]string{"2027-11-07T01:00:00-04:00", "2027-11-07T01:30:00-04:00", "2027-11-07T01:00:00-05:00", "2027-11-07T01:30:00-05:00", "2028-11-07T01:00:00-05:00"}},
		{"01:00 and 01:30 fixed", "America/New_York", "0 0,30 1 7 11 ?", "2027-11-06T00:00:00-04:00",
			[]string{"2027-11-07T01:00:00-04:00", "2027-11-07T01:30:00-04:00", "2028-11-07T01:00:00-05:00"}},
		// Australia/Lord_Howe, 30 minutes: 2026-04-05 02:00 +11 -> 01:30 +1030, 2026-10-04 02:00 +1030 -> 02:30 +11.
		{"Lord Howe daily 02:00 on the fall-back day", "Australia/Lord_Howe", "0 0 2 * * ?", "2026-04-04T02:00:00+11:00",
			[]string{"2026-04-05T02:00:00+10:30", "2026-04-06T02:00:00+10:30"}},
		{"Lord Howe daily 02:15 on the fall-back day", "Australia/Lord_Howe", "0 15 2 * * ?", "2026-04-04T02:15:00+11:00",
			[]string{"2026-04-05T02:15:00+10:30", "2026-04-06T02:15:00+10:30"}},
		{"Lord Howe daily 01:45, shown twice", "Australia/Lord_Howe", "0 45 1 * * ?", "2026-04-04T12:00:00+11:00",
			[]string{"2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"}},
		{"Lord Howe daily 02:15 at the jump", "Australia/Lord_Howe", "0 15 2 * * ?", "2026-10-03T12:00:00+10:30",
			[]string{"2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00"}},
		{"Lord Howe hourly back", "Australia/Lord_Howe", "0 0 * * * ?", "2026-04-05T00:30:00+11:00",
			[]string{"2026-04-05T01:00:00+11:00", "2026-04-05T02:00:00+10:30", "2026-04-05T03:00:00+10:30"}},
		{"Lord Howe hourly forward", "Australia/Lord_Howe", "0 0 * * * ?", "2026-10-04T00:30:00+10:30",
			[]string{"2026-10-04T01:00:00+10:30", "2026-10-04T03:00:00+11:00"}},
		{"Lord Howe every 30 minutes back", "Australia/Lord_Howe", "0 0/30 * * * ?", "2026-04-05T01:15:00+11:00",
			[]string{"2026-04-05T01:30:00+11:00", "2026-04-05T01:30:00+10:30", "2026-04-05T02:00:00+10:30"}},
		{"Lord Howe every 30 minutes forward", "Australia/Lord_Howe", "0 0/30 * * * ?", "2026-10-04T01:15:00+10:30",
			[]string{"2026-10-04T01:30:00+10:30", "2026-10-04T02:30:00+11:00"}},
		// A gap at midnight: America/Santiago 2026-09-06 00:00 -04 -> 01:00 -03,
		// and back 2026-04-05 00:00 -03 -> 2026-04-04 23:00 -04.
		{"Santiago midnight daily at the jump", "America/Santiago", "0 0 0 * * ?", "2026-09-05T12:00:00-04:00",
			[]string{"2026-09-06T01:00:00-03:00", "2026-09-07T00:00:00-03:00"}},
		{"Santiago midnight daily on the fall-back day", "America/Santiago", "0 0 0 * * ?", "2026-04-04T12:00:00-03:00",
			[]string{"2026-04-05T00:00:00-04:00", "2026-04-06T00:00:00-04:00"}},
		{"Santiago 23:30 shown twice", "America/Santiago", "0 30 23 * * ?", "2026-04-04T12:00:00-03:00",
			[]string{"2026-04-04T23:30:00-03:00", "2026-04-05T23:30:00-04:00"}},
		{"Santiago hourly over midnight's gap", "America/Santiago", "0 0 * * * ?", "2026-09-05T22:30:00-04:00",
			[]string{"2026-09-05T23:00:00-04:00", "2026-09-06T01:00:00-03:00"}},
		// Asia/Beirut: 2026-03-29 00:00 -> 01:00, 2026-10-25 00:00 -> 2026-10-24 23:00.
		{"Beirut midnight daily at the jump", "Asia/Beirut", "0 0 0 * * ?", "2026-03-28T12:00:00+02:00",
			[]string{"2026-03-29T01:00:00+03:00", "2026-03-30T00:00:00+03:00"}},
		{"Beirut midnight daily on the fall-back day", "Asia/Beirut", "0 0 0 * * ?", "2026-10-24T12:00:00+03:00",
			[]string{"2026-10-25T00:00:00+02:00"}},
		// America/Nuuk jumps from Saturday 23:00 -02 to Sunday 00:00 -01:
		// Saturday's 23:15 runs at the jump, the first instant of Sunday.
		{"Nuuk 23:15 at the jump into the next day", "America/Nuuk", "0 15 23 * * ?", "2026-03-28T12:00:00-02:00",
			[]string{"2026-03-29T00:00:00-01:00", "2026-03-29T23:15:00-01:00"}},
		// Zones without transitions, and @every, are untouched.
		{"UTC", "UTC", "0 15 2 * * ?", "2026-10-25T00:00:00Z", []string{"2026-10-25T02:15:00Z", "2026-10-26T02:15:00Z"}},
		{"@every counts real time", "Europe/Berlin", "@every 1h", "2026-10-25T01:30:00+02:00",
			[]string{"2026-10-25T02:00:00+02:00", "2026-10-25T02:00:00+01:00", "2026-10-25T03:00:00+01:00"}},
	}
	for _, tt := range tests {
		loc := mustZone(t, tt.zone)
		s, err := Parse(tt.expr, loc)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		from := rfc3339(t, tt.from)
		var got, want []string
		for f, i := from, 0; i < len(tt.want); i++ {
			f = s.Next(f)
			got = append(got, f.In(loc).Format(time.RFC3339))
			want = append(want, rfc3339(t, tt.want[i]).In(loc).Format(time.RFC3339))
			if !f.IsZero() && !s.Next(f.Add(-time.Nanosecond)).Equal(f) {
				t.Errorf("%s: Next(%s - 1ns) is not %[2]s", tt.name, f.Format(time.RFC3339))
			}
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: %q in %s from %s:\n got %s\nwant %s", tt.name, tt.expr, tt.zone, tt.from, got, want)
		}
	}
}

// The rule's reading of each field: a wildcard second, minute or hour
// (all of the field, with or without a step) makes a schedule follow the
// clock.
func TestFollowsTheClock(t *testing.T) {
	t.Parallel()
	for expr, want := range map[string]bool{
		"0 15 2 * * ?": false, "0 0 2,14 * * ?": false, "0 0,30 1 * * ?": false, "0 0 9-17 * * ?": false,
		"0 0 2/12 * * ?": false, "0 5/15 2 * * ?": false, "0 0-30/15 2 * * ?": false, "0 */60 2 * * ?": false,
		"0 0 0 * * ?": false, "0 0 2 ? * MON-FRI": false, "15 2 * * *": false, "@daily": false, "@weekly": false,
		"0 0 * * * ?": true, "0 0/30 * * * ?": true, "0 0 */2 * * ?": true, "0 0 0-23 * * ?": true,
		"0 0/30 1 7 11 ?": true, "0 */15 2 * * ?": true, "0 0-59/20 2 * * ?": true, "0/10 15 2 * * ?": true,
		"* 15 2 * * ?": true, "0 0 1,*/3 * * ?": true, "*/5 * * * *": true, "0 * * * *": true, "@hourly": true,
	} {
		s, err := Parse(expr, nil)
		if err != nil {
			t.Fatalf("%q: %v", expr, err)
		}
		if got := s.(*cronSchedule).follow; got != want {
			t.Errorf("%q follows the clock: %v, want %v", expr, got, want)
		}
	}
}

// Seq counts from the first instant of the day, also where midnight is
// skipped.
func TestSeqWhereMidnightIsSkipped(t *testing.T) {
	t.Parallel()
	loc := mustZone(t, "America/Santiago")
	s, err := Parse("0 0 * * * ?", loc)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		fire string
		want int64
	}{{"2026-09-06T01:00:00-03:00", 0}, {"2026-09-06T02:00:00-03:00", 1}, {"2026-09-05T23:00:00-04:00", 23}} {
		if got := Seq(s, rfc3339(t, tt.fire)); got != tt.want {
			t.Errorf("Seq(%s) = %d, want %d", tt.fire, got, tt.want)
		}
	}
}

func TestInstants(t *testing.T) {
	t.Parallel()
	tests := []struct {
		zone, wall string
		at         []string
		jump       string
	}{
		{"Europe/Berlin", "2026-06-01T02:15:00Z", []string{"2026-06-01T02:15:00+02:00"}, ""},
		{"Europe/Berlin", "2026-10-25T02:15:00Z", []string{"2026-10-25T02:15:00+02:00", "2026-10-25T02:15:00+01:00"}, ""},
		{"Europe/Berlin", "2027-03-28T02:15:00Z", nil, "2027-03-28T03:00:00+02:00"},
		{"Australia/Lord_Howe", "2026-04-05T01:45:00Z", []string{"2026-04-05T01:45:00+11:00", "2026-04-05T01:45:00+10:30"}, ""},
		{"Australia/Lord_Howe", "2026-10-04T02:00:00Z", nil, "2026-10-04T02:30:00+11:00"},
		{"America/Santiago", "2026-09-06T00:00:00Z", nil, "2026-09-06T01:00:00-03:00"},
		{"UTC", "2026-10-25T02:15:00Z", []string{"2026-10-25T02:15:00Z"}, ""},
	}
	for _, tt := range tests {
		at, jump := Instants(mustZone(t, tt.zone), rfc3339(t, tt.wall))
		var got []string
		for _, a := range at {
			got = append(got, a.Format(time.RFC3339))
		}
		gotJump := ""
		if !jump.IsZero() {
			gotJump = jump.Format(time.RFC3339)
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.at) || gotJump != tt.jump {
			t.Errorf("Instants(%s, %s) = %v, %q; want %v, %q", tt.zone, tt.wall, got, gotJump, tt.at, tt.jump)
		}
	}
}

func TestChanges(t *testing.T) {
	t.Parallel()
	from, to := rfc3339(t, "2026-01-01T00:00:00Z"), rfc3339(t, "2027-01-01T00:00:00Z")
	tests := []struct {
		zone, expr string
		want       []string
	}{
		{"Europe/Berlin", "0 15 2 * * ?", []string{
			"clocks jump Sun 2026-03-29 02:00 CET -> 03:00 CEST: 02:15:00 does not exist; fires when the clocks jump: 03:00:00 CEST",
			"clocks go back Sun 2026-10-25 03:00 CEST -> 02:00 CET: 02:15:00 comes twice; fires the first time only: 02:15:00 CEST; the second (CET) is skipped",
		}},
		{"Europe/Berlin", "0 0 * * * ?", []string{
			"clocks jump Sun 2026-03-29 02:00 CET -> 03:00 CEST: 02:00:00 does not exist; no fire for it (the schedule follows the clock)",
			"clocks go back Sun 2026-10-25 03:00 CEST -> 02:00 CET: 02:00:00 comes twice; fires both times: 02:00:00 CEST, 02:00:00 CET",
		}},
		{"Europe/Berlin", "0 0/10 2 * * ?", []string{
			"clocks jump Sun 2026-03-29 02:00 CET -> 03:00 CEST: 02:00:00, 02:10:00, 02:20:00 and 3 more do not exist; no fire for them (the schedule follows the clock)",
			"clocks go back Sun 2026-10-25 03:00 CEST -> 02:00 CET: 02:00:00, 02:10:00, 02:20:00 and 3 more come twice; fire both times: 02:00:00 CEST, 02:10:00 CEST, 02:20:00 CEST, 02:30:00 CEST, 02:40:00 CEST, 02:50:00 CEST and 6 more",
		}},
		{"Europe/Berlin", "0 0,30 2 * * ?", []string{
			"clocks jump Sun 2026-03-29 02:00 CET -> 03:00 CEST: 02:00:00, 02:30:00 do not exist; fire once when the clocks jump: 03:00:00 CEST",
			"clocks go back Sun 2026-10-25 03:00 CEST -> 02:00 CET: 02:00:00, 02:30:00 come twice; fire the first time only: 02:00:00 CEST, 02:30:00 CEST; the second (CET) is skipped",
		}},
		{"Europe/Berlin", "* * 2 * * ?", []string{
			"clocks jump Sun 2026-03-29 02:00 CET -> 03:00 CEST: 02:00:00, 02:00:01, 02:00:02 and 3597 more do not exist; no fire for them (the schedule follows the clock)",
			"clocks go back Sun 2026-10-25 03:00 CEST -> 02:00 CET: 02:00:00, 02:00:01, 02:00:02 and 3597 more come twice; fire both times: 02:00:00 CEST, 02:00:01 CEST, 02:00:02 CEST, 02:00:03 CEST, 02:00:04 CEST, 02:00:05 CEST and 7194 more",
		}},
		{"Europe/Berlin", "0 0 12 * * ?", nil},
		{"Australia/Lord_Howe", "0 45 1 * * ?", []string{
			"clocks go back Sun 2026-04-05 02:00 +11 -> 01:30 +1030: 01:45:00 comes twice; fires the first time only: 01:45:00 +11; the second (+1030) is skipped",
		}},
		{"Australia/Lord_Howe", "0 0 2 * * ?", []string{
			"clocks jump Sun 2026-10-04 02:00 +1030 -> 02:30 +11: 02:00:00 does not exist; fires when the clocks jump: 02:30:00 +11",
		}},
		{"America/Santiago", "0 30 23 * * ?", []string{
			"clocks go back Sun 2026-04-05 00:00 -03 -> 23:00 -04: 23:30:00 comes twice; fires the first time only: Sat 23:30:00 -03; the second (-04) is skipped",
		}},
		{"UTC", "0 15 2 * * ?", nil},
	}
	for _, tt := range tests {
		s, err := Parse(tt.expr, mustZone(t, tt.zone))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, c := range Changes(s, from, to) {
			got = append(got, c.String())
		}
		if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
			t.Errorf("Changes(%q in %s):\n got %s\nwant %s", tt.expr, tt.zone, strings.Join(got, "\n     "), strings.Join(tt.want, "\n     "))
		}
	}
	if got := Changes(Every(time.Hour), from, to); got != nil {
		t.Errorf("Changes(@every 1h) = %v, want none", got)
	}
}

func ExampleChanges() {
	berlin, _ := time.LoadLocation("Europe/Berlin")
	s, _ := Parse("0 15 2 * * ?", berlin)
	for _, c := range Changes(s, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)) {
		fmt.Println(c)
	}
	// Output:
	// clocks jump Sun 2026-03-29 02:00 CET -> 03:00 CEST: 02:15:00 does not exist; fires when the clocks jump: 03:00:00 CEST
	// clocks go back Sun 2026-10-25 03:00 CEST -> 02:00 CET: 02:15:00 comes twice; fires the first time only: 02:15:00 CEST; the second (CET) is skipped
}
