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
	"strings"
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
// names (see the package doc): every directory a name is looked up in on
// the way to it, and every symbolic link on the way, intermediate links'
// included. what names dir in the errors ("the data directory").
func Ancestors(dir, what string) error {
	w, err := Walk(dir)
	if err != nil {
		return err
	}
	me := os.Geteuid()
	for _, l := range w.Links {
		if l.UID != 0 && l.UID != me {
			return fmt.Errorf("%s, on the way to %s, is a symbolic link of uid %d: %w; whoever owns a link chooses where it leads: name the directory itself", l.Path, what, l.UID, ErrNotTrusted)
		}
	}
	for _, d := range w.Dirs {
		fi, err := os.Stat(d)
		if err != nil {
			return err
		}
		uid := ownerOf(fi)
		if uid != 0 && uid != me {
			return fmt.Errorf("%s, above %s, belongs to uid %d, neither root nor this user (uid %d): %w; they could swap %s: put it somewhere only you (or root) can write", d, what, uid, me, ErrNotTrusted, what)
		}
		if fi.Mode().Perm()&0o022 != 0 && fi.Mode()&fs.ModeSticky == 0 {
			return fmt.Errorf("%s, above %s, is writable by other users (mode %v) and not sticky: %w; they could swap %s: put it somewhere only you can write", d, what, fi.Mode().Perm(), ErrNotTrusted, what)
		}
	}
	return nil
}

// A Path is how a path resolves, one name at a time.
type Path struct {
	// Real is the path with every link resolved.
	Real string
	// Dirs are the directories a name was looked up in on the way, in
	// order, once each; Links the symbolic links followed, with their
	// owners.
	Dirs  []string
	Links []Link
}

// Link is a symbolic link on the way to a path.
type Link struct {
	Path string
	UID  int // -1 when unknown
}

// Walk resolves path one name at a time, as the kernel does, recording
// every directory looked in and every link followed: what decides what
// path names. The last name must exist.
func Walk(path string) (Path, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return Path{}, err
	}
	var w Path
	seen := map[string]bool{}
	todo := strings.Split(abs, "/")
	cur, hops := "/", 0
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		if !seen[cur] {
			seen[cur] = true
			w.Dirs = append(w.Dirs, cur)
		}
		next := filepath.Join(cur, name)
		fi, err := os.Lstat(next)
		if err != nil {
			return Path{}, err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return Path{}, fmt.Errorf("%s: too many symbolic links", abs)
		}
		w.Links = append(w.Links, Link{Path: next, UID: ownerOf(fi)})
		target, err := os.Readlink(next)
		if err != nil {
			return Path{}, err
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	w.Real = cur
	return w, nil
}

func ownerOf(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}
