package runlog

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestEndRecordRoundTrips(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 2, 0, 0, 123456789, time.UTC)
	cases := []struct {
		name string
		end  End
		text string // the record's text, when it matters
	}{
		{"done", End{State: "DONE", ExitCode: 0, Start: t0, Finish: t0.Add(time.Second)},
			"end state=DONE exit=0 start=2026-12-04T02:00:00.123456789Z finish=2026-12-04T02:00:01.123456789Z"},
		{"failed, with its last line", End{State: "FAILED", ExitCode: 3, Err: "exit status 3", Last: `db timeout for "AMER"`}, `end state=FAILED exit=3 last="db timeout for \"AMER\"" err="exit status 3"`},
		{"a hook", End{State: "FAILED", ExitCode: -1, HTTPStatus: 503, Err: "http 503: busy"}, `end state=FAILED status=503 err="http 503: busy"`},
		{"killed", End{State: "KILLED", Reason: "timeout", ExitCode: -1, Err: "timed out after 1s"}, ""},
		{"retried", End{State: "DONE", ExitCode: 0, Start: t0, Finish: t0.Add(3 * time.Second),
			Tries: []Try{{t0, t0.Add(time.Second)}, {t0.Add(2 * time.Second), t0.Add(3 * time.Second)}}}, ""},
		{"newlines and tabs in the error", End{State: "FAILED", ExitCode: 1, Err: "a\nb\tc", Last: "ü\x01"}, ""},
		{"a state with a space is one word", End{State: "NOT A STATE", ExitCode: -1}, "end state=NOT_A_STATE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			text := tc.end.String()
			if tc.text != "" && text != tc.text {
				t.Errorf("text\n got %s\nwant %s", text, tc.text)
			}
			got, ok := ParseEnd(text)
			want := tc.end
			want.State = bare(want.State)
			if !ok || !reflect.DeepEqual(got, want) {
				t.Errorf("ParseEnd(%s) = %+v, %v; want %+v", text, got, ok, want)
			}
		})
	}
}

func TestParseEndRefusesWhatIsNotAnEndRecord(t *testing.T) {
	for _, text := range []string{"", "end", "end ", "retry 1 in 1s, after: exit status 4", "end exit=0", "ended state=DONE"} {
		if e, ok := ParseEnd(text); ok {
			t.Errorf("ParseEnd(%q) = %+v, true", text, e)
		}
	}
	// A record cut at its cap ends in an open quote: the rest is the value.
	e, ok := ParseEnd(`end state=FAILED exit=1 err="very long...[cut]`)
	if !ok || e.Err != "very long...[cut]" || e.ExitCode != 1 {
		t.Errorf("a cut record: %+v, %v", e, ok)
	}
}

func FuzzParseEnd(f *testing.F) {
	f.Add(End{State: "FAILED", ExitCode: 3, Err: "exit status 3", Last: "x"}.String())
	f.Add(`end state=DONE exit=0 tries=2026-12-04T02:00:00Z/2026-12-04T02:00:01Z,bad`)
	f.Add(`end state="open`)
	f.Fuzz(func(t *testing.T, text string) {
		e, ok := ParseEnd(text)
		if !ok {
			return
		}
		// What parses prints to a record that fits a shardd record and
		// prints the same once parsed again: String's bounds and
		// encodings are a fixed point after one pass.
		s1 := e.String()
		e2, ok := ParseEnd(s1)
		if !ok || len(s1) > maxNote {
			t.Fatalf("%q: printed %q (%d bytes), parsed again: %v", text, s1, len(s1), ok)
		}
		if s2 := e2.String(); s2 != s1 {
			t.Fatalf("%q: printed\n%q\nthen\n%q", text, s1, s2)
		}
	})
}

// An end record fits a shardd record whole, its run's times first, however
// long the error, however many the tries, whatever bytes they hold.
func TestEndRecordFitsWhatever(t *testing.T) {
	start := time.Date(2026, 12, 4, 2, 0, 1, 0, time.UTC)
	var tries []Try
	for i := range 300 {
		at := start.Add(time.Duration(i) * time.Second)
		tries = append(tries, Try{at, at.Add(500 * time.Millisecond)})
	}
	for _, e := range []End{
		{State: "FAILED", ExitCode: 1, Err: strings.Repeat("e", 4000), Last: strings.Repeat("\x01", 2000), Start: start, Finish: start.Add(time.Hour), Tries: tries},
		{State: "FAILED", ExitCode: 1, Err: strings.Repeat("\x01", 1100), Last: "last words", Start: start, Finish: start.Add(time.Minute), Tries: tries[:80]},
	} {
		text := e.String()
		got, ok := ParseEnd(text)
		if len(text) > maxNote || !ok || !got.Start.Equal(start) || !got.Finish.Equal(e.Finish) || got.State != "FAILED" {
			t.Fatalf("%d bytes: %+v", len(text), got)
		}
		wantTries, wantTried := len(e.Tries), 0
		if len(e.Tries) > maxTries {
			wantTries, wantTried = maxTries, len(e.Tries)
		}
		if len(got.Tries) != wantTries || got.Tried != wantTried || !got.Tries[len(got.Tries)-1].Finish.Equal(e.Tries[len(e.Tries)-1].Finish) {
			t.Errorf("tries: %d read back, tried %d; want %d, tried %d, the last one kept", len(got.Tries), got.Tried, wantTries, wantTried)
		}
		if got.Last == "" || !strings.HasSuffix(got.Err, "...[cut]") {
			t.Errorf("last %q, err ending %q", got.Last, got.Err[max(0, len(got.Err)-10):])
		}
	}
}

func TestCutRunesKeepsWholeRunes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{{"abc", 5, "abc"}, {"abc", 2, "ab"}, {"aü", 2, "a"}, {"üü", 3, "ü"}, {"", 0, ""}} {
		if got := cutRunes(tc.in, tc.n); got != tc.want {
			t.Errorf("cutRunes(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

// writeRun writes a whole run's log: its header, out on stdout and errs
// on stderr, and end (nil: none, as a run cut by shardd's death leaves it).
func writeRun(t *testing.T, s *Store, h Header, out, errs string, end *End) *Log {
	t.Helper()
	l, err := s.Create(h, Retention{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(l.Stdout(), out)
	fmt.Fprint(l.Stderr(), errs)
	if end != nil {
		e := *end
		e.Last = l.LastLine()
		if err := l.Close(e.String()); err != nil {
			t.Fatal(err)
		}
	}
	return l
}

func TestSummaryReadsTheHeaderAndTheEndRecord(t *testing.T) {
	s := newStore(t)
	fire := time.Date(2026, 12, 4, 2, 0, 0, 0, time.UTC)
	h := Header{Job: "nightly", Item: 2, Fence: 41, Fire: fire, Attempt: 2, Source: "MANUAL", Instance: "a", By: "alice (token ops)", Param: "region=AMER full"}
	writeRun(t, s, h, "step 1\nstep 2\n", "db timeout for AMER\n\n", &End{State: "FAILED", ExitCode: 3, Err: "exit status 3", Start: fire, Finish: fire.Add(time.Second)})
	sum, err := s.Summary("nightly", RunID{Fence: 41, Item: 2})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Item != 2 || sum.Fence != 41 || !sum.Fire.Equal(fire) || sum.Attempt != 2 || sum.Source != "MANUAL" || sum.Instance != "a" ||
		sum.By != h.By || sum.Param != h.Param || sum.Began.IsZero() || sum.Writing {
		t.Errorf("header: %+v", sum)
	}
	if !sum.Ended || sum.End.State != "FAILED" || sum.End.ExitCode != 3 || sum.End.Last != "db timeout for AMER" || !sum.End.Finish.Equal(fire.Add(time.Second)) {
		t.Errorf("end: %v %+v (the last line is stderr's last non-blank one)", sum.Ended, sum.End)
	}

	// Only stdout: its last line.
	h.Fence, h.Item = 42, 0
	writeRun(t, s, h, "one\ntwo, no newline", "", &End{State: "DONE", ExitCode: 0})
	if sum, _ := s.Summary("nightly", RunID{Fence: 42}); sum.End.Last != "two, no newline" {
		t.Errorf("last line of stdout: %q", sum.End.Last)
	}

	// A long log: the end record is found past the header's reach.
	h.Fence = 43
	writeRun(t, s, h, strings.Repeat("0123456789abcdef\n", 10000), "", &End{State: "DONE", ExitCode: 0})
	if sum, _ := s.Summary("nightly", RunID{Fence: 43}); !sum.Ended || sum.End.State != "DONE" || sum.Attempt != 2 || sum.Bytes < 100000 {
		t.Errorf("a long log: %+v", sum)
	}

	// Being written, then cut (no end record).
	h.Fence = 44
	l := writeRun(t, s, h, "half\n", "", nil)
	if sum, _ := s.Summary("nightly", RunID{Fence: 44}); !sum.Writing || sum.Ended || sum.Source != "MANUAL" {
		t.Errorf("a log being written: %+v", sum)
	}
	l.Close("") // as a log left by a shardd that died: no end record
	if sum, _ := s.Summary("nightly", RunID{Fence: 44}); sum.Writing || sum.Ended {
		t.Errorf("a cut run's log: %+v", sum)
	}
}

func TestScanReadsNewestFirstRunsInProgressFirst(t *testing.T) {
	s := newStore(t)
	fire := time.Date(2026, 12, 4, 2, 0, 0, 0, time.UTC)
	var open *Log
	for i, fence := range []int64{30, 10, 20, 40} { // closed in this order
		h := Header{Job: "j", Item: i % 2, Fence: fence, Fire: fire.Add(time.Duration(i) * time.Second), Attempt: 1, Source: "NORMAL", Instance: "a"}
		if fence == 40 {
			open = writeRun(t, s, h, "", "", nil)
			continue
		}
		writeRun(t, s, h, "", "", &End{State: "DONE", ExitCode: 0})
		time.Sleep(10 * time.Millisecond) // distinct modification times
	}
	defer open.Close("")
	scan := func(item, stopAfter int) []int64 {
		var got []int64
		if err := s.Scan("j", item, func(sum Summary) bool {
			got = append(got, sum.Fence)
			return len(got) < stopAfter
		}); err != nil {
			t.Fatal(err)
		}
		return got
	}
	if got := scan(-1, 10); !reflect.DeepEqual(got, []int64{40, 20, 10, 30}) {
		t.Errorf("scan: %v, want the open 40, then 20, 10, 30 (newest closed first)", got)
	}
	if got := scan(1, 10); !reflect.DeepEqual(got, []int64{40, 10}) {
		t.Errorf("scan of item 1: %v, want 40, 10", got)
	}
	if got := scan(-1, 2); !reflect.DeepEqual(got, []int64{40, 20}) {
		t.Errorf("scan stopped after 2: %v", got)
	}
	if err := s.Scan("no-such-job", -1, func(Summary) bool { t.Error("a summary of no log"); return true }); err != nil {
		t.Errorf("scan of a job without logs: %v", err)
	}
	if err := s.Scan("../x", -1, func(Summary) bool { return true }); err == nil {
		t.Error("scan of a path, not a job name: no error")
	}
}
