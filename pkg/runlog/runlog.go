// Package runlog keeps each run's whole output in a file on the host that
// ran it, with retention per job. The history in etcd keeps only a run's
// output tail; the run log has all of it, stdout and stderr apart, each line
// with the time it arrived.
//
// # Files
//
// A run is one claim of one item: its fence (the claim's etcd revision) and
// its item name it in the cluster (a claim of several items at once gives
// them one revision), so a run's log is
//
//	<dir>/<job>/<fence>-<item>.log
//
// created 0600 in directories 0700. Retries of the run (same fence) append
// to the same file.
//
// # Format
//
// One record per line:
//
//	<time: RFC 3339, UTC, microseconds> <tag> <text>
//
// where tag is out or err for a line the run wrote to stdout or stderr
// (text is the line's bytes, without its newline), out+ or err+ for a piece
// of a line that has no newline there (a line longer than 32 KiB goes on in
// the stream's next record; a try's last line without a newline ends in
// one, before a retry's note or the end), and shardd for what shardd says
// about the run: its header (job, item, fire, ...), its retries, what was
// not kept, and how it ended. Joining the texts of a stream's records, with
// a newline after each out or err record, gives the stream back as written
// (output beyond the cap excepted).
//
// # Bounds
//
// A run's log grows to at most Retention.MaxBytesPerRun bytes, records and
// all, for caps of 16 KiB and more (below that, the header and the closing
// records may pass it): output beyond is counted in a last shardd record,
// not kept. A job's finished logs take at most Retention.MaxTotalBytes of
// disk (in blocks, as du counts them; logs being written come on top) and
// none is kept longer than Retention.MaxAge: the oldest finished logs are
// removed first, when a run of the job ends and at Sweep. A log being
// written is never removed. Writing stops (with a shardd record saying so)
// before a write would leave the file system less than MinFree available
// (looked at every 64 KiB), so run logs never fill the disk; the run itself
// goes on. Memory per open log is bounded: two partial-line buffers (32 KiB
// each) and a batch of records (flushed at 64 KiB, kept up to 128 KiB).
//
// # Locks
//
// The store's lock covers its index (each job's logs, the open ones and
// their readers' notifications) and is held for at most one file system
// call (an unlink, an rmdir): listing a job's directory, reading sizes and
// writing logs are done without it. So creating a run's log never waits
// for a Sweep, nor for another run's retention, longer than one unlink.
//
// # Reading
//
// Store.Open reads a run's log by job and RunID, Store.Runs lists a job's
// logs (of one fence), Store.Writing says whether a log is being written.
// Reader.Follow returns records as they are appended and ends when the
// run's log is closed: the store wakes its followers at each write and
// when the run's last writer closes the log, so a silent run costs a
// follower nothing. A log this store does not write (a previous process
// still writes it during a restart) is polled until it has not grown for
// Store.FollowIdle. A log removed by retention while read is read to its
// end (the open file keeps its data).
//
// Failures: a log that cannot be created or written does not stop the run;
// the caller is told (Create's error, Log.Err) and the history still has the
// tail. One Log per run: two open on the same run would each count only
// their own bytes against the cap.
package runlog

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"
)

// Retention bounds a job's run logs. Zero fields take the defaults.
type Retention struct {
	MaxAge         time.Duration
	MaxBytesPerRun int64
	MaxTotalBytes  int64
}

// Defaults of Retention.
const (
	DefaultMaxAge         = 7 * 24 * time.Hour
	DefaultMaxBytesPerRun = 16 << 20
	DefaultMaxTotalBytes  = 256 << 20
)

// withDefaults returns r with its zero fields set to the defaults.
func (r Retention) withDefaults() Retention {
	if r.MaxAge <= 0 {
		r.MaxAge = DefaultMaxAge
	}
	if r.MaxBytesPerRun <= 0 {
		r.MaxBytesPerRun = DefaultMaxBytesPerRun
	}
	if r.MaxTotalBytes <= 0 {
		r.MaxTotalBytes = DefaultMaxTotalBytes
	}
	return r
}

// maxPiece is the longest record text: a longer line is written in pieces.
const maxPiece = 32 << 10

// checkEvery is how many bytes a log writes between two looks at the file
// system's free space (a statfs: about a microsecond).
const checkEvery = 64 << 10

// Store is a directory of run logs.
type Store struct {
	dir string
	// MinFree is the space (bytes) the file system must keep available:
	// below it, logs stop writing. Default: the smaller of 1 GiB and 5 % of
	// the file system.
	MinFree func(total uint64) uint64
	// FollowIdle bounds how long a follower (Reader.Follow) waits, polling,
	// for a log this store does not write to grow: one that a previous
	// process still writes, during a restart. Default 5 s. Logs this store
	// writes are followed by notification, however long they are silent.
	FollowIdle time.Duration
	now        func() time.Time
	// sweepHook, when set (tests), is called by Sweep holding no lock,
	// after it lists a job's logs ("listed") and after each log it
	// removes ("removed").
	sweepHook func(job, what string)

	mu   sync.Mutex
	jobs map[string]*jobIndex // loaded on first use
}

// RunID names a run within its job: its claim's fence and its item.
type RunID struct {
	Fence int64
	Item  int32
}

// String is the run's name in its log's file name: <fence>-<item>.
func (id RunID) String() string {
	return strconv.FormatInt(id.Fence, 10) + "-" + strconv.Itoa(int(id.Item))
}

// ParseRunID reads a RunID written by String.
func ParseRunID(s string) (RunID, bool) {
	f, i, ok := strings.Cut(s, "-")
	fence, ferr := strconv.ParseInt(f, 10, 64)
	item, ierr := strconv.ParseInt(i, 10, 32)
	id := RunID{Fence: fence, Item: int32(item)}
	return id, ok && ferr == nil && ierr == nil && fence >= 0 && item >= 0 && id.String() == s
}

// runOfFile returns the run of a log's file name, and whether it is one.
func runOfFile(name string) (RunID, bool) {
	s, ok := strings.CutSuffix(name, ".log")
	if !ok {
		return RunID{}, false
	}
	return ParseRunID(s)
}

// New returns the store in dir, creating dir (0700) if needed.
func New(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("run log directory: %w", err)
	}
	return &Store{dir: dir, now: time.Now, jobs: map[string]*jobIndex{}, MinFree: defaultMinFree, FollowIdle: defaultFollowIdle}, nil
}

func defaultMinFree(total uint64) uint64 { return min(1<<30, total/20) }

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// Path returns where the log of run id of job is.
func (s *Store) Path(job string, id RunID) string {
	return filepath.Join(s.dir, job, id.String()+".log")
}

// Header describes a run; it is the log's first record.
type Header struct {
	Job      string
	Item     int
	Fence    int64
	Fire     time.Time
	Attempt  int
	Source   string
	Instance string
	// StartAt is when a run prepared ahead of its fire is let go (zero:
	// at once): its header is written before then.
	StartAt time.Time
}

// Create opens the log of the run h for writing (appending, when the run
// already has one) and writes h into it. Close it when the run ends.
func (s *Store) Create(h Header, r Retention) (*Log, error) {
	if !isJobName(h.Job) {
		return nil, fmt.Errorf("run log of job %q: not a job name", h.Job)
	}
	if h.Fence < 0 || h.Item < 0 || h.Item > math.MaxInt32 {
		return nil, fmt.Errorf("run log of job %q: fence %d, item %d", h.Job, h.Fence, h.Item)
	}
	id := RunID{Fence: h.Fence, Item: int32(h.Item)}
	r = r.withDefaults()
	s.mu.Lock()
	idx := s.entry(h.Job)
	idx.open[id]++ // from here, Sweep leaves the job's directory alone
	act := idx.activity(id)
	s.mu.Unlock()
	if err := os.MkdirAll(filepath.Join(s.dir, h.Job), 0o700); err != nil {
		s.release(h.Job, id, r)
		return nil, fmt.Errorf("run log of job %q: %w", h.Job, err)
	}
	f, err := os.OpenFile(s.Path(h.Job, id), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		s.release(h.Job, id, r)
		return nil, fmt.Errorf("run log of job %q: %w", h.Job, err)
	}
	l := &Log{s: s, f: f, job: h.Job, id: id, ret: r, act: act}
	if fi, err := f.Stat(); err == nil && fi.Size() > 0 {
		l.size = fi.Size() // a retry's log goes on from its earlier tries
		s.mu.Lock()
		s.entry(h.Job).reopened(id)
		s.mu.Unlock()
	}
	l.mu.Lock()
	head := fmt.Appendf(nil, "run job=%s item=%d fence=%d fire=%s attempt=%d source=%s instance=%s",
		h.Job, h.Item, h.Fence, h.Fire.UTC().Format(time.RFC3339), h.Attempt, oneLine(h.Source), oneLine(h.Instance))
	if !h.StartAt.IsZero() {
		head = fmt.Appendf(head, " starts_at=%s", h.StartAt.UTC().Format(time.RFC3339Nano))
	}
	l.write(record(nil, l.stamp(), "shardd", head))
	l.mu.Unlock()
	l.checkSpace()
	return l, nil
}

// diskBytes is the disk a file takes, in blocks as du counts them.
func diskBytes(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

// isJobName reports whether name can be a job's directory: what shardd
// allows in job names (letters, digits, '-', '_', '.', not starting with
// '.'). Sweep leaves other directories alone (lost+found of a mount point).
func isJobName(name string) bool {
	if name == "" || len(name) > 255 || name[0] == '.' {
		return false
	}
	for _, r := range name {
		if !unicode.IsLetter(r) && !unicode.IsDigit(r) && r != '-' && r != '_' && r != '.' {
			return false
		}
	}
	return true
}

// oneLine makes text one record's text: newlines become spaces, and it is
// cut at maxNote bytes.
func oneLine(text string) string {
	return oneLineCut(strings.ReplaceAll(text, "\n", " "), maxNote)
}

// oneLineCut cuts text to at most n bytes, marked.
func oneLineCut(text string, n int) string {
	const mark = "...[cut]"
	if len(text) <= n {
		return text
	}
	return strings.ToValidUTF8(text[:max(0, n-len(mark))], "") + mark
}

// maxNote bounds one shardd record's text.
const maxNote = 4 << 10

// Log is one run's log. Its writers and methods are safe for concurrent use.
type Log struct {
	s   *Store
	job string
	id  RunID
	ret Retention
	act *activity // its readers' notifications

	mu           sync.Mutex
	f            *os.File
	size         int64     // the file's size
	full         bool      // no more output fits
	dropped      int64     // output bytes not kept
	droppedNotes int       // shardd records not kept
	batch        []byte    // records of one Write
	partial      [2][]byte // each stream's unfinished line
	unsaid       int64     // bytes written since the last free-space check
	stopped      string    // why writing stopped; "" while it goes on
	err          error     // the first write error
	closed       bool
}

// Stdout returns the writer of the run's standard output.
func (l *Log) Stdout() io.Writer { return stream{l, 0} }

// Stderr returns the writer of the run's standard error.
func (l *Log) Stderr() io.Writer { return stream{l, 1} }

type stream struct {
	l *Log
	n int
}

var tags = [2]string{"out", "err"}

// Write records p's complete lines; the rest waits for its newline.
// It never fails: a run's output is not the run's problem.
func (w stream) Write(p []byte) (int, error) {
	l := w.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return len(p), nil
	}
	if l.full {
		l.dropped += int64(len(p))
		return len(p), nil
	}
	n := len(p)
	l.batch = l.batch[:0]
	ts := l.stamp()
	buf := &l.partial[w.n]
	for len(p) > 0 {
		i := indexNL(p)
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		for len(*buf)+len(chunk) > maxPiece { // a long line goes in pieces
			take := maxPiece - len(*buf)
			l.add(ts, tags[w.n]+"+", append(*buf, chunk[:take]...))
			*buf, chunk = (*buf)[:0], chunk[take:]
		}
		*buf = append(*buf, chunk...)
		if i < 0 {
			break
		}
		l.add(ts, tags[w.n], *buf)
		*buf = (*buf)[:0]
		p = p[i+1:]
	}
	l.write(l.batch)
	l.batch = l.batch[:0]
	if cap(l.batch) > 2*maxBatch {
		l.batch = nil
	}
	return n, nil
}

// add puts a record of output in the batch if the log has room for it;
// from the first one it has no room for, output is counted, not kept.
// l.mu is held.
func (l *Log) add(ts, tag string, text []byte) {
	lost := int64(len(text))
	if !strings.HasSuffix(tag, "+") {
		lost++ // and its newline
	}
	if !l.full && l.size+int64(len(l.batch)+len(ts)+len(tag)+len(text)+3) > l.room() {
		l.full = true
	}
	if l.full {
		l.dropped += lost
		return
	}
	l.batch = record(l.batch, ts, tag, text)
	if len(l.batch) >= maxBatch { // memory per log stays bounded
		l.write(l.batch)
		l.batch = l.batch[:0]
	}
}

// maxBatch bounds the records a Write holds before they go to the file.
const maxBatch = 64 << 10

// room is how large output may make the file: MaxBytesPerRun, less room
// for the records that close it (the cut, and the end: at most maxNote).
func (l *Log) room() int64 {
	return l.ret.MaxBytesPerRun - min(maxNote+512, l.ret.MaxBytesPerRun/4)
}

func indexNL(p []byte) int {
	for i, b := range p {
		if b == '\n' {
			return i
		}
	}
	return -1
}

func record(out []byte, ts, tag string, text []byte) []byte {
	out = append(out, ts...)
	out = append(out, ' ')
	out = append(out, tag...)
	out = append(out, ' ')
	out = append(out, text...)
	return append(out, '\n')
}

// write appends records to the file. l.mu is held.
func (l *Log) write(b []byte) {
	if len(b) == 0 || l.stopped != "" || l.err != nil {
		return
	}
	if l.unsaid += int64(len(b)); l.unsaid >= checkEvery {
		l.unsaid = 0
		if !l.checkSpaceLocked(len(b)) {
			return
		}
	}
	if _, err := l.f.Write(b); err != nil {
		l.f.Truncate(l.size) // no half record at the end
		l.err = err
		if errors.Is(err, syscall.ENOSPC) {
			l.stopped = "run log stopped: no space left on the device"
		}
		return
	}
	l.size += int64(len(b))
	l.act.wake()
}

func (l *Log) checkSpace() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checkSpaceLocked(0)
}

// checkSpaceLocked reports whether n more bytes leave the file system
// MinFree available; if not, it stops the log (with a last record, if
// that fits).
func (l *Log) checkSpaceLocked(n int) bool {
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(int(l.f.Fd()), &st); err != nil {
		return true
	}
	avail, total := st.Bavail*uint64(st.Bsize), st.Blocks*uint64(st.Bsize)
	if need := l.s.MinFree(total); avail < need+uint64(n) {
		why := fmt.Sprintf("run log stopped: the file system has %d bytes available, and keeps %d free", avail, need)
		rec := record(nil, l.stamp(), "shardd", []byte(why))
		if _, err := l.f.Write(rec); err == nil {
			l.size += int64(len(rec))
			l.act.wake()
		} else {
			l.f.Truncate(l.size)
		}
		l.stopped = why
		return false
	}
	return true
}

// stampLayout is a record's time: UTC, microseconds, fixed width.
const stampLayout = "2006-01-02T15:04:05.000000Z"

func (l *Log) stamp() string { return l.s.now().UTC().Format(stampLayout) }

// Note records text as shardd's (one line; newlines become spaces).
func (l *Log) Note(text string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	// The streams' unfinished lines end here: what follows the note (a
	// retry's output) is not glued to them.
	ts := l.stamp()
	l.batch = l.batch[:0]
	for n := range l.partial {
		if len(l.partial[n]) > 0 {
			l.add(ts, tags[n]+"+", l.partial[n])
			l.partial[n] = l.partial[n][:0]
		}
	}
	l.write(l.batch)
	l.batch = l.batch[:0]
	rec := record(nil, ts, "shardd", []byte(oneLine(text)))
	if l.full || l.size+int64(len(rec)) > l.room() {
		l.full = true // notes count against the cap like output
		l.droppedNotes++
		return
	}
	l.write(rec)
}

// Err returns the first error met writing the log, or why it stopped.
func (l *Log) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if l.stopped != "" {
		return errors.New(l.stopped)
	}
	return nil
}

// Close writes the streams' unfinished lines, what was not kept and end
// (how the run ended) and closes the file; then the job's retention runs.
func (l *Log) Close(end string) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	ts := l.stamp()
	l.batch = l.batch[:0]
	for n := range l.partial {
		if len(l.partial[n]) > 0 {
			l.add(ts, tags[n]+"+", l.partial[n])
			l.partial[n] = nil
		}
	}
	out := l.batch
	if l.dropped > 0 || l.droppedNotes > 0 {
		notes := ""
		if l.droppedNotes > 0 {
			notes = fmt.Sprintf(" and %d shardd records", l.droppedNotes)
		}
		out = record(out, ts, "shardd", fmt.Appendf(nil, "output cut: %d bytes%s not kept, beyond maxBytesPerRun (%d bytes of run log)", l.dropped, notes, l.ret.MaxBytesPerRun))
	}
	if end != "" { // cut to fit the cap, when it can
		text := oneLine(end)
		if over := l.size + int64(len(out)+len(ts)+len(text)+len(" shardd \n")) - l.ret.MaxBytesPerRun; over > 0 {
			text = oneLineCut(text, max(64, len(text)-int(over)))
		}
		out = record(out, ts, "shardd", []byte(text))
	}
	l.write(out)
	l.closed = true
	var gone error
	if fi, err := l.f.Stat(); err == nil {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink == 0 {
			gone = fmt.Errorf("run log %s was removed while the run wrote it", l.f.Name())
		}
	}
	err := l.f.Close()
	if gone != nil {
		err = gone
	}
	if l.err != nil {
		err = l.err
	}
	l.mu.Unlock()
	l.s.release(l.job, l.id, l.ret)
	return err
}

// Record is one record of a run log.
type Record struct {
	Time time.Time
	// Tag is out, out+, err, err+ or shardd (see the package doc).
	Tag  string
	Text []byte
}

// ReadAll parses a run log. It returns the records read before the first
// malformed one, and an error naming that one's line.
func ReadAll(r io.Reader) ([]Record, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	var recs []Record
	for n := 1; len(data) > 0; n++ {
		line := data
		i := indexNL(data)
		if i < 0 {
			return recs, fmt.Errorf("run log line %d: no newline (a record being written?)", n)
		}
		line, data = data[:i], data[i+1:]
		rec, err := ParseRecord(line)
		if err != nil {
			return recs, fmt.Errorf("run log line %d: %w", n, err)
		}
		recs = append(recs, rec)
	}
	return recs, nil
}

// Streams joins records back into the streams they came from.
func Streams(recs []Record) (stdout, stderr []byte) {
	for _, r := range recs {
		switch r.Tag {
		case "out":
			stdout = append(append(stdout, r.Text...), '\n')
		case "out+":
			stdout = append(stdout, r.Text...)
		case "err":
			stderr = append(append(stderr, r.Text...), '\n')
		case "err+":
			stderr = append(stderr, r.Text...)
		}
	}
	return stdout, stderr
}
