package history

// Review tests (breaker): paging that loses rows. Each test pages a job's
// history the way the console's "Older runs" and `shardd history --before`
// do, and checks that every run is shown exactly once.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runlog"
)

// pageAll pages through the answers of ask (one call per page, so the
// rows may change between pages, as they do between HTTP requests) and
// returns how often each run (fence-item) was shown.
func pageAll(t *testing.T, limit int, ask func(page int, q Query) Answer) map[string]int {
	t.Helper()
	seen := map[string]int{}
	q := Query{Item: -1, Limit: limit}
	for page := 0; page < 50; page++ {
		ans := ask(page, q)
		for _, r := range ans.Runs {
			seen[fmt.Sprintf("%d-%d", r.Fence, r.Item)]++
		}
		if ans.Next == "" {
			return seen
		}
		c, err := ParseCursor(ans.Next)
		if err != nil {
			t.Fatal(err)
		}
		q.Before = &c
	}
	t.Fatal("more than 50 pages")
	return nil
}

// A run in progress is ordered by its RUNNING record's Start, which the
// claim writes (the claim's time: for a run claimed ahead of its fire, up
// to 3 s before it starts). Its final record's Start is when its work
// started (Grant.Final: o.Start). So its place in the order moves up when
// it ends: a RUNNING row that was below the first page's cursor and ends
// before the second page is asked for jumps above the cursor and is on
// no page at all.
//
// Here: a fire of 5 items, claimed ahead at fire-1s; items 1-4 started at
// fire+1..4ms and are done; item 0 is still running when page 1 (limit 2)
// is read, and ends (it started at fire+5ms) before page 2 is.
func TestReviewRunningRowThatEndsBetweenPagesIsOnNoPage(t *testing.T) {
	fire := t0
	claim := fire.Add(-time.Second)
	done := func(item int, fence int64, startMs int) keyspace.ItemRecord {
		s := fire.Add(time.Duration(startMs) * time.Millisecond)
		return keyspace.ItemRecord{Job: "j", Item: item, Fire: fire, State: keyspace.StateDone, Attempt: 1, Fence: fence, Start: s, End: s.Add(time.Millisecond), Sched: fire}
	}
	finished := []keyspace.ItemRecord{done(1, 101, 1), done(2, 102, 2), done(3, 103, 3), done(4, 104, 4)}
	running := keyspace.ItemRecord{Job: "j", Item: 0, Fire: fire, State: keyspace.StateRunning, Attempt: 1, Fence: 100, Start: claim, Sched: fire} // the claim's record
	ended := done(0, 100, 5)                                                                                                                       // Grant.Final: Start is the work's start

	seen := pageAll(t, 2, func(page int, q Query) Answer {
		recs := append([]keyspace.ItemRecord{}, finished...)
		if page == 0 {
			recs = append(recs, running)
		} else {
			recs = append(recs, ended) // it ended between the two requests
		}
		return Gather(context.Background(), recs, nil, nil, q)
	})
	if seen["100-0"] != 1 {
		t.Errorf("run 100-0 (running on page 1, ended before page 2) shown %d times, want once; shown: %v", seen["100-0"], seen)
	}
}

// Local stops reading logs once a log's mtime is older than the page's
// floor, assuming "a run starts before its log was last modified". That
// is false when the wall clock stepped back during the run (NTP step, VM
// resume): the end record's start= is the old clock, the file's mtime the
// new one. Such a run is then on no page: page 1 stops before reading its
// log, and on page 2 its start is above the cursor.
//
// The clock step is simulated with os.Chtimes; a new store lists the
// directory (as after a restart) and orders the logs by their mtimes.
func TestReviewLocalEarlyStopLosesARunWhoseLogIsOlderThanItsStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "runs")
	store, err := runlog.New(dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Truncate(time.Second)
	// Runs A, B, C started at now-30s, now-20s, now-10s. C ended while the
	// clock read 60 s less than before (its mtime: now-60s).
	type lg struct {
		fence int64
		start time.Duration
		mtime time.Duration
	}
	logs := []lg{{10, -30 * time.Second, -25 * time.Second}, {11, -20 * time.Second, -15 * time.Second}, {12, -10 * time.Second, -60 * time.Second}}
	for _, l := range logs {
		w, err := store.Create(runlog.Header{Job: "j", Item: 0, Fence: l.fence, Fire: now.Add(l.start), Attempt: 1, Source: "NORMAL", Instance: "a"}, runlog.Retention{})
		if err != nil {
			t.Fatal(err)
		}
		s := now.Add(l.start)
		if err := w.Close(runlog.End{State: "DONE", ExitCode: 0, Start: s, Finish: s.Add(time.Second)}.String()); err != nil {
			t.Fatal(err)
		}
		m := now.Add(l.mtime)
		if err := os.Chtimes(store.Path("j", runlog.RunID{Fence: l.fence}), m, m); err != nil {
			t.Fatal(err)
		}
	}
	store.Close()
	store, err = runlog.New(dir) // a restart: the index is the directory's listing
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()

	seen := pageAll(t, 1, func(_ int, q Query) Answer {
		rows, err := Local(store, "j", q)
		if err != nil {
			t.Fatal(err)
		}
		return Gather(context.Background(), nil, []keyspace.InstanceInfo{{ID: "a"}}, func(context.Context, keyspace.InstanceInfo, Query) ([]Run, error) { return rows, nil }, q)
	})
	for _, run := range []string{"10-0", "11-0", "12-0"} {
		if seen[run] != 1 {
			t.Errorf("run %s shown %d times, want once (all shown: %v)", run, seen[run], seen)
		}
	}
}

// An instance answers with its n = limit+1 newest rows by the logs' own
// order; the merge then places a run etcd also records by etcd's record.
// The two orders differ for a run in progress: its log row is at its
// StartAt (a run claimed ahead: its fire) or its header's time, etcd's
// RUNNING record at its claim's time, earlier. The rows such runs take
// from the instance's page push out log-only rows (runs etcd no longer
// records: rotated out, or after an etcd restore, which the operations doc
// says the run logs' history survives) that belong on the merged page, and
// the page's cursor then passes below them: they are on no page.
func TestReviewInstancePageCutByTheLogsOrderLosesLogOnlyRows(t *testing.T) {
	fire := t0.Add(time.Minute)
	claim := fire.Add(-3 * time.Second) // claimed ahead, the longest lead
	// Runs in progress of items 1 and 2, claimed ahead, let go at the fire.
	prep := func(item int, fence int64) (keyspace.ItemRecord, Run) {
		rec := keyspace.ItemRecord{Job: "j", Item: item, Fire: fire, State: keyspace.StateRunning, Attempt: 1, Fence: fence, Start: claim}
		row := Run{ItemRecord: rec, Log: "x"}
		row.Start = fire // FromSummary: StartAt, after the header's time
		return rec, row
	}
	r1, l1 := prep(1, 201)
	r2, l2 := prep(2, 202)
	// Runs etcd no longer records (etcd restored from a snapshot), only in
	// this instance's logs, that started between the claims and the fire.
	old := func(item int, fence int64, before time.Duration) Run {
		s := fire.Add(-before)
		return Run{ItemRecord: keyspace.ItemRecord{Job: "j", Item: item, Fire: s, State: keyspace.StateDone, Attempt: 1, Fence: fence, Start: s, End: s.Add(10 * time.Millisecond)}, Log: "y"}
	}
	logRows := []Run{l1, l2, old(3, 150, time.Second), old(4, 151, 2*time.Second)}
	recs := []keyspace.ItemRecord{r1, r2}

	seen := pageAll(t, 2, func(_ int, q Query) Answer {
		fetch := func(_ context.Context, _ keyspace.InstanceInfo, q Query) ([]Run, error) {
			page, _ := Page(logRows, Query{Item: q.Item, Since: q.Since, Result: q.Result, Before: q.Before, Limit: q.limit() + 1}) // what Local answers
			return page, nil
		}
		return Gather(context.Background(), recs, []keyspace.InstanceInfo{{ID: "a"}}, fetch, q)
	})
	for _, run := range []string{"201-1", "202-2", "150-3", "151-4"} {
		if seen[run] != 1 {
			t.Errorf("run %s shown %d times, want once (all shown: %v)", run, seen[run], seen)
		}
	}
}
