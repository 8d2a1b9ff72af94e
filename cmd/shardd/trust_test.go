package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/metrics"
)

const trustJob = "jobs:\n  - name: report\n    cron: \"0 0 3 * * ?\"\n    script: [/bin/true]\n"

// tree makes a directory (mode 0755) under a fresh temporary directory,
// with a job file in it.
func tree(t *testing.T) (top, dir, file string) {
	t.Helper()
	top = t.TempDir()
	dir = filepath.Join(top, "jobs.d")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file = filepath.Join(dir, "jobs.yaml")
	if err := os.WriteFile(file, []byte(trustJob), 0o644); err != nil {
		t.Fatal(err)
	}
	return top, dir, file
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// Who else than root and shardd's user could change a job file: through
// the file, the config directory, or a directory above either.
func TestConfigProblems(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prepare func(t *testing.T, top, dir, file string) (config string)
		want    []string // substrings, one problem each; none: safe
	}{
		{"safe: a directory and a file only their owner writes", func(t *testing.T, top, dir, file string) string { return dir }, nil},
		{"safe: a file given directly", func(t *testing.T, top, dir, file string) string { return file }, nil},
		{"a job file every user can write", func(t *testing.T, top, dir, file string) string {
			chmod(t, file, 0o666)
			return dir
		}, []string{"job file " + "JOBS.D/jobs.yaml is writable by every user (mode -rw-rw-rw-)"}},
		{"a job file its group can write", func(t *testing.T, top, dir, file string) string {
			chmod(t, file, 0o664)
			return file
		}, []string{"is writable by its group (mode -rw-rw-r--)"}},
		{"a config directory every user can write, sticky or not", func(t *testing.T, top, dir, file string) string {
			chmod(t, dir, os.ModeSticky|0o777)
			return dir
		}, []string{"config directory JOBS.D is writable by every user"}},
		{"a directory above, not sticky", func(t *testing.T, top, dir, file string) string {
			chmod(t, top, 0o777)
			return dir
		}, []string{"directory TOP, above the job files, is writable by every user"}},
		{"a directory above, sticky (/tmp's way): safe", func(t *testing.T, top, dir, file string) string {
			chmod(t, top, os.ModeSticky|0o777)
			return dir
		}, nil},
		{"a job file linked from a directory others can write", func(t *testing.T, top, dir, file string) string {
			open := filepath.Join(top, "open")
			os.Mkdir(open, 0o755)
			chmod(t, open, 0o777)
			target := filepath.Join(open, "real.yaml")
			os.Rename(file, target)
			os.Symlink(target, file)
			return dir
		}, []string{"directory TOP/open, above the job files, is writable by every user"}},
		{"a job file of another user", func(t *testing.T, top, dir, file string) string {
			if os.Geteuid() != 0 {
				t.Skip("needs root, to give the file to another user")
			}
			if err := os.Chown(file, 65534, 65534); err != nil {
				t.Fatal(err)
			}
			return dir
		}, []string{"JOBS.D/jobs.yaml belongs to uid 65534, neither root nor this user"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			top, dir, file := tree(t)
			path := tc.prepare(t, top, dir, file)
			got := configProblems(path)
			if len(got) != len(tc.want) {
				t.Fatalf("problems %q, want %d: %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				w = strings.NewReplacer("JOBS.D", dir, "TOP", top).Replace(w)
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %q, want %q", got[i], w)
				}
			}
		})
	}
}

// As root, a job file others can write is refused, at start and at a
// reload, like an invalid one (the previous configuration keeps running);
// as another user, it is a warning.
func TestJobFileOthersCanWrite(t *testing.T) {
	_, dir, file := tree(t)
	chmod(t, file, 0o666)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	err := vetConfig(log, dir, true)
	if err == nil || !strings.Contains(err.Error(), "writable by every user") || !strings.Contains(err.Error(), "refused as root") {
		t.Errorf("as root: %v, want a refusal", err)
	}
	if err := vetConfig(log, dir, false); err != nil || !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "writable by every user") {
		t.Errorf("as another user: %v, log %s; want a warning", err, logs.String())
	}

	// The reload: safe, then the file is opened to every user.
	chmod(t, file, 0o644)
	var applied []*config.Config
	r := &reloader{path: dir, log: log, metrics: metrics.New(prometheus.NewRegistry(), "test"), root: true, apply: func(c *config.Config) { applied = append(applied, c) }}
	r.reload("test")
	if r.Err() != nil || len(applied) != 1 {
		t.Fatalf("a safe reload: %v, %d applied", r.Err(), len(applied))
	}
	chmod(t, file, 0o666)
	r.reload("test")
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "writable by every user") || len(applied) != 1 {
		t.Errorf("a reload of a file every user can write, as root: %v, %d applied; want it rejected", err, len(applied))
	}
	if n := len(config.Errors(r.Err())); n != 1 {
		t.Errorf("the rejection counts %d problems, want 1", n)
	}

	// shardd run, as root, refuses it before anything else starts.
	if os.Geteuid() == 0 {
		code, _, stderr := shardd(t, "run", "--config", dir, "--etcd", "http://127.0.0.1:1", "--listen", "")
		if code != exitFailure || !strings.Contains(stderr, "refused, as root") || !strings.Contains(stderr, "writable by every user") {
			t.Errorf("shardd run, as root, with a job file every user can write: exit %d, %s", code, stderr)
		}
	}
}

// A token file others can write is refused as root, like a job file; one
// they can read is a warning, as it always was.
func TestTokenFileOthersCanWrite(t *testing.T) {
	f := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(f, []byte("ops write 0123456789abcdef0123\n"), 0o600)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	if err := vetTokenFiles(log, true, f, ""); err != nil || logs.Len() > 0 {
		t.Errorf("a 0600 token file: %v, %s", err, logs.String())
	}
	chmod(t, f, 0o644)
	if err := vetTokenFiles(log, true, f); err != nil || !strings.Contains(logs.String(), "readable by other users") {
		t.Errorf("a 0644 token file: %v, %s; want a warning", err, logs.String())
	}
	chmod(t, f, 0o622)
	if err := vetTokenFiles(log, true, f); err == nil || !strings.Contains(err.Error(), "token file "+f+" is writable by every user") {
		t.Errorf("a token file every user can write, as root: %v, want a refusal", err)
	}
}

// Whoever can change a symbolic link on the way to a job file chooses what
// shardd reads there: a link of another user's (which they may remove and
// make again, even in a sticky directory), and every link a path goes
// through, not only the first and the last (an intermediate link in a
// directory others can write is theirs to swap).
func TestConfigProblemsSeeEveryLinkOnTheWay(t *testing.T) {
	t.Run("a link of another user in a sticky directory", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("needs root, to give the link to another user")
		}
		top, dir, _ := tree(t)
		chmod(t, top, os.ModeSticky|0o777)
		link := filepath.Join(top, "current")
		if err := os.Symlink(dir, link); err != nil {
			t.Fatal(err)
		}
		if err := os.Lchown(link, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if got := configProblems(link); len(got) == 0 {
			t.Errorf("config %s, a link of uid 65534 (who may remove it and link their own directory): no problem", link)
		}
	})
	t.Run("an intermediate link in a directory others can write", func(t *testing.T) {
		top, dir, file := tree(t)
		releases := filepath.Join(top, "releases")
		open := filepath.Join(top, "open")
		for _, d := range []string{releases, open} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		chmod(t, open, 0o777)
		if err := os.Rename(file, filepath.Join(releases, "real.yaml")); err != nil {
			t.Fatal(err)
		}
		// jobs.d/jobs.yaml -> open/current/real.yaml, open/current -> releases
		if err := os.Symlink(releases, filepath.Join(open, "current")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(open, "current", "real.yaml"), file); err != nil {
			t.Fatal(err)
		}
		got := configProblems(dir)
		if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, open) }) {
			t.Errorf("problems %q: none names %s, which every user can write (they can point open/current at their own directory)", got, open)
		}
	})
}
