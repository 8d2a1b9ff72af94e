package schedule

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// tzdata returns every IANA zone's name and TZif data, from Go's own
// zoneinfo.zip (in every Go installation that ships it) or else from the
// system's /usr/share/zoneinfo (Debian's tzdata, which Debian's Go uses).
// Zones whose data is the same (links, old names) are given once.
func tzdata(t *testing.T) (names []string, data map[string][]byte) {
	t.Helper()
	data = map[string][]byte{}
	seen := map[string]bool{}
	add := func(name string, b []byte) {
		if !bytes.HasPrefix(b, []byte("TZif")) || seen[string(b)] {
			return
		}
		seen[string(b)] = true
		names = append(names, name)
		data[name] = b
	}
	goroot := runtime.GOROOT()
	if goroot == "" {
		goroot = os.Getenv("GOROOT")
	}
	if z, err := zip.OpenReader(filepath.Join(goroot, "lib", "time", "zoneinfo.zip")); err == nil {
		defer z.Close()
		for _, f := range z.File {
			r, err := f.Open()
			if err != nil {
				t.Fatalf("zoneinfo.zip %s: %v", f.Name, err)
			}
			b, err := io.ReadAll(r)
			r.Close()
			if err != nil {
				t.Fatalf("zoneinfo.zip %s: %v", f.Name, err)
			}
			add(f.Name, b)
		}
		return names, data
	}
	const dir = "/usr/share/zoneinfo"
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.IsDir() {
			if rel == "posix" || rel == "right" {
				return filepath.SkipDir
			}
			return nil
		}
		if rel == "localtime" || rel == "posixrules" || strings.Contains(rel, ".") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err == nil {
			add(rel, b)
		}
		return nil
	})
	if err != nil || len(names) == 0 {
		t.Skipf("no zone data: neither %s/lib/time/zoneinfo.zip nor %s (%v)", goroot, dir, err)
	}
	return names, data
}

// transition is a change of a zone's offset.
type transition struct {
	at       time.Time
	old, new time.Duration
}

func transitions(loc *time.Location, from, to time.Time) []transition {
	var out []transition
	for t := from; ; {
		_, end := t.In(loc).ZoneBounds()
		if !end.IsZero() && !end.After(t) {
			// Go's bound for the year past a zone's listed transitions
			// is 365 days after the year's start, even in a leap year.
			t = t.Add(24 * time.Hour)
			continue
		}
		if end.IsZero() || !end.Before(to) {
			return out
		}
		_, o1 := end.Add(-time.Nanosecond).In(loc).Zone()
		_, o2 := end.In(loc).Zone()
		if o1 != o2 {
			out = append(out, transition{end.UTC(), time.Duration(o1) * time.Second, time.Duration(o2) * time.Second})
		}
		t = end
	}
}

// readingOf is what loc's clock shows at u, as a UTC time.
func readingOf(loc *time.Location, u time.Time) time.Time {
	_, off := u.In(loc).Zone()
	return u.UTC().Add(time.Duration(off) * time.Second)
}

// step is the grain of the model below: every offset and transition of
// 2026-2030, and every reading the jobs below match, is a multiple of it.
const step = 15 * time.Minute

// Every IANA zone's transitions of 2026-2030, with a daily job at readings
// the transition skips or repeats, an hourly and a 30-minute job, against
// a model that walks real time in 15-minute steps and reads the clock, as
// vixie cron does each minute: a fixed-time reading is due when the clock
// first reaches or passes it (the first time, or at the jump); a schedule
// that follows the clock is due at each step whose reading matches.
func TestNextInEveryZone2026To2030(t *testing.T) {
	t.Parallel()
	names, data := tzdata(t)
	from, to := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2031, 1, 1, 0, 0, 0, 0, time.UTC)
	var checked int
	var changes atomic.Int64
	t.Cleanup(func() { t.Logf("%d zones (of %d distinct), %d transitions", checked, len(names), changes.Load()) })
	for _, name := range names {
		loc, err := time.LoadLocationFromTZData(name, data[name])
		if err != nil {
			t.Errorf("zone %s: %v", name, err)
			continue
		}
		trs := transitions(loc, from, to)
		if len(trs) == 0 {
			continue
		}
		checked++
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			for _, tr := range trs {
				checkTransition(t, loc, tr)
			}
			changes.Add(int64(len(trs)))
			// And the last day of a leap year, past which Go's bounds of
			// a zone's period, computed from its rule, are a day off.
			checkWindow(t, loc, time.Date(2028, 12, 31, 12, 0, 0, 0, time.UTC), "the end of 2028",
				[]time.Time{time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(0, 1, 1, 12, 0, 0, 0, time.UTC)})
		})
	}
	if checked < 50 {
		t.Errorf("only %d zones of %d have transitions in 2026-2030; the zone data looks wrong", checked, len(names))
	}
}

func checkTransition(t *testing.T, loc *time.Location, tr transition) {
	t.Helper()
	if tr.at.Sub(tr.at.Truncate(step)) != 0 || tr.old%step != 0 || tr.new%step != 0 {
		t.Fatalf("transition at %s (%s -> %s) is not on the model's %s grain", tr.at, tr.old, tr.new, step)
	}
	// Daily jobs at the first readings the transition skips or repeats.
	lo, hi := tr.at.UTC().Add(tr.old), tr.at.UTC().Add(tr.new) // readings
	if hi.Before(lo) {
		lo, hi = hi, lo
	}
	daily := []time.Time{lo}
	if hi.Sub(lo) > step {
		daily = append(daily, lo.Add(step))
	}
	checkWindow(t, loc, tr.at, fmt.Sprintf("the change at %s (%s -> %s)", tr.at.In(loc).Format(time.RFC3339), tr.old, tr.new), daily)
}

// checkWindow compares the fires of an hourly, a 30-minute and daily jobs
// (at the times of day of daily) with the model, from the local day before
// at's to the day after it.
func checkWindow(t *testing.T, loc *time.Location, at time.Time, what string, daily []time.Time) {
	t.Helper()
	type job struct {
		expr    string
		matches func(r time.Time) bool
		fixed   bool
	}
	jobs := []job{
		{"0 0 * * * ?", func(r time.Time) bool { return r.Minute() == 0 && r.Second() == 0 }, false},
		{"0 0/30 * * * ?", func(r time.Time) bool { return r.Minute()%30 == 0 && r.Second() == 0 }, false},
	}
	for _, d := range daily {
		h, m := d.Hour(), d.Minute()
		jobs = append(jobs, job{fmt.Sprintf("0 %d %d * * ?", m, h), func(r time.Time) bool { return r.Hour() == h && r.Minute() == m && r.Second() == 0 }, true})
	}
	// The window, in whole steps.
	startDay := readingOf(loc, at).AddDate(0, 0, -1)
	ws := time.Date(startDay.Year(), startDay.Month(), startDay.Day(), 0, 0, 0, 0, loc).Add(-2 * step).Truncate(step)
	we := ws.Add(3*24*time.Hour + 3*time.Hour)
	for _, j := range jobs {
		s, err := Parse(j.expr, loc)
		if err != nil {
			t.Fatalf("%q: %v", j.expr, err)
		}
		// The model.
		var want []time.Time
		days := map[time.Time][]string{}      // the days whose readings a fixed-time fire stands for
		high := readingOf(loc, ws.Add(-step)) // the highest reading shown so far
		for u := ws; !u.After(we); u = u.Add(step) {
			r := readingOf(loc, u)
			if j.fixed {
				for v := high.Truncate(step).Add(step); !v.After(r); v = v.Add(step) {
					if j.matches(v) {
						days[u] = append(days[u], v.Format(time.DateOnly))
					}
				}
				if len(days[u]) > 0 {
					want = append(want, u)
				}
			} else if j.matches(r) {
				want = append(want, u)
			}
			if r.After(high) {
				high = r
			}
		}
		// The schedule.
		var got []time.Time
		for f := s.Next(ws.Add(-time.Nanosecond)); !f.IsZero() && !f.After(we); f = s.Next(f) {
			if n := len(got); n > 0 && !f.After(got[n-1]) {
				t.Fatalf("%q: fire %s after %s", j.expr, f, got[n-1])
			}
			if back := s.Next(f.Add(-time.Nanosecond)); !back.Equal(f) {
				t.Errorf("%q: Next(%s - 1ns) = %s", j.expr, f.Format(time.RFC3339), back.Format(time.RFC3339))
			}
			got = append(got, f)
			if len(got) > 1000 {
				t.Fatalf("%q: more than 1000 fires in %s", j.expr, we.Sub(ws))
			}
		}
		if g, w := fireList(got, loc), fireList(want, loc); g != w {
			t.Errorf("%q around %s:\n got %s\nwant %s", j.expr, what, g, w)
		}
		// A daily job fires exactly once for each local calendar day: on
		// it, or, where the clocks jump over its time at the end of the
		// day (America/Nuuk: Saturday 23:00 -02 to Sunday 00:00 -01), at
		// the jump, the first instant of the next day.
		if j.fixed {
			perDay := map[string]int{}
			for _, f := range got {
				for _, d := range days[f] {
					perDay[d]++
				}
			}
			for d := startDay; d.Before(startDay.AddDate(0, 0, 3)); d = d.AddDate(0, 0, 1) {
				if n := perDay[d.Format(time.DateOnly)]; n != 1 {
					t.Errorf("%q: %d fires on %s (around %s): %s", j.expr, n, d.Format(time.DateOnly), what, fireList(got, loc))
				}
			}
		}
	}
}

func fireList(fires []time.Time, loc *time.Location) string {
	s := make([]string, len(fires))
	for i, f := range fires {
		s[i] = f.In(loc).Format(time.RFC3339)
	}
	return strings.Join(s, " ")
}
