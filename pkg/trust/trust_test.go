package trust

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	link := filepath.Join(dir, "link")
	os.Symlink(dir, link)
	open := filepath.Join(dir, "open")
	os.WriteFile(open, nil, 0o600)
	os.Chmod(open, 0o620)
	mine := filepath.Join(dir, "mine")
	os.WriteFile(mine, nil, 0o644)
	for path, want := range map[string]string{link: "symbolic link", open: "writable by other users", mine: ""} {
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		err = Check(path, fi, true)
		if (want == "") != (err == nil) || (err != nil && (!errors.Is(err, ErrNotTrusted) || !strings.Contains(err.Error(), want))) {
			t.Errorf("Check(%s) = %v, want %q", filepath.Base(path), err, want)
		}
	}
	if err := Owned(filepath.Join(dir, "none")); err != nil {
		t.Errorf("Owned of nothing: %v", err)
	}
}

// Whoever can change a directory above, or a link on the way, can swap
// what a path names: a directory others can write (unless sticky), one of
// another user (root excepted), a link of another user.
func TestAncestors(t *testing.T) {
	ok := func(what, dir string) {
		t.Helper()
		if err := Ancestors(dir, "the directory"); err != nil {
			t.Errorf("%s: %v", what, err)
		}
	}
	refused := func(what, dir, says string) {
		t.Helper()
		if err := Ancestors(dir, "the directory"); !errors.Is(err, ErrNotTrusted) || !strings.Contains(err.Error(), says) {
			t.Errorf("%s: %v, want ErrNotTrusted saying %q", what, err, says)
		}
	}
	base := t.TempDir()
	mk := func(mode os.FileMode, parts ...string) string {
		p := filepath.Join(append([]string{base}, parts...)...)
		os.MkdirAll(p, 0o700)
		os.Chmod(p, mode)
		return p
	}
	ok("under directories of this user's", mk(0o700, "a", "b"))
	mk(0o777, "open")
	refused("under a directory others can write", mk(0o700, "open", "d"), "not sticky")
	mk(0o777|os.ModeSticky, "sticky")
	ok("under a sticky directory others can write (like /tmp)", mk(0o700, "sticky", "d"))
	// A link of this user's, to a directory of this user's, is followed:
	// the directories above its target, and the link's own, are checked.
	os.Symlink(mk(0o700, "open", "target"), filepath.Join(base, "a", "link"))
	refused("through a link to under a directory others can write", filepath.Join(base, "a", "link"), "not sticky")
	os.Symlink(mk(0o700, "a", "target"), filepath.Join(base, "open", "link"))
	refused("through a link in a directory others can write", filepath.Join(base, "open", "link"), "not sticky")

	if os.Geteuid() != 0 {
		return // what follows needs files of another user
	}
	other := mk(0o755, "other")
	os.Chown(other, 65534, 65534)
	refused("under another user's directory", mk(0o700, "other", "d"), "belongs to uid 65534")
	os.Chown(mk(0o777|os.ModeSticky, "othersticky"), 65534, 65534)
	refused("under another user's sticky directory (its owner renames anything)", mk(0o700, "othersticky", "d"), "belongs to uid 65534")
	link := filepath.Join(base, "sticky", "theirs")
	os.Symlink(mk(0o700, "a", "t2"), link)
	os.Lchown(link, 65534, 65534)
	refused("through another user's link, in a sticky directory", link, "symbolic link of uid 65534")
}

// A path through two links: the first, in a directory of this user's,
// leads to a second in a directory others can write, which leads to the
// directory itself. The second link's directory is neither above the path
// as written nor above the path resolved, but whoever can write it points
// the second link wherever they like: Ancestors must see it.
func TestAncestorsSeeAnIntermediateLink(t *testing.T) {
	base := t.TempDir()
	real := filepath.Join(base, "real", "data")
	open := filepath.Join(base, "open")
	safe := filepath.Join(base, "safe")
	for _, d := range []string{real, open, safe} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(open, 0o777)
	// safe/data -> open/current/data, open/current -> real
	if err := os.Symlink(filepath.Join(base, "real"), filepath.Join(open, "current")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(safe, "data")
	if err := os.Symlink(filepath.Join(open, "current", "data"), dir); err != nil {
		t.Fatal(err)
	}
	if err := Ancestors(dir, "the directory"); !errors.Is(err, ErrNotTrusted) || !strings.Contains(err.Error(), open) {
		t.Errorf("Ancestors(%s) = %v, want ErrNotTrusted naming %s, which others can write (its link current leads to the directory)", dir, err, open)
	}
}
