package runlog

// Review tests (breaker): what a log's end record keeps of its run.

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// End.String puts err= (a run's error, up to 4 KiB: runner's maxErr)
// before start=, finish=, tries= and last=, and the record is cut at
// maxNote (4 KiB) when written (oneLine in Close). A long error, or one
// whose quoting grows it (control bytes: \x01 is 4 bytes quoted), pushes
// the run's times off the record: the log's row then has no start (it
// falls back to the header's time, history.FromSummary), no end, no tries
// and no last line; once etcd's record rotates out, the row moves in the
// history's order (etcd ordered it by its start) and has no duration.
func TestReviewLongErrorPushesTheRunsTimesOffItsEndRecord(t *testing.T) {
	s := newStore(t)
	fire := time.Date(2026, 12, 4, 2, 0, 0, 0, time.UTC)
	start := fire.Add(time.Second)
	for i, err := range []string{
		strings.Repeat("e", 4000),    // an error at runner's bound (maxErr = 4 KiB)
		strings.Repeat("\x01", 1100), // 1.1 KiB that quotes to 4.4 KiB
	} {
		h := Header{Job: "j", Item: 0, Fence: int64(50 + i), Fire: fire, Attempt: 1, Source: "NORMAL", Instance: "a"}
		writeRun(t, s, h, "", "last words\n", &End{State: "FAILED", ExitCode: -1, Err: err, Start: start, Finish: start.Add(time.Minute),
			Tries: []Try{{Start: start, Finish: start.Add(time.Second)}, {Start: start.Add(2 * time.Second), Finish: start.Add(time.Minute)}}})
		sum, serr := s.Summary("j", RunID{Fence: int64(50 + i)})
		if serr != nil {
			t.Fatal(serr)
		}
		if !sum.Ended || sum.End.State != "FAILED" {
			t.Fatalf("case %d: end %v %+v", i, sum.Ended, sum.End.State)
		}
		if !sum.End.Start.Equal(start) || !sum.End.Finish.Equal(start.Add(time.Minute)) || len(sum.End.Tries) != 2 || sum.End.Last != "last words" {
			t.Errorf("case %d (err of %d bytes): start %v finish %v, %d tries, last %q; want the run's start, finish, 2 tries and its last line",
				i, len(err), sum.End.Start, sum.End.Finish, len(sum.End.Tries), sum.End.Last)
		}
	}
}

// A job may retry any number of times (config: retries >= 0, no bound):
// each try is ~62 bytes of tries=, so from ~60 tries the end record passes
// maxNote and is cut: the last line is lost and so is the tail of tries=.
func TestReviewManyTriesCutTheEndRecord(t *testing.T) {
	s := newStore(t)
	fire := time.Date(2026, 12, 4, 2, 0, 0, 0, time.UTC)
	var tries []Try
	for i := range 80 {
		at := fire.Add(time.Duration(i) * time.Second).Add(123456789)
		tries = append(tries, Try{Start: at, Finish: at.Add(500 * time.Millisecond)})
	}
	h := Header{Job: "j", Item: 0, Fence: 60, Fire: fire, Attempt: 1, Source: "NORMAL", Instance: "a"}
	writeRun(t, s, h, "", "boom\n", &End{State: "FAILED", ExitCode: 1, Err: "exit status 1", Start: tries[0].Start, Finish: tries[79].Finish, Tries: tries})
	sum, err := s.Summary("j", RunID{Fence: 60})
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.End.Tries) != 80 || sum.End.Last != "boom" {
		t.Errorf("%d tries read back (want 80), last %q (want boom)", len(sum.End.Tries), sum.End.Last)
	}
}

// The header writes fire= as RFC 3339 in whole seconds; a manual run's
// fire is the trigger's time (admin Trigger: Fire: now, nanoseconds), so
// a log-only row of a manual run has another fire than etcd's record of
// it had: the history's FIRE moves when etcd's record rotates out, and the
// console's cutAttempts (keyed by item, Fire.UnixNano, attempt) does not
// recognise the cut attempt's log row and draws the cut run twice.
func TestReviewHeaderKeepsAManualRunsFire(t *testing.T) {
	s := newStore(t)
	fire := time.Date(2026, 12, 4, 2, 0, 0, 123456789, time.UTC)
	writeRun(t, s, Header{Job: "j", Item: 0, Fence: 70, Fire: fire, Attempt: 1, Source: "MANUAL", Instance: "a", By: "alice"}, "", "", &End{State: "DONE", ExitCode: 0})
	sum, err := s.Summary("j", RunID{Fence: 70})
	if err != nil {
		t.Fatal(err)
	}
	if !sum.Fire.Equal(fire) {
		t.Errorf("fire %s read back, want %s", sum.Fire.Format(time.RFC3339Nano), fire.Format(time.RFC3339Nano))
	}
}

// GET /api/v1/jobs/{job}/runs?local=1 (or with X-Shardd-Hop) answers from
// history.Local without asking etcd whether the job exists; Local calls
// Scan, and Scan's loaded(job) makes an index entry for any job name
// (s.entry), which nothing ever drops: Sweep and forget only visit job
// directories, and these jobs have none. A caller with a read token (or
// anyone, with reads open) grows the instance's memory without bound, one
// entry (two maps) per name it makes up.
func TestReviewScanOfJobsWithoutLogsLeavesNoIndexBehind(t *testing.T) {
	s := newStore(t)
	for i := range 10000 {
		name := "no-such-job-" + strconv.Itoa(i)
		if err := s.Scan(name, -1, func(Summary) bool { return true }); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Sweep(func(string) (Retention, bool) { return Retention{}, false }); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	n := len(s.jobs)
	s.mu.Unlock()
	if n != 0 {
		t.Errorf("%d job indexes kept for jobs that have no run log, after a Sweep; want none", n)
	}
}
