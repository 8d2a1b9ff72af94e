package runlog

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func newStore(t *testing.T) *Store {
	t.Helper()
	s, err := New(filepath.Join(t.TempDir(), "runs"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func read(t *testing.T, s *Store, job string, fence int64) []Record {
	t.Helper()
	return readRun(t, s, job, RunID{Fence: fence})
}

func readRun(t *testing.T, s *Store, job string, id RunID) []Record {
	t.Helper()
	f, err := os.Open(s.Path(job, id))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func notes(recs []Record) []string {
	var out []string
	for _, r := range recs {
		if r.Tag == "shardd" {
			out = append(out, string(r.Text))
		}
	}
	return out
}

func TestStreamsComeBackAsWritten(t *testing.T) {
	long := strings.Repeat("x", 3*maxPiece+17)
	cases := []struct {
		name         string
		out, err     []string // the writes, in order
		wantOut      string
		wantErr      string
		wantTags     []string // tags of the output records, in order
		wantNotesLen int
	}{
		{name: "lines", out: []string{"a\nb\n"}, err: []string{"e\n"}, wantOut: "a\nb\n", wantErr: "e\n",
			wantTags: []string{"out", "out", "err"}},
		{name: "split writes", out: []string{"he", "llo\nwor", "ld\n"}, wantOut: "hello\nworld\n",
			wantTags: []string{"out", "out"}},
		{name: "no final newline", out: []string{"a\nlast"}, wantOut: "a\nlast", wantTags: []string{"out", "out+"}},
		{name: "long line in pieces", out: []string{long + "\n"}, wantOut: long + "\n",
			wantTags: []string{"out+", "out+", "out+", "out"}},
		{name: "binary and NUL kept", out: []string{"\x00\xff\r\n"}, wantOut: "\x00\xff\r\n", wantTags: []string{"out"}},
		{name: "empty lines", err: []string{"\n\n"}, wantErr: "\n\n", wantTags: []string{"err", "err"}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := newStore(t)
			l, err := s.Create(Header{Job: "j", Item: 2, Fence: int64(100 + i)}, Retention{})
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range c.out {
				l.Stdout().Write([]byte(w))
			}
			for _, w := range c.err {
				l.Stderr().Write([]byte(w))
			}
			if err := l.Close("end DONE exit=0"); err != nil {
				t.Fatal(err)
			}
			recs := readRun(t, s, "j", RunID{Fence: int64(100 + i), Item: 2})
			out, errb := Streams(recs)
			if string(out) != c.wantOut || string(errb) != c.wantErr {
				t.Errorf("streams = %q, %q; want %q, %q", out, errb, c.wantOut, c.wantErr)
			}
			var tags []string
			for _, r := range recs {
				if r.Tag != "shardd" {
					tags = append(tags, r.Tag)
				}
			}
			if fmt.Sprint(tags) != fmt.Sprint(c.wantTags) {
				t.Errorf("tags = %v, want %v", tags, c.wantTags)
			}
			n := notes(recs)
			if len(n) != 2 || !strings.HasPrefix(n[0], "run job=j item=2 fence=") || n[1] != "end DONE exit=0" {
				t.Errorf("shardd records = %q", n)
			}
		})
	}
}

func TestPerRunCap(t *testing.T) {
	const limit = 2000
	s := newStore(t)
	l, err := s.Create(Header{Job: "j", Fence: 1}, Retention{MaxBytesPerRun: limit})
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	for i := range 100 {
		fmt.Fprintf(io.MultiWriter(l.Stdout(), &out), "line %d of stdout\n", i)
		fmt.Fprintf(io.MultiWriter(l.Stderr(), &errb), "line %d of stderr\n", i)
	}
	l.Stdout().Write([]byte("unterminated"))
	out.WriteString("unterminated")
	l.Close("end")
	fi, _ := os.Stat(s.Path("j", RunID{Fence: 1}))
	if fi.Size() > limit {
		t.Errorf("run log is %d bytes, over maxBytesPerRun %d", fi.Size(), limit)
	}
	recs := read(t, s, "j", 1)
	gotOut, gotErr := Streams(recs)
	if !bytes.HasPrefix(out.Bytes(), gotOut) || !bytes.HasPrefix(errb.Bytes(), gotErr) || len(gotOut) == 0 {
		t.Errorf("kept output is not a prefix of each stream: %q, %q", gotOut, gotErr)
	}
	n := notes(recs)
	lost := out.Len() + errb.Len() - len(gotOut) - len(gotErr)
	if want := fmt.Sprintf("output cut: %d bytes not kept, beyond maxBytesPerRun (%d bytes of run log)", lost, limit); n[len(n)-2] != want || n[len(n)-1] != "end" {
		t.Errorf("closing notes = %q, want %q and end", n[len(n)-2:], want)
	}
}

func TestRetentionRemovesOldestFirstButNeverAnOpenLog(t *testing.T) {
	s := newStore(t)
	clock := time.Now()
	s.now = func() time.Time { return clock }
	ret := Retention{MaxTotalBytes: 3 * 4096, MaxAge: time.Hour}
	open, err := s.Create(Header{Job: "j", Fence: 1}, ret) // stays open throughout
	if err != nil {
		t.Fatal(err)
	}
	for fence := int64(2); fence <= 6; fence++ {
		l, err := s.Create(Header{Job: "j", Fence: fence}, ret)
		if err != nil {
			t.Fatal(err)
		}
		l.Stdout().Write([]byte("line\n"))
		// mtimes one second apart, in fence order
		os.Chtimes(s.Path("j", RunID{Fence: fence}), clock, clock.Add(time.Duration(fence)*time.Second))
		l.Close("")
	}
	exists := func(fence int64) bool { _, err := os.Stat(s.Path("j", RunID{Fence: fence})); return err == nil }
	// Each log takes one 4 KiB block: the 3 newest finished ones fit, and
	// fence 1 is open.
	for fence, want := range map[int64]bool{1: true, 2: false, 3: false, 4: true, 5: true, 6: true} {
		if exists(fence) != want {
			t.Errorf("log of fence %d exists = %v, want %v", fence, !want, want)
		}
	}
	open.Close("")
	// Two hours later, everything is past maxAge: Sweep removes it all,
	// and the job's directory.
	clock = clock.Add(2 * time.Hour)
	if err := s.Sweep(func(string) (Retention, bool) { return ret, true }); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), "j")); !os.IsNotExist(err) {
		t.Errorf("job directory after the sweep: %v, want it removed", err)
	}
}

func TestSweepLoadsLogsOfAPreviousLife(t *testing.T) {
	s := newStore(t)
	dir := filepath.Join(s.Dir(), "gone")
	os.MkdirAll(dir, 0o700)
	old := time.Now().Add(-DefaultMaxAge - time.Hour)
	for _, name := range []string{"7-0.log", "8-1.log"} {
		os.WriteFile(filepath.Join(dir, name), []byte("x\n"), 0o600)
		os.Chtimes(filepath.Join(dir, name), old, old)
	}
	os.WriteFile(filepath.Join(dir, "9-0.log"), []byte("x\n"), 0o600) // recent
	s.Sweep(func(string) (Retention, bool) { return Retention{}, false })
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != "9-0.log" {
		t.Errorf("left %v, want only 9-0.log", entries)
	}
}

func TestStopsWhenTheDiskIsNearlyFull(t *testing.T) {
	s := newStore(t)
	s.MinFree = func(total uint64) uint64 { return total + 1 } // never enough
	l, err := s.Create(Header{Job: "j", Fence: 1}, Retention{})
	if err != nil {
		t.Fatal(err)
	}
	l.Stdout().Write([]byte("not kept\n"))
	if l.Err() == nil || !strings.Contains(l.Err().Error(), "run log stopped") {
		t.Errorf("Err() = %v, want the stop", l.Err())
	}
	l.Close("end")
	recs := read(t, s, "j", 1)
	out, _ := Streams(recs)
	if len(out) != 0 {
		t.Errorf("output kept on a full disk: %q", out)
	}
	// It says why it stopped, what it did not keep, and how the run ended.
	if n := notes(recs); len(n) != 4 || !strings.HasPrefix(n[1], "run log stopped: the file system has") ||
		n[2] != "output cut: 9 bytes not kept, after the run log stopped for lack of space" || n[3] != "end" {
		t.Errorf("notes = %q", n)
	}
}

func TestRetriesAppendToTheRunsLog(t *testing.T) {
	s := newStore(t)
	for try := range 2 {
		l, err := s.Create(Header{Job: "j", Fence: 5}, Retention{})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(l.Stdout(), "try %d\n", try)
		l.Close("")
	}
	out, _ := Streams(read(t, s, "j", 5))
	if string(out) != "try 0\ntry 1\n" {
		t.Errorf("stdout = %q", out)
	}
	if n := len(s.jobs["j"].files); n != 1 {
		t.Errorf("index holds %d files, want 1", n)
	}
}

func TestCreateRefusesABadJobName(t *testing.T) {
	s := newStore(t)
	for _, job := range []string{"", "../x", "a/b", ".hidden"} {
		if _, err := s.Create(Header{Job: job, Fence: 1}, Retention{}); err == nil {
			t.Errorf("Create(job %q) succeeded", job)
		}
	}
}

// FuzzRoundTrip: whatever a run writes, in whatever pieces, reads back
// as written.
func FuzzRoundTrip(f *testing.F) {
	f.Add([]byte("a\nb"), []byte("err\n"), uint8(3))
	f.Add([]byte("\n\n\x00\r"), []byte("\xff"), uint8(1))
	s, err := New(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	fence := int64(0)
	f.Fuzz(func(t *testing.T, out, errb []byte, step uint8) {
		fence++
		l, err := s.Create(Header{Job: "fuzz", Fence: fence}, Retention{})
		if err != nil {
			t.Fatal(err)
		}
		n := int(step)%7 + 1
		for i := 0; i < max(len(out), len(errb)); i += n {
			if i < len(out) {
				l.Stdout().Write(out[i:min(i+n, len(out))])
			}
			if i < len(errb) {
				l.Stderr().Write(errb[i:min(i+n, len(errb))])
			}
		}
		l.Close("end")
		gotOut, gotErr := Streams(read(t, s, "fuzz", fence))
		if !bytes.Equal(gotOut, out) || !bytes.Equal(gotErr, errb) {
			t.Fatalf("read back %q, %q; wrote %q, %q", gotOut, gotErr, out, errb)
		}
		os.Remove(s.Path("fuzz", RunID{Fence: fence}))
	})
}

// Nothing shardd or the run writes takes the log past its cap: long
// notes and many of them (a retry each) included.
func TestNotesCountAgainstTheCap(t *testing.T) {
	const limit = 16 << 10
	s := newStore(t)
	l, err := s.Create(Header{Job: "j", Fence: 1}, Retention{MaxBytesPerRun: limit})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		l.Note(fmt.Sprintf("retry %d after: %s", i, strings.Repeat("e", 100)))
	}
	l.Note(strings.Repeat("x", 1<<20)) // a server-chosen error message
	l.Close("end err=" + strings.Repeat("y", 1<<20))
	fi, _ := os.Stat(s.Path("j", RunID{Fence: 1}))
	if fi.Size() > limit {
		t.Errorf("run log is %d bytes, over maxBytesPerRun %d", fi.Size(), limit)
	}
	n := notes(read(t, s, "j", 1))
	if last := n[len(n)-1]; !strings.HasPrefix(last, "end err=yyy") || !strings.HasSuffix(last, "...[cut]") {
		t.Errorf("end record %.40q... not cut", last)
	}
	if cut := n[len(n)-2]; !strings.Contains(cut, "shardd records not kept") {
		t.Errorf("cut record = %q", cut)
	}
}

// Memory per log: one Write of a MiB of empty lines (the worst framing)
// does not keep a MiB of records around.
func TestBatchMemoryIsBounded(t *testing.T) {
	s := newStore(t)
	l, err := s.Create(Header{Job: "j", Fence: 1}, Retention{MaxBytesPerRun: 64 << 20})
	if err != nil {
		t.Fatal(err)
	}
	l.Stdout().Write(bytes.Repeat([]byte("\n"), 1<<20))
	if c := cap(l.batch); c > 2*maxBatch {
		t.Errorf("after a MiB of empty lines the log holds %d bytes of batch", c)
	}
	l.Close("")
	out, _ := Streams(read(t, s, "j", 1))
	if len(out) != 1<<20 {
		t.Errorf("read back %d bytes of stdout, want %d", len(out), 1<<20)
	}
}

func TestSweepLeavesOtherDirectoriesAlone(t *testing.T) {
	s := newStore(t)
	old := time.Now().Add(-DefaultMaxAge - time.Hour)
	for _, dir := range []string{"lost+found", ".hidden", "other app"} {
		os.MkdirAll(filepath.Join(s.Dir(), dir), 0o700)
		p := filepath.Join(s.Dir(), dir, "2024.log")
		os.WriteFile(p, []byte("x\n"), 0o600)
		os.Chtimes(p, old, old)
	}
	s.Sweep(func(string) (Retention, bool) { return Retention{}, false })
	for _, dir := range []string{"lost+found", ".hidden", "other app"} {
		if _, err := os.Stat(filepath.Join(s.Dir(), dir, "2024.log")); err != nil {
			t.Errorf("Sweep touched %s: %v", dir, err)
		}
	}
}

// Sweep removes a job's empty directory; a run log created meanwhile
// must not lose its directory.
func TestSweepRacingCreate(t *testing.T) {
	s := newStore(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				s.Sweep(func(string) (Retention, bool) { return Retention{MaxAge: time.Nanosecond}, true })
			}
		}
	}()
	failures := 0
	for fence := range int64(2000) {
		l, err := s.Create(Header{Job: "j", Fence: fence}, Retention{MaxAge: time.Nanosecond})
		if err != nil {
			failures++
			continue
		}
		l.Close("")
	}
	close(stop)
	<-done
	if failures > 0 {
		t.Errorf("%d of 2000 run logs could not be created while Sweep ran", failures)
	}
}

func TestCloseSaysTheLogWasRemoved(t *testing.T) {
	s := newStore(t)
	l, err := s.Create(Header{Job: "j", Fence: 1}, Retention{})
	if err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(s.Dir(), "j"))
	l.Stdout().Write([]byte("lost\n"))
	if err := l.Close(""); err == nil || !strings.Contains(err.Error(), "removed while the run wrote it") {
		t.Errorf("Close() = %v, want it to say the log was removed", err)
	}
}

// The disk fills during a run: the log stops at the next look (every
// 64 KiB), with a whole last record.
func TestStopsWhenTheDiskFillsDuringARun(t *testing.T) {
	s := newStore(t)
	looks := 0
	s.MinFree = func(total uint64) uint64 {
		if looks++; looks > 1 { // the look at Create passes, the next fails
			return total + 1
		}
		return 0
	}
	l, err := s.Create(Header{Job: "j", Fence: 1}, Retention{})
	if err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		l.Stdout().Write([]byte(strings.Repeat("z", 1000) + "\n"))
	}
	if l.Err() == nil {
		t.Error("Err() = nil after the disk filled")
	}
	l.Close("end")
	fi, _ := os.Stat(s.Path("j", RunID{Fence: 1}))
	if fi.Size() > 2*checkEvery {
		t.Errorf("the log grew to %d bytes; it should stop within %d", fi.Size(), checkEvery)
	}
	recs := read(t, s, "j", 1) // fails on a half record
	if n := notes(recs); len(n) != 4 || !strings.HasPrefix(n[1], "run log stopped") || !strings.HasPrefix(n[2], "output cut: ") || n[3] != "end" {
		t.Errorf("notes %q, want the header, the stop, the cut and the end", n)
	}
}

// A retry's output starts after the retry's note, not glued to the last
// unterminated line of the try before.
func TestANoteEndsTheStreamsUnfinishedLines(t *testing.T) {
	s := newStore(t)
	l, err := s.Create(Header{Job: "j", Fence: 1}, Retention{})
	if err != nil {
		t.Fatal(err)
	}
	l.Stdout().Write([]byte("try 0 no newline"))
	l.Note("retry 1")
	l.Stdout().Write([]byte("try 1\n"))
	l.Close("")
	var got []string
	for _, r := range read(t, s, "j", 1)[1:] {
		got = append(got, r.Tag+" "+string(r.Text))
	}
	if want := []string{"out+ try 0 no newline", "shardd retry 1", "out try 1"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("records %q, want %q", got, want)
	}
}

// Runs of one claim of several items share a fence: each has its own log.
func TestRunsSharingAFenceHaveTheirOwnLogs(t *testing.T) {
	s := newStore(t)
	for item := range 3 {
		l, err := s.Create(Header{Job: "j", Item: item, Fence: 7}, Retention{})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(l.Stdout(), "item %d\n", item)
		l.Close("")
	}
	for item := range 3 {
		out, _ := Streams(readRun(t, s, "j", RunID{Fence: 7, Item: int32(item)}))
		if want := fmt.Sprintf("item %d\n", item); string(out) != want {
			t.Errorf("log of item %d: %q, want %q", item, out, want)
		}
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), "j", "7-2.log")); err != nil {
		t.Errorf("file name: %v", err)
	}
}

func TestParseRunID(t *testing.T) {
	for in, ok := range map[string]bool{"7-2": true, "0-0": true, "7": false, "-1-2": false, "7--2": false, "07-2": false, "7-02": false, "7-2x": false, "99999999999999999999-1": false} {
		id, got := ParseRunID(in)
		if got != ok || (ok && id.String() != in) {
			t.Errorf("ParseRunID(%q) = %v, %v", in, id, got)
		}
	}
}

// A run prepared ahead of its fire says, in its header (written before
// the run starts), when it is let go.
func TestHeaderOfARunPreparedAhead(t *testing.T) {
	s := newStore(t)
	at := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	l, err := s.Create(Header{Job: "j", Fence: 1, Fire: at, StartAt: at}, Retention{})
	if err != nil {
		t.Fatal(err)
	}
	l.Close("end")
	if n := notes(read(t, s, "j", 1)); len(n) == 0 || !strings.HasSuffix(n[0], " starts_at=2026-11-30T12:00:00Z") {
		t.Errorf("header = %q, want it to end with starts_at", n)
	}
}
