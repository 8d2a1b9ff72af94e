package runlog

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/trust"
)

// victim is a file shardd's user can write, outside the store: a script
// only that user may change (which then runs), or a secret (the API's
// token file, tls/client.key).
func victim(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func unchanged(t *testing.T, path, content string) {
	t.Helper()
	if b, err := os.ReadFile(path); err != nil || string(b) != content {
		t.Errorf("%s changed: %q, %v; want %q", path, b, err, content)
	}
}

// Files planted under a log's name, where a run's log will be (another
// user who could write there, before the checks): a symbolic link to a
// script or a secret, a hard link to one, a copy of a secret. A run's log
// is never written through them, nor are they served or listed.
func TestAFilePlantedUnderALogsNameIsNeitherWrittenNorServed(t *testing.T) {
	s := newStore(t)
	os.Mkdir(filepath.Join(s.Dir(), "j"), 0o700)
	const script, secret = "#!/bin/sh\necho backup\n", "client-key-0123456789\n"
	cases := []struct {
		name  string
		plant func(log string) string // returns the file the plant reaches
	}{
		{"a symbolic link to a script", func(log string) string {
			p := victim(t, "backup.sh", script)
			os.Symlink(p, log)
			return p
		}},
		{"a dangling symbolic link", func(log string) string {
			p := filepath.Join(t.TempDir(), "new.sh")
			os.Symlink(p, log)
			return p
		}},
		{"a hard link to a secret", func(log string) string {
			p := victim(t, "client.key", secret)
			os.Link(p, log)
			return p
		}},
		{"a copy of a secret", func(log string) string {
			os.WriteFile(log, []byte(secret), 0o600)
			return log
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := RunID{Fence: int64(10 + i)}
			log := s.Path("j", id)
			target := tc.plant(log)
			was, _ := os.ReadFile(target)

			if _, err := s.Open("j", id); !errors.Is(err, trust.ErrNotTrusted) {
				t.Errorf("Open: %v, want ErrNotTrusted", err)
			}
			if s.Has("j", id) {
				t.Error("Has says there is a log")
			}
			if ids, _ := s.Runs("j", id.Fence); len(ids) > 0 && tc.name != "a copy of a secret" {
				t.Errorf("Runs lists %v", ids)
			}
			l, err := s.Create(Header{Job: "j", Fence: id.Fence, Instance: "a"}, Retention{})
			if err == nil {
				l.Stdout().Write([]byte("chmod 4755 /bin/sh\n"))
				l.Close("end state=DONE")
				t.Errorf("Create wrote through it")
			} else if !errors.Is(err, trust.ErrNotTrusted) {
				t.Errorf("Create: %v, want ErrNotTrusted", err)
			}
			if now, err := os.ReadFile(target); string(now) != string(was) || (len(was) == 0 && !errors.Is(err, os.ErrNotExist)) {
				t.Errorf("%s changed: %q, want %q (%v)", target, now, was, err)
			}
			// Retention leaves links alone too (a copy is this user's file,
			// which it may remove).
			if tc.name == "a copy of a secret" {
				return
			}
			s.Sweep(func(string) (Retention, bool) { return Retention{MaxAge: time.Nanosecond}, true })
			if _, err := os.Lstat(log); err != nil {
				t.Errorf("retention removed it: %v", err)
			}
		})
	}
}

// A FIFO under a log's name blocks neither a run's Create nor a reader.
func TestAFIFOUnderALogsNameBlocksNothing(t *testing.T) {
	s := newStore(t)
	os.Mkdir(filepath.Join(s.Dir(), "j"), 0o700)
	if err := syscall.Mkfifo(s.Path("j", RunID{Fence: 3}), 0o600); err != nil {
		t.Skip(err)
	}
	done := make(chan error, 2)
	go func() {
		_, err := s.Open("j", RunID{Fence: 3})
		done <- err
	}()
	go func() {
		_, err := s.Create(Header{Job: "j", Fence: 3}, Retention{})
		done <- err
	}()
	for range 2 {
		select {
		case err := <-done:
			if !errors.Is(err, trust.ErrNotTrusted) {
				t.Errorf("%v, want ErrNotTrusted", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("blocked on the FIFO")
		}
	}
}

// A job directory that is a symbolic link (to a directory of this user's,
// or anyone's) is refused: by New when it is there at start, by Create,
// Open and retention when it appears later. Nothing is written, served or
// removed through it.
func TestAJobDirectoryThatIsALinkIsRefused(t *testing.T) {
	elsewhere := t.TempDir()
	const old = "2026-01-01T00:00:00.000000Z shardd run job=j item=0 fence=1 fire=2026-01-01T00:00:00Z\n"
	os.WriteFile(filepath.Join(elsewhere, "1-0.log"), []byte(old), 0o600)
	past := time.Now().Add(-30 * 24 * time.Hour)
	os.Chtimes(filepath.Join(elsewhere, "1-0.log"), past, past)

	dir := filepath.Join(t.TempDir(), "runs")
	os.Mkdir(dir, 0o700)
	os.Symlink(elsewhere, filepath.Join(dir, "j"))
	if s, err := New(dir); !errors.Is(err, trust.ErrNotTrusted) || !strings.Contains(err.Error(), "symbolic link") {
		if err == nil {
			s.Close()
		}
		t.Errorf("New with a job directory that is a link: %v, want ErrNotTrusted", err)
	}

	os.Remove(filepath.Join(dir, "j"))
	s, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	os.Symlink(elsewhere, filepath.Join(dir, "j")) // planted after the start
	if _, err := s.Create(Header{Job: "j", Fence: 2}, Retention{}); !errors.Is(err, trust.ErrNotTrusted) {
		t.Errorf("Create: %v, want ErrNotTrusted", err)
	}
	if _, err := s.Open("j", RunID{Fence: 1}); !errors.Is(err, trust.ErrNotTrusted) {
		t.Errorf("Open: %v, want ErrNotTrusted", err)
	}
	if _, err := s.Runs("j", 0); !errors.Is(err, trust.ErrNotTrusted) {
		t.Errorf("Runs: %v, want ErrNotTrusted", err)
	}
	err = s.Sweep(func(string) (Retention, bool) { return Retention{MaxAge: time.Hour}, true })
	if !errors.Is(err, trust.ErrNotTrusted) || !strings.Contains(err.Error(), filepath.Join(dir, "j")) {
		t.Errorf("Sweep: %v, want it to name the link", err)
	}
	entries, _ := os.ReadDir(elsewhere)
	if len(entries) != 1 || entries[0].Name() != "1-0.log" {
		t.Errorf("the directory the link names holds %v, want its one old file, kept", entries)
	}
}

// The run log directory gets the data directory's checks: writable by
// others (or under a directory they can write), or another user's, it is
// refused; so is a job directory in it that others can write.
func TestARunLogDirectoryOthersCanWriteIsRefused(t *testing.T) {
	refused := func(what, dir, says string) {
		t.Helper()
		s, err := New(dir)
		if err == nil {
			s.Close()
		}
		if !errors.Is(err, trust.ErrNotTrusted) || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v, want ErrNotTrusted saying %q", what, err, says)
		}
	}
	for _, mode := range []os.FileMode{0o777, 0o770, 0o722} {
		dir := filepath.Join(t.TempDir(), "runs")
		os.Mkdir(dir, 0o700)
		os.Chmod(dir, mode)
		refused("a run log directory "+mode.String(), dir, "writable by other users")
	}
	shared := filepath.Join(t.TempDir(), "shared") // a shared working directory
	os.Mkdir(shared, 0o700)
	os.Chmod(shared, 0o777)
	refused("under a directory others can write", filepath.Join(shared, "shardd-data", "runs", "a"), "not sticky")

	dir := filepath.Join(t.TempDir(), "runs")
	os.MkdirAll(filepath.Join(dir, "j"), 0o700)
	os.Chmod(filepath.Join(dir, "j"), 0o777)
	refused("a job directory others can write", dir, filepath.Join(dir, "j"))
	os.Chmod(filepath.Join(dir, "j"), 0o700)
	s, err := New(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	os.Chmod(filepath.Join(dir, "j"), 0o777) // after the start
	if _, err := s.Create(Header{Job: "j", Fence: 1}, Retention{}); !errors.Is(err, trust.ErrNotTrusted) {
		t.Errorf("Create in a job directory others can write: %v, want ErrNotTrusted", err)
	}

	if os.Geteuid() != 0 {
		return // what follows needs files of another user
	}
	other := filepath.Join(t.TempDir(), "runs")
	os.Mkdir(other, 0o700)
	os.Chown(other, 65534, 65534)
	refused("a run log directory of another user", other, "belongs to uid 65534")

	// The instance's directory, runs/<instance>, a link another user
	// planted (to a directory of theirs, or of this user's).
	runs := filepath.Join(t.TempDir(), "runs")
	os.Mkdir(runs, 0o700)
	mine := t.TempDir()
	os.Symlink(mine, filepath.Join(runs, "a"))
	os.Lchown(filepath.Join(runs, "a"), 65534, 65534)
	refused("an instance directory that is another user's link", filepath.Join(runs, "a"), "symbolic link of uid 65534")
	// A data directory of another user's, above the run logs.
	data := filepath.Join(t.TempDir(), "shardd-data")
	os.Mkdir(data, 0o755)
	os.Chown(data, 65534, 65534)
	refused("under another user's directory", filepath.Join(data, "runs", "a"), "belongs to uid 65534")
}

// A log is appended to only when it is the run's: a retry after a restart
// goes on in its log; a file of the same name that does not begin with
// that run's header is not written.
func TestAnExistingLogIsAppendedToOnlyWhenItIsTheRuns(t *testing.T) {
	s := newStore(t)
	l, err := s.Create(Header{Job: "j", Fence: 4, Instance: "a"}, Retention{})
	if err != nil {
		t.Fatal(err)
	}
	l.Stdout().Write([]byte("first try\n"))
	l.Close("end state=FAILED")
	if l, err = s.Create(Header{Job: "j", Fence: 4, Attempt: 2, Instance: "a"}, Retention{}); err != nil {
		t.Fatalf("the same run again: %v", err)
	}
	l.Close("end state=DONE")
	if got := notes(read(t, s, "j", 4)); len(got) != 4 || !strings.HasPrefix(got[2], "run job=j item=0 fence=4") {
		t.Errorf("notes %q", got)
	}

	// Another run's log (fence 4's, renamed 40-0.log) is not the run's.
	os.Rename(s.Path("j", RunID{Fence: 4}), s.Path("j", RunID{Fence: 40}))
	if _, err := s.Create(Header{Job: "j", Fence: 40}, Retention{}); !errors.Is(err, trust.ErrNotTrusted) || !strings.Contains(err.Error(), "header") {
		t.Errorf("Create over another run's log: %v, want ErrNotTrusted naming the header", err)
	}
	if _, err := s.Open("j", RunID{Fence: 40}); !errors.Is(err, trust.ErrNotTrusted) {
		t.Errorf("Open of another run's log: %v, want ErrNotTrusted", err)
	}
	if ids, err := s.Runs("j", 0); err != nil || !slices.Equal(ids, []RunID{{Fence: 40}}) {
		t.Errorf("Runs = %v, %v", ids, err) // listed (it is this user's file), but not served
	}
}

// OpenFile (shardd logs reading a log of this host's) follows no link
// below the directory it is given, and reads only files of that
// directory's owner that begin with the run's header.
func TestOpenFileReadsNoPlantedFile(t *testing.T) {
	secret := victim(t, "api-tokens", "deploy write cluster-WRITE-token-0123\n")
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "j"), 0o700)
	os.Symlink(secret, filepath.Join(dir, "j", "1-0.log"))
	os.WriteFile(filepath.Join(dir, "j", "2-0.log"), []byte("deploy write cluster-WRITE-token-0123\n"), 0o600)
	elsewhere := t.TempDir()
	os.Mkdir(filepath.Join(elsewhere, "k"), 0o700)
	os.WriteFile(filepath.Join(elsewhere, "k", "3-0.log"), []byte(headerLine("k", RunID{Fence: 3})), 0o600)
	os.Symlink(filepath.Join(elsewhere, "k"), filepath.Join(dir, "k"))
	for _, tc := range []struct {
		job string
		id  RunID
	}{{"j", RunID{Fence: 1}}, {"j", RunID{Fence: 2}}, {"k", RunID{Fence: 3}}} {
		if r, err := OpenFile(dir, tc.job, tc.id, 0); !errors.Is(err, trust.ErrNotTrusted) {
			if err == nil {
				r.Close()
			}
			t.Errorf("OpenFile(%s, %s): %v, want ErrNotTrusted", tc.job, tc.id, err)
		}
	}
	if os.Geteuid() != 0 {
		return
	}
	// A log of another user than the directory's owner.
	os.WriteFile(filepath.Join(dir, "j", "4-0.log"), []byte(headerLine("j", RunID{Fence: 4})), 0o600)
	os.Chown(filepath.Join(dir, "j", "4-0.log"), 65534, 65534)
	if _, err := OpenFile(dir, "j", RunID{Fence: 4}, 0); !errors.Is(err, trust.ErrNotTrusted) || !strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("OpenFile of another user's log: %v, want ErrNotTrusted", err)
	}
}

// A run log directory that is refused leaves nothing behind: shardd
// checks before it creates, so a link another user planted in a shared
// working directory (shardd-data -> a directory of their choosing) does
// not get directories of shardd's user made through it.
func TestARefusedRunLogDirectoryIsNotCreatedThroughALink(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root, to give the link to another user")
	}
	shared := filepath.Join(t.TempDir(), "shared")
	os.Mkdir(shared, 0o700)
	os.Chmod(shared, os.ModeSticky|0o777) // sticky, so the directory itself passes
	target := t.TempDir()                 // where the planter wants shardd's directories
	link := filepath.Join(shared, "shardd-data")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	os.Lchown(link, 65534, 65534)
	s, err := New(filepath.Join(link, "runs", "a"))
	if err == nil {
		s.Close()
	}
	if !errors.Is(err, trust.ErrNotTrusted) {
		t.Errorf("New through another user's link: %v, want ErrNotTrusted", err)
	}
	if _, err := os.Lstat(filepath.Join(target, "runs")); err == nil {
		t.Errorf("%s was created through %s, another user's link, before it was refused", filepath.Join(target, "runs"), link)
	}
}
