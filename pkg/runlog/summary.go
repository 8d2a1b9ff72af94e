package runlog

// A run's log describes its run: the header record says which run it is
// (job, item, fence, fire, attempt, source, instance, who triggered it and
// with which parameter), and the end record, written as the log closes,
// how it ended (End). So the logs a store keeps are its index of the runs
// it made: Scan reads them newest first, a header and an end record per
// log, with no file of its own to keep in step with retention, restarts or
// a full disk. A log's end record goes missing only when shardd stopped
// during the run (kill -9, a crash): Summary.Ended is false, and the run's
// fate is in etcd's record of it (a settled run: KILLED) while etcd keeps
// it.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// End is how a run ended, as its log's end record says it:
//
//	end state=FAILED exit=3 err="exit status 3" start=... finish=... last="db timeout for AMER"
//
// with reason=, status= (a hook's HTTP status) and tries= (each try's
// start/finish, when the run was retried) when there are some.
type End struct {
	State  string
	Reason string
	// ExitCode of a script; -1 when there is none.
	ExitCode   int
	HTTPStatus int
	Err        string
	// Start is when the first try started, Finish when the last one ended
	// (zero when no try started).
	Start, Finish time.Time
	// Tries are each try's span, when the run was tried more than once.
	Tries []Try
	// Last is the last line the run wrote on stderr, else on stdout.
	Last string
}

// Try is one try of a run.
type Try struct {
	Start  time.Time `json:"start"`
	Finish time.Time `json:"end"`
}

// maxLast bounds End.Last.
const maxLast = 512

// String is the end record's text.
func (e End) String() string {
	var b strings.Builder
	b.WriteString("end state=" + bare(e.State))
	if e.Reason != "" {
		b.WriteString(" reason=" + bare(e.Reason))
	}
	if e.ExitCode >= 0 {
		fmt.Fprintf(&b, " exit=%d", e.ExitCode)
	}
	if e.HTTPStatus > 0 {
		fmt.Fprintf(&b, " status=%d", e.HTTPStatus)
	}
	if e.Err != "" {
		b.WriteString(" err=" + strconv.Quote(e.Err))
	}
	if !e.Start.IsZero() {
		b.WriteString(" start=" + e.Start.UTC().Format(time.RFC3339Nano))
	}
	if !e.Finish.IsZero() {
		b.WriteString(" finish=" + e.Finish.UTC().Format(time.RFC3339Nano))
	}
	if len(e.Tries) > 1 {
		spans := make([]string, len(e.Tries))
		for i, t := range e.Tries {
			spans[i] = t.Start.UTC().Format(time.RFC3339Nano) + "/" + t.Finish.UTC().Format(time.RFC3339Nano)
		}
		b.WriteString(" tries=" + strings.Join(spans, ","))
	}
	if e.Last != "" {
		b.WriteString(" last=" + strconv.Quote(cutRunes(e.Last, maxLast)))
	}
	return b.String()
}

// Brief is the end record without its times and last line: how the run
// ended, in a word or three.
func (e End) Brief() string {
	e.Start, e.Finish, e.Tries, e.Last = time.Time{}, time.Time{}, nil, ""
	return e.String()
}

// bare makes s one token: spaces and quotes become '_'.
func bare(s string) string {
	return strings.Map(func(r rune) rune {
		if r == ' ' || r == '"' || r < 0x20 {
			return '_'
		}
		return r
	}, s)
}

// cutRunes cuts s to at most n bytes, at a rune boundary.
func cutRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// ParseEnd reads an end record's text (End.String); false when text is
// not one.
func ParseEnd(text string) (End, bool) {
	rest, ok := strings.CutPrefix(text, "end ")
	if !ok {
		return End{}, false
	}
	f := fields(rest)
	if f["state"] == "" {
		return End{}, false
	}
	e := End{State: f["state"], Reason: f["reason"], Err: f["err"], Last: f["last"], ExitCode: -1}
	if v, err := strconv.Atoi(f["exit"]); err == nil {
		e.ExitCode = v
	}
	e.HTTPStatus, _ = strconv.Atoi(f["status"])
	e.Start, _ = time.Parse(time.RFC3339Nano, f["start"])
	e.Finish, _ = time.Parse(time.RFC3339Nano, f["finish"])
	for span := range strings.SplitSeq(f["tries"], ",") {
		s, fin, ok := strings.Cut(span, "/")
		ts, err1 := time.Parse(time.RFC3339Nano, s)
		tf, err2 := time.Parse(time.RFC3339Nano, fin)
		if ok && err1 == nil && err2 == nil {
			e.Tries = append(e.Tries, Try{Start: ts, Finish: tf})
		}
	}
	return e, true
}

// fields reads key=value pairs separated by spaces; a value is a bare word
// or a Go quoted string (a quote that does not end, a record cut at its
// cap, gives the rest of the text).
func fields(s string) map[string]string {
	out := map[string]string{}
	for s != "" {
		s = strings.TrimLeft(s, " ")
		key, rest, ok := strings.Cut(s, "=")
		if !ok || key == "" || strings.Contains(key, " ") {
			return out
		}
		var val string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil { // cut: the rest, unquoted as far as it goes
				val, rest = strings.TrimPrefix(rest, `"`), ""
			} else {
				val, _ = strconv.Unquote(q)
				rest = rest[len(q):]
			}
		} else {
			val, rest, _ = strings.Cut(rest, " ")
		}
		out[key] = val
		s = rest
	}
	return out
}

// Summary is what a run's log says of its run.
type Summary struct {
	ID       RunID
	Job      string
	Item     int
	Fence    int64
	Fire     time.Time
	Attempt  int
	Source   string
	Instance string
	By       string
	Param    string
	// Began is the time of the header record: when the run's log was
	// created, as it was claimed (a run prepared ahead: before StartAt).
	Began   time.Time
	StartAt time.Time
	// Writing says that this store writes the log now: the run goes on.
	Writing bool
	// Ended says the log has its end record, End; a log neither written
	// nor ended is of a run cut by shardd's own end (kill -9, a crash).
	Ended bool
	End   End
	// Modified is the log's modification time.
	Modified time.Time
	// Bytes is the log's size.
	Bytes int64
}

// headLimit and tailLimit bound what Summary reads of a log: the header
// is in its first records, the end record in its last ones.
const (
	headLimit = 2*maxNote + 256
	tailLimit = 3*maxNote + 1024
)

// summarize reads the summary of the log f of run id of job.
func summarize(f *os.File, job string, id RunID) (Summary, error) {
	fi, err := f.Stat()
	if err != nil {
		return Summary{}, err
	}
	s := Summary{ID: id, Job: job, Item: int(id.Item), Fence: id.Fence, Modified: fi.ModTime(), Bytes: fi.Size(), End: End{ExitCode: -1}}
	head := make([]byte, min(fi.Size(), headLimit))
	if _, err := f.ReadAt(head, 0); err != nil && !errors.Is(err, io.EOF) {
		return s, err
	}
	if line, _, ok := bytes.Cut(head, []byte("\n")); ok {
		if rec, err := ParseRecord(line); err == nil && rec.Tag == "shardd" {
			s.header(rec)
		}
	}
	tail := head
	if fi.Size() > int64(len(head)) {
		off := max(0, fi.Size()-tailLimit)
		tail = make([]byte, fi.Size()-off)
		if _, err := f.ReadAt(tail, off); err != nil && !errors.Is(err, io.EOF) {
			return s, err
		}
		if _, rest, ok := bytes.Cut(tail, []byte("\n")); ok && off > 0 {
			tail = rest // from the first whole record
		}
	}
	// The last end record, unless a header follows it (a retry after a
	// restart appends a new header to its run's log).
	for line := range bytes.SplitSeq(tail, []byte("\n")) {
		rec, err := ParseRecord(line)
		if err != nil || rec.Tag != "shardd" {
			continue
		}
		switch {
		case bytes.HasPrefix(rec.Text, []byte("end ")):
			s.End, s.Ended = ParseEnd(string(rec.Text))
		case bytes.HasPrefix(rec.Text, []byte("run job=")):
			s.Ended, s.End = false, End{ExitCode: -1}
		}
	}
	return s, nil
}

// header fills s from its log's header record.
func (s *Summary) header(rec Record) {
	f := fields(strings.TrimPrefix(string(rec.Text), "run "))
	s.Began = rec.Time
	s.Fire, _ = time.Parse(time.RFC3339, f["fire"])
	s.Attempt, _ = strconv.Atoi(f["attempt"])
	s.Source, s.Instance, s.By, s.Param = f["source"], f["instance"], f["by"], f["param"]
	s.StartAt, _ = time.Parse(time.RFC3339Nano, f["starts_at"])
}

// Summary reads the summary of run id of job's log, opened as Open does.
func (s *Store) Summary(job string, id RunID) (Summary, error) {
	r, err := s.Open(job, id)
	if err != nil {
		return Summary{}, err
	}
	defer r.Close()
	sum, err := summarize(r.f, job, id)
	sum.Writing = r.Writing()
	return sum, err
}

// Scan calls each with the summary of each of job's logs (only item's,
// when item >= 0), the ones being written first, then the others newest
// modified first, until each returns false. A log removed meanwhile is
// left out; one that cannot be read is skipped, and counted in the error
// Scan returns.
func (s *Store) Scan(job string, item int, each func(Summary) bool) error {
	if !isJobName(job) {
		return fmt.Errorf("run logs of job %q: not a job name", job)
	}
	idx, err := s.loaded(job)
	if err != nil {
		return err
	}
	s.mu.Lock()
	ids := make([]RunID, 0, len(idx.open)+len(idx.files))
	for id := range idx.open {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b RunID) int { return b.compare(a) })
	files := slices.Clone(idx.files)
	s.mu.Unlock()
	slices.Reverse(files) // newest first
	for _, f := range files {
		ids = append(ids, f.id)
	}
	var bad []string
	for _, id := range ids {
		if item >= 0 && int(id.Item) != item {
			continue
		}
		sum, err := s.Summary(job, id)
		if errors.Is(err, ErrNoLog) || errors.Is(err, fs.ErrNotExist) {
			continue // removed by retention meanwhile
		}
		if err != nil {
			bad = append(bad, filepath.Join(job, id.String()+".log")+": "+err.Error())
			continue
		}
		if !each(sum) {
			break
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d run logs could not be read, the first: %s", len(bad), bad[0])
	}
	return nil
}

// compare orders runs by fence, then item.
func (id RunID) compare(o RunID) int {
	if id.Fence != o.Fence {
		if id.Fence < o.Fence {
			return -1
		}
		return 1
	}
	return int(id.Item) - int(o.Item)
}

// Jobs lists the jobs that have a directory in the store (job names only).
func (s *Store) Jobs() ([]string, error) {
	jobs, err := listDirs(s.root, s.dir)
	if err != nil {
		return nil, fmt.Errorf("run logs: %w", err)
	}
	slices.Sort(jobs)
	return jobs, nil
}
