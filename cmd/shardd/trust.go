package main

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/trust"
)

// The files an operator gives shardd decide what it runs (the job files)
// and who may command it (the API's token files). Whoever else can change
// one runs any command as shardd's user (root's, when shardd runs as
// root) or mints a token, so shardd vets them, at start and, for the job
// files, at every reload, with one rule: a file is unsafe when someone
// other than root and shardd's own user could change what shardd reads
// there, that is when
//
//   - the file (followed through links), or a directory whose entries
//     shardd reads (the config directory), belongs to another user or is
//     writable by its group or by others;
//   - a directory a name is looked up in on the way to it (links followed
//     one at a time, intermediate ones too: trust.Walk) belongs to another
//     user or is writable by its group or by others without the sticky bit
//     (/tmp's): they could rename it away and put their own in its place;
//   - a symbolic link on the way belongs to another user: they choose
//     where it leads.
//
// An unsafe file is refused when shardd runs as root (a start fails, a
// reload is rejected like an invalid one) and logged as a warning
// otherwise. A token file that others can read is a warning either way.

// fileCheck collects the problems of files: who else than root and this
// process's user could change what shardd reads there.
type fileCheck struct {
	euid     int
	dirs     map[string]bool // the directories above checked already
	problems []string
}

func newFileCheck() *fileCheck { return &fileCheck{euid: os.Geteuid(), dirs: map[string]bool{}} }

// file checks path, named kind ("job file"), and the directories above
// it, named as above what ("the job files"); entries says path is a
// directory whose entries are read, which may not be writable by others
// even when sticky. A path that does not exist has no problem: its load
// says so.
func (c *fileCheck) file(kind, above, path string, entries bool) {
	w, err := trust.Walk(path)
	if err != nil {
		return
	}
	abs, _ := filepath.Abs(path)
	self := kind + " " + abs
	if w.Real != abs {
		self += " (" + w.Real + ")"
	}
	c.check(w.Real, self, true)
	if entries {
		c.dirs[w.Real] = true // checked as itself, stricter
	}
	for _, l := range w.Links { // whoever owns a link chooses where it leads
		if l.UID >= 0 && l.UID != 0 && l.UID != c.euid {
			c.problems = append(c.problems, fmt.Sprintf("symbolic link %s, on the way to %s, belongs to uid %d, neither root nor this user (uid %d)", l.Path, above, l.UID, c.euid))
		}
	}
	for _, d := range w.Dirs { // every directory a name is looked up in, intermediate links' too
		if !c.dirs[d] {
			c.dirs[d] = true
			c.check(d, fmt.Sprintf("directory %s, above %s,", d, above), false)
		}
	}
}

func (c *fileCheck) check(p, what string, self bool) {
	fi, err := os.Stat(p)
	if err != nil {
		return // not ours to see (a directory above, as another user); the load fails if it matters
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != c.euid {
		c.problems = append(c.problems, fmt.Sprintf("%s belongs to uid %d, neither root nor this user (uid %d)", what, st.Uid, c.euid))
	}
	perm := fi.Mode().Perm()
	switch {
	case !self && fi.Mode()&fs.ModeSticky != 0: // others cannot rename what is not theirs
	case perm&0o002 != 0:
		c.problems = append(c.problems, fmt.Sprintf("%s is writable by every user (mode %v)", what, perm))
	case perm&0o020 != 0:
		c.problems = append(c.problems, fmt.Sprintf("%s is writable by its group (mode %v)", what, perm))
	}
}

// configProblems returns the problems of a config path, a file or a
// directory, and of the job files in it.
func configProblems(path string) []string {
	fi, err := os.Stat(path)
	if err != nil {
		return nil
	}
	c := newFileCheck()
	if !fi.IsDir() {
		c.file("job file", "the job file", path, false)
		return c.problems
	}
	c.file("config directory", "the job files", path, true)
	files, _ := config.Files(path)
	for _, f := range files {
		c.file("job file", "the job files", f, false)
	}
	return c.problems
}

// errUnsafeFile is wrapped by the errors of vetConfig and vetTokenFiles.
var errUnsafeFile = errors.New("refused as root")

// vetConfig applies the rule to the config at path: with root (shardd runs
// as root), its unsafe files make an error (one problem each, which
// config.Errors splits); otherwise they are logged as warnings.
func vetConfig(log *slog.Logger, path string, root bool) error {
	return vet(log, configProblems(path), root, "makes shardd run any command")
}

// vetTokenFiles applies the rule to the API's token files ("" for none),
// and warns of one that others can read.
func vetTokenFiles(log *slog.Logger, root bool, files ...string) error {
	c := newFileCheck()
	for _, f := range files {
		if f == "" {
			continue
		}
		c.file("token file", "token file "+f, f, false)
		if fi, err := os.Stat(f); err == nil && fi.Mode().Perm()&0o077 != 0 {
			log.Warn(fmt.Sprintf("token file %s is readable by other users (mode %v): chmod 600 it", f, fi.Mode().Perm()), "file", f)
		}
	}
	return vet(log, c.problems, root, "gives themselves an API token")
}

func vet(log *slog.Logger, problems []string, root bool, why string) error {
	if len(problems) == 0 {
		return nil
	}
	if root {
		var errs []error
		for _, p := range problems {
			errs = append(errs, fmt.Errorf("%s: %w (whoever can change it %s as root); let only root write it (chown root, chmod go-w), or run shardd as its own user", p, errUnsafeFile, why))
		}
		return errors.Join(errs...)
	}
	for _, p := range problems {
		log.Warn(fmt.Sprintf("%s: whoever can change it %s as this user; let only root or this user write it (chmod go-w); as root, shardd would refuse it", p, why))
	}
	return nil
}
