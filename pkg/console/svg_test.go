package console

import (
	"encoding/xml"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/history"
)

// svgElements parses an SVG and returns each element's name with its
// attributes; a picture that is not well-formed XML fails the test.
func svgElements(t *testing.T, svg string) []map[string]string {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(svg))
	var out []map[string]string
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("not well-formed: %v\n%s", err, svg)
		}
		if se, ok := tok.(xml.StartElement); ok {
			m := map[string]string{"": se.Name.Local}
			for _, a := range se.Attr {
				m[a.Name.Local] = a.Value
			}
			out = append(out, m)
		}
	}
}

func TestTimelineShowsACutRunAndItsFailover(t *testing.T) {
	now := time.Date(2026, 12, 4, 2, 10, 0, 0, time.UTC)
	at := func(s int) time.Time { return now.Add(time.Duration(s) * time.Second) }
	run := func(item int, fence int64, state, reason, source string, start, end int) history.Run {
		r := history.Run{ItemRecord: keyspace.ItemRecord{Job: "ten", Item: item, Fence: fence, Attempt: 1, Fire: at(start), Start: at(start), State: state, Reason: reason, Source: source, Instance: "a"}}
		if end != 0 {
			r.End = at(end)
		}
		return r
	}
	rerun := run(1, 12, "DONE", "", "FAILOVER", -50, -46)
	rerun.Attempt, rerun.Instance = 2, "b"
	runs := []history.Run{ // newest first, as a history page
		run(2, 13, "RUNNING", "", "NORMAL", -5, 0),
		rerun,
		run(1, 11, "KILLED", "lost", "NORMAL", -59, -55),
		run(0, 10, "FAILED", "", "NORMAL", -60, -58),
		{ItemRecord: keyspace.ItemRecord{Job: "ten", Item: 0, Fire: at(-30), State: "SKIPPED", Reason: "disabled"}},
	}
	els := svgElements(t, string(timelineSVG("ten", runs, 3, now)))
	byRun := map[string]map[string]string{}
	labels := 0
	for _, e := range els {
		if r := e["data-run"]; r != "" {
			byRun[r] = e
		}
		if strings.Contains(e["class"], "label") {
			labels++
		}
	}
	if labels != 3 {
		t.Errorf("%d row labels, want one per item (3)", labels)
	}
	if e := byRun["11-1"]; e[""] != "polygon" || !strings.Contains(e["class"], "cut") {
		t.Errorf("the run cut by its instance's death: %v, want a polygon of class cut (its jagged end)", e)
	}
	if e := byRun["12-1"]; e[""] != "rect" || !strings.Contains(e["class"], "failover") || !strings.Contains(e["class"], "done") {
		t.Errorf("its failover re-run: %v", e)
	}
	if e := byRun["10-0"]; !strings.Contains(e["class"], "failed") {
		t.Errorf("a failed run: %v", e)
	}
	if e := byRun["0-0"]; e[""] != "line" || !strings.Contains(e["class"], "skipped") {
		t.Errorf("a skip: %v", e)
	}
	// The run in progress reaches now: the plot's right end.
	if e := byRun["13-2"]; !strings.Contains(e["class"], "running") || e["width"] == "" {
		t.Errorf("the run in progress: %v", e)
	} else if x, w := atof(e["x"]), atof(e["width"]); x+w < tlLabel+tlWidth-1 {
		t.Errorf("the run in progress ends at x=%.1f, want now (%d)", x+w, tlLabel+tlWidth)
	}
	// A failover re-run whose cut attempt etcd no longer has (the re-run's
	// claim replaced its record): the cut attempt is drawn, from its fire
	// to the re-run's start.
	lone := run(0, 20, "DONE", "", "FAILOVER", -20, -16)
	lone.Attempt, lone.Fire = 2, at(-25)
	var cutOf map[string]string
	for _, e := range svgElements(t, string(timelineSVG("ten", []history.Run{lone}, 3, now))) {
		if e[""] == "polygon" {
			cutOf = e
		}
	}
	if cutOf == nil || !strings.Contains(cutOf["class"], "cut") || cutOf["data-item"] != "0" || cutOf["data-attempt"] != "1" {
		t.Errorf("the cut attempt of a lone failover re-run: %v", cutOf)
	}
	if timelineSVG("ten", nil, 3, now) != "" {
		t.Error("a timeline of no run")
	}
}

func atof(s string) float64 {
	f, _ := strconv.ParseFloat(s, 64)
	return f
}

func TestHoursChartHasAnHourEach(t *testing.T) {
	h := history.NewHours()
	now := time.Date(2026, 12, 4, 10, 30, 0, 0, time.UTC)
	for i := range 7 {
		h.Add(now.Add(-time.Duration(i)*time.Minute), i%3 == 0)
	}
	day, _ := h.Day(now)
	els := svgElements(t, string(hoursSVG(day)))
	hours := 0
	for _, e := range els {
		if e["class"] == "hour" {
			hours++
			if e["data-hour"] == "2026-12-04T10:00:00Z" && (e["data-runs"] != "7" || e["data-failures"] != "3") {
				t.Errorf("this hour: %v, want 7 runs, 3 failed", e)
			}
		}
	}
	if hours != history.Day {
		t.Errorf("%d hours drawn, want %d", hours, history.Day)
	}
}
