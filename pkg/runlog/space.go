package runlog

// A log's closing records that found no room (see Space in the package
// doc): the store keeps them, with the log's file open, until there is.

import (
	"errors"
	"os"
	"slices"
	"syscall"
)

// maxUnwritten bounds the logs whose closing records the store keeps for
// room, each with its file open: beyond, the oldest are forgotten.
const maxUnwritten = 64

// noSpace says whether err is a write's failure for lack of space.
func noSpace(err error) bool {
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// StoppedPrefix begins the shardd record that says why a log stopped
// early, for lack of space: what comes after it is why.
const StoppedPrefix = "run log stopped: "

// spaceText is what a log says when err, a lack of space, stopped it.
func spaceText(err error) string {
	why := "no space left on device"
	if errors.Is(err, syscall.EDQUOT) {
		why = "disk quota exceeded"
	}
	return StoppedPrefix + why
}

type runKey struct {
	job string
	id  RunID
}

// unwritten is a log's closing records that found no room.
type unwritten struct {
	f    *os.File
	size int64  // the file's size: a failed write is cut back to it
	recs []byte // the records
	why  string // why the log stopped
}

// flush appends the records and closes the file, but reports false, and
// keeps both, when there is still no room.
func (u *unwritten) flush() bool {
	if _, err := u.f.Write(u.recs); err != nil {
		u.f.Truncate(u.size)
		if noSpace(err) {
			return false
		}
	}
	u.f.Close()
	return true
}

// unwrittenSet is the store's unwritten records, by log. s.mu is held.
type unwrittenSet struct {
	m     map[runKey]*unwritten
	order []runKey // oldest first
}

func (us *unwrittenSet) keep(k runKey, u *unwritten) {
	us.drop(k)
	if len(us.order) >= maxUnwritten {
		us.drop(us.order[0])
	}
	if us.m == nil {
		us.m = map[runKey]*unwritten{}
	}
	us.m[k] = u
	us.order = append(us.order, k)
}

// take removes k's records from the set and returns them (nil: none).
func (us *unwrittenSet) take(k runKey) *unwritten {
	u := us.m[k]
	if u != nil {
		delete(us.m, k)
		us.order = slices.DeleteFunc(us.order, func(o runKey) bool { return o == k })
	}
	return u
}

// drop forgets k's records, closing its file.
func (us *unwrittenSet) drop(k runKey) {
	if u := us.take(k); u != nil {
		u.f.Close()
	}
}

// flushUnwritten appends the closing records kept for room, oldest first,
// while there is room; each under the lock (a removal closes their file).
func (s *Store) flushUnwritten() {
	for {
		s.mu.Lock()
		if len(s.unwritten.order) == 0 {
			s.mu.Unlock()
			return
		}
		k := s.unwritten.order[0]
		u := s.unwritten.m[k]
		if !u.flush() {
			s.mu.Unlock()
			return // still no room
		}
		s.unwritten.take(k)
		s.mu.Unlock()
	}
}

// stoppedWhy says why log id of job stopped, when its closing records
// wait for room.
func (s *Store) stoppedWhy(job string, id RunID) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u := s.unwritten.m[runKey{job, id}]; u != nil {
		return u.why
	}
	return ""
}
