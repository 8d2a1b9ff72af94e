package embedetcd

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPrepareDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	unlock, err := prepareDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	// One process per data dir.
	if _, err := prepareDir(dir); err == nil || !strings.Contains(err.Error(), "in use by another process") {
		t.Errorf("a second user of the data dir: %v", err)
	}
	unlock()
	unlock, err = prepareDir(dir)
	if err != nil {
		t.Fatalf("after unlock: %v", err)
	}
	unlock()

	// A widened data dir is tightened; what it holds is not trusted blindly.
	os.Chmod(dir, 0o755)
	if unlock, err = prepareDir(dir); err != nil {
		t.Fatal(err)
	}
	unlock()
	if fi, _ := os.Stat(dir); fi.Mode().Perm() != 0o700 {
		t.Errorf("data dir mode %v, want 0700", fi.Mode().Perm())
	}

	refused := func(what string, setup, undo func()) {
		t.Helper()
		setup()
		defer undo()
		if _, err := prepareDir(dir); !errors.Is(err, ErrNotTrusted) {
			t.Errorf("%s: %v, want ErrNotTrusted", what, err)
		}
	}
	elsewhere := t.TempDir()
	refused("a tls that is a symbolic link",
		func() { os.Symlink(elsewhere, filepath.Join(dir, "tls")) },
		func() { os.Remove(filepath.Join(dir, "tls")) })
	refused("an etcd.log that is a symbolic link",
		func() { os.Symlink(filepath.Join(elsewhere, "victim"), filepath.Join(dir, "etcd.log")) },
		func() { os.Remove(filepath.Join(dir, "etcd.log")) })
	refused("an etcd dir others can write",
		func() { os.Mkdir(filepath.Join(dir, "etcd"), 0o700); os.Chmod(filepath.Join(dir, "etcd"), 0o777) },
		func() { os.Chmod(filepath.Join(dir, "etcd"), 0o700) })
	if os.Geteuid() == 0 {
		refused("a data dir of another user", func() { os.Chown(dir, 65534, 65534) }, func() { os.Chown(dir, 0, 0) })
		refused("a tls dir of another user",
			func() { os.Mkdir(filepath.Join(dir, "tls"), 0o700); os.Chown(filepath.Join(dir, "tls"), 65534, 65534) },
			func() { os.Remove(filepath.Join(dir, "tls")) })
	}
	// Under a directory others can write (and not sticky), the data dir
	// could be swapped between the checks and its use.
	shared := filepath.Join(t.TempDir(), "shared")
	os.Mkdir(shared, 0o777)
	os.Chmod(shared, 0o777)
	if _, err := prepareDir(filepath.Join(shared, "data")); !errors.Is(err, ErrNotTrusted) || !strings.Contains(err.Error(), "not sticky") {
		t.Errorf("a data dir under a world-writable directory: %v, want ErrNotTrusted", err)
	}
	os.Chmod(shared, 0o777|os.ModeSticky)
	if unlock, err := prepareDir(filepath.Join(shared, "data2")); err != nil {
		t.Errorf("under a sticky directory (like /tmp): %v", err)
	} else {
		unlock()
	}
	// Anything under etcd/ that someone else could write is refused too.
	deep := filepath.Join(dir, "etcd", "member")
	os.MkdirAll(deep, 0o700)
	os.Chmod(deep, 0o777)
	if _, err := prepareDir(dir); !errors.Is(err, ErrNotTrusted) {
		t.Errorf("a world-writable etcd/member: %v, want ErrNotTrusted", err)
	}
	os.RemoveAll(filepath.Join(dir, "etcd"))

	// A file planted in tls/ is not used to build the CA.
	tls := filepath.Join(dir, "tls")
	os.Mkdir(tls, 0o700)
	os.WriteFile(filepath.Join(tls, "ca.key"), []byte("planted"), 0o666)
	os.Chmod(filepath.Join(tls, "ca.key"), 0o666)
	if _, err := EnsureTLS(dir, nil, time.Now()); !errors.Is(err, ErrNotTrusted) {
		t.Errorf("a world-writable ca.key: %v, want ErrNotTrusted", err)
	}
}
