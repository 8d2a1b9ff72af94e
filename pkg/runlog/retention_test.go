package runlog

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// writeOld writes log files of a previous process, with mtime at, of
// size bytes each.
func writeOld(t *testing.T, s *Store, job string, at time.Time, size int, fences ...int64) {
	t.Helper()
	dir := filepath.Join(s.Dir(), job)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, fence := range fences {
		p := s.Path(job, RunID{Fence: fence})
		if err := os.WriteFile(p, []byte(strings.Repeat("x", size-1)+"\n"), 0o600); err != nil {
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
