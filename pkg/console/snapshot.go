package console

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"github.com/shardd/shardd/pkg/coord/admin"
)

// current returns the current snapshot, nil if none, without reading.
func (s *snapshots) current() *snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// ---- snapshots

// snapshot is the cluster as read at one time.
type snapshot struct {
	at time.Time
	// gen is the generation of the snapshots (see snapshots.gen) when
	// its read began: it shows every write invalidated before that.
	gen  uint64
	st   *admin.ClusterStatus
	runs map[string]admin.JobRuns
	rows []jobRow // by name
}

// snapshots keeps the latest snapshot and refreshes it, one read at a time.
//
// A write through this instance's API (invalidate) bumps gen. A snapshot
// is current only if its read began at the current generation: a read in
// progress when a write is made saw the cluster before the write, however
// late it ends, so it does not count as fresh for the pages after the
// write; they wait for a read begun after it.
type snapshots struct {
	c          *console
	mu         sync.Mutex
	cur        *snapshot
	refreshing chan struct{} // closed when the read in progress ends; nil if none
	err        error         // the last read's
	gen        uint64        // bumped by every invalidate
	lastUse    time.Time     // of a page (real time)
	warming    bool          // a refresh is scheduled (keepWarm)
}

// maxStale is the oldest snapshot a page shows without waiting for a
// fresh one: an operator coming back after a while sees the cluster as it
// is, not as it was.
const maxStale = 15 * time.Second

// get returns a snapshot, and a warning when it is older than it should
// be: the current one if younger than MaxAge; else, starting a refresh,
// the current one anyway if younger than maxStale and no write made it
// stale (invalidate); else a newer one whose read began after every
// write before the page, if it comes while ctx lasts (a read that began
// before such a write, in progress or just ended, is followed by another);
// else the current one, however old, with a warning that says why; else
// the error.
func (s *snapshots) get(ctx context.Context) (*snapshot, string, error) {
	s.mu.Lock()
	s.lastUse = time.Now()
	cur, want := s.cur, s.gen
	age := time.Duration(0)
	if cur != nil {
		age = s.c.o.Now().Sub(cur.at)
	}
	valid := cur != nil && cur.gen == want
	if valid && age < s.c.o.MaxAge {
		s.mu.Unlock()
		return cur, "", nil
	}
	done := s.refresh()
	s.mu.Unlock()
	if valid && age < maxStale {
		return cur, "", nil
	}
	for {
		select {
		case <-done:
		case <-ctx.Done():
		}
		s.mu.Lock()
		if fresh := s.cur; fresh != nil && fresh != cur && fresh.gen >= want {
			s.mu.Unlock()
			return fresh, "", nil
		}
		if s.err != nil || ctx.Err() != nil {
			break // s.mu held
		}
		// The read that ended began before a write the page must show.
		done = s.refresh()
		s.mu.Unlock()
	}
	defer s.mu.Unlock()
	switch {
	case s.cur != nil && s.err != nil:
		return s.cur, fmt.Sprintf("etcd did not answer (%v): this is the cluster as it was %s ago", s.err, s.c.o.Now().Sub(s.cur.at).Round(time.Second)), nil
	case s.cur != nil:
		return s.cur, fmt.Sprintf("etcd has not answered within %s: this is the cluster as it was %s ago", s.c.o.PageWait, s.c.o.Now().Sub(s.cur.at).Round(time.Second)), nil
	case s.err != nil:
		return nil, "", s.err
	}
	return nil, "", fmt.Errorf("etcd at %s has not answered within %s", strings.Join(s.c.o.Endpoints, ","), s.c.o.PageWait)
}

// invalidate makes the next page wait for a fresh snapshot: a write
// through this instance's API changed the cluster.
func (s *snapshots) invalidate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
}

// refresh starts a read unless one is in progress; s.mu is held.
func (s *snapshots) refresh() chan struct{} {
	if s.refreshing != nil {
		return s.refreshing
	}
	done := make(chan struct{})
	s.refreshing = done
	gen := s.gen
	go func() { // ends with the read, bounded by Timeout
		defer close(done)
		began := time.Now()
		snap, err := s.c.read()
		took := time.Since(began)
		s.mu.Lock()
		defer s.mu.Unlock()
		s.refreshing, s.err = nil, err
		if err == nil {
			// Newer than cur, kept even when a write came meanwhile
			// (then it is not current: its gen is behind).
			snap.gen = gen
			s.cur = snap
		} else {
			s.c.o.Logger.Warn("console: read the cluster", "err", err)
		}
		s.keepWarm(took)
	}()
	return done
}

// keepWarm schedules the next refresh while pages are asked for (within
// Options.Warm of the last one), so that a page in use never waits for a
// read: every MaxAge, or five times as long as a read takes (a large
// cluster is not read back to back). s.mu is held.
func (s *snapshots) keepWarm(took time.Duration) {
	warm := s.c.o.Warm
	if warm <= 0 || s.warming || time.Since(s.lastUse) > warm {
		return
	}
	s.warming = true
	time.AfterFunc(max(s.c.o.MaxAge, 5*took), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.warming = false
		if time.Since(s.lastUse) <= warm {
			s.refresh()
		}
	})
}

// read reads a snapshot.
func (c *console) read() (*snapshot, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.o.Timeout)
	defer cancel()
	at := c.o.Now()
	st, err := c.o.Admin.Status(ctx)
	if err != nil {
		return nil, err
	}
	// The items' records come with the status (at its revision, so that
	// the rows and the health agree); read apart only when they did not.
	runs := make(map[string]admin.JobRuns, len(st.Jobs))
	var missing []string
	for i := range st.Jobs {
		if jr, ok := st.Jobs[i].Runs(); ok {
			runs[st.Jobs[i].Name] = jr
		} else {
			missing = append(missing, st.Jobs[i].Name)
		}
	}
	if len(missing) > 0 {
		more, err := c.o.Admin.JobRuns(ctx, missing)
		if err != nil {
			return nil, err
		}
		maps.Copy(runs, more)
	}
	snap := &snapshot{at: at, st: st, runs: runs, rows: make([]jobRow, len(st.Jobs))}
	for i := range st.Jobs {
		snap.rows[i] = newJobRow(&st.Jobs[i], runs[st.Jobs[i].Name])
	}
	return snap, nil
}

// ---- job rows
