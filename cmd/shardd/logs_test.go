package main

import (
	"bytes"
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
