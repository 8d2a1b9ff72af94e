package main

import (
	"bytes"
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
