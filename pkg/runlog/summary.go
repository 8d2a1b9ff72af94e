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
//	end state=FAILED exit=3 start=... finish=... last="db timeout for AMER" err="exit status 3" tries=0+1000000,2000000+1500000
//
// with reason= and status= (a hook's HTTP status) when there are some.
// The fields come in order of importance, each bounded, so that the
// record fits a shardd record (maxNote) whole: a cut (a log at its
// maxBytesPerRun) loses the least of it. tries= gives each try, when the
// run was retried, as START+DURATION in microseconds from start=: at most
// maxTries of them (the first and the last halves), and tried= counts
// them all when there were more.
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
	// Tries are each try's span, when the run was tried more than once;
	// Tried counts them (more than len(Tries) when some were left out).
	Tries []Try
	Tried int
	// Last is the last line the run wrote on stderr, else on stdout.
	Last string
}

// Try is one try of a run.
type Try struct {
	Start  time.Time `json:"start"`
	Finish time.Time `json:"end"`
}

// Bounds of an end record's fields, quoted.
const (
	maxLast     = 512 // End.Last, raw
	maxLastText = 640
	maxErrText  = 1024
	maxTries    = 100
)

// String is the end record's text.
func (e End) String() string {
	var b strings.Builder
	b.WriteString("end state=" + cutRunes(bare(e.State), 64))
	if e.Reason != "" {
		b.WriteString(" reason=" + cutRunes(bare(e.Reason), 64))
	}
	if e.ExitCode >= 0 {
		fmt.Fprintf(&b, " exit=%d", e.ExitCode)
	}
	if e.HTTPStatus > 0 {
		fmt.Fprintf(&b, " status=%d", e.HTTPStatus)
	}
	if !e.Start.IsZero() {
		b.WriteString(" start=" + e.Start.UTC().Format(time.RFC3339Nano))
	}
	if !e.Finish.IsZero() {
		b.WriteString(" finish=" + e.Finish.UTC().Format(time.RFC3339Nano))
	}
	if e.Last != "" {
		b.WriteString(" last=" + quoteCut(cutRunes(e.Last, maxLast), maxLastText))
	}
	if e.Err != "" {
		b.WriteString(" err=" + quoteCut(e.Err, maxErrText))
	}
	if tries := e.Tries; len(tries) > 1 && !e.Start.IsZero() {
		if len(tries) > maxTries {
			fmt.Fprintf(&b, " tried=%d", max(e.Tried, len(tries)))
			tries = append(slices.Clone(tries[:maxTries/2]), tries[len(tries)-maxTries/2:]...)
		} else if e.Tried > len(tries) {
			fmt.Fprintf(&b, " tried=%d", e.Tried)
		}
		spans := make([]string, len(tries))
		for i, t := range tries {
			spans[i] = strconv.FormatInt(t.Start.Sub(e.Start).Microseconds(), 10) + "+" + strconv.FormatInt(t.Finish.Sub(t.Start).Microseconds(), 10)
		}
		b.WriteString(" tries=" + strings.Join(spans, ","))
	}
	return b.String()
}

// quoteCut quotes s (Go syntax) in at most n bytes: cut, and marked, when
// its quoting is longer.
func quoteCut(s string, n int) string {
	q := strconv.Quote(s)
	if len(q) <= n {
		return q
	}
	const mark = "...[cut]"
	r := []rune(s)
	lo, hi := 0, len(r) // the longest prefix whose quoting with the mark fits
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if len(strconv.Quote(string(r[:mid])+mark)) <= n {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return strconv.Quote(string(r[:lo]) + mark)
}

// Brief is the end record without its times, tries and last line: how
// the run ended, in a word or three.
func (e End) Brief() string {
	e.Start, e.Finish, e.Tries, e.Tried, e.Last = time.Time{}, time.Time{}, nil, 0, ""
	return e.String()
}

// bare makes s one token: spaces and quotes become '_', and bytes that are
// not UTF-8 become U+FFFD (cut after, so a second pass changes nothing).
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
	e.Tried, _ = strconv.Atoi(f["tried"])
	if f["tries"] != "" && !e.Start.IsZero() {
		for span := range strings.SplitSeq(f["tries"], ",") {
			off, dur, ok := strings.Cut(span, "+")
			o, err1 := strconv.ParseInt(off, 10, 64)
			d, err2 := strconv.ParseInt(dur, 10, 64)
			if !ok || err1 != nil || err2 != nil {
				continue
			}
			at := e.Start.Add(time.Duration(o) * time.Microsecond)
			e.Tries = append(e.Tries, Try{Start: at, Finish: at.Add(time.Duration(d) * time.Microsecond)})
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
	s.Fire, _ = time.Parse(time.RFC3339Nano, f["fire"]) // whole seconds before 2026-12 (a manual run's fire to the second)
	s.Attempt, _ = strconv.Atoi(f["attempt"])
	s.Source, s.Instance, s.By, s.Param = f["source"], f["instance"], f["by"], f["param"]
	s.StartAt, _ = time.Parse(time.RFC3339Nano, f["starts_at"])
}

// Summary reads the summary of run id of job's log, opened as Open does.
// A log this store writes when the read begins, and whose end record the
// read did not find, is Writing (the run goes on, or ends at this
// moment); one whose closing records wait in memory for room on the disk
// (see Space in the package doc) ends with them.
func (s *Store) Summary(job string, id RunID) (Summary, error) {
	r, err := s.Open(job, id)
	if err != nil {
		return Summary{}, err
	}
	defer r.Close()
	writing := r.Writing()
	sum, err := summarize(r.f, job, id)
	if err != nil || sum.Ended {
		return sum, err
	}
	sum.Writing = writing || r.Writing()
	if !sum.Writing {
		s.mu.Lock()
		var kept []byte
		if u := s.unwritten.m[runKey{job, id}]; u != nil {
			kept = slices.Clone(u.recs)
		}
		s.mu.Unlock()
		for line := range bytes.SplitSeq(kept, []byte("\n")) {
			if rec, err := ParseRecord(line); err == nil && rec.Tag == "shardd" {
				if e, ok := ParseEnd(string(rec.Text)); ok {
					sum.End, sum.Ended = e, true
				}
			}
		}
	}
	return sum, nil
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
	// No directory, no logs, and no index made for the name: a job name
	// asked of the API makes nothing that stays.
	dir, err := s.jobDir(job, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("run logs of job %q: %w", job, err)
	}
	dir.Close()
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
