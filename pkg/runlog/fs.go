package runlog

// The store's files (see Trust in the package doc): every directory and
// log under the store's directory is reached from that directory's open
// descriptor, one name at a time, with O_NOFOLLOW, and checked once open
// (fstat): a directory must be this user's and writable by nobody else; a
// log too, and a regular file with one link. New logs are created with
// O_EXCL. So no symbolic link is ever followed below the store's
// directory, and no name is looked up again between its check and its
// use.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/shardd/shardd/pkg/trust"
)

const (
	dirFlags  = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	readFlags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK // a FIFO does not block the open
	// appendFlags open a log for writing (and reading its header); O_EXCL
	// and O_CREAT are added to create one.
	appendFlags = unix.O_RDWR | unix.O_APPEND | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NONBLOCK
)

// owner is whom the files of a tree must belong to: this user (the store
// that writes them), or, for a reader of another user's tree (shardd logs
// run as root), the owner of its top directory.
type owner struct {
	uid  int  // -1: not checked
	mine bool // uid is this user
}

var thisUser = owner{uid: os.Geteuid(), mine: true}

// check is trust.Check of the open file f (at path), and its owner.
func (o owner) check(f *os.File, path string) (fs.FileInfo, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := trust.Check(path, fi, o.mine); err != nil {
		return nil, err
	}
	if uid := uidOf(fi); o.uid >= 0 && uid >= 0 && uid != o.uid {
		return nil, fmt.Errorf("%s belongs to uid %d, not to uid %d, who owns the run log directory: %w; someone else may have put it there", path, uid, o.uid, trust.ErrNotTrusted)
	}
	return fi, nil
}

func uidOf(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}

// openat opens name in directory dir (a descriptor, or unix.AT_FDCWD for
// an absolute name) with flags and returns it as a file named path.
func openat(dir int, name, path string, flags int, perm uint32) (*os.File, error) {
	fd, err := unix.Openat(dir, name, flags, perm)
	if err != nil {
		if errors.Is(err, unix.ELOOP) || (errors.Is(err, unix.ENOTDIR) && isLink(dir, name)) {
			return nil, fmt.Errorf("%s is a symbolic link: %w (shardd follows none in its run log directory); someone may have planted it: look, then remove it", path, trust.ErrNotTrusted)
		}
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	if flags&unix.O_NONBLOCK != 0 {
		unix.SetNonblock(fd, false) // regular files only: the checks follow
	}
	return os.NewFile(uintptr(fd), path), nil
}

// isLink says whether name in dir is a symbolic link.
func isLink(dir int, name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
}

// openDir opens directory name of dir, never following a link, and checks
// it: a directory, of o's, writable by nobody else.
func openDir(dir int, name, path string, o owner) (*os.File, error) {
	f, err := openat(dir, name, path, dirFlags, 0)
	if err != nil {
		return nil, err
	}
	if _, err := o.check(f, path); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// openLogAt opens log name of job directory dir with flags (readFlags or
// appendFlags), never following a link, and checks it (checkLog).
func openLogAt(dir *os.File, name, path string, flags int, o owner) (*os.File, fs.FileInfo, error) {
	f, err := openat(int(dir.Fd()), name, path, flags, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := checkLog(f, path, o)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// checkLog checks the open log f: o's, writable by nobody else, a regular
// file with one link (not a hard link to a file elsewhere).
func checkLog(f *os.File, path string, o owner) (fs.FileInfo, error) {
	fi, err := o.check(f, path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%v): %w; someone may have planted it: look, then remove it", path, fi.Mode().Type(), trust.ErrNotTrusted)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
		return nil, fmt.Errorf("%s has %d links: %w (a run log has one; another may be a file elsewhere); someone may have planted it: look, then remove it", path, st.Nlink, trust.ErrNotTrusted)
	}
	return fi, nil
}

// createLog creates log name of job directory dir for appending (O_EXCL),
// or opens the one there, never following a link; created says which.
func createLog(dir *os.File, name, path string) (f *os.File, fi fs.FileInfo, created bool, err error) {
	for range 2 { // an existing log removed between the two opens: create it
		f, err = openat(int(dir.Fd()), name, path, appendFlags|unix.O_CREAT|unix.O_EXCL, 0o600)
		if err == nil {
			fi, err = checkLog(f, path, thisUser)
			if err != nil {
				f.Close()
				return nil, nil, false, err
			}
			return f, fi, true, nil
		}
		if !errors.Is(err, unix.EEXIST) {
			return nil, nil, false, err
		}
		f, fi, err = openLogAt(dir, name, path, appendFlags, thisUser)
		if !errors.Is(err, fs.ErrNotExist) {
			return f, fi, false, err
		}
	}
	return nil, nil, false, err
}

// headerOf is the beginning of the header of a run's log, after its
// time: a log is served or appended to only when it begins so (or is
// empty: its header waits for room).
func headerOf(job string, id RunID) []byte {
	return []byte("shardd run job=" + job + " item=" + strconv.Itoa(int(id.Item)) + " fence=" + strconv.FormatInt(id.Fence, 10) + " ")
}

// checkHeader checks that the log f (at path) is the log of run id of
// job: its first record is shardd's header of that run. It reads with
// ReadAt, leaving f's offset alone.
func checkHeader(f *os.File, path, job string, id RunID) error {
	want := headerOf(job, id)
	buf := make([]byte, len(stampLayout)+1+len(want))
	n, err := f.ReadAt(buf, 0)
	if n == 0 && err == io.EOF {
		return nil
	}
	if n == 0 {
		return fmt.Errorf("read the header of %s: %w", path, err)
	}
	if _, rest, ok := bytes.Cut(buf[:n], []byte(" ")); !ok || !bytes.HasPrefix(rest, want) {
		return fmt.Errorf("%s does not begin with the header of run %s of job %q: %w; not a run log shardd wrote: look, then remove it", path, id, job, trust.ErrNotTrusted)
	}
	return nil
}

// mkdirAt creates directory name of dir (0700) if it is missing.
func mkdirAt(dir int, name, path string) error {
	if err := unix.Mkdirat(dir, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return &fs.PathError{Op: "mkdir", Path: path, Err: err}
	}
	return nil
}

// entry is what a listing of a job's directory says of one name.
type entry struct {
	name  string
	mtime int64 // Unix nanoseconds
	bytes int64 // disk used, in blocks
}

// listLogs returns the logs in job directory dir (at path) that pass
// checkLog's checks (by their lstat, not opened); accept, when set,
// chooses by name before any stat. odd names the log names that do not
// pass (links, others' files): never written, served nor removed.
func listLogs(dir *os.File, path string, accept func(RunID) bool) (logs []entry, odd []string, err error) {
	d, err := openat(int(dir.Fd()), ".", path, dirFlags, 0) // its own offset: listings may run side by side
	if err != nil {
		return nil, nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, nil, err
	}
	for _, name := range names {
		id, ok := runOfFile(name)
		if !ok || (accept != nil && !accept(id)) {
			continue
		}
		var st unix.Stat_t
		if unix.Fstatat(int(d.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue // removed meanwhile
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 || trust.Perm(name, fs.FileMode(st.Mode&0o777), int(st.Uid), true) != nil {
			odd = append(odd, name)
			continue
		}
		logs = append(logs, entry{name: name, mtime: st.Mtim.Nano(), bytes: st.Blocks * 512})
	}
	return logs, odd, nil
}

// listDirs returns the names of the job directories in the store's
// directory root (job names; what is not a directory is left out).
func listDirs(root *os.File, path string) ([]string, error) {
	d, err := openat(int(root.Fd()), ".", path, dirFlags, 0)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	jobs := names[:0]
	for _, name := range names {
		var st unix.Stat_t
		if !isJobName(name) || unix.Fstatat(int(d.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue
		}
		if t := st.Mode & unix.S_IFMT; t == unix.S_IFDIR || t == unix.S_IFLNK {
			jobs = append(jobs, name) // a link is refused when opened, and says so
		}
	}
	return jobs, nil
}
