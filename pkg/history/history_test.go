package history

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runlog"
)

var t0 = time.Date(2026, 12, 4, 2, 0, 0, 0, time.UTC)

// run is a row of item's run under fence, started at t0 + sec seconds.
func run(item int, fence int64, sec int, state string) Run {
	at := t0.Add(time.Duration(sec) * time.Second)
	return Run{ItemRecord: keyspace.ItemRecord{Job: "j", Item: item, Fence: fence, Attempt: 1, Fire: at, Start: at, End: at.Add(time.Second), State: state}}
}

func fences(rows []Run) []int64 {
	out := make([]int64, len(rows))
	for i, r := range rows {
		out[i] = r.Fence
	}
	return out
}

func TestMergeMakesOneRowOfARunBothKnow(t *testing.T) {
	rec := run(0, 10, 0, keyspace.StateKilled).ItemRecord
	rec.Reason = keyspace.ReasonFence // the settled record of a cut run
	fromLog := run(0, 10, 0, StateUnknown)
	fromLog.Log, fromLog.LastLine = "10-0", "half way"
	fromLog.Tries = []runlog.Try{{Start: t0, Finish: t0.Add(time.Second)}}
	other := run(0, 11, 5, keyspace.StateDone)
	skip := keyspace.ItemRecord{Job: "j", Item: 0, Fire: t0.Add(9 * time.Second), State: keyspace.StateSkipped, Skipped: 2} // no fence
	got := Merge([]keyspace.ItemRecord{rec, skip}, []Run{fromLog}, []Run{other})
	if len(got) != 3 {
		t.Fatalf("%d rows, want 3: %+v", len(got), got)
	}
	if r := got[0]; !r.Recorded || r.State != keyspace.StateKilled || r.Log != "10-0" || r.LastLine != "half way" || len(r.Tries) != 1 {
		t.Errorf("the run both know: %+v; want etcd's state with the log's detail", r)
	}
	if r := got[2]; r.Recorded || r.Fence != 11 {
		t.Errorf("a run only a log knows: %+v", r)
	}
	// A later attempt of the same fire and fence is another run.
	again := run(0, 10, 0, keyspace.StateDone)
	again.Attempt = 2
	if got := Merge([]keyspace.ItemRecord{rec}, []Run{again}); len(got) != 2 {
		t.Errorf("attempt 2 merged into attempt 1: %+v", got)
	}
}

func TestPageOrdersNewestFirstAndCutsWithACursor(t *testing.T) {
	rows := []Run{run(0, 1, 0, "DONE"), run(1, 1, 0, "DONE"), run(0, 2, 10, "FAILED"), run(0, 3, 20, "DONE"), run(1, 3, 20, "FAILED")}
	skip := Run{ItemRecord: keyspace.ItemRecord{Item: 2, Fire: t0.Add(15 * time.Second), State: "SKIPPED"}}
	rows = append(rows, skip)
	cases := []struct {
		name string
		q    Query
		want []int64 // fences of the page
		next bool
	}{
		{"everything", Query{Item: -1}, []int64{3, 3, 0, 2, 1, 1}, false},
		{"one item", Query{Item: 1}, []int64{3, 1}, false},
		{"failures", Query{Item: -1, Result: "FAILED"}, []int64{3, 2}, false},
		{"since", Query{Item: -1, Since: t0.Add(10 * time.Second)}, []int64{3, 3, 0, 2}, false},
		{"a page of two", Query{Item: -1, Limit: 2}, []int64{3, 3}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			page, next := Page(rows, tc.q)
			if got := fences(page); !reflect.DeepEqual(got, tc.want) || (next != nil) != tc.next {
				t.Errorf("page %v (next %v), want %v (next: %v)", got, next, tc.want, tc.next)
			}
		})
	}
	// Paging by the cursor visits every row once, in order, ties (the
	// two items of fence 1 and 3 started at once) included.
	var seen []string
	q := Query{Item: -1, Limit: 1}
	for range 10 {
		page, next := Page(rows, q)
		for _, r := range page {
			seen = append(seen, fmt.Sprintf("%d-%d", r.Fence, r.Item))
		}
		if next == nil {
			break
		}
		c, err := ParseCursor(next.String())
		if err != nil || c != *next {
			t.Fatalf("cursor %s read back as %v, %v", next, c, err)
		}
		q.Before = &c
	}
	if want := []string{"3-1", "3-0", "0-2", "2-0", "1-1", "1-0"}; !reflect.DeepEqual(seen, want) {
		t.Errorf("paged through %v, want %v", seen, want)
	}
}

// Merging each source's first page gives the first page of everything:
// the property that lets Gather ask each instance for one page only.
func TestMergedPagesAreThePagesOfTheWhole(t *testing.T) {
	var all []Run
	sources := make([][]Run, 3)
	for i := range 60 {
		r := run(i%4, int64(100+i), (i*7)%45, []string{"DONE", "FAILED"}[i%3/2])
		all = append(all, r)
		sources[i%3] = append(sources[i%3], r)
	}
	for _, q := range []Query{{Item: -1, Limit: 7}, {Item: 2, Limit: 3}, {Item: -1, Limit: 5, Result: "FAILED"}} {
		want, _ := Page(all, q)
		var firsts [][]Run
		for _, src := range sources {
			p, _ := Page(src, Query{Item: q.Item, Limit: q.Limit + 1, Result: q.Result})
			firsts = append(firsts, p)
		}
		got, _ := Page(Merge(nil, firsts...), q)
		if !reflect.DeepEqual(fences(got), fences(want)) {
			t.Errorf("%+v: merged first pages %v, the whole's first page %v", q, fences(got), fences(want))
		}
	}
}

func TestParseQuery(t *testing.T) {
	now := t0
	cases := []struct {
		query string
		want  Query
		err   string
	}{
		{"", Query{Item: -1}, ""},
		{"item=2&since=10m&result=failed&limit=5", Query{Item: 2, Since: now.Add(-10 * time.Minute), Result: "FAILED", Limit: 5}, ""},
		{"since=7d", Query{Item: -1, Since: now.Add(-7 * 24 * time.Hour)}, ""},
		{"since=2026-12-01", Query{Item: -1, Since: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}, ""},
		{"since=2026-12-01T10:00:00%2B01:00", Query{Item: -1, Since: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}, ""},
		{"item=-1", Query{}, "item must be"},
		{"since=yesterday", Query{}, "since must be"},
		{"since=-5m", Query{}, "since must be"},
		{"result=LOST", Query{}, "result must be one of"},
		{"limit=0", Query{}, "limit must be"},
		{"limit=1001", Query{}, "limit must be"},
		{"before=2026", Query{}, "before: cursor"},
	}
	for _, tc := range cases {
		v, _ := url.ParseQuery(tc.query)
		q, err := ParseQuery(v, now)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: error %v, want one containing %q", tc.query, err, tc.err)
			}
			continue
		}
		if err != nil || q.Item != tc.want.Item || !q.Since.Equal(tc.want.Since) || q.Result != tc.want.Result || q.Limit != tc.want.Limit {
			t.Errorf("%q: %+v, %v; want %+v", tc.query, q, err, tc.want)
		}
		// Values gives the query back.
		back, err := ParseQuery(q.Values(), now)
		if err != nil || back.Item != q.Item || !back.Since.Equal(q.Since) || back.Result != q.Result || back.limit() != q.limit() {
			t.Errorf("%q: Values %v read back as %+v, %v", tc.query, q.Values(), back, err)
		}
	}
}

func FuzzParseCursor(f *testing.F) {
	f.Add(Cursor{At: t0, Fence: 12, Item: 3, Attempt: 1}.String())
	f.Add("x/1/2/3")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCursor(s)
		if err != nil {
			return
		}
		back, err := ParseCursor(c.String())
		if err != nil || back.compare(c) != 0 {
			t.Fatalf("%q: %+v printed %q, read back %+v, %v", s, c, c.String(), back, err)
		}
	})
}

// Local answers from real run logs: a finished run, one in progress, one
// cut (no end record), newest first, a page at most.
func TestLocalReadsTheRunLogs(t *testing.T) {
	store, err := runlog.New(filepath.Join(t.TempDir(), "runs"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	write := func(fence int64, item int, end *runlog.End) *runlog.Log {
		l, err := store.Create(runlog.Header{Job: "j", Item: item, Fence: fence, Fire: t0, Attempt: 1, Source: "NORMAL", Instance: "a"}, runlog.Retention{})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(l.Stderr(), "line of", fence)
		if end != nil {
			e := *end
			e.Last = l.LastLine()
			l.Close(e.String())
		}
		return l
	}
	for i := range 5 {
		at := time.Now().Add(time.Duration(i-10) * time.Second)
		write(int64(10+i), i%2, &runlog.End{State: "DONE", ExitCode: 0, Start: at, Finish: at.Add(time.Second)})
		time.Sleep(5 * time.Millisecond)
	}
	write(20, 0, nil).Close("") // cut: no end record
	open := write(21, 1, nil)
	defer open.Close("")

	rows, err := Local(store, "j", Query{Item: -1, Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := fences(rows); !reflect.DeepEqual(got, []int64{21, 20, 14, 13}) {
		t.Fatalf("rows %v, want the run in progress, the cut one, then the newest two finished (a page and one more)", got)
	}
	if rows[0].State != keyspace.StateRunning || rows[1].State != StateUnknown || rows[2].State != "DONE" || rows[2].LastLine != "line of 14" || rows[2].Log != "14-0" {
		t.Errorf("rows: %+v", rows)
	}
	rows, _ = Local(store, "j", Query{Item: 1, Result: "DONE"})
	if got := fences(rows); !reflect.DeepEqual(got, []int64{13, 11}) {
		t.Errorf("item 1's DONE runs: %v", got)
	}
}

func TestGatherNamesTheInstancesItCouldNotAsk(t *testing.T) {
	peers := []keyspace.InstanceInfo{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	fetch := func(ctx context.Context, in keyspace.InstanceInfo, q Query) ([]Run, error) {
		switch in.ID {
		case "a":
			return []Run{run(0, 5, 5, "DONE"), run(0, 3, 3, "DONE")}, nil
		case "b":
			return []Run{run(1, 4, 4, "FAILED")}, nil
		}
		return nil, errors.New("its API at http://c:8080 did not answer")
	}
	recs := []keyspace.ItemRecord{run(0, 5, 5, "DONE").ItemRecord, run(1, 6, 6, "RUNNING").ItemRecord}
	ans := Gather(context.Background(), recs, peers, fetch, Query{Item: -1, Limit: 3})
	if got := fences(ans.Runs); !reflect.DeepEqual(got, []int64{6, 5, 4}) || ans.Next == "" {
		t.Errorf("runs %v next %q, want 6 5 4 and a next page", got, ans.Next)
	}
	if len(ans.Unreachable) != 1 || !strings.Contains(ans.Unreachable["c"], "did not answer") {
		t.Errorf("unreachable: %v", ans.Unreachable)
	}
}

func TestHoursCountTheLastDay(t *testing.T) {
	h := NewHours()
	now := time.Date(2026, 12, 4, 10, 30, 0, 0, time.UTC)
	h.Add(now.Add(-time.Minute), false)
	h.Add(now.Add(-2*time.Minute), true)
	h.Add(now.Add(-3*time.Hour), false)
	h.Add(now.Add(-25*time.Hour), true) // a day before: not in the day
	day, complete := h.Day(now)
	if len(day) != Day || !day[Day-1].Start.Equal(time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)) || complete {
		t.Fatalf("day: %d hours, the last at %s, complete %v", len(day), day[Day-1].Start, complete)
	}
	if last := day[Day-1]; last.Runs != 2 || last.Failures != 1 {
		t.Errorf("this hour: %+v", last)
	}
	if three := day[Day-4]; three.Runs != 1 || three.Failures != 0 {
		t.Errorf("3 hours ago: %+v", three)
	}
	total := 0
	for _, hr := range day {
		total += hr.Runs
	}
	if total != 3 {
		t.Errorf("%d runs in the day, want 3", total)
	}
	// Two instances asked across an hour's start sum hour by hour.
	other := NewHours()
	other.Add(now.Add(40*time.Minute), true) // 11:10, the next hour
	d2, _ := other.Day(now.Add(40 * time.Minute))
	sum := SumHours(day, d2)
	if len(sum) != Day || sum[Day-1].Runs != 1 || sum[Day-2].Runs != 2 || !sum[Day-1].Start.Equal(time.Date(2026, 12, 4, 11, 0, 0, 0, time.UTC)) {
		t.Errorf("sum: last %+v, before %+v", sum[Day-1], sum[Day-2])
	}
}

// Seed counts the runs of the logs that ended before the process began,
// in the last day, by their end record.
func TestHoursSeedFromTheRunLogs(t *testing.T) {
	store, err := runlog.New(filepath.Join(t.TempDir(), "runs"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	for i, state := range []string{"DONE", "FAILED", "DONE"} {
		l, err := store.Create(runlog.Header{Job: []string{"a", "b", "a"}[i], Item: 0, Fence: int64(10 + i), Fire: time.Now(), Attempt: 1, Source: "NORMAL", Instance: "x"}, runlog.Retention{})
		if err != nil {
			t.Fatal(err)
		}
		l.Close(runlog.End{State: state, ExitCode: 0, Finish: time.Now()}.String())
	}
	open, _ := store.Create(runlog.Header{Job: "a", Item: 1, Fence: 20, Fire: time.Now(), Attempt: 1, Source: "NORMAL", Instance: "x"}, runlog.Retention{})
	defer open.Close("")
	h := NewHours()
	if err := h.Seed(store, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	day, complete := h.Day(time.Now())
	var sum Hour
	for _, hr := range day {
		sum.Runs, sum.Failures = sum.Runs+hr.Runs, sum.Failures+hr.Failures
	}
	if sum.Runs != 3 || sum.Failures != 1 || !complete {
		t.Errorf("seeded: %+v, complete %v; want 3 runs, 1 failure (the run in progress is Added when it ends)", sum, complete)
	}
}
