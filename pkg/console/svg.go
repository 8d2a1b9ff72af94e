package console

// Pictures, drawn on the server as SVG (no script, no library, nothing
// fetched): a job's timeline of recent runs, and the cluster's runs and
// failures per hour.
//
// The timeline has a row per item (per instance when the job has more
// than maxTimelineRows items), time across, from the oldest run shown to
// now, and a bar per run from its start to its end (a run in progress to
// now), coloured by its result. A run cut by a failure (KILLED/lost,
// KILLED/fence, UNKNOWN: its instance died or was cut off) ends in a
// jagged edge; its failover re-run (source FAILOVER) has a dashed outline
// and follows on the same row. A skip is a tick. Each bar has a title (the
// browser's tooltip) and links to the run's log.

import (
	"fmt"
	"html/template"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/history"
)

// maxTimelineRows bounds the timeline's rows: a job with more items gets
// a row per instance.
const maxTimelineRows = 24

// Geometry of the timeline.
const (
	tlLabel = 110 // the rows' labels
	tlWidth = 900 // the plot
	tlRow   = 18
	tlBar   = 12
	tlAxis  = 22
)

// resultClass is the CSS class of a run's result: its colour.
func resultClass(r *history.Run) string {
	switch {
	case r.State == keyspace.StateDone:
		return "done"
	case r.State == keyspace.StateRunning:
		return "running"
	case r.State == keyspace.StateSkipped:
		return "skipped"
	case cut(r):
		return "cut"
	case r.State == keyspace.StateKilled:
		return "killed"
	case r.State == history.StateUnknown:
		return "cut"
	}
	return "failed"
}

// cut reports whether r was cut short by a failure of its instance, not
// ended by itself or an operator.
func cut(r *history.Run) bool {
	return r.State == history.StateUnknown || r.State == keyspace.StateKilled && (r.Reason == keyspace.ReasonLost || r.Reason == keyspace.ReasonFence)
}

// timelineSVG draws runs (newest first, as the history gives them) of a
// job of total items, up to now; "" when there is nothing to draw.
func timelineSVG(job string, runs []history.Run, total int, now time.Time) template.HTML {
	var drawn []history.Run
	for _, r := range runs {
		if !r.At().IsZero() {
			drawn = append(drawn, r)
		}
	}
	if len(drawn) == 0 {
		return ""
	}
	drawn = append(drawn, cutAttempts(drawn)...)
	from := now
	for _, r := range drawn {
		for _, t := range []time.Time{r.At(), r.Start} {
			if !t.IsZero() && t.Before(from) {
				from = t
			}
		}
	}
	// A little room before the oldest run; at least 10 s across.
	span := max(now.Sub(from)*21/20, 10*time.Second)
	from = now.Add(-span)
	byInstance := total > maxTimelineRows
	var rows []string // the row labels, in order
	rowOf := map[string]int{}
	key := func(r *history.Run) string {
		if byInstance {
			return r.Instance
		}
		return strconv.Itoa(r.Item)
	}
	if !byInstance {
		for i := range total {
			rowOf[strconv.Itoa(i)] = i
			rows = append(rows, "item "+strconv.Itoa(i))
		}
	}
	for i := range drawn {
		k := key(&drawn[i])
		if _, ok := rowOf[k]; !ok {
			rowOf[k] = len(rows)
			label := "item " + k
			if byInstance {
				label = k
			}
			rows = append(rows, label)
		}
	}
	if byInstance {
		slices.Sort(rows)
		for i, l := range rows {
			rowOf[l] = i
		}
	}
	x := func(t time.Time) float64 {
		return tlLabel + float64(tlWidth)*float64(t.Sub(from))/float64(span)
	}
	height := tlAxis + tlRow*len(rows) + 4
	var b strings.Builder
	what := "item"
	if byInstance {
		what = "instance"
	}
	fmt.Fprintf(&b, `<svg id="timeline" class="timeline" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-labelledby="timeline-title">`,
		tlLabel+tlWidth+10, height, tlLabel+tlWidth+10, height)
	fmt.Fprintf(&b, `<title id="timeline-title">Runs of %s by %s, %s to %s (UTC)</title>`, esc(job), what, from.UTC().Format("15:04:05"), now.UTC().Format("15:04:05"))
	for i, l := range rows {
		y := tlAxis + i*tlRow
		if i%2 == 0 {
			fmt.Fprintf(&b, `<rect class="band" x="0" y="%d" width="%d" height="%d"/>`, y, tlLabel+tlWidth, tlRow)
		}
		fmt.Fprintf(&b, `<text class="label" x="4" y="%d">%s</text>`, y+tlRow-5, esc(l))
	}
	// The axis: a tick every step, labelled with the time.
	step := axisStep(span)
	for t := from.Truncate(step).Add(step); t.Before(now); t = t.Add(step) {
		fmt.Fprintf(&b, `<line class="tick" x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`, x(t), tlAxis-4, x(t), height-2)
		fmt.Fprintf(&b, `<text class="time" x="%.1f" y="%d" text-anchor="middle">%s</text>`, x(t), tlAxis-8, t.UTC().Format(axisLayout(step)))
	}
	for i := range drawn {
		r := &drawn[i]
		row := rowOf[key(r)]
		y := float64(tlAxis+row*tlRow) + float64(tlRow-tlBar)/2
		begin := r.Start // the bar starts when the run did (the order is by fire)
		if begin.IsZero() {
			begin = r.At()
		}
		x0 := x(begin)
		end := r.End
		if r.State == keyspace.StateRunning || end.IsZero() {
			end = now
		}
		if cut(r) && r.End.IsZero() {
			end = begin.Add(span / 200) // unknown: a sliver, then the cut
		}
		w := max(x(end)-x0, 2)
		class := resultClass(r)
		if r.Source == keyspace.SourceFailover {
			class += " failover"
		}
		rerunOf := ""
		if r.Source == "cut" { // drawn for a failover re-run (cutAttempts)
			rerunOf = fmt.Sprintf(` data-attempt="%d"`, r.Attempt)
		}
		title := runTitle(r)
		link := ""
		if r.Fence > 0 {
			link = "/jobs/" + url.PathEscape(job) + "?run=" + strconv.FormatInt(r.Fence, 10) + "-" + strconv.Itoa(r.Item) + "#log"
		}
		if link != "" {
			fmt.Fprintf(&b, `<a href="%s">`, esc(link))
		}
		switch {
		case r.State == keyspace.StateSkipped:
			fmt.Fprintf(&b, `<line class="run %s" data-run="%d-%d" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f"><title>%s</title></line>`,
				class, r.Fence, r.Item, x0, y, x0, y+tlBar, esc(title))
		case cut(r): // a bar whose end is a zigzag
			x1 := x0 + w
			fmt.Fprintf(&b, `<polygon class="run %s" data-run="%d-%d" data-item="%d"%s points="%.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f %.1f,%.1f"><title>%s</title></polygon>`,
				class, r.Fence, r.Item, r.Item, rerunOf, x0, y, x1, y, x1-3, y+tlBar/4, x1, y+tlBar/2, x1-3, y+3*tlBar/4, x1, y+tlBar, x0, y+tlBar, esc(title))
		default:
			fmt.Fprintf(&b, `<rect class="run %s" data-run="%d-%d" x="%.1f" y="%.1f" width="%.1f" height="%d" rx="2"><title>%s</title></rect>`,
				class, r.Fence, r.Item, x0, y, w, tlBar, esc(title))
		}
		if link != "" {
			b.WriteString(`</a>`)
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // built of numbers and escaped text
}

// cutAttempts are the runs that the failover re-runs among runs stand for
// and runs lack: a run cut by its instance's death has no record of its
// own once its re-run claimed the item (the re-run's record, attempt+1,
// replaces it), and its log is on the dead instance. Each is drawn from
// its fire to its re-run's start, cut.
func cutAttempts(runs []history.Run) []history.Run {
	type attemptKey struct {
		item    int
		fire    int64
		attempt int
	}
	have := map[attemptKey]bool{}
	for _, r := range runs {
		have[attemptKey{r.Item, r.Fire.UnixNano(), r.Attempt}] = true
	}
	var out []history.Run
	for _, r := range runs {
		k := attemptKey{r.Item, r.Fire.UnixNano(), r.Attempt - 1}
		if r.Source != keyspace.SourceFailover || r.Attempt < 2 || have[k] || r.Start.IsZero() {
			continue
		}
		have[k] = true
		c := history.Run{ItemRecord: keyspace.ItemRecord{Job: r.Job, Item: r.Item, Fire: r.Fire, Attempt: r.Attempt - 1, Start: r.Fire, End: r.Start,
			State: history.StateUnknown, Source: "cut", Error: fmt.Sprintf("cut by its instance's failure; from its fire to its re-run (attempt %d, run %d-%d), which etcd records instead", r.Attempt, r.Fence, r.Item)}}
		if c.Start.After(c.End) {
			c.Start = c.End
		}
		out = append(out, c)
	}
	return out
}

// runTitle is a run's tooltip.
func runTitle(r *history.Run) string {
	if r.Source == "cut" {
		return fmt.Sprintf("item %d, fire %s, attempt %d: %s", r.Item, r.Fire.UTC().Format(time.RFC3339), r.Attempt, r.Error)
	}
	s := fmt.Sprintf("item %d, fire %s, on %s, attempt %d, %s: %s", r.Item, r.Fire.UTC().Format(time.RFC3339), r.Instance, r.Attempt, r.Source, result(r.ItemRecord))
	if !r.Start.IsZero() && !r.End.IsZero() {
		s += fmt.Sprintf(" in %s", r.End.Sub(r.Start).Round(time.Millisecond))
	}
	if r.Fence > 0 {
		s += fmt.Sprintf(" (run %d-%d)", r.Fence, r.Item)
	}
	if r.Error != "" { // whole: a tooltip has room
		s += ": " + r.Error
	}
	if r.LastLine != "" && r.LastLine != r.Error {
		s += "; its last line: " + r.LastLine
	}
	return s
}

// axisStep is the time between the axis's ticks: about 6 over span.
func axisStep(span time.Duration) time.Duration {
	for _, s := range []time.Duration{5 * time.Second, 10 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute, 10 * time.Minute,
		30 * time.Minute, time.Hour, 3 * time.Hour, 6 * time.Hour, 24 * time.Hour} {
		if span/s <= 8 {
			return s
		}
	}
	return 7 * 24 * time.Hour
}

func axisLayout(step time.Duration) string {
	switch {
	case step < time.Minute:
		return "15:04:05"
	case step < 24*time.Hour:
		return "15:04"
	}
	return "01-02"
}

func esc(s string) string { return template.HTMLEscapeString(s) }

// Geometry of the chart of runs per hour.
const (
	chWidth  = 900
	chHeight = 160
	chLeft   = 50
	chBottom = 22
)

// hoursSVG draws the runs (and, over them, the failures) of each hour.
func hoursSVG(hours []history.Hour) template.HTML {
	if len(hours) == 0 {
		return ""
	}
	top := 1
	for _, h := range hours {
		top = max(top, h.Runs)
	}
	top = niceCeil(top)
	var b strings.Builder
	w, h := chLeft+chWidth+10, chHeight+chBottom+10
	fmt.Fprintf(&b, `<svg id="hours" class="hours" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-labelledby="hours-title">`, w, h, w, h)
	fmt.Fprintf(&b, `<title id="hours-title">Runs and failures per hour, %s to %s (UTC)</title>`, hours[0].Start.UTC().Format("Jan 2 15:04"), hours[len(hours)-1].Start.Add(time.Hour).UTC().Format("Jan 2 15:04"))
	y := func(n int) float64 { return 5 + float64(chHeight)*(1-float64(n)/float64(top)) }
	for _, n := range []int{0, top / 2, top} {
		fmt.Fprintf(&b, `<line class="tick" x1="%d" y1="%.1f" x2="%d" y2="%.1f"/><text class="time" x="%d" y="%.1f" text-anchor="end">%d</text>`,
			chLeft, y(n), chLeft+chWidth, y(n), chLeft-4, y(n)+4, n)
	}
	slot := float64(chWidth) / float64(len(hours))
	for i, hr := range hours {
		x := float64(chLeft) + slot*float64(i)
		label := fmt.Sprintf("%s: %d runs, %d failed", hr.Start.UTC().Format("Jan 2 15:04"), hr.Runs, hr.Failures)
		fmt.Fprintf(&b, `<g class="hour" data-hour="%s" data-runs="%d" data-failures="%d"><title>%s</title>`, hr.Start.UTC().Format(time.RFC3339), hr.Runs, hr.Failures, esc(label))
		fmt.Fprintf(&b, `<rect class="runs" x="%.1f" y="%.1f" width="%.1f" height="%.1f"/>`, x+1, y(hr.Runs), slot-2, y(0)-y(hr.Runs))
		if hr.Failures > 0 {
			fmt.Fprintf(&b, `<rect class="failures" x="%.1f" y="%.1f" width="%.1f" height="%.1f"/>`, x+1, y(hr.Failures), slot-2, y(0)-y(hr.Failures))
		}
		b.WriteString(`</g>`)
		if i%3 == 0 {
			fmt.Fprintf(&b, `<text class="time" x="%.1f" y="%d" text-anchor="middle">%s</text>`, x+slot/2, chHeight+chBottom, hr.Start.UTC().Format("15:04"))
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// niceCeil rounds n up to 1, 2 or 5 times a power of ten.
func niceCeil(n int) int {
	for p := 1; ; p *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*p >= n {
				return m * p
			}
		}
	}
}
