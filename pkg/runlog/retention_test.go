package runlog

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// writeOld writes log files of a previous process, with mtime at, of
// size bytes each (at least their header).
func writeOld(t *testing.T, s *Store, job string, at time.Time, size int, fences ...int64) {
	t.Helper()
	dir := filepath.Join(s.Dir(), job)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, fence := range fences {
		p := s.Path(job, RunID{Fence: fence})
		data := headerLine(job, RunID{Fence: fence})
		if len(data) < size {
			data += "2026-11-30T16:40:00.000000Z out " + strings.Repeat("x", max(0, size-len(data)-33)) + "\n"
		}
		if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
		at = at.Add(time.Second)
	}
}

// logsOf lists the log files of job, by name.
func logsOf(t *testing.T, s *Store, job string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(s.Dir(), job))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// A sweep paused mid-pass (after it listed a job's logs, and after it
// removed one) holds nothing a run's log needs: runs of the job being
// swept, of a job not swept yet and of a new job create, write and close
// their logs meanwhile.
func TestCreateIsNotBlockedByASweepInProgress(t *testing.T) {
	for _, at := range []string{"listed", "removed"} {
		t.Run(at, func(t *testing.T) {
			s := newStore(t)
			old := time.Now().Add(-30 * 24 * time.Hour) // past maxAge: the sweep removes them
			writeOld(t, s, "busy", old, 2, 1, 2, 3, 4, 5)
			writeOld(t, s, "later", old, 2, 1, 2, 3)
			paused, resume := make(chan struct{}), make(chan struct{})
			var once sync.Once
			s.sweepHook = func(job, what string) {
				if job == "busy" && what == at {
					once.Do(func() { close(paused); <-resume })
				}
			}
			swept := make(chan error, 1)
			go func() { swept <- s.Sweep(func(string) (Retention, bool) { return Retention{}, false }) }()
			<-paused
			ran := make(chan error, 1)
			go func() {
				for _, job := range []string{"busy", "later", "new"} {
					l, err := s.Create(Header{Job: job, Fence: 99}, Retention{})
					if err != nil {
						ran <- err
						return
					}
					fmt.Fprintln(l.Stdout(), "hello")
					if err := l.Close("end state=DONE"); err != nil {
						ran <- err
						return
					}
				}
				ran <- nil
			}()
			var err error
			blocked := false
			select {
			case err = <-ran:
			case <-time.After(30 * time.Second):
				blocked = true
			}
			close(resume)
			if blocked {
				err = <-ran
			}
			if serr := <-swept; serr != nil {
				t.Fatal(serr)
			}
			if blocked {
				t.Fatal("runs could not create, write and close their logs while a sweep was paused mid-pass: they waited for it")
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, job := range []string{"busy", "later", "new"} {
				if got := logsOf(t, s, job); !slices.Equal(got, []string{"99-0.log"}) {
					t.Errorf("job %s has logs %q after the sweep, want only the new run's", job, got)
				}
			}
		})
	}
}

// fakeDisk is a file system of capacity bytes holding only the store's
// files (counted as the index counts them, in blocks): a test sets how
// short of space it is.
type fakeDisk struct {
	dir      string
	capacity int64
}

func (d *fakeDisk) used(t *testing.T) int64 {
	var n int64
	filepath.WalkDir(d.dir, func(path string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() {
			if fi, err := e.Info(); err == nil {
				n += diskBytes(fi)
			}
		}
		return nil
	})
	return n
}

func (d *fakeDisk) statfs(t *testing.T) func(int) (uint64, uint64, error) {
	return func(int) (uint64, uint64, error) {
		return uint64(max(0, d.capacity-d.used(t))), uint64(d.capacity), nil
	}
}

// On a disk short of space, a log removes finished logs to make room:
// its own job's oldest first, then the store's oldest of any job; when
// removing them all would not make room it removes none and stops, and it
// still ends with how the run ended.
func TestAShortDiskRemovesTheJobsOldestLogsFirst(t *testing.T) {
	s := newStore(t)
	const floor, size = 1 << 20, 8 << 10 // logs of 8 KiB, more than a file system keeps inline
	disk := &fakeDisk{dir: s.Dir()}
	s.statfs = disk.statfs(t)
	s.MinFree = func(uint64) uint64 { return floor }
	base := time.Now().Add(-3 * time.Hour)
	writeOld(t, s, "b", base, size, 1, 2, 3)             // the oldest
	writeOld(t, s, "a", base.Add(time.Hour), size, 1, 2) // then a's
	run := func(job string, fence int64) []string {
		t.Helper()
		// The disk is full to one byte under the floor: the run's log
		// must make room, and one old log is enough.
		disk.capacity = disk.used(t) + floor - 1
		l, err := s.Create(Header{Job: job, Fence: fence}, Retention{})
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(l.Stdout(), strings.Repeat("y", size))
		if err := l.Close("end state=DONE exit=0"); err != nil {
			t.Errorf("run %d of %s: Close() = %v", fence, job, err)
		}
		return notes(read(t, s, job, fence))
	}
	for _, tc := range []struct {
		job   string
		fence int64
		gone  string // the log it removed
	}{
		{"a", 10, "a/1-0.log"},  // its job's oldest, though b's are older
		{"a", 11, "a/2-0.log"},  // and the next
		{"a", 12, "a/10-0.log"}, // a's own newer log before any of b's
		{"c", 20, "b/1-0.log"},  // c has none: the store's oldest
		{"b", 30, "b/2-0.log"},
	} {
		if n := run(tc.job, tc.fence); len(n) != 2 || n[1] != "end state=DONE exit=0" {
			t.Errorf("run %d of %s: notes %q, want the header and the end", tc.fence, tc.job, n)
		}
		if _, err := os.Stat(filepath.Join(s.Dir(), tc.gone)); !os.IsNotExist(err) {
			t.Errorf("run %d of %s: %s is still there (%v)", tc.fence, tc.job, tc.gone, err)
		}
	}
	var left []string
	for _, job := range []string{"a", "b", "c"} {
		for _, name := range logsOf(t, s, job) {
			left = append(left, job+"/"+name)
		}
	}
	if want := []string{"a/11-0.log", "a/12-0.log", "b/3-0.log", "b/30-0.log", "c/20-0.log"}; !slices.Equal(left, want) {
		t.Errorf("logs left %q, want %q (one removed per run)", left, want)
	}

	// A disk so short that removing every finished log would not make
	// room: they stay (they would go for nothing), and the log stops,
	// saying why, what it did not keep and how the run ended.
	s.MinFree = func(total uint64) uint64 { return total + 1 }
	l, err := s.Create(Header{Job: "d", Fence: 40}, Retention{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintln(l.Stdout(), "not kept")
	l.Close("end state=DONE exit=0")
	n := notes(read(t, s, "d", 40))
	if len(n) != 4 || !strings.HasPrefix(n[1], "run log stopped: the file system has ") || !strings.HasSuffix(n[1], " would not make up the difference") ||
		n[2] != "output cut: 9 bytes not kept, after the run log stopped for lack of space" || n[3] != "end state=DONE exit=0" {
		t.Errorf("notes of the log that found no room: %q", n)
	}
	var kept []string
	for _, job := range []string{"a", "b", "c"} {
		for _, name := range logsOf(t, s, job) {
			kept = append(kept, job+"/"+name)
		}
	}
	if !slices.Equal(kept, left) {
		t.Errorf("logs left %q, want %q: removing them could not make room", kept, left)
	}
}

// smallFS mounts a tmpfs of size bytes for the test (root only: skipped
// otherwise), unmounted at its end.
func smallFS(t *testing.T, size int) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small file system needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=0700", size), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fill writes path until the file system is full.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	block := make([]byte, 4096)
	for {
		if _, err := f.Write(block); err != nil {
			if !noSpace(err) {
				t.Fatal(err)
			}
			return
		}
	}
}

// Run logs on a real file system of 1 MiB: runs that write more than it
// holds keep their logs whole, the oldest making room; when something else
// fills the disk, a log still makes room; with nothing left to remove, a
// log that stops says why (in memory, then in the file once there is room).
func TestRunLogsOnAFullFileSystem(t *testing.T) {
	mnt := smallFS(t, 1<<20)
	s, err := New(filepath.Join(mnt, "runs"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() }) // before the unmount
	line := strings.Repeat("z", 99)
	run := func(job string, fence int64, lines int) error {
		t.Helper()
		l, err := s.Create(Header{Job: job, Fence: fence}, Retention{})
		if err != nil {
			t.Fatal(err)
		}
		for range lines {
			fmt.Fprintln(l.Stdout(), line)
		}
		return l.Close("end state=DONE exit=0")
	}
	whole := func(job string, fence int64, lines int) {
		t.Helper()
		recs := read(t, s, job, fence)
		out, _ := Streams(recs)
		if n := notes(recs); len(out) != lines*100 || len(n) != 2 || n[1] != "end state=DONE exit=0" {
			t.Errorf("log of run %d of %s: %d bytes of output (want %d), notes %q", fence, job, len(out), lines*100, n)
		}
	}

	// 8 runs of 300 KiB of output each (about 400 KiB of log): the disk
	// holds two.
	for fence := int64(1); fence <= 8; fence++ {
		if err := run("loud", fence, 3000); err != nil {
			t.Errorf("run %d: %v", fence, err)
		}
		whole("loud", fence, 3000)
	}
	if got := logsOf(t, s, "loud"); !slices.Equal(got, []string{"7-0.log", "8-0.log"}) {
		t.Errorf("logs kept %q, want the newest two", got)
	}

	// Something else fills the disk: a run of another job makes room with
	// the oldest log of any job.
	fill(t, filepath.Join(mnt, "filler"))
	if err := run("other", 1, 10); err != nil {
		t.Errorf("a run on the full disk: %v", err)
	}
	whole("other", 1, 10)
	if got := logsOf(t, s, "loud"); !slices.Equal(got, []string{"8-0.log"}) {
		t.Errorf("loud's logs %q, want only its newest: its oldest made room", got)
	}

	// Nothing left to remove: the log stops, and its closing records wait
	// in memory, which its readers see.
	if err := s.Sweep(func(string) (Retention, bool) { return Retention{MaxAge: time.Nanosecond}, true }); err != nil {
		t.Fatal(err)
	}
	fill(t, filepath.Join(mnt, "filler"))
	err = run("last", 1, 10)
	if err == nil || !strings.Contains(err.Error(), "run log stopped: no space left on device") {
		t.Errorf("Close() on a full disk = %v, want it to say the log stopped", err)
	}
	r, err := s.Open("last", RunID{Fence: 1})
	if err != nil {
		t.Fatal(err)
	}
	if why := r.Stopped(); why != "run log stopped: no space left on device" {
		t.Errorf("Stopped() = %q", why)
	}
	if b, _ := os.ReadFile(s.Path("last", RunID{Fence: 1})); strings.Contains(string(b), " end ") {
		t.Errorf("the log has its end record on a full disk: %q", b)
	}
	r.Close()

	// A retry of the run (its log again) while the disk is still full:
	// the first try's records go first, when room comes.
	if err := run("last", 1, 10); err == nil {
		t.Errorf("Close() of the retry on a full disk = nil, want it to say the log stopped")
	}

	// Space returns: the next log closed whole appends them.
	os.Remove(filepath.Join(mnt, "filler"))
	if err := run("next", 1, 1); err != nil {
		t.Fatal(err)
	}
	recs := read(t, s, "last", 1)
	try := []string{"run job=last item=0 fence=1 fire=0001-01-01T00:00:00Z attempt=0 source= instance=", "run log stopped: no space left on device",
		"output cut: 1000 bytes not kept, after the run log stopped for lack of space", "end state=DONE exit=0"}
	want := append(slices.Clone(try), try...)
	if n := notes(recs); !slices.Equal(n, want) {
		t.Errorf("the stopped log, once there is room:\n%q\nwant\n%q", n, want)
	}
	if r, err := s.Open("last", RunID{Fence: 1}); err != nil || r.Stopped() != "" {
		t.Errorf("Stopped() after its records were written: %v", err)
	} else {
		r.Close()
	}
}

// Runs of several jobs, retries among them, close their logs while sweeps
// and retention remove others: at the end each job's index lists exactly
// the logs in its directory, with their disk.
func TestIndexMatchesTheDirectoryAfterConcurrentRetention(t *testing.T) {
	s := newStore(t)
	writeOld(t, s, "j0", time.Now().Add(-time.Hour), 100, 1000, 1001, 1002)
	ret := Retention{MaxTotalBytes: 8 * 4096}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
				s.Sweep(func(string) (Retention, bool) { return ret, true })
			}
		}
	}()
	var runs sync.WaitGroup
	for w := range 4 {
		runs.Add(1)
		go func() {
			defer runs.Done()
			for i := range 300 {
				job := fmt.Sprintf("j%d", (w+i)%3)
				fence := int64(w*1000 + i/2) // each fence twice: a retry appends
				l, err := s.Create(Header{Job: job, Fence: fence}, ret)
				if err != nil {
					t.Error(err)
					return
				}
				fmt.Fprintln(l.Stdout(), "x")
				l.Close("")
			}
		}()
	}
	runs.Wait()
	close(stop)
	wg.Wait()
	s.Sweep(func(string) (Retention, bool) { return ret, true })
	for _, job := range []string{"j0", "j1", "j2"} {
		var want []string
		var bytes int64
		for _, name := range logsOf(t, s, job) {
			want = append(want, name)
			fi, _ := os.Stat(filepath.Join(s.Dir(), job, name))
			bytes += diskBytes(fi)
		}
		s.mu.Lock()
		idx := s.jobs[job]
		var got []string
		var indexed int64
		if idx != nil {
			for _, f := range idx.files {
				got = append(got, f.id.String()+".log")
			}
			indexed = idx.bytes
		}
		s.mu.Unlock()
		slices.Sort(got)
		if !slices.Equal(got, want) || indexed != bytes {
			t.Errorf("job %s: index lists %q (%d bytes), the directory has %q (%d bytes)", job, got, indexed, want, bytes)
		}
		if bytes > ret.MaxTotalBytes {
			t.Errorf("job %s keeps %d bytes, over its %d", job, bytes, ret.MaxTotalBytes)
		}
	}
}
