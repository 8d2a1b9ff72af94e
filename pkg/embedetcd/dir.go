package embedetcd

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/shardd/shardd/pkg/trust"
)

// The data directory is the cluster's key: its tls/ holds the only client
// certificate the embedded etcd accepts, and etcd/ holds every definition.
// So shardd uses a data directory only when nobody else could have put
// anything in it:
//
//   - the directory belongs to this user (it is made 0700 if it is not);
//   - tls, etcd, etcd.log and the files in tls are not symbolic links,
//     belong to this user, and are writable by nobody else;
//   - one process at a time: a lock file (.lock, holding the pid) is held
//     while the embedded etcd runs.
//
// A directory that fails a check is refused with the reason, never
// repaired: what someone else prepared may be a trap (a CA whose key they
// keep, a database holding their job definitions).

// ErrNotTrusted is wrapped by the errors of a data directory that fails
// the ownership checks (package trust's).
var ErrNotTrusted = trust.ErrNotTrusted

// prepareDir creates dir if needed, checks that it and what shardd keeps
// in it are this user's, tightens it to 0700 and locks it. unlock releases
// the lock.
func prepareDir(dir string) (unlock func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded etcd data dir: %w", err)
	}
	fi, err := os.Stat(dir) // a link to a directory of this user's is fine
	if err != nil {
		return nil, fmt.Errorf("embedded etcd data dir: %w", err)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("embedded etcd data dir %s belongs to uid %d, not to this user (uid %d): %w; use a directory of your own (--data-dir)", dir, st.Uid, os.Geteuid(), ErrNotTrusted)
	}
	if err := safeAncestors(dir); err != nil {
		return nil, fmt.Errorf("embedded etcd data dir: %w", err)
	}
	if fi.Mode().Perm() != 0o700 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return nil, fmt.Errorf("embedded etcd data dir: %w", err)
		}
	}
	for _, name := range []string{tlsDirName, "etcd.log", ".lock"} {
		if err := trust.Owned(filepath.Join(dir, name)); err != nil {
			return nil, fmt.Errorf("embedded etcd data dir: %w", err)
		}
	}
	// etcd's files, all of them: a directory someone else made inside it
	// would let them replace the WAL later.
	etcdDir := filepath.Join(dir, "etcd")
	err = filepath.WalkDir(etcdDir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		return trust.Owned(p)
	})
	if err != nil {
		return nil, fmt.Errorf("embedded etcd data dir: %w", err)
	}
	lock := filepath.Join(dir, ".lock")
	f, err := os.OpenFile(lock, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd data dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		pid, _ := os.ReadFile(lock)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("embedded etcd data dir %s is in use by another process (pid %s): one shardd run per data dir; join it with --etcd instead", dir, strings.TrimSpace(string(pid)))
		}
		return nil, fmt.Errorf("embedded etcd data dir lock: %w", err)
	}
	f.Truncate(0)
	f.WriteString(strconv.Itoa(os.Getpid()) + "\n")
	return func() { f.Close() }, nil // closing releases the lock
}

// safeAncestors checks that nobody else can swap dir (trust.Ancestors):
// whoever could write a directory above it could rename it away, and put
// their own in its place, between shardd's checks and its use of it.
func safeAncestors(dir string) error { return trust.Ancestors(dir, "the data directory") }
