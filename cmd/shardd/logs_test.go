package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// shardd logs refuses a bad command line before it reaches etcd, and takes
// only connection flags from the environment: never --item from a job's
// SHARDD_ITEM.
func TestLogsCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		code int
		want string
	}{
		{[]string{"logs"}, nil, exitUsage, "a JOB argument is required"},
		{[]string{"logs", "j", "--run", "latest"}, nil, exitUsage, `--run "latest": a run is FENCE or FENCE-ITEM`},
		{[]string{"logs", "j", "--run", "40-1", "--item", "2"}, nil, exitUsage, "--run 40-1 is a run of item 1, not of --item 2"},
		{[]string{"logs", "j", "--item", "-1"}, nil, exitUsage, "items are numbered from 0"},
		{[]string{"logs", "j", "--api-cert", "c.pem"}, nil, exitUsage, "--api-cert and its key go together"},
		{[]string{"logs", "j", "--api-token-file", "/nonexistent/token"}, nil, exitFailure, "--api-token-file"},
		// SHARDD_ITEM is not --item: the command goes on to etcd (nothing
		// listens there) instead of taking item 7.
		{[]string{"logs", "j", "--timeout", "300ms"}, map[string]string{"SHARDD_ITEM": "7", "SHARDD_ETCD": "http://127.0.0.1:1"}, exitFailure, "http://127.0.0.1:1"},
	} {
		var out, errOut bytes.Buffer
		code := run(tc.args, &env{stdout: &out, stderr: &errOut, getenv: func(k string) string { return tc.env[k] }})
		if code != tc.code || !strings.Contains(errOut.String(), tc.want) || strings.Contains(errOut.String(), "item 7") {
			t.Errorf("%v: exit %d, stderr %q; want exit %d saying %q", tc.args, code, errOut.String(), tc.code, tc.want)
		}
	}
	var out bytes.Buffer
	run([]string{"help"}, &env{stdout: &out, stderr: &out, getenv: func(string) string { return "" }})
	if !strings.Contains(out.String(), "\tlogs       print a run's output") {
		t.Errorf("help does not list logs:\n%s", out.String())
	}
}

// shardd logs reads a token file of shardd run's format, and presents its
// first read token (reads need no more), else its first.
func TestLogsToken(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		file, want, err string
	}{
		{"bare-secret-0123456789\n", "bare-secret-0123456789", ""},
		{"# ops\nadmin write admin-secret-0123456789\nviewer read viewer-secret-0123456789\n", "viewer-secret-0123456789", ""},
		{"admin write admin-secret-0123456789\n", "admin-secret-0123456789", ""},
		{"# nothing\n", "", "holds no token"},
		{"short\n", "", "at least 16"},
	} {
		path := filepath.Join(dir, "token")
		os.WriteFile(path, []byte(tc.file), 0o600)
		got, err := cliToken(path)
		if got != tc.want || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("token file %q: %q, %v; want %q, %q", tc.file, got, err, tc.want, tc.err)
		}
	}
	if got, err := cliToken(""); got != "" || err != nil {
		t.Errorf("no file: %q, %v", got, err)
	}
}

// shardd logs says a log stopped for lack of space when it did (its own
// record, or its instance's word when that record is not in the file
// yet), not that the run was cut by an instance stop.
func TestLogsSaysALogStoppedForLackOfSpace(t *testing.T) {
	const head = "2026-01-02T03:04:05.000000Z shardd run job=j item=0 fence=7 fire=2026-01-02T03:04:05Z attempt=1 source=NORMAL instance=a"
	for _, tc := range []struct {
		name     string
		lines    []string
		told     string // by the instance's API
		followed bool
		want     string
	}{
		{"stopped, then ended", []string{head, "2026-01-02T03:04:06.000000Z shardd run log stopped: no space left on device",
			"2026-01-02T03:04:07.000000Z shardd output cut: 10 bytes not kept, after the run log stopped for lack of space", "2026-01-02T03:04:07.000000Z shardd end state=DONE exit=0"},
			"", false, "the run ended: end state=DONE exit=0; the log stopped: no space left on device (the output after that was not kept)"},
		{"stopped, its instance then stopped", []string{head, "2026-01-02T03:04:06.000000Z shardd run log stopped: no space left on device"},
			"", false, "the log stopped: no space left on device; how the run ended is in its history"},
		{"its end waits for room", []string{head}, "run log stopped: no space left on device", false,
			"the log stopped: no space left on device; how the run ended is in its history"},
		{"followed, its end waits for room", []string{head}, "run log stopped: no space left on device", true,
			"the log stopped: no space left on device; how the run ended is in its history"},
		{"cut", []string{head}, "", false, "its log has no end record: the run was cut (its instance stopped mid-run) or its log stopped"},
	} {
		var out, errOut bytes.Buffer
		p := &logPrinter{e: &env{stdout: &out, stderr: &errOut}, stopped: tc.told}
		lines := tc.lines
		p.copyLines(func() ([]byte, error) {
			if len(lines) == 0 {
				return nil, io.EOF
			}
			l := lines[0]
			lines = lines[1:]
			return []byte(l), nil
		})
		p.summary("run 7-0 of job j", "instance a's API", tc.followed, false)
		if got := errOut.String(); !strings.Contains(got, tc.want) || strings.Contains(got, "instance stopped") != strings.Contains(tc.want, "instance stopped") {
			t.Errorf("%s: %q, want it to say %q", tc.name, got, tc.want)
		}
	}
}
