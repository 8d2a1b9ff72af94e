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
// # Trust
//
// Run logs hold what scripts print, and the API serves them to its
// readers: so a store writes and serves only files nobody else can have
// put there, with the checks of shardd's data directory (package trust).
// New refuses a directory that another user could have prepared or could
// swap: it, and each job directory in it, must belong to this user and be
// writable by nobody else, none of them a symbolic link (dir itself may
// be a link of this user's or root's, to a directory of this user's);
// each directory above it must belong to root or to this user, and be
// sticky if others can write it; a symbolic link on its path must belong
// to root or to this user.
//
// Below dir nothing is looked up by path: each job directory and log is
// opened from its directory's descriptor, one name at a time, with
// O_NOFOLLOW, and checked once open: this user's and writable by nobody
// else; a log also a regular file with one link (not a hard link to a
// file elsewhere). A new log is created with O_EXCL. A log that is there
// already is appended to (a run retried after a restart) or read only
// when its first record is the header of that run (job, item and fence),
// or it is empty (its header waits for room). So a file planted under a
// log's name (a link to the API's token file, a hard link to a key, a
// copy of one) is never written, served nor removed. Retention lists with
// fstatat (no link followed), indexes only the logs that pass, removes
// them relative to their job's directory, and logs the names it leaves
// alone; Sweep returns the job directories it refused.
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
// written is never removed. Memory per open log is bounded: two
// partial-line buffers (32 KiB each) and a batch of records (flushed at
// 64 KiB, kept up to 128 KiB).
//
// # Space
//
// Run logs leave the file system MinFree available (the floor). A log
// looks at the space available when it is created and every 64 KiB it
// writes; below the floor (and what it is about to write), it makes room:
// it removes finished logs, oldest first, of its own job first, then of
// any job (the store's oldest first), until the floor holds again. So the
// newest logs survive a short disk, a job's output pays with its own
// history before others', and a disk that was full becomes usable again as
// soon as old logs can go. A write that fails for lack of space (ENOSPC,
// EDQUOT: something else filled the disk past the floor) makes room the
// same way and is tried once more. When removing every finished log would
// not restore the floor (something else holds the disk), none is removed:
// they would go for nothing. Then the log stops: a record says why ("run
// log stopped: ..."), the run goes on, and its output from there on is
// counted, not kept. A stopped log still ends with its closing records
// (what was not kept, how the run ended): they may use the floor. When
// even those cannot be written, the store keeps them, with the file, for
// at most maxUnwritten logs, and appends them once another log closes
// whole (or at Sweep). Whenever the record saying why a log stopped is not
// in its file (while the run goes on, or its closing records wait),
// Reader.Stopped says why.
//
// # Locks
//
// The store's lock covers its index (each job's logs, the open ones and
// their readers' notifications) and is held for at most one file system
// call (an unlink, an rmdir, or appending kept closing records): listing
// a job's directory, reading sizes and writing logs are done without it.
// So creating a run's log never waits for a Sweep, nor for another run's
// retention, longer than one unlink. On a short disk, a log waits for the
// removals that make its room (the first time, for the listing of the
// logs it chooses from): that is the price of having a log at all.
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
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"golang.org/x/sys/unix"

	"github.com/shardd/shardd/pkg/trust"
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
	dir  string
	root *os.File // dir, open: every name below it is looked up from it (see Trust)
	// MinFree is the space (bytes) run logs leave the file system
	// available (see Space in the package doc): below it, a log removes
	// finished logs to make room, and stops when none is left. Default: the
	// smaller of 1 GiB and 5 % of the file system.
	MinFree func(total uint64) uint64
	// FollowIdle bounds how long a follower (Reader.Follow) waits, polling,
	// for a log this store does not write to grow: one that a previous
	// process still writes, during a restart. Default 5 s. Logs this store
	// writes are followed by notification, however long they are silent.
	FollowIdle time.Duration
	// Logger receives what the store does on its own: logs it removed to
	// make room on a short disk. Default: discarded.
	Logger *slog.Logger
	now    func() time.Time
	// statfs returns the space available and the file system's size, of
	// the file system of fd (tests give a file system of their own).
	statfs func(fd int) (avail, total uint64, err error)
	// sweepHook, when set (tests), is called by Sweep holding no lock,
	// after it lists a job's logs ("listed") and after each log it
	// removes ("removed").
	sweepHook func(job, what string)

	mu        sync.Mutex
	jobs      map[string]*jobIndex // loaded on first use
	unwritten unwrittenSet         // closing records waiting for room
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

// New returns the store in dir, creating dir (0700) if needed. It refuses
// (errors.Is trust.ErrNotTrusted) a directory that another user could
// have prepared or could swap (see Trust in the package doc): dir must be
// this user's and writable by nobody else, so must each job directory in
// it, none of them a symbolic link, and no one but this user and root may
// be able to change what dir names. Close it when done.
func New(dir string) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("run log directory: %w", err)
	}
	// What exists of the path is checked before anything is created in
	// it: a link planted there must not lead this user's mkdir elsewhere.
	exists := abs
	for {
		if _, err := os.Lstat(exists); err == nil || exists == filepath.Dir(exists) {
			break
		}
		exists = filepath.Dir(exists)
	}
	if err := trust.Ancestors(exists, "the run log directory"); err != nil {
		return nil, fmt.Errorf("run log directory: %w", err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("run log directory: %w", err)
	}
	if err := trust.Ancestors(abs, "the run log directory"); err != nil {
		return nil, fmt.Errorf("run log directory: %w", err)
	}
	resolved, err := filepath.EvalSymlinks(abs) // dir may be a link (of this user's or root's: Ancestors)
	if err != nil {
		return nil, fmt.Errorf("run log directory: %w", err)
	}
	root, err := openDir(unix.AT_FDCWD, resolved, dir, thisUser)
	if err != nil {
		return nil, fmt.Errorf("run log directory: %w", err)
	}
	if err := checkJobDirs(root, dir); err != nil {
		root.Close()
		return nil, fmt.Errorf("run log directory: %w", err)
	}
	return &Store{dir: dir, root: root, now: time.Now, statfs: statfs, jobs: map[string]*jobIndex{}, MinFree: defaultMinFree, FollowIdle: defaultFollowIdle}, nil
}

// checkJobDirs checks the job directories in root (at dir), for New.
func checkJobDirs(root *os.File, dir string) error {
	jobs, err := listDirs(root, dir)
	if err != nil {
		return err
	}
	for _, job := range jobs {
		d, err := openDir(int(root.Fd()), job, filepath.Join(dir, job), thisUser)
		if err != nil {
			return err
		}
		d.Close()
	}
	return nil
}

// Close closes the store's directory. Call it once its logs and readers
// are closed.
func (s *Store) Close() error { return s.root.Close() }

// jobDir opens job's directory (creating it, with create), never
// following a link, and checks it (see Trust in the package doc).
func (s *Store) jobDir(job string, create bool) (*os.File, error) {
	path := filepath.Join(s.dir, job)
	if create {
		if err := mkdirAt(int(s.root.Fd()), job, path); err != nil {
			return nil, err
		}
	}
	return openDir(int(s.root.Fd()), job, path, thisUser)
}

func defaultMinFree(total uint64) uint64 { return min(1<<30, total/20) }

func statfs(fd int) (avail, total uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(fd, &st); err != nil {
		return 0, 0, err
	}
	return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize), nil
}

func (s *Store) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

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
	// By names who triggered a manual run; Param is its one-off parameter.
	By, Param string
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
	earlier := s.unwritten.take(runKey{h.Job, id})
	s.mu.Unlock()
	var carried []byte // an earlier try's closing records, kept for room
	if earlier != nil && !earlier.flush() {
		earlier.f.Close()
		carried = earlier.recs // still no room: they go before this try's header, when it finds some
	}
	f, fi, err := s.createLog(h.Job, id)
	if err != nil {
		s.release(h.Job, id, r, nil, false, nil)
		return nil, fmt.Errorf("run log of job %q: %w", h.Job, err)
	}
	l := &Log{s: s, f: f, job: h.Job, id: id, ret: r, act: act}
	if fi.Size() > 0 {
		l.size = fi.Size() // a retry's log goes on from its earlier tries
		s.mu.Lock()
		s.entry(h.Job).reopened(id)
		s.mu.Unlock()
	}
	l.mu.Lock()
	head := fmt.Appendf(nil, "run job=%s item=%d fence=%d fire=%s attempt=%d source=%s instance=%s",
		h.Job, h.Item, h.Fence, h.Fire.UTC().Format(time.RFC3339Nano), h.Attempt, oneLine(h.Source), oneLine(h.Instance))
	if !h.StartAt.IsZero() {
		head = fmt.Appendf(head, " starts_at=%s", h.StartAt.UTC().Format(time.RFC3339Nano))
	}
	if h.By != "" {
		head = fmt.Appendf(head, " by=%s", strconv.Quote(cutRunes(h.By, 256)))
	}
	if h.Param != "" {
		head = fmt.Appendf(head, " param=%s", strconv.Quote(cutRunes(h.Param, 1024)))
	}
	if hrec := append(carried, record(nil, l.stamp(), "shardd", head)...); !l.write(hrec) {
		l.owed = append(hrec, l.owed...) // the header first, when it finds room
	}
	if l.stopped == "" && l.err == nil {
		l.checkSpaceLocked(0)
	}
	l.mu.Unlock()
	return l, nil
}

// createLog creates the log of run id of job (O_EXCL), or opens the one
// there if it is that run's (see Trust in the package doc).
func (s *Store) createLog(job string, id RunID) (*os.File, os.FileInfo, error) {
	dir, err := s.jobDir(job, true)
	if err != nil {
		return nil, nil, err
	}
	defer dir.Close()
	path := s.Path(job, id)
	f, fi, created, err := createLog(dir, id.String()+".log", path)
	if err == nil && !created {
		if err = checkHeader(f, path, job, id); err != nil {
			f.Close()
		}
	}
	if err != nil {
		return nil, nil, err
	}
	return f, fi, nil
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
	full         bool      // no more output fits under MaxBytesPerRun
	dropped      int64     // output bytes not kept
	droppedNotes int       // shardd records not kept
	batch        []byte    // records of one Write
	batchOut     int64     // output bytes in batch
	partial      [2][]byte // each stream's unfinished line
	last         [2][]byte // each stream's last non-blank line (its first maxLast bytes)
	unsaid       int64     // bytes written since the last free-space check
	stopped      string    // why writing stopped for lack of space; "" while it goes on
	owed         []byte    // shardd records that found no room: the closing records begin with them
	removed      int       // finished logs removed to make room for this one
	freed        int64     // and the disk they took
	err          error     // the first write error, other than a lack of space
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
	if l.full || l.stopped != "" {
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
		l.keepLast(w.n, *buf)
		*buf = (*buf)[:0]
		p = p[i+1:]
	}
	l.flush()
	if cap(l.batch) > 2*maxBatch {
		l.batch = nil
	}
	return n, nil
}

// keepLast remembers line as stream n's last, unless it is blank. l.mu is
// held.
func (l *Log) keepLast(n int, line []byte) {
	if len(bytes.TrimSpace(line)) > 0 {
		l.last[n] = append(l.last[n][:0], line[:min(len(line), maxLast)]...)
	}
}

// LastLine returns the last non-blank line the run wrote on stderr, else
// on stdout (a line without its newline yet counts), cut to 512 bytes:
// what a failed run's history shows.
func (l *Log) LastLine() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range []int{1, 0} {
		line := l.last[n]
		if len(bytes.TrimSpace(l.partial[n])) > 0 {
			line = l.partial[n][:min(len(l.partial[n]), maxLast)]
		}
		if len(line) > 0 {
			return cutRunes(strings.ToValidUTF8(strings.TrimSpace(string(line)), "\uFFFD"), maxLast)
		}
	}
	return ""
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
	if l.full || l.stopped != "" {
		l.dropped += lost
		return
	}
	l.batch = record(l.batch, ts, tag, text)
	l.batchOut += lost
	if len(l.batch) >= maxBatch { // memory per log stays bounded
		l.flush()
	}
}

// flush writes the batch; its output that a stopped log cannot write is
// counted as not kept. l.mu is held.
func (l *Log) flush() {
	if len(l.batch) > 0 && !l.write(l.batch) {
		l.dropped += l.batchOut
	}
	l.batch, l.batchOut = l.batch[:0], 0
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

// write appends records to the file, looking at the space left every
// checkEvery bytes, and reports whether they are in it. l.mu is held.
func (l *Log) write(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	if l.stopped != "" || l.err != nil {
		return false
	}
	if l.unsaid += int64(len(b)); l.unsaid >= checkEvery {
		l.unsaid = 0
		if !l.checkSpaceLocked(len(b)) {
			return false
		}
	}
	switch err := l.putRoom(b); {
	case err == nil:
		return true
	case noSpace(err):
		l.stop(spaceText(err))
	default:
		l.err = err
	}
	return false
}

// put appends b to the file, whole or not at all. l.mu is held.
func (l *Log) put(b []byte) error {
	if _, err := l.f.Write(b); err != nil {
		l.f.Truncate(l.size) // no half record at the end
		return err
	}
	l.size += int64(len(b))
	l.act.wake()
	return nil
}

// putRoom is put, which, when the file system has no room for b, makes
// room and tries once more. l.mu is held.
func (l *Log) putRoom(b []byte) error {
	err := l.put(b)
	if noSpace(err) {
		if ok, _, _, _ := l.makeRoom(len(b), true); ok {
			err = l.put(b)
		}
	}
	return err
}

// makeRoom removes finished logs (Store.makeRoom) until the file system
// has MinFree and n more bytes available, and reports whether it has (after
// a write that failed for lack of space, whether it freed any), with the
// space available then, the floor and the disk the finished logs took.
// l.mu is held.
func (l *Log) makeRoom(n int, failed bool) (ok bool, avail, floor uint64, finished int64) {
	avail, total, err := l.s.statfs(int(l.f.Fd()))
	if err != nil {
		return !failed, 0, 0, 0
	}
	floor = l.s.MinFree(total)
	need := floor + uint64(n)
	if avail >= need && !failed {
		return true, avail, floor, 0
	}
	var want int64
	if avail < need {
		want = int64(min(need-avail, math.MaxInt64))
	}
	if failed { // a quota (EDQUOT) does not show in the file system's space
		want = max(want, int64(n)+4096)
	}
	freed, removed, finished := l.s.makeRoom(l.job, want)
	l.removed, l.freed = l.removed+removed, l.freed+freed
	avail += uint64(freed)
	if failed {
		return freed > 0, avail, floor, finished
	}
	return avail >= need, avail, floor, finished
}

// checkSpaceLocked reports whether n more bytes leave the file system
// MinFree available, making room if need be; if not, it stops the log.
// l.mu is held.
func (l *Log) checkSpaceLocked(n int) bool {
	ok, avail, floor, finished := l.makeRoom(n, false)
	if !ok {
		l.stop(fmt.Sprintf(StoppedPrefix+"the file system has %d bytes available, below the %d bytes run logs leave free, and removing the finished run logs (%d bytes) would not make up the difference", avail, floor, finished))
	}
	return ok
}

// stop ends the log's output for lack of space, with a record saying
// why: now, or first among the closing records if it finds no room. l.mu
// is held.
func (l *Log) stop(why string) {
	l.stopped = why
	rec := record(nil, l.stamp(), "shardd", []byte(why))
	if l.put(rec) != nil {
		l.owed = append(l.owed, rec...)
		l.act.stop(why) // its readers learn it from the store meanwhile
	}
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
	l.flush()
	rec := record(nil, ts, "shardd", []byte(oneLine(text)))
	if l.full || l.size+int64(len(rec)) > l.room() {
		l.full = true // notes count against the cap like output
		l.droppedNotes++
		return
	}
	if !l.write(rec) {
		l.droppedNotes++
	}
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
// The closing records are written even when the log stopped for lack of
// space (making room for them, see Space in the package doc); when they
// find none, the store keeps them until there is, and Close says so.
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
	l.flush()
	var kept *unwritten // the closing records, when they find no room
	if out := l.closing(ts, end); len(out) > 0 && l.err == nil {
		err := l.putRoom(out)
		if noSpace(err) {
			if l.stopped == "" { // the closing records are the first to find no room
				l.stopped = spaceText(err)
				l.owed = append(l.owed, record(nil, ts, "shardd", []byte(l.stopped))...)
				out = l.closing(ts, end)
			}
			kept = &unwritten{f: l.f, size: l.size, recs: out, why: l.stopped}
		} else if err != nil {
			l.err = err
		}
	}
	l.closed = true
	var gone error
	fi, err := l.f.Stat() // for the index
	if err != nil {
		fi = nil
	} else if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink == 0 {
		gone = fmt.Errorf("run log %s was removed while the run wrote it", l.f.Name())
		kept, fi = nil, nil // nothing to keep them for
	}
	if kept == nil {
		err = l.f.Close()
	} else {
		err = fmt.Errorf("%s: its last records (what was not kept, how the run ended) wait in memory until there is room", l.stopped)
	}
	if gone != nil {
		err = gone
	}
	if l.err != nil {
		err = l.err
	}
	whole := kept == nil && gone == nil && l.err == nil
	removed, freed := l.removed, l.freed
	l.mu.Unlock()
	if removed > 0 {
		l.s.logger().Info("run logs: the file system was short of space; removed the oldest finished run logs to make room",
			"job", l.job, "run", l.id.String(), "removed", removed, "freed_bytes", freed)
	}
	l.s.release(l.job, l.id, l.ret, kept, whole, fi)
	return err
}

// closing returns the records that close the log: those owed, what was
// not kept, and end, cut to fit the cap when it can be. l.mu is held.
func (l *Log) closing(ts, end string) []byte {
	out := slices.Clone(l.owed)
	if l.dropped > 0 || l.droppedNotes > 0 {
		notes := ""
		if l.droppedNotes > 0 {
			notes = fmt.Sprintf(" and %d shardd records", l.droppedNotes)
		}
		why := fmt.Sprintf("beyond maxBytesPerRun (%d bytes of run log)", l.ret.MaxBytesPerRun)
		if l.stopped != "" && !l.full {
			why = "after the run log stopped for lack of space"
		}
		out = record(out, ts, "shardd", fmt.Appendf(nil, "output cut: %d bytes%s not kept, %s", l.dropped, notes, why))
	}
	if end != "" { // cut to fit the cap, when it can
		text := oneLine(end)
		if over := l.size + int64(len(out)+len(ts)+len(text)+len(" shardd \n")) - l.ret.MaxBytesPerRun; over > 0 {
			text = oneLineCut(text, max(64, len(text)-int(over)))
		}
		out = record(out, ts, "shardd", []byte(text))
	}
	return out
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
