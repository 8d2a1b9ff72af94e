package runlog

// Retention and the store's index of its logs (see Bounds, Space and Locks
// in the package doc).
//
// The index of a job is loaded on first need (retention at a run's end, a
// Sweep, making room), listing the job's directory without the store's
// lock; logs closed meanwhile are remembered apart (fresh) and win over
// what the listing saw. Every removal takes the lock for one log: it
// checks that the log is not open, unlinks it and drops it from the index,
// so that a run appending to its log (a retry) either keeps it open
// through the removal's check or creates it anew after.

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/shardd/shardd/pkg/trust"
)

// jobIndex is what the store knows of a job's logs.
type jobIndex struct {
	open map[RunID]int // runs whose logs are being written: how many writers
	// watch tells the readers of each open log when it grows and when it
	// closes (see read.go); closed remembers, for FollowIdle, when this
	// store closed a log, so that its followers need not poll.
	watch  map[RunID]*activity
	closed recentCloses

	// loaded says that files lists the job's directory: its log files,
	// oldest first, taking bytes of disk. Before, fresh holds the logs
	// closed since the store began.
	loaded bool
	files  []file
	bytes  int64
	fresh  map[RunID]file
}

// file is one log in the index: 32 bytes, so that a job's index stays
// small even with tens of thousands of logs.
type file struct {
	id    RunID
	mtime int64 // Unix nanoseconds
	bytes int64 // disk used, in blocks
}

// entry returns job's index, empty and not loaded when new. s.mu is held.
func (s *Store) entry(job string) *jobIndex {
	idx := s.jobs[job]
	if idx == nil {
		idx = &jobIndex{open: map[RunID]int{}, watch: map[RunID]*activity{}}
		s.jobs[job] = idx
	}
	return idx
}

// loaded returns job's index, loaded: the first time, it lists the job's
// directory, holding no lock.
func (s *Store) loaded(job string) (*jobIndex, error) {
	s.mu.Lock()
	idx := s.entry(job)
	done := idx.loaded
	s.mu.Unlock()
	if done {
		return idx, nil
	}
	files, err := s.list(job)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	idx = s.entry(job) // another one, if Sweep forgot the job meanwhile
	if !idx.loaded {
		idx.install(files)
	}
	return idx, nil
}

// list reads job's log files from its directory, oldest first; names of
// logs that fail the checks (see Trust in the package doc) are left out,
// and logged. It holds no lock.
func (s *Store) list(job string) ([]file, error) {
	dir, err := s.jobDir(job, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("run logs of job %q: %w", job, err)
	}
	defer dir.Close()
	logs, odd, err := listLogs(dir, dir.Name(), nil)
	if err != nil {
		return nil, fmt.Errorf("run logs of job %q: %w", job, err)
	}
	if len(odd) > 0 {
		s.logger().Warn("run logs: files named like run logs that are not this user's regular files (symbolic links, hard links, others' or writable by others) are never written, served nor removed; someone may have planted them: look, then remove them",
			"job", job, "dir", dir.Name(), "files", strings.Join(odd[:min(len(odd), 10)], " "), "count", len(odd))
	}
	files := make([]file, 0, len(logs))
	for _, e := range logs {
		id, _ := runOfFile(e.name)
		files = append(files, file{id: id, mtime: e.mtime, bytes: e.bytes})
	}
	slices.SortStableFunc(files, older)
	return files, nil
}

// older orders logs by their mtime, oldest first.
func older(a, b file) int { return cmp.Compare(a.mtime, b.mtime) }

// install makes files (a listing, oldest first) the index, with the logs
// closed since the listing began; logs being written come in when they
// close. s.mu is held: the listing was sorted without it.
func (idx *jobIndex) install(files []file) {
	files = slices.DeleteFunc(files, func(f file) bool { return idx.open[f.id] > 0 })
	for i, f := range files {
		if g, ok := idx.fresh[f.id]; ok {
			files[i] = g
			delete(idx.fresh, f.id)
		}
	}
	for _, g := range idx.fresh { // closed after the listing read the directory
		files = append(files, g)
	}
	if !slices.IsSortedFunc(files, older) { // the listing is sorted: only logs closed since move
		slices.SortStableFunc(files, older)
	}
	idx.files, idx.fresh, idx.loaded = files, nil, true
	idx.bytes = 0
	for _, f := range files {
		idx.bytes += f.bytes
	}
}

// reopened takes log id out of the index while it is written again (a
// retry appends to its run's log): logs being written are not counted
// against the job's retention, and are never removed. s.mu is held.
func (idx *jobIndex) reopened(id RunID) {
	if !idx.loaded {
		delete(idx.fresh, id) // it comes in again when it closes
		return
	}
	if i := slices.IndexFunc(idx.files, func(f file) bool { return f.id == id }); i >= 0 {
		idx.bytes -= idx.files[i].bytes
		idx.files = slices.Delete(idx.files, i, i+1)
	}
}

// closedLog records in the index that log id was closed, as fi (nil: it is
// gone, or was not opened). s.mu is held.
func (idx *jobIndex) closedLog(id RunID, fi os.FileInfo) {
	if fi == nil {
		return
	}
	f := file{id: id, mtime: fi.ModTime().UnixNano(), bytes: diskBytes(fi)}
	if !idx.loaded {
		if idx.fresh == nil {
			idx.fresh = map[RunID]file{}
		}
		idx.fresh[id] = f
		return
	}
	idx.reopened(id) // in case it was listed: it moves to the end
	idx.files = append(idx.files, f)
	idx.bytes += f.bytes
}

// release marks a job's log as written (u: its closing records, kept for
// room; fi: the file as it was closed, nil when gone or never opened) and
// applies the job's retention; whole says the log was closed with all its
// records, so that there is room for the records of others.
func (s *Store) release(job string, id RunID, r Retention, u *unwritten, whole bool, fi os.FileInfo) {
	s.mu.Lock()
	idx := s.entry(job)
	if u != nil { // before its readers learn that it closed
		s.unwritten.keep(runKey{job, id}, u)
	}
	if idx.open[id]--; idx.open[id] <= 0 {
		delete(idx.open, id)
		idx.closeWatch(id, s.now(), s.followIdle())
	}
	idx.closedLog(id, fi)
	s.mu.Unlock()
	s.prune(job, r, nil)
	if whole {
		s.flushUnwritten()
	}
}

// prune removes job's oldest finished logs while they are older than
// r.MaxAge or take more than r.MaxTotalBytes; each, if set, is called
// after each removal.
func (s *Store) prune(job string, r Retention, each func()) error {
	idx, err := s.loaded(job)
	if err != nil {
		return err
	}
	cutoff := s.now().Add(-r.MaxAge).UnixNano()
	over := func(f file) bool { return f.mtime < cutoff || idx.bytes > r.MaxTotalBytes }
	dir := &jobDir{s: s, job: job}
	defer dir.close()
	for {
		if _, ok := s.removeOldest(dir, idx, over); !ok {
			return nil
		}
		if each != nil {
			each()
		}
	}
}

// oldest returns the position of the oldest finished log of idx, -1 when
// none. s.mu is held.
func (idx *jobIndex) oldest() int {
	for i, f := range idx.files {
		if idx.open[f.id] == 0 {
			return i
		}
	}
	return -1
}

// jobDir is a job's directory, opened (outside the store's lock) when a
// removal first needs it: logs are removed relative to it, never through
// a path.
type jobDir struct {
	s   *Store
	job string
	f   *os.File
	err error
}

func (d *jobDir) open() error {
	if d.f == nil && d.err == nil {
		d.f, d.err = d.s.jobDir(d.job, false)
	}
	return d.err
}

func (d *jobDir) close() {
	if d.f != nil {
		d.f.Close()
	}
}

// removeOldest removes the oldest finished log of dir's job (idx) if over
// says so, and returns the disk it took. A log that cannot be removed
// stops it (tried again next time).
func (s *Store) removeOldest(dir *jobDir, idx *jobIndex, over func(file) bool) (int64, bool) {
	due := func() bool { i := idx.oldest(); return i >= 0 && over(idx.files[i]) }
	if dir.f == nil { // the directory is opened only for a removal
		s.mu.Lock()
		ok := due()
		s.mu.Unlock()
		if !ok || dir.open() != nil {
			return 0, false
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !due() {
		return 0, false
	}
	return s.remove(dir, idx, idx.oldest())
}

// remove unlinks log i of dir's job (idx) and drops it from the index.
// s.mu is held.
func (s *Store) remove(dir *jobDir, idx *jobIndex, i int) (int64, bool) {
	f := idx.files[i]
	if err := unix.Unlinkat(int(dir.f.Fd()), f.id.String()+".log", 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, false
	}
	if i == 0 {
		idx.files = idx.files[1:]
	} else {
		idx.files = slices.Delete(idx.files, i, i+1)
	}
	idx.bytes -= f.bytes
	s.unwritten.drop(runKey{dir.job, f.id}) // its file is gone: its space with it
	return f.bytes, true
}

// makeRoom removes finished logs, oldest first, until want bytes (of disk,
// in blocks) are freed: job's own first, then any job's, the store's
// oldest first. When removing every finished log would not free want, it
// removes none: they would go for nothing, the log still could not write.
// It returns the bytes freed, the logs removed, and the disk the finished
// logs it chose from took.
func (s *Store) makeRoom(job string, want int64) (freed int64, removed int, finished int64) {
	own, err := s.loaded(job)
	if err == nil {
		finished = s.finished(own)
	}
	all := err != nil || finished < want
	if all { // its own are not enough: every job's, to know the store's oldest
		jobs, err := listDirs(s.root, s.dir)
		if err != nil {
			return 0, 0, finished
		}
		for _, name := range jobs {
			s.loaded(name)
		}
		if finished = s.finished(nil); finished < want {
			return 0, 0, finished
		}
	}
	everything := func(file) bool { return true }
	dir := &jobDir{s: s, job: job}
	defer dir.close()
	for own != nil && freed < want {
		b, ok := s.removeOldest(dir, own, everything)
		if !ok {
			break
		}
		freed, removed = freed+b, removed+1
	}
	for all && freed < want {
		b, ok := s.removeOldestOfAll()
		if !ok {
			break
		}
		freed, removed = freed+b, removed+1
	}
	return freed, removed, finished
}

// finished returns the disk idx's finished logs take, or with idx nil
// every loaded job's (as the index counts them).
func (s *Store) finished(idx *jobIndex) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if idx != nil {
		return idx.bytes
	}
	var n int64
	for _, x := range s.jobs {
		if x.loaded {
			n += x.bytes
		}
	}
	return n
}

// removeOldestOfAll removes the oldest finished log of the store's loaded
// jobs: it chooses the job under the lock, opens its directory without
// it, and removes that job's oldest finished log then.
func (s *Store) removeOldestOfAll() (int64, bool) {
	s.mu.Lock()
	var job string
	var idx *jobIndex
	at := -1
	for name, x := range s.jobs {
		if !x.loaded {
			continue
		}
		if i := x.oldest(); i >= 0 && (at < 0 || x.files[i].mtime < idx.files[at].mtime) {
			job, idx, at = name, x, i
		}
	}
	s.mu.Unlock()
	if at < 0 {
		return 0, false
	}
	dir := &jobDir{s: s, job: job}
	defer dir.close()
	return s.removeOldest(dir, idx, func(file) bool { return true })
}

// Sweep applies retention to every job's logs, those of jobs no longer
// defined included (retention gives their retention; unknown jobs get the
// defaults), and forgets jobs whose logs are all gone; then it appends the
// closing records kept for room, if there is room now. Run it now and then
// (shardd does hourly): jobs that no longer run have no run end to do it.
// It holds the store's lock for one file system call at a time: runs
// create and close their logs meanwhile. Its error names the job
// directories it refused (see Trust in the package doc), left alone.
func (s *Store) Sweep(retention func(job string) (Retention, bool)) error {
	jobs, err := listDirs(s.root, s.dir) // job names only: not lost+found, nor another program's
	if err != nil {
		return fmt.Errorf("run logs: %w", err)
	}
	var refused []error
	for _, job := range jobs {
		if _, err := s.loaded(job); err != nil {
			if errors.Is(err, trust.ErrNotTrusted) {
				refused = append(refused, err)
			}
			continue
		}
		var each func()
		if s.sweepHook != nil {
			s.sweepHook(job, "listed")
			each = func() { s.sweepHook(job, "removed") }
		}
		r, _ := retention(job)
		s.prune(job, r.withDefaults(), each)
		s.forget(job)
	}
	s.flushUnwritten()
	return errors.Join(refused...)
}

// forget drops job's index, and its directory, when it has no log left.
func (s *Store) forget(job string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if idx := s.jobs[job]; idx != nil && idx.loaded && len(idx.files) == 0 && len(idx.open) == 0 {
		delete(s.jobs, job)
		unix.Unlinkat(int(s.root.Fd()), job, unix.AT_REMOVEDIR) // only if empty; never a link
	}
}
