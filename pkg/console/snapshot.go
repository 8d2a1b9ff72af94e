// Package console is shardd's web console: server-rendered pages, served
// by every instance at / on its --listen address, over the same data as
// the API and acting through the API's own endpoints.
//
// # Pages
//
//	/                  overview: cluster health, job counts, recent failures
//	/jobs              jobs, searched and filtered server-side, 50 a page
//	/jobs/{job}        one job: items, instances, history, a run's log, actions
//	/instances         live instances: version, start, jobs, items, leaderships
//	/audit             who did what (the audit log)
//	/login, /logout    a token pasted once becomes a session cookie
//
// # Reading
//
// The overview, the job list and the instances page read a snapshot of the
// cluster (coord.ReadStatus and coord.ReadJobRuns) kept for a few seconds:
// with 10,000 jobs one read takes seconds, a page must not. A page served
// from a snapshot older than Options.MaxAge starts one refresh in the
// background (never two) and shows the age of what it shows; a snapshot
// older than 15 s is not shown: the page waits for the refresh (at most
// PageWait, then it shows what it has, with a warning). While pages are
// asked for, the snapshot is refreshed in the background (Options.Warm),
// so pages in use do not wait. A write through this instance's API
// (Invalidate) makes the next page wait for a read begun after the write:
// a read already in progress saw the cluster before it, however late it
// ends. The job page reads its job fresh (one job's keys, its items and
// history).
//
// # Acting
//
// Actions are forms that the page's script sends to the API
// (/api/v1/jobs/{job}/trigger, kill, disable, enable) with the session's
// cookie and its key in a header, after a confirmation; the API checks,
// does and records them in the audit log exactly as for any other caller.
// The console itself changes nothing: one mechanism, one audit.
//
// # Who
//
// api.Auth decides: when some token has the read role, every page needs a
// login; otherwise pages are open and a login is needed only to act. A
// read-role login sees everything and no action. Login and logout refuse
// cross-origin posts; logins are rate-limited (429).
//
// A session is two halves (see api.Auth): an HttpOnly, SameSite=Strict
// cookie (Secure over TLS), which the browser sends to every port of the
// host, so to other local users' servers too, and a key, which only this
// origin's script has. The login answers with a page that gives the key to
// the script, which keeps it in the origin's localStorage and sends it in
// api.KeyHeader with every request it makes. A navigation sends only the
// cookie: a page asked for with the cookie of a live session and no key
// is answered with a bootstrap page that holds no data, whose script asks
// for the same URL with the key and shows that page in its place. So the
// cookie alone gets nothing but the bootstrap; and the key replaces a CSRF
// token (no page of another origin can know or send it). Logout takes the
// key from its form (the script fills it in); without it, it only clears
// the caller's cookie.
package console

import (
	"context"
	"fmt"
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
	names := make([]string, len(st.Jobs))
	for i, j := range st.Jobs {
		names[i] = j.Name
	}
	runs, err := c.o.Admin.JobRuns(ctx, names)
	if err != nil {
		return nil, err
	}
	snap := &snapshot{at: at, st: st, runs: runs, rows: make([]jobRow, len(st.Jobs))}
	for i := range st.Jobs {
		snap.rows[i] = newJobRow(&st.Jobs[i], runs[st.Jobs[i].Name])
	}
	return snap, nil
}

// ---- job rows
