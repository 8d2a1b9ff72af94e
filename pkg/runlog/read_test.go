package runlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestParseRun(t *testing.T) {
	for _, tc := range []struct {
		in    string
		fence int64
		item  int
		ok    bool
	}{
		{"4711-2", 4711, 2, true},
		{"4711-0", 4711, 0, true},
		{"4711", 4711, -1, true},
		{"0", 0, 0, false},
		{"-3", 0, 0, false},
		{"0471", 0, 0, false},
		{"4711-", 0, 0, false},
		{"4711-x", 0, 0, false},
		{"4711-2-3", 0, 0, false},
		{"", 0, 0, false},
		{"latest", 0, 0, false},
	} {
		fence, item, ok := ParseRun(tc.in)
		if ok != tc.ok || (ok && (fence != tc.fence || item != tc.item)) {
			t.Errorf("ParseRun(%q) = %d, %d, %v; want %d, %d, %v", tc.in, fence, item, ok, tc.fence, tc.item, tc.ok)
		}
	}
}

func TestParseRecord(t *testing.T) {
	for _, tc := range []struct {
		line, tag, text string
		ok              bool
	}{
		{"2026-11-30T16:40:00.004120Z out hello world", "out", "hello world", true},
		{"2026-11-30T16:40:00.004120Z err+ ", "err+", "", true},
		{"2026-11-30T16:40:00.004120Z shardd end state=DONE exit=0", "shardd", "end state=DONE exit=0", true},
		{"2026-11-30T16:40:00.004120Z out \x00\xff", "out", "\x00\xff", true},
		{"2026-11-30T16:40:00.004120Z stdout x", "", "", false},
		{"yesterday out x", "", "", false},
		{"2026-11-30T16:40:00.004120Z out", "", "", false},
		{"", "", "", false},
	} {
		rec, err := ParseRecord([]byte(tc.line))
		if (err == nil) != tc.ok || (tc.ok && (rec.Tag != tc.tag || string(rec.Text) != tc.text)) {
			t.Errorf("ParseRecord(%q) = %q %q, %v", tc.line, rec.Tag, rec.Text, err)
		}
	}
	for tag, want := range map[string]string{"out": "stdout", "out+": "stdout", "err": "stderr", "err+": "stderr", "shardd": "shardd"} {
		if got := Stream(tag); got != want {
			t.Errorf("Stream(%q) = %q, want %q", tag, got, want)
		}
	}
}

// readAll reads r with Next to io.EOF.
func readAll(t *testing.T, r *Reader) []string {
	t.Helper()
	var out []string
	for {
		l, err := r.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, string(l))
	}
}

// texts returns the tag and text of each line.
func texts(t *testing.T, lines []string) []string {
	t.Helper()
	var out []string
	for _, l := range lines {
		rec, err := ParseRecord([]byte(l))
		if err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		out = append(out, rec.Tag+" "+string(rec.Text))
	}
	return out
}

func TestOpenReadsARunsLog(t *testing.T) {
	s := newStore(t)
	for item := range 2 {
		l, err := s.Create(Header{Job: "j", Item: item, Fence: 9, Instance: "a"}, Retention{})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(l.Stdout(), "out of %d\n", item)
		fmt.Fprintf(l.Stderr(), "err of %d\n", item)
		if item == 0 {
			l.Close("end state=DONE exit=0")
		} else {
			defer l.Close("")
		}
	}
	r, err := s.Open("j", RunID{Fence: 9, Item: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if r.Writing() {
		t.Error("a closed log says it is being written")
	}
	got := texts(t, readAll(t, r))
	want := []string{"shardd run job=j item=0 fence=9 fire=0001-01-01T00:00:00Z attempt=0 source= instance=a", "out out of 0", "err err of 0", "shardd end state=DONE exit=0"}
	if !slices.Equal(got, want) {
		t.Errorf("records\n%q\nwant\n%q", got, want)
	}
	// The other item's log is still open.
	r1, err := s.Open("j", RunID{Fence: 9, Item: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	if !r1.Writing() || !s.Writing("j", RunID{Fence: 9, Item: 1}) {
		t.Error("an open log says it is not being written")
	}
	if got := texts(t, readAll(t, r1)); len(got) != 3 || got[2] != "err err of 1" {
		t.Errorf("records of the open log: %q", got)
	}

	for _, tc := range []struct {
		job string
		id  RunID
	}{{"j", RunID{Fence: 9, Item: 2}}, {"j", RunID{Fence: 8}}, {"other", RunID{Fence: 9}}} {
		if _, err := s.Open(tc.job, tc.id); !errors.Is(err, ErrNoLog) {
			t.Errorf("Open(%s, %s) = %v, want ErrNoLog", tc.job, tc.id, err)
		}
	}
	if _, err := s.Open("../x", RunID{Fence: 1}); err == nil || errors.Is(err, ErrNoLog) {
		t.Errorf("Open of a bad job name = %v", err)
	}

	l, _ := s.Create(Header{Job: "j", Item: 0, Fence: 12}, Retention{})
	l.Close("")
	for fence, want := range map[int64][]RunID{9: {{9, 0}, {9, 1}}, 12: {{12, 0}}, 10: nil, 0: {{9, 0}, {9, 1}, {12, 0}}} {
		if got, err := s.Runs("j", fence); err != nil || !slices.Equal(got, want) {
			t.Errorf("Runs(j, %d) = %v, %v; want %v", fence, got, err, want)
		}
	}
	for id, want := range map[RunID]bool{{9, 0}: true, {9, 1}: true, {12, 0}: true, {12, 1}: false, {10, 0}: false} {
		if got := s.Has("j", id); got != want {
			t.Errorf("Has(j, %s) = %v", id, got)
		}
	}
	if s.Has("../j", RunID{Fence: 9}) {
		t.Error("Has of a bad job name")
	}
	if got, err := s.Runs("nothing", 0); err != nil || got != nil {
		t.Errorf("Runs of a job without logs = %v, %v", got, err)
	}
}

// A log whose process died mid-record (no writer here, an old file) is
// read to its end, its last unfinished line included.
func TestNextReadsALogOfAPreviousProcess(t *testing.T) {
	s := newStore(t)
	path := s.Path("j", RunID{Fence: 3, Item: 1})
	os.MkdirAll(filepath.Dir(path), 0o700)
	os.WriteFile(path, []byte(headerLine("j", RunID{Fence: 3, Item: 1})+"2026-11-30T16:40:00.000000Z out a\n2026-11-30T16:40:00.000001Z out b cut"), 0o600)
	old := time.Now().Add(-time.Hour)
	os.Chtimes(path, old, old)
	r, err := s.Open("j", RunID{Fence: 3, Item: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got := readAll(t, r); len(got) != 3 || got[2] != "2026-11-30T16:40:00.000001Z out b cut" {
		t.Errorf("lines %q", got)
	}
	// Follow of it ends at once: nothing writes it.
	r2, _ := s.Open("j", RunID{Fence: 3, Item: 1})
	defer r2.Close()
	start := time.Now()
	if got, err := followAll(r2, context.Background()); err != nil || len(got) != 3 || time.Since(start) > time.Second {
		t.Errorf("follow of an old log: %q, %v after %s", got, err, time.Since(start))
	}
}

// headerLine is the header record of run id of job, as a log written by
// an earlier process begins.
func headerLine(job string, id RunID) string {
	return fmt.Sprintf("2026-11-30T16:40:00.000000Z shardd run job=%s item=%d fence=%d fire=2026-11-30T16:40:00Z\n", job, id.Item, id.Fence)
}

// followAll follows r to its end and returns its lines and the error
// that ended it (nil for io.EOF).
func followAll(r *Reader, ctx context.Context) ([]string, error) {
	var out []string
	for {
		l, err := r.Follow(ctx)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, string(l))
	}
}

// follower follows r in a goroutine: each line on lines, then the end
// (nil for io.EOF) on end.
func follower(r *Reader, ctx context.Context) (lines <-chan string, end <-chan error) {
	lc, ec := make(chan string, 1000), make(chan error, 1)
	go func() {
		defer close(lc)
		for {
			l, err := r.Follow(ctx)
			if err != nil {
				if err == io.EOF {
					err = nil
				}
				ec <- err
				return
			}
			lc <- string(l)
		}
	}()
	return lc, ec
}

func next(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	select {
	case l := <-lines:
		if rec, err := ParseRecord([]byte(l)); err != nil || rec.Tag+" "+string(rec.Text) != want {
			t.Fatalf("followed %q, want %q", l, want)
		}
	case <-time.After(2 * time.Second):
		t.Fatalf("no line after 2s, want %q", want)
	}
}

// A follower gets each record as it is written, waits through a silent
// run however long (no polling: FollowIdle is an hour), and ends when the
// log is closed, with the closing record.
func TestFollowEndsWhenTheLogCloses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes []string // "" is a pause
		end    string
		want   []string
	}{
		{"lines", []string{"one\n", "two\n"}, "end state=DONE exit=0", []string{"out one", "out two", "shardd end state=DONE exit=0"}},
		{"silent, then a line", []string{"", "", "late\n"}, "end state=DONE exit=0", []string{"out late", "shardd end state=DONE exit=0"}},
		{"an unfinished line is written at the close", []string{"no newline"}, "end state=FAILED exit=1", []string{"out+ no newline", "shardd end state=FAILED exit=1"}},
		{"nothing at all", nil, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			s.FollowIdle = time.Hour
			l, err := s.Create(Header{Job: "j", Fence: 5}, Retention{})
			if err != nil {
				t.Fatal(err)
			}
			r, err := s.Open("j", RunID{Fence: 5})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			lines, end := follower(r, context.Background())
			next(t, lines, "shardd run job=j item=0 fence=5 fire=0001-01-01T00:00:00Z attempt=0 source= instance=")
			var got []string
			for _, w := range tc.writes {
				if w == "" {
					time.Sleep(150 * time.Millisecond)
					continue
				}
				l.Stdout().Write([]byte(w))
				if strings.HasSuffix(w, "\n") { // it arrives before the next write
					next(t, lines, "out "+strings.TrimSuffix(w, "\n"))
					got = append(got, "out "+strings.TrimSuffix(w, "\n"))
				}
			}
			select {
			case err := <-end:
				t.Fatalf("follow ended (%v) before the log was closed", err)
			case <-time.After(100 * time.Millisecond):
			}
			closed := time.Now()
			l.Close(tc.end)
			select {
			case err := <-end:
				if err != nil {
					t.Fatalf("follow ended with %v", err)
				}
				if took := time.Since(closed); took > time.Second {
					t.Errorf("follow ended %s after the close", took)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("follow did not end 3s after the close")
			}
			for l := range lines {
				got = append(got, texts(t, []string{l})...)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("followed %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFollowStopsWithItsContext(t *testing.T) {
	s := newStore(t)
	l, _ := s.Create(Header{Job: "j", Fence: 5}, Retention{})
	defer l.Close("")
	r, _ := s.Open("j", RunID{Fence: 5})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	got, err := followAll(r, ctx)
	if !errors.Is(err, context.DeadlineExceeded) || len(got) != 1 {
		t.Errorf("follow = %q, %v; want the header, then the context's end", got, err)
	}
}

// Retention never removes a log being written; it can remove one the
// moment it is closed, or one being read: the reader reads it to its end.
func TestFollowOfALogRemovedByRetention(t *testing.T) {
	s := newStore(t)
	s.FollowIdle = time.Hour
	ret := Retention{MaxTotalBytes: 1} // no finished log is kept
	l, err := s.Create(Header{Job: "j", Fence: 5}, ret)
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Open("j", RunID{Fence: 5})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	lines, end := follower(r, context.Background())
	for i := range 3 {
		fmt.Fprintf(l.Stdout(), "line %d\n", i)
	}
	l.Close("end state=DONE exit=0")
	if _, err := os.Stat(s.Path("j", RunID{Fence: 5})); !os.IsNotExist(err) {
		t.Fatalf("the log is still there after its close (%v): the test needs retention to remove it", err)
	}
	select {
	case err := <-end:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("follow of a removed log did not end")
	}
	var got []string
	for l := range lines {
		got = append(got, l)
	}
	if tt := texts(t, got); len(tt) != 5 || tt[3] != "out line 2" || tt[4] != "shardd end state=DONE exit=0" {
		t.Errorf("followed %q", tt)
	}

	// A finished log opened, then removed by a sweep before it is read.
	l2, _ := s.Create(Header{Job: "k", Fence: 6}, Retention{})
	fmt.Fprintln(l2.Stdout(), "kept in the open file")
	l2.Close("end")
	r2, err := s.Open("k", RunID{Fence: 6})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	s.now = func() time.Time { return time.Now().Add(30 * 24 * time.Hour) }
	s.Sweep(func(string) (Retention, bool) { return Retention{}, false })
	if _, err := os.Stat(s.Path("k", RunID{Fence: 6})); !os.IsNotExist(err) {
		t.Fatalf("the sweep left the log: %v", err)
	}
	if got, err := followAll(r2, context.Background()); err != nil || len(got) != 3 {
		t.Errorf("read of a swept log: %q, %v", got, err)
	}
}

// A log no writer of the store notifies of (a previous process writes it)
// is polled while it grows, and its follower ends when it stays the same
// for FollowIdle, or at once when it is removed.
func TestFollowPollsALogItsStoreDoesNotWrite(t *testing.T) {
	for _, tc := range []struct {
		name   string
		idle   time.Duration
		remove bool
	}{
		{"ends when idle", 400 * time.Millisecond, false},
		{"ends when removed", time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			s.FollowIdle = tc.idle
			path := s.Path("j", RunID{Fence: 2})
			os.MkdirAll(filepath.Dir(path), 0o700)
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			write := func(text string) {
				fmt.Fprintf(f, "%s out %s\n", time.Now().UTC().Format(stampLayout), text)
			}
			f.WriteString(headerLine("j", RunID{Fence: 2}))
			write("first")
			r, err := s.Open("j", RunID{Fence: 2})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			lines, end := follower(r, context.Background())
			next(t, lines, "shardd run job=j item=0 fence=2 fire=2026-11-30T16:40:00Z")
			next(t, lines, "out first")
			for i := range 3 {
				time.Sleep(150 * time.Millisecond)
				write(fmt.Sprint(i))
				next(t, lines, fmt.Sprintf("out %d", i))
			}
			last := time.Now()
			if tc.remove {
				os.Remove(path)
			}
			select {
			case err := <-end:
				took := time.Since(last)
				if err != nil || took > tc.idle+time.Second || (!tc.remove && took < tc.idle/2) {
					t.Errorf("follow ended %s after the last write: %v", took, err)
				}
			case <-time.After(tc.idle + 3*time.Second):
				if tc.remove {
					t.Fatal("follow of a removed log did not end")
				}
				t.Fatalf("follow did not end %s after the last write", tc.idle)
			}
		})
	}

	// OpenFile: the same, for a log outside any store.
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "j"), 0o700)
	os.WriteFile(filepath.Join(dir, "j", "7-0.log"), []byte(headerLine("j", RunID{Fence: 7})+"2026-11-30T16:40:00.000000Z out x\n"), 0o600)
	r, err := OpenFile(dir, "j", RunID{Fence: 7}, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	start := time.Now()
	if got, err := followAll(r, context.Background()); err != nil || len(got) != 2 || time.Since(start) > 2*time.Second {
		t.Errorf("OpenFile follow: %q, %v after %s", got, err, time.Since(start))
	}
	if _, err := OpenFile(dir, "j", RunID{Fence: 8}, 0); !errors.Is(err, ErrNoLog) {
		t.Errorf("OpenFile of nothing: %v", err)
	}
}

// Writers of both streams from several goroutines, and followers that
// start before, during and after the writes: every follower gets every
// record whole, and each stream comes back with every line.
func TestConcurrentWritersAndFollowers(t *testing.T) {
	s := newStore(t)
	s.FollowIdle = time.Hour
	l, err := s.Create(Header{Job: "j", Fence: 1}, Retention{})
	if err != nil {
		t.Fatal(err)
	}
	const writers, lines = 4, 300
	type result struct {
		lines []string
		err   error
	}
	results := make(chan result, 3)
	startFollower := func() {
		r, err := s.Open("j", RunID{Fence: 1})
		if err != nil {
			t.Error(err)
			results <- result{}
			return
		}
		go func() {
			defer r.Close()
			got, err := followAll(r, context.Background())
			results <- result{got, err}
		}()
	}
	startFollower()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := l.Stdout()
			if w%2 == 1 {
				out = l.Stderr()
			}
			for i := range lines {
				fmt.Fprintf(out, "writer %d line %d %s\n", w, i, strings.Repeat("x", i%50))
				if i == lines/2 && w == 0 {
					startFollower()
				}
			}
		}()
	}
	wg.Wait()
	l.Close("end state=DONE exit=0")
	startFollower()
	for range 3 {
		var res result
		select {
		case res = <-results:
		case <-time.After(10 * time.Second):
			t.Fatal("a follower did not end")
		}
		if res.err != nil {
			t.Fatal(res.err)
		}
		var recs []Record
		for _, line := range res.lines {
			rec, err := ParseRecord([]byte(line))
			if err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			recs = append(recs, rec)
		}
		if last := recs[len(recs)-1]; last.Tag != "shardd" || string(last.Text) != "end state=DONE exit=0" {
			t.Errorf("last record %q %q", last.Tag, last.Text)
		}
		stdout, stderr := Streams(recs)
		for w := range writers {
			stream := stdout
			if w%2 == 1 {
				stream = stderr
			}
			for i := range lines {
				if !strings.Contains(string(stream), fmt.Sprintf("writer %d line %d %s\n", w, i, strings.Repeat("x", i%50))) {
					t.Fatalf("writer %d's line %d missing", w, i)
				}
			}
		}
		if n := strings.Count(string(stdout), "\n") + strings.Count(string(stderr), "\n"); n != writers*lines {
			t.Errorf("%d lines, want %d", n, writers*lines)
		}
	}
}
