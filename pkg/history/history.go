// Package history gives a job's runs as one list, newest first, as long as
// the run logs keep them.
//
// Two sources describe a run. etcd keeps each item's last
// keyspace.HistoryPerItem records (the run in progress among them), read
// by every instance and command alike. Each instance keeps the log of
// every run it made (package runlog), bounded by the job's logRetention;
// a log's header and end record describe its run (runlog.Summary). A
// query (Query: item, since, result, a page's size and where it starts)
// is answered by
//
//  1. each live instance, from its own logs (Local), through its API
//     (GET /api/v1/jobs/{job}/runs), newest first, one page at most;
//  2. merged with etcd's records (Merge): a run both know is one row, with
//     etcd's record of how it ended (the settled record of a run cut by a
//     kill -9 is only there) and its log's detail (each try, the last
//     output line, the log's name);
//  3. cut to the page (Page), with the cursor of the next one.
//
// Each source returns at most a page of the rows below the cursor, newest
// first, so the first page of their merge is the merged history's: paging
// through every instance costs a page per instance per page, however long
// the history. An instance that does not answer is named in the answer
// (Answer.Unreachable): its runs older than etcd's records are missing,
// and the answer says so, rather than looking complete.
//
// # Order
//
// Rows are ordered newest first by their fire (a manual run's: when it was
// triggered), then by fence, item and attempt, descending: a total order,
// so that a page's last row is a cursor (Cursor) that the next page
// starts below, whichever instance it came from. The key is the run's
// own, the same in every record of it: the claim's RUNNING record, the
// outcome, the log (a start time would not do: a run in progress is
// recorded with its claim's time and ends with its work's, so it would
// move between two pages and be on neither).
package history

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runlog"
)

// StateUnknown is the state of a run whose log has no end record and that
// etcd does not record: its instance died during it (kill -9, a crash);
// its failover re-run's claim took the item's record over, or the record
// has rotated out.
const StateUnknown = "UNKNOWN"

// Run is one row of a job's history: etcd's record of the run and what its
// log adds.
type Run struct {
	keyspace.ItemRecord
	// Tries are each try's span, when the run was retried.
	Tries []runlog.Try `json:"tries,omitempty"`
	// Log names the run's log (FENCE-ITEM, for shardd logs --run) when an
	// instance has it.
	Log string `json:"log,omitempty"`
	// Recorded says etcd has the run's record; false: the row is from the
	// run's log alone.
	Recorded bool `json:"recorded"`
}

// Limits of a page.
const (
	DefaultLimit = 100
	MaxLimit     = 1000
)

// Query chooses the rows of a job's history.
type Query struct {
	Item   int       // -1: every item
	Since  time.Time // zero: no bound; else only rows that fired at or after it
	Result string    // "": any; else a state (DONE, FAILED, KILLED, SKIPPED, RUNNING, UNKNOWN)
	Limit  int       // the page's size; 0: DefaultLimit
	Before *Cursor   // nil: from the newest; else only rows below it
	Fence  int64     // 0: any; else only the runs of that claim (shardd logs --run)
}

// Results are the states a query may ask for.
var Results = []string{keyspace.StateDone, keyspace.StateFailed, keyspace.StateKilled, keyspace.StateSkipped, keyspace.StateRunning, StateUnknown}

// Cursor is a row's place in the order (see Order in the package doc).
type Cursor struct {
	At      time.Time
	Fence   int64
	Item    int
	Attempt int
}

// String is the cursor as a query parameter: TIME/FENCE/ITEM/ATTEMPT.
func (c Cursor) String() string {
	return fmt.Sprintf("%s/%d/%d/%d", c.At.UTC().Format(time.RFC3339Nano), c.Fence, c.Item, c.Attempt)
}

// ParseCursor reads Cursor.String.
func ParseCursor(s string) (Cursor, error) {
	parts := strings.Split(s, "/")
	bad := fmt.Errorf("cursor %q: want TIME/FENCE/ITEM/ATTEMPT, as a page's next cursor says", s)
	if len(parts) != 4 {
		return Cursor{}, bad
	}
	at, err := time.Parse(time.RFC3339Nano, parts[0])
	if err != nil {
		return Cursor{}, bad
	}
	fence, err1 := strconv.ParseInt(parts[1], 10, 64)
	item, err2 := strconv.Atoi(parts[2])
	attempt, err3 := strconv.Atoi(parts[3])
	if errors.Join(err1, err2, err3) != nil {
		return Cursor{}, bad
	}
	return Cursor{At: at, Fence: fence, Item: item, Attempt: attempt}, nil
}

// At is when a row is ordered: its fire, else (a record without one) its
// start.
func (r *Run) At() time.Time {
	if !r.Fire.IsZero() {
		return r.Fire
	}
	return r.Start
}

// Cursor is r's place in the order.
func (r *Run) Cursor() Cursor {
	return Cursor{At: r.At(), Fence: r.Fence, Item: r.Item, Attempt: r.Attempt}
}

// compare orders cursors newest first.
func (c Cursor) compare(o Cursor) int {
	if n := o.At.Compare(c.At); n != 0 {
		return n
	}
	if n := cmp.Compare(o.Fence, c.Fence); n != 0 {
		return n
	}
	if n := cmp.Compare(o.Item, c.Item); n != 0 {
		return n
	}
	return cmp.Compare(o.Attempt, c.Attempt)
}

// limit is q's page size.
func (q Query) limit() int {
	if q.Limit <= 0 {
		return DefaultLimit
	}
	return min(q.Limit, MaxLimit)
}

// Match reports whether row r is one q asks for (its page aside).
func (q Query) Match(r *Run) bool {
	switch {
	case q.Item >= 0 && r.Item != q.Item:
		return false
	case !q.Since.IsZero() && r.At().Before(q.Since):
		return false
	case q.Result != "" && r.State != q.Result:
		return false
	case q.Before != nil && r.Cursor().compare(*q.Before) <= 0:
		return false
	case q.Fence > 0 && r.Fence != q.Fence:
		return false
	}
	return true
}

// Values is q as the query parameters of the API's history endpoints.
func (q Query) Values() url.Values {
	v := url.Values{}
	if q.Item >= 0 {
		v.Set("item", strconv.Itoa(q.Item))
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if q.Result != "" {
		v.Set("result", q.Result)
	}
	v.Set("limit", strconv.Itoa(q.limit()))
	if q.Before != nil {
		v.Set("before", q.Before.String())
	}
	if q.Fence > 0 {
		v.Set("fence", strconv.FormatInt(q.Fence, 10))
	}
	return v
}

// ParseQuery reads a query from its parameters (Values): item, since (a
// time, RFC 3339, or a duration back from now: 10m, 36h, 7d), result,
// limit and before (a cursor). Errors name the parameter.
func ParseQuery(v url.Values, now time.Time) (Query, error) {
	q := Query{Item: -1}
	if s := v.Get("item"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return q, fmt.Errorf("item must be a non-negative integer, got %q", s)
		}
		q.Item = n
	}
	if s := v.Get("since"); s != "" {
		t, err := ParseSince(s, now)
		if err != nil {
			return q, err
		}
		q.Since = t
	}
	if s := v.Get("result"); s != "" {
		r := strings.ToUpper(s)
		if !slices.Contains(Results, r) {
			return q, fmt.Errorf("result must be one of %s, got %q", strings.Join(Results, ", "), s)
		}
		q.Result = r
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 || n > MaxLimit {
			return q, fmt.Errorf("limit must be an integer from 1 to %d, got %q", MaxLimit, s)
		}
		q.Limit = n
	}
	if s := v.Get("before"); s != "" {
		c, err := ParseCursor(s)
		if err != nil {
			return q, fmt.Errorf("before: %w", err)
		}
		q.Before = &c
	}
	if s := v.Get("fence"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return q, fmt.Errorf("fence must be a positive integer (a claim's etcd revision), got %q", s)
		}
		q.Fence = n
	}
	return q, nil
}

// ParseSince reads a time, RFC 3339 (2026-12-04T02:00:00Z) or a date
// (2026-12-04, midnight UTC), or a duration back from now: Go's (90m,
// 36h) or a number of days (7d).
func ParseSince(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n >= 0 && n <= 100000 {
			return now.Add(-time.Duration(n) * 24 * time.Hour), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("since must be a time (2026-12-04T02:00:00Z, 2026-12-04) or a duration back from now (10m, 36h, 7d), got %q", s)
}

// FromSummary is the row of a run described by its log alone.
func FromSummary(s runlog.Summary) Run {
	r := Run{ItemRecord: keyspace.ItemRecord{
		Job: s.Job, Item: s.Item, Fire: s.Fire, Instance: s.Instance, Attempt: s.Attempt, Source: s.Source, Fence: s.Fence,
		By: s.By, Param: s.Param, ExitCode: -1,
	}, Log: s.ID.String()}
	switch {
	case s.Writing:
		r.State = keyspace.StateRunning
		r.Start = s.Began
		if s.StartAt.After(s.Began) {
			r.Start = s.StartAt
		}
	case s.Ended:
		e := s.End
		r.State, r.Reason, r.ExitCode, r.HTTPStatus, r.Error = e.State, e.Reason, e.ExitCode, e.HTTPStatus, e.Err
		r.Start, r.End, r.Tries, r.LastLine = e.Start, e.Finish, e.Tries, e.Last
		if r.Start.IsZero() {
			r.Start = s.Began
		}
	default:
		r.State = StateUnknown
		r.Start = s.Began
		r.End = s.Modified // its log's last write: it ran at least until then
		r.Error = "its log has no end record and etcd has no record of it: its instance died during the run (kill -9, a crash); a failover re-run, if any, is the next attempt of the same fire"
	}
	return r
}

// FromRecord is the row of etcd's record rec.
func FromRecord(rec keyspace.ItemRecord) Run { return Run{ItemRecord: rec, Recorded: true} }

// Merge makes one history of etcd's records and the rows of the instances'
// logs: a run both describe (same item, fence and attempt) is one row,
// etcd's record with what its log adds. Rows come out in no order (Page
// sorts them).
func Merge(recs []keyspace.ItemRecord, logs ...[]Run) []Run {
	type runKey struct {
		item    int
		fence   int64
		attempt int
	}
	out := make([]Run, 0, len(recs))
	at := map[runKey]int{}
	for _, rec := range recs {
		if rec.Fence > 0 {
			k := runKey{rec.Item, rec.Fence, rec.Attempt}
			if i, ok := at[k]; ok { // two records of one run (read at two moments): the one that ended
				if out[i].State == keyspace.StateRunning {
					out[i] = FromRecord(rec)
				}
				continue
			}
			at[k] = len(out)
		}
		out = append(out, FromRecord(rec))
	}
	for _, rows := range logs {
		for _, r := range rows {
			k := runKey{r.Item, r.Fence, r.Attempt}
			i, ok := at[k]
			if !ok {
				at[k] = len(out)
				out = append(out, r)
				continue
			}
			o := &out[i]
			if o.Recorded {
				o.Tries, o.Log = r.Tries, r.Log
				if o.LastLine == "" {
					o.LastLine = r.LastLine
				}
			}
		}
	}
	return out
}

// Page sorts rows newest first and returns those q asks for, at most a
// page, with the cursor of the next page (nil: this is the last one).
func Page(rows []Run, q Query) (page []Run, next *Cursor) {
	page = slices.DeleteFunc(slices.Clone(rows), func(r Run) bool { return !q.Match(&r) })
	slices.SortFunc(page, func(a, b Run) int { return a.Cursor().compare(b.Cursor()) })
	if n := q.limit(); len(page) > n {
		page = page[:n]
		c := page[n-1].Cursor()
		next = &c
	}
	return page, next
}

// clockSlack is how far back a log's modification time may be from its
// run's fire and Local still find it: a wall clock stepped back during
// the run (NTP, a VM resumed) by more than this hides the run from pages
// whose cursor is below it.
const clockSlack = 2 * time.Minute

// Local answers q from store's logs of job: at most a page (and one row
// more, so that the merge knows whether a next page exists), newest first.
// It reads logs newest modified first, and stops once no log older can
// hold a row of the page: a run fires before its log is last modified
// (clockSlack allowing for the clock).
func Local(store *runlog.Store, job string, q Query) ([]Run, error) {
	if q.Fence > 0 { // one claim's runs: their logs are named by it
		return localOfFence(store, job, q)
	}
	n := q.limit() + 1
	var rows []Run
	// floor is the start of the n-th newest row so far (zero: fewer).
	var floor time.Time
	err := store.Scan(job, q.Item, func(s runlog.Summary) bool {
		if !s.Writing && (!q.Since.IsZero() && s.Modified.Before(q.Since.Add(-clockSlack)) || !floor.IsZero() && s.Modified.Before(floor.Add(-clockSlack))) {
			return false
		}
		r := FromSummary(s)
		if !q.Match(&r) {
			return true
		}
		rows = append(rows, r)
		if len(rows) >= n {
			slices.SortFunc(rows, func(a, b Run) int { return a.Cursor().compare(b.Cursor()) })
			rows = rows[:n]
			floor = rows[n-1].At()
		}
		return true
	})
	slices.SortFunc(rows, func(a, b Run) int { return a.Cursor().compare(b.Cursor()) })
	return rows, err
}

// localOfFence answers a query of one claim's runs from their logs.
func localOfFence(store *runlog.Store, job string, q Query) ([]Run, error) {
	ids, err := store.Runs(job, q.Fence)
	if err != nil {
		return nil, err
	}
	var rows []Run
	for _, id := range ids {
		if q.Item >= 0 && int(id.Item) != q.Item {
			continue
		}
		s, err := store.Summary(job, id)
		if err != nil {
			continue // removed meanwhile, or refused (Runs lists only logs that pass)
		}
		if r := FromSummary(s); q.Match(&r) {
			rows = append(rows, r)
		}
	}
	rows, _ = Page(rows, Query{Item: -1, Limit: q.limit() + 1})
	return rows, nil
}

// Answer is a page of a job's merged history.
type Answer struct {
	Runs []Run `json:"runs"`
	// Next is the cursor of the next page (the before parameter); empty on
	// the last page.
	Next string `json:"next,omitempty"`
	// Unreachable names the live instances whose logs were not read, and
	// why: their runs that etcd no longer records are missing.
	Unreachable map[string]string `json:"unreachable,omitempty"`
}

// Fetch reads one instance's rows for a query (its Local answer).
type Fetch func(ctx context.Context, in keyspace.InstanceInfo, q Query) ([]Run, error)

// gatherAtOnce bounds the instances asked at once.
const gatherAtOnce = 8

// Gather answers q from etcd's records recs and the rows every live
// instance in peers has (fetch), asked side by side; an instance whose
// answer fails is named in Unreachable with its error.
func Gather(ctx context.Context, recs []keyspace.ItemRecord, peers []keyspace.InstanceInfo, fetch Fetch, q Query) Answer {
	rows := make([][]Run, len(peers))
	errs := make([]error, len(peers))
	var wg sync.WaitGroup
	sem := make(chan struct{}, gatherAtOnce)
	for i, in := range peers {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			rows[i], errs[i] = fetch(ctx, in, q)
		})
	}
	wg.Wait()
	ans := Answer{}
	for i, err := range errs {
		if err != nil {
			if ans.Unreachable == nil {
				ans.Unreachable = map[string]string{}
			}
			ans.Unreachable[peers[i].ID] = err.Error()
		}
	}
	page, next := Page(Merge(recs, rows...), q)
	ans.Runs = page
	if ans.Runs == nil {
		ans.Runs = []Run{}
	}
	if next != nil {
		ans.Next = next.String()
	}
	return ans
}
