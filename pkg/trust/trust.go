// Package trust decides whether shardd may use a directory or file that
// holds its state (the embedded etcd's data directory, the run logs):
// only when nobody but shardd's user, and root, can have written it, or
// can change what its path names.
//
//   - A file or directory shardd keeps is not a symbolic link, is writable
//     by its owner alone and, where shardd made it, belongs to this user.
//   - Every directory above one shardd keeps, on its path as written and
//     once links are resolved, belongs to root or to this user and, when
//     others can write it, is sticky (like /tmp: then others cannot rename
//     what this user owns in it); every symbolic link on the way belongs
//     to root or to this user (whoever owns a link chose where it leads).
//     Whoever could write such a directory could rename what shardd keeps
//     away, and put their own in its place, between shardd's checks and
//     its use.
//
// What fails a check is refused with the reason, never repaired: what
// someone else prepared may be a trap.
//
// The package uses the standard library only: pkg/runlog, whose files are
// its own business, depends on it.
package trust

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// ErrNotTrusted is wrapped by the errors of a path that fails a check.
var ErrNotTrusted = errors.New("not trusted")

// Owned checks that path (not followed if a link) belongs to this user and
// that no one else can write it. A path that does not exist passes.
func Owned(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return Check(path, fi, true)
}

// Check checks fi, the Lstat (or, of an open file, the Fstat) of path: not
// a symbolic link, writable by its owner alone, and, with mine, owned by
// this user.
func Check(path string, fi fs.FileInfo, mine bool) error {
	if fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("%s is a symbolic link: %w (shardd follows none where it keeps its state)", path, ErrNotTrusted)
	}
	uid := -1
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		uid = int(st.Uid)
	}
	return Perm(path, fi.Mode().Perm(), uid, mine)
}

// Perm is Check of a file known not to be a link, from its permission
// bits and its owner (uid; -1 when unknown).
func Perm(path string, perm fs.FileMode, uid int, mine bool) error {
	if perm&0o022 != 0 {
		return fmt.Errorf("%s is writable by other users (mode %v): %w; someone else may have changed what it holds: remove it", path, perm, ErrNotTrusted)
	}
	if me := os.Geteuid(); mine && uid >= 0 && uid != me {
		return fmt.Errorf("%s belongs to uid %d, not to this user (uid %d): %w; someone else may have prepared it: use a directory of your own, or remove it", path, uid, me, ErrNotTrusted)
	}
	return nil
}

// Ancestors checks that nobody but this user and root can change what dir
// names (see the package doc): the directories above it, on its path as
// written and once resolved, and the symbolic links on its path. what
// names dir in the errors ("the data directory").
func Ancestors(dir, what string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	resolved, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return err
	}
	me := os.Geteuid()
	ours := func(fi fs.FileInfo) (int, bool) {
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return -1, true
		}
		return int(st.Uid), int(st.Uid) == 0 || int(st.Uid) == me
	}
	// The links on the way, as written.
	for p := abs; ; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		if uid, ok := ours(fi); fi.Mode()&fs.ModeSymlink != 0 && !ok {
			return fmt.Errorf("%s, on the way to %s, is a symbolic link of uid %d: %w; whoever owns a link chooses where it leads: name the directory itself", p, what, uid, ErrNotTrusted)
		}
		if p == filepath.Dir(p) {
			break
		}
	}
	starts := []string{abs}
	if resolved != abs {
		starts = append(starts, resolved)
	}
	for _, start := range starts {
		for p := filepath.Dir(start); ; p = filepath.Dir(p) {
			fi, err := os.Stat(p)
			if err != nil {
				return err
			}
			if uid, ok := ours(fi); !ok {
				return fmt.Errorf("%s, above %s, belongs to uid %d, neither root nor this user (uid %d): %w; they could swap %s: put it somewhere only you (or root) can write", p, what, uid, me, ErrNotTrusted, what)
			}
			if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
				return fmt.Errorf("%s, above %s, is writable by other users (mode %v) and not sticky: %w; they could swap %s: put it somewhere only you can write", p, what, fi.Mode().Perm(), ErrNotTrusted, what)
			}
			if p == filepath.Dir(p) {
				break
			}
		}
	}
	return nil
}
