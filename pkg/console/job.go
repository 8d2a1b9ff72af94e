package console

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/history"
	"github.com/shardd/shardd/pkg/runlog"
	sched "github.com/shardd/shardd/pkg/schedule"
)

type jobData struct {
	Job       admin.JobStatus
	Schedule  schedule
	Failover  bool
	Items     []itemRow
	Instances []instanceFor
	History   []history.Run
	// Filters of the history, and where its page begins (a cursor).
	Item, Result, Source, Since, Before string
	// Older is the link to the next page, "" on the last one.
	Older            template.URL
	Results, Sources []string
	HistoryNote      string
	// Run is the run whose log is shown ("FENCE-ITEM"), "" for none.
	Run string
	// Description and Definition (indented JSON) say what the job is;
	// PastFires are its latest fires, to re-run, in its time zone.
	Description string
	Definition  string
	PastFires   []string
	// Timeline draws the history's runs (SVG).
	Timeline template.HTML
}

// errorData is an error page's way on.
type errorData struct {
	Link, LinkText string
}

// pastFires returns the job's last n fires before now, newest first, as
// the re-run form takes them: in the job's time zone, with the offset
// where the clocks show that time twice (a schedule that follows the
// clock fires at both).
func pastFires(j *config.Job, now time.Time, n int) []string {
	if j.Schedule == nil {
		return nil
	}
	loc := j.Location
	if loc == nil {
		loc = time.UTC
	}
	var fires []time.Time
	for span := time.Hour; span <= 400*24*time.Hour && len(fires) < n; span *= 4 {
		fires = fires[:0]
		for t := j.Schedule.Next(now.Add(-span)); !t.IsZero() && !t.After(now); t = j.Schedule.Next(t) {
			fires = append(fires, t)
		}
	}
	var out []string
	for i := len(fires) - 1; i >= 0 && len(out) < n; i-- {
		f := fires[i].In(loc)
		if at, _ := sched.Instants(loc, f); len(at) > 1 {
			out = append(out, f.Format(time.RFC3339))
			continue
		}
		out = append(out, f.Format("2006-01-02 15:04:05"))
	}
	return out
}

type itemRow struct {
	admin.ItemStatus
	Disabled  bool
	RunningOn string
	// RunningFence is the fence of the run in progress: its Kill button
	// names it, so that a kill from this page never stops a later run.
	RunningFence int64
	Last         *keyspace.ItemRecord
	Result       string
	LogRun       string
}

type instanceFor struct {
	ID       string
	Eligible bool
	Disabled bool
}

func (c *console) job(r *http.Request, v *view) (string, error) {
	name := r.PathValue("job")
	ctx, cancel := c.ctx(r)
	defer cancel()
	st, err := c.o.Admin.JobStatus(ctx, name)
	if err != nil {
		return "", err
	}
	idx := slices.IndexFunc(st.Jobs, func(j admin.JobStatus) bool { return j.Name == name })
	if idx < 0 {
		return c.unknownJob(name, v), nil
	}
	js := st.Jobs[idx]
	runs, err := c.o.Admin.JobRuns(ctx, []string{name})
	if err != nil {
		return "", err
	}
	q := r.URL.Query()
	d := jobData{Job: js, Item: q.Get("item"), Result: q.Get("result"), Source: q.Get("source"), Since: q.Get("since"), Before: q.Get("before"),
		Results: append([]string{""}, history.Results...),
		Sources: []string{"", keyspace.SourceNormal, keyspace.SourceMisfire, keyspace.SourceFailover, keyspace.SourceManual, keyspace.SourceUpstream}}
	if run := q.Get("run"); run != "" {
		if _, _, ok := runlog.ParseRun(run); ok {
			d.Run = run
		} else {
			d.HistoryNote = "run " + strconv.Quote(run) + " is not a run (FENCE-ITEM, as the history's log links give it)"
		}
	}
	def := []byte(nil)
	if js.Definition != nil {
		def = js.Definition.Job
	}
	if j := definition(def, name); j != nil {
		d.Schedule, d.Failover, d.Description = scheduleOf(j, v.Now, 3), j.Failover, j.Description
		d.PastFires = pastFires(j, v.Now, 10)
	}
	if len(def) > 0 {
		var pretty bytes.Buffer
		if json.Indent(&pretty, def, "", "  ") == nil {
			d.Definition = pretty.String()
		}
	}
	jr := runs[name]
	d.Items, d.Instances = itemRows(js, jr), instancesFor(js)
	c.history(ctx, &d, jr, v.Now, v.Caller)
	d.Timeline = timelineSVG(name, d.History, js.Total, v.Now)
	v.Title, v.Nav, v.Data = name, "jobs", d
	return "job", nil
}

// unknownJob is the page of a job the cluster does not have: a near name
// the snapshot knows, or a search.
func (c *console) unknownJob(name string, v *view) string {
	v.Status, v.Error = http.StatusNotFound, "no job "+strconv.Quote(name)+" in the cluster"
	if snap := c.snap.current(); snap != nil {
		names := make([]string, len(snap.rows))
		for i, row := range snap.rows {
			names[i] = row.Name
		}
		if near, ok := config.Nearest(name, names); ok {
			v.Error += " (did you mean " + near + "?)"
			v.Data = errorData{Link: "/jobs/" + url.PathEscape(near), LinkText: near}
			return "error"
		}
	}
	v.Data = errorData{Link: "/jobs?q=" + url.QueryEscape(name), LinkText: "search the jobs for " + strconv.Quote(name)}
	return "error"
}

// itemRows are the rows of js's items, with what each did last (jr).
func itemRows(js admin.JobStatus, jr admin.JobRuns) []itemRow {
	var out []itemRow
	off := map[int]bool{}
	for _, i := range js.DisabledItems {
		off[i] = true
	}
	for _, it := range js.Items {
		row := itemRow{ItemStatus: it, Disabled: off[it.Item], RunningOn: jr.Running[it.Item]}
		if rec, ok := jr.Records[it.Item]; ok && !rec.Begins() {
			row.Last, row.Result = &rec, result(rec)
			if row.RunningOn != "" && rec.State == keyspace.StateRunning {
				row.RunningFence = rec.Fence
			}
			if rec.Fence > 0 {
				row.LogRun = strconv.FormatInt(rec.Fence, 10) + "-" + strconv.Itoa(it.Item)
			}
		}
		out = append(out, row)
	}
	return out
}

// instancesFor are the instances eligible for js or disabled for it,
// sorted by id.
func instancesFor(js admin.JobStatus) []instanceFor {
	var out []instanceFor
	ids := map[string]*instanceFor{}
	for _, id := range js.Eligible {
		ids[id] = &instanceFor{ID: id, Eligible: true}
	}
	for _, id := range js.DisabledInstances {
		if ids[id] == nil {
			ids[id] = &instanceFor{ID: id}
		}
		ids[id].Disabled = true
	}
	for _, in := range ids {
		out = append(out, *in)
	}
	slices.SortFunc(out, func(a, b instanceFor) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// history fills d's history, a page of it, from the filters (d.Item,
// d.Result, d.Source, d.Since, d.Before), with the runs in progress (jr);
// a filter that does not parse is said in d.HistoryNote and dropped.
// The other instances are asked with a read token for caller.
func (c *console) history(ctx context.Context, d *jobData, jr admin.JobRuns, now time.Time, caller *auth.Caller) {
	q := history.Query{Item: -1, Result: d.Result}
	if d.Item != "" {
		if n, err := strconv.Atoi(d.Item); err == nil && n >= 0 {
			q.Item = n
		} else {
			d.HistoryNote = "item must be a number; showing every item"
			d.Item = ""
		}
	}
	if d.Since != "" {
		if t, err := history.ParseSince(d.Since, now); err == nil {
			q.Since = t
		} else {
			d.HistoryNote, d.Since = "since must be a duration like 1h, 30m or 7d, or a date; showing all", ""
		}
	}
	if d.Before != "" {
		if cur, err := history.ParseCursor(d.Before); err == nil {
			q.Before = &cur
		} else {
			d.HistoryNote, d.Before = "before: "+err.Error()+"; showing the newest", ""
		}
	}
	var ans history.Answer
	var err error
	if c.o.History != nil {
		ans, err = c.o.History(ctx, d.Job.Name, q, c.o.Auth.ReadSecret(caller))
	} else { // etcd's records alone
		var recs []keyspace.ItemRecord
		recs, err = c.o.Admin.History(ctx, d.Job.Name, q.Item)
		for _, rec := range jr.Records { // runs in progress: history has them when they end
			if rec.State == keyspace.StateRunning {
				recs = append(recs, rec)
			}
		}
		ans = history.Gather(ctx, recs, nil, nil, q)
	}
	if err != nil {
		d.HistoryNote = err.Error()
	}
	for _, id := range slices.Sorted(maps.Keys(ans.Unreachable)) {
		d.HistoryNote += fmt.Sprintf(" Instance %s was not reached (its runs older than etcd's last %d per item are missing): %s.", id, keyspace.HistoryPerItem, ans.Unreachable[id])
	}
	d.HistoryNote = strings.TrimSpace(d.HistoryNote)
	for _, r := range ans.Runs {
		if d.Source == "" || r.Source == d.Source {
			d.History = append(d.History, r)
		}
	}
	if ans.Next != "" {
		v := url.Values{"before": {ans.Next}}
		for k, val := range map[string]string{"item": d.Item, "result": d.Result, "source": d.Source, "since": d.Since} {
			if val != "" {
				v.Set(k, val)
			}
		}
		d.Older = template.URL("/jobs/" + url.PathEscape(d.Job.Name) + "?" + v.Encode() + "#hist-h") // escaped here
	}
}
