package admin

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/schedule"
)

// A re-run's fire is a past fire of the job's schedule, read in its time
// zone; a local time that a daylight-saving change skips or repeats is
// refused (it names no fire, or two), not moved to a neighbour.
func TestRerunFire(t *testing.T) {
	loc, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	s, err := schedule.Parse("0 30 * * * ?", loc) // hourly at :30
	if err != nil {
		t.Fatal(err)
	}
	f := &jobFacts{name: "hourly", def: &config.Job{Name: "hourly", Cron: config.CronList{"0 30 * * * ?"}, Schedule: s, Location: loc}}
	now := time.Date(2025, 12, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		text string
		want string // RFC 3339, or an error's words
	}{
		{"2025-06-01 10:30", "2025-06-01T10:30:00-04:00"},
		{"2025-06-01T10:30:00", "2025-06-01T10:30:00-04:00"},
		{"2025-06-01T14:30:00Z", "2025-06-01T10:30:00-04:00"},
		{"2025-12-01T08:30:00+09:00", "2025-11-30T18:30:00-05:00"},
		{"2025-03-09 02:30", "does not exist in time zone America/New_York"},
		{"2025-11-02 01:30", "happens twice in time zone America/New_York (the clocks went back): give its offset, 2025-11-02T01:30:00-04:00 or 2025-11-02T01:30:00-05:00"},
		{"2025-11-02T01:30:00-05:00", "2025-11-02T01:30:00-05:00"},
		{"2025-06-01 10:45", `is not a fire of job "hourly"`},
		{"2026-06-01 10:30", "is in the future"},
		{"June 1st", "want RFC 3339"},
	}
	for _, tt := range tests {
		got, err := f.checkRerun(tt.text, now)
		switch {
		case strings.Contains(tt.want, " "):
			if !errors.Is(err, ErrBadTarget) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%q: %v, want an error saying %q", tt.text, err, tt.want)
			}
		case err != nil || !got.Equal(mustTime(t, tt.want)):
			t.Errorf("%q: %s, %v; want %s", tt.text, got.In(loc).Format(time.RFC3339), err, tt.want)
		}
	}
}

// The same around half-hour shifts (Lord Howe: 2026-04-05 02:00 +11 ->
// 01:30 +1030, 2026-10-04 02:00 +1030 -> 02:30 +11) and for the fire a
// fixed-time job runs when the clocks jump over its time.
func TestRerunFireAroundDST(t *testing.T) {
	howe, err := time.LoadLocation("Australia/Lord_Howe")
	if err != nil {
		t.Fatal(err)
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2027, 12, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		cron string
		loc  *time.Location
		text string
		want string // RFC 3339, or an error's words
	}{
		{"0 45 * * * ?", howe, "2026-04-05 01:45", "happens twice in time zone Australia/Lord_Howe (the clocks went back): give its offset, 2026-04-05T01:45:00+11:00 or 2026-04-05T01:45:00+10:30"},
		{"0 45 * * * ?", howe, "2026-04-05T01:45:00+10:30", "2026-04-05T01:45:00+10:30"},
		{"0 45 * * * ?", howe, "2026-04-05 02:45", "2026-04-05T02:45:00+10:30"},
		{"0 15 2 * * ?", howe, "2026-10-04 02:15", "does not exist in time zone Australia/Lord_Howe (the clocks skipped it; the job's fire for it ran when they jumped, at 2026-10-04T02:30:00+11:00)"},
		// A job that follows the clock did not fire in the gap.
		{"0 0 * * * ?", berlin, "2027-03-28 02:00", "the job, which follows the clock, did not fire in the gap"},
		// A fixed-time job fired at the first of a time shown twice: that one.
		{"0 15 2 * * ?", berlin, "2026-10-25 02:15", "2026-10-25T02:15:00+02:00"},
		{"0 15 2 * * ?", howe, "2026-10-04 02:30", "2026-10-04T02:30:00+11:00"},
		{"0 15 2 * * ?", berlin, "2027-03-28T03:00:00+02:00", "2027-03-28T03:00:00+02:00"},
		{"0 15 2 * * ?", berlin, "2027-03-28 03:15", `is not a fire of job "j"`},
		{"0 15 2 * * ?", berlin, "2026-10-25T02:15:00+01:00", `is not a fire of job "j"`}, // the second 02:15 is skipped
	}
	for _, tt := range tests {
		s, err := schedule.Parse(tt.cron, tt.loc)
		if err != nil {
			t.Fatal(err)
		}
		f := &jobFacts{name: "j", def: &config.Job{Name: "j", Cron: config.CronList{tt.cron}, Schedule: s, Location: tt.loc}}
		got, err := f.checkRerun(tt.text, now)
		switch {
		case strings.Contains(tt.want, " "):
			if !errors.Is(err, ErrBadTarget) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%q in %s: %v, want an error saying %q", tt.text, tt.loc, err, tt.want)
			}
		case err != nil || !got.Equal(mustTime(t, tt.want)):
			t.Errorf("%q in %s: %s, %v; want %s", tt.text, tt.loc, got.In(tt.loc).Format(time.RFC3339), err, tt.want)
		}
	}
}
func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
