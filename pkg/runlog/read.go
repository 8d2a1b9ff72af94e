package runlog

// Reading run logs, for serving them: a run's log by job and RunID, whether
// it is still being written, and a follower that returns its records as
// they are appended and ends when the log is closed.
//
// A store knows which of its logs are being written: a follower of one of
// them is woken by the store at each write and ends when the run's last
// writer closes it, however long the run is silent. A log this store does
// not write (one a previous shardd process still writes while a restarted
// one serves) is followed by polling its size, until it has not grown for
// Store.FollowIdle. A log removed by retention while it is read is read to
// its end all the same: the open file keeps its data.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shardd/shardd/pkg/trust"
)

// defaultFollowIdle is Store.FollowIdle's default.
const defaultFollowIdle = 5 * time.Second

// pollEvery is how often a follower looks at a log that no writer of its
// store notifies it of.
const pollEvery = 100 * time.Millisecond

// maxLine bounds a line a Reader returns: a record is at most a 32 KiB
// piece and its stamp and tag; a longer "line" (a damaged file) comes in
// pieces of this size.
const maxLine = 1 << 20

// ErrNoLog is the error (errors.Is) of Open for a run without a log here.
var ErrNoLog = errors.New("no run log")

// activity tells the readers of a log being written when it grows and when
// its last writer closes it.
type activity struct {
	mu   sync.Mutex
	grew chan struct{} // closed at the log's next write; nil while nobody waits
	done chan struct{} // closed when the run's last writer closed its Log
	// stopped says why the log stopped for lack of space, when the record
	// saying so found no room in its file.
	stopped string
}

// stop tells the readers why the log stopped, which its file cannot say.
func (a *activity) stop(why string) {
	if a == nil {
		return
	}
	a.mu.Lock()
	a.stopped = why
	a.mu.Unlock()
}

func (a *activity) why() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stopped
}

// wait returns a channel closed at the log's next write.
func (a *activity) wait() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.grew == nil {
		a.grew = make(chan struct{})
	}
	return a.grew
}

// wake tells the waiting readers that the log grew. A Log without readers
// pays a lock and a nil check per write.
func (a *activity) wake() {
	if a == nil {
		return
	}
	a.mu.Lock()
	if a.grew != nil {
		close(a.grew)
		a.grew = nil
	}
	a.mu.Unlock()
}

// activity returns the notifications of open log id. s.mu is held.
func (idx *jobIndex) activity(id RunID) *activity {
	a := idx.watch[id]
	if a == nil {
		a = &activity{done: make(chan struct{})}
		idx.watch[id] = a
	}
	return a
}

// closeWatch ends the notifications of log id, whose last writer closed
// it at now, and remembers that for idle. s.mu is held.
func (idx *jobIndex) closeWatch(id RunID, now time.Time, idle time.Duration) {
	if a := idx.watch[id]; a != nil {
		a.wake()
		close(a.done)
		delete(idx.watch, id)
	}
	idx.closed.add(id, now, idle)
}

// recentCloses remembers which logs a store closed within the last
// FollowIdle: a reader that opened one just before it closed knows it is
// finished without polling. Its size is bounded by the runs that end in a
// FollowIdle.
type recentCloses struct {
	at    map[RunID]int64 // when, Unix nanoseconds
	order []RunID         // at's keys, oldest first (a key may repeat)
}

func (r *recentCloses) add(id RunID, now time.Time, idle time.Duration) {
	if r.at == nil {
		r.at = map[RunID]int64{}
	}
	cut := now.Add(-idle).UnixNano()
	for len(r.order) > 0 {
		old := r.order[0]
		if t, ok := r.at[old]; ok && t >= cut {
			break
		} else if ok {
			delete(r.at, old)
		}
		r.order = r.order[1:]
	}
	if len(r.order) == 0 && cap(r.order) > 1024 {
		r.order = nil // let a burst's backing array go
	}
	r.at[id] = now.UnixNano()
	r.order = append(r.order, id)
}

func (r *recentCloses) since(id RunID, cut time.Time) bool {
	t, ok := r.at[id]
	return ok && t >= cut.UnixNano()
}

func (s *Store) followIdle() time.Duration {
	if s.FollowIdle > 0 {
		return s.FollowIdle
	}
	return defaultFollowIdle
}

// state says whether job's log id is being written by this store (its
// notifications) or was closed by it within FollowIdle.
func (s *Store) state(job string, id RunID) (act *activity, closedLately bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	idx := s.jobs[job]
	if idx == nil {
		return nil, false
	}
	if a := idx.watch[id]; a != nil {
		return a, false
	}
	return nil, idx.closed.since(id, s.now().Add(-s.followIdle()))
}

// Writing reports whether the log of run id of job is being written: a
// Log of this store is open on it.
func (s *Store) Writing(job string, id RunID) bool {
	act, _ := s.state(job, id)
	return act != nil
}

// Has reports whether run id of job has a log in this store that Open
// opens.
func (s *Store) Has(job string, id RunID) bool {
	r, err := s.Open(job, id)
	if err != nil {
		return false
	}
	r.Close()
	return true
}

// Runs lists the runs of job that have a log in this store, by fence and
// item; fence > 0 lists only that fence's (the runs of one claim). Files
// that fail the checks of a log (see Trust in the package doc) are left
// out.
func (s *Store) Runs(job string, fence int64) ([]RunID, error) {
	if !isJobName(job) {
		return nil, fmt.Errorf("run logs of job %q: not a job name", job)
	}
	dir, err := s.jobDir(job, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("run logs of job %q: %w", job, err)
	}
	defer dir.Close()
	logs, _, err := listLogs(dir, dir.Name(), func(id RunID) bool { return fence <= 0 || id.Fence == fence })
	if err != nil {
		return nil, fmt.Errorf("run logs of job %q: %w", job, err)
	}
	var ids []RunID
	for _, e := range logs {
		id, _ := runOfFile(e.name)
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b RunID) int {
		if a.Fence != b.Fence {
			return int(a.Fence - b.Fence)
		}
		return int(a.Item - b.Item)
	})
	return ids, nil
}

// Reader reads one run's log line by line (each line one record, see the
// package doc); ParseRecord reads a line. Not safe for concurrent use.
type Reader struct {
	s    *Store // nil: a file opened on its own (OpenFile)
	job  string
	id   RunID
	f    *os.File
	buf  []byte // read from f, not yet returned: buf[start:]
	pos  int
	act  *activity // while the store writes the log
	done bool      // the store's writer closed the log: nothing more comes
	idle time.Duration
	eof  bool // Follow returned io.EOF
}

// Open opens the log of run id of job for reading from its start: only a
// log that passes the checks (see Trust in the package doc), reached
// without following a link, whose first record is the header of that run
// (or that is empty: its header waits for room). Its error is ErrNoLog
// (errors.Is) when this store has no such log, and wraps
// trust.ErrNotTrusted for a file refused.
func (s *Store) Open(job string, id RunID) (*Reader, error) {
	if !isJobName(job) {
		return nil, fmt.Errorf("run log of job %q: not a job name", job)
	}
	// The file first, then the store's state: a log closed in between is
	// known closed, and its data is in the open file even if retention
	// removes it now.
	f, err := openLog(int(s.root.Fd()), s.dir, job, id, thisUser)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: run %s of job %q has no log in %s", ErrNoLog, id, job, s.dir)
	}
	if err != nil {
		return nil, fmt.Errorf("run log of job %q: %w", job, err)
	}
	r := &Reader{s: s, job: job, id: id, f: f, idle: s.followIdle()}
	act, closed := s.state(job, id)
	r.act, r.done = act, closed
	return r, nil
}

// openLog opens the log of run id of job for reading in the run log
// directory root (at path), as Open does, for files of o's.
func openLog(root int, path, job string, id RunID, o owner) (*os.File, error) {
	dirPath := filepath.Join(path, job)
	dir, err := openDir(root, job, dirPath, o)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	logPath := filepath.Join(dirPath, id.String()+".log")
	f, _, err := openLogAt(dir, id.String()+".log", logPath, readFlags, o)
	if err != nil {
		return nil, err
	}
	if err := checkHeader(f, logPath, job, id); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// OpenFile opens the log of run id of job in the run log directory dir
// for a reader outside the process that writes it (shardd logs, on the
// host of an instance that is not live): dir as named (its links
// followed), nothing below it; the job's directory and the log must pass
// the checks of Open, and belong to the owner of dir. Its follower polls
// the log, and ends once it has not grown for idle (<= 0: the default
// FollowIdle) or it is removed. Its error is ErrNoLog (errors.Is) when dir
// has no such log.
func OpenFile(dir, job string, id RunID, idle time.Duration) (*Reader, error) {
	if !isJobName(job) {
		return nil, fmt.Errorf("run log of job %q: not a job name", job)
	}
	f, err := openIn(dir, job, id)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: run %s of job %q has no log in %s", ErrNoLog, id, job, dir)
	}
	if err != nil {
		return nil, err
	}
	if idle <= 0 {
		idle = defaultFollowIdle
	}
	return &Reader{f: f, idle: idle}, nil
}

// openIn opens the log of run id of job in the run log directory dir, for
// OpenFile.
func openIn(dir, job string, id RunID) (*os.File, error) {
	top, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer top.Close()
	fi, err := top.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s is not a directory", dir)
	}
	if err := trust.Check(dir, fi, false); err != nil {
		return nil, err
	}
	return openLog(int(top.Fd()), dir, job, id, owner{uid: uidOf(fi)})
}

// Close closes the reader's file.
func (r *Reader) Close() error { return r.f.Close() }

// Writing reports whether the log is being written by the reader's store
// now: then Next's io.EOF is the end of what is written so far.
func (r *Reader) Writing() bool {
	r.refresh()
	return r.act != nil
}

// Stopped says why the log stopped early, when it ran out of space and
// the record saying so found no room in its file: while the run goes on,
// and after, while its closing records wait in its store's memory (see
// Space in the package doc). "" otherwise: a log that stopped says so
// itself, in a shardd record beginning "run log stopped:", whenever that
// could be written.
func (r *Reader) Stopped() string {
	if r.s == nil {
		return ""
	}
	r.refresh()
	if r.act != nil {
		if why := r.act.why(); why != "" {
			return why
		}
	}
	return r.s.stoppedWhy(r.job, r.id)
}

// refresh looks at the store's state again: the writer may have closed the
// log, or a writer opened it since (a retry appending, a run just begun).
func (r *Reader) refresh() {
	if r.act != nil {
		select {
		case <-r.act.done:
			r.act, r.done = nil, true
		default:
		}
		return
	}
	if r.s != nil && !r.done {
		r.act, r.done = r.s.state(r.job, r.id)
	}
}

// Buffered reports whether the next line is read already: Next and
// Follow return it without reading or waiting.
func (r *Reader) Buffered() bool {
	rest := r.buf[r.pos:]
	return bytes.IndexByte(rest, '\n') >= 0 || len(rest) >= maxLine
}

// line returns the next complete line in buf, without its newline.
func (r *Reader) line() ([]byte, bool) {
	rest := r.buf[r.pos:]
	if i := bytes.IndexByte(rest, '\n'); i >= 0 {
		r.pos += i + 1
		return rest[:i], true
	}
	if len(rest) >= maxLine {
		r.pos += maxLine
		return rest[:maxLine], true
	}
	return nil, false
}

// fill reads what the file has after buf; n is how many bytes it read.
func (r *Reader) fill() (int, error) {
	if r.pos > 0 { // keep the unread part at the start
		r.buf = r.buf[:copy(r.buf, r.buf[r.pos:])]
		r.pos = 0
	}
	total := 0
	for {
		if cap(r.buf)-len(r.buf) < 32<<10 {
			r.buf = slices.Grow(r.buf, 64<<10)
		}
		n, err := r.f.Read(r.buf[len(r.buf):cap(r.buf)])
		r.buf = r.buf[:len(r.buf)+n]
		total += n
		if err == io.EOF || (err == nil && n == 0) {
			return total, nil
		}
		if err != nil {
			return total, err
		}
		if len(r.buf)-r.pos >= maxLine {
			return total, nil
		}
	}
}

// rest returns an unfinished last line of a log nobody writes (a damaged
// file, or the end of one whose process died mid-record), once.
func (r *Reader) rest() ([]byte, bool) {
	rest := r.buf[r.pos:]
	r.pos = len(r.buf)
	return rest, len(rest) > 0
}

// Next returns the log's next line (one record, without its newline; it
// is valid until the next call), or io.EOF at the end of what is written
// now. Of a log being written it returns only complete lines.
func (r *Reader) Next() ([]byte, error) {
	if l, ok := r.line(); ok {
		return l, nil
	}
	r.refresh()
	writing := r.act != nil
	if _, err := r.fill(); err != nil {
		return nil, err
	}
	if l, ok := r.line(); ok {
		return l, nil
	}
	if !writing && (r.done || r.finished()) {
		if l, ok := r.rest(); ok {
			return l, nil
		}
	}
	return nil, io.EOF
}

// Follow returns the log's next line (as Next), waiting for one while the
// log is being written; io.EOF once the log is closed and every line of it
// was returned; ctx's error when ctx ends first.
//
// A log the store writes wakes its followers at each write and ends them
// when its run's last writer closes it. A log the store does not write is
// polled until it has not grown for the idle time, or is removed.
func (r *Reader) Follow(ctx context.Context) ([]byte, error) {
	if r.eof {
		return nil, io.EOF
	}
	for {
		if l, ok := r.line(); ok {
			return l, nil
		}
		r.refresh()
		var grew <-chan struct{}
		if r.act != nil {
			grew = r.act.wait() // before reading: a write after the read wakes us
		}
		n, err := r.fill()
		if err != nil {
			return nil, err
		}
		if n > 0 {
			continue
		}
		switch {
		case r.act != nil:
			select {
			case <-grew:
			case <-r.act.done:
				r.act, r.done = nil, true // read once more to its end
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			continue
		case r.done || r.finished():
			if l, ok := r.rest(); ok {
				return l, nil
			}
			r.eof = true
			return nil, io.EOF
		}
		select {
		case <-time.After(pollEvery):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// finished says whether a log no writer of the store notifies of is over:
// removed, or not changed for the idle time.
func (r *Reader) finished() bool {
	fi, err := r.f.Stat()
	if err != nil {
		return true
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink == 0 {
		return true // removed: nothing will write it again
	}
	return time.Since(fi.ModTime()) >= r.idle
}

// ParseRecord reads one line of a run log (without its newline).
func ParseRecord(line []byte) (Record, error) {
	ts, rest, ok1 := bytes.Cut(line, []byte(" "))
	tag, text, ok2 := bytes.Cut(rest, []byte(" "))
	t, terr := time.Parse(time.RFC3339Nano, string(ts))
	if !ok1 || !ok2 || terr != nil || !slices.Contains([]string{"out", "out+", "err", "err+", "shardd"}, string(tag)) {
		return Record{}, errors.New("not <time> <tag> <text>")
	}
	return Record{Time: t, Tag: string(tag), Text: slices.Clone(text)}, nil
}

// Stream is the stream of a record's tag: "stdout" (out, out+), "stderr"
// (err, err+), or "shardd".
func Stream(tag string) string {
	switch strings.TrimSuffix(tag, "+") {
	case "out":
		return "stdout"
	case "err":
		return "stderr"
	}
	return tag
}

// ParseRun reads a run named FENCE-ITEM, or FENCE alone (item -1): how
// operators name a run, from the FENCE and ITEM columns of its history.
func ParseRun(s string) (fence int64, item int, ok bool) {
	if id, ok := ParseRunID(s); ok {
		return id.Fence, int(id.Item), true
	}
	f, err := strconv.ParseInt(s, 10, 64)
	if err != nil || f <= 0 || strconv.FormatInt(f, 10) != s {
		return 0, 0, false
	}
	return f, -1, true
}
