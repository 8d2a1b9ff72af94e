package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/api"
)

func TestClusterPeer(t *testing.T) {
	three := "a=https://10.0.0.1:2380,b=https://10.0.0.2:2380,c=https://10.0.0.3:2380"
	for _, tt := range []struct {
		spec, name, peer string
		given            bool
		joining          bool // joins or restarts: not forming a new cluster
		want, err        string
	}{
		{three, "b", "", false, false, "https://10.0.0.2:2380", ""},
		{three, "b", "https://10.0.0.2:2380", true, false, "https://10.0.0.2:2380", ""},
		{three, "b", "https://10.0.0.9:2380", true, false, "", "--embed-peer-url https://10.0.0.9:2380 differs from member b's URL in the list, https://10.0.0.2:2380"},
		{three, "d", "", false, false, "", "this instance's --name d is not one of the members"},
		{"a=https://10.0.0.1:2380,b=https://10.0.0.2:2380", "a", "", false, false, "", "a new cluster of 2 members tolerates no more member failures than one of 1: use 3 or 5"},
		{"a=https://10.0.0.1:2380,a=https://10.0.0.2:2380,c=https://x:1", "a", "", false, false, "", "member a is listed twice"},
		{"a=http://10.0.0.1:2380,b=https://10.0.0.2:2380,c=https://x:1", "a", "", false, false, "", `member a: peer URL "http://10.0.0.1:2380" must be https://HOST:PORT`},
		{"a,b=https://x:1,c=https://y:1", "b", "", false, false, "", `"a" is not NAME=PEER_URL`},
		{"solo=https://127.0.0.1:2380", "solo", "", false, false, "https://127.0.0.1:2380", ""},
		// Growing 3 to 5 goes through 4: the joining member, and the
		// others restarting on their data, take a list of 4.
		{"a=https://10.0.0.1:2380,b=https://10.0.0.2:2380,c=https://10.0.0.3:2380,d=https://10.0.0.4:2380", "d", "", false, true, "https://10.0.0.4:2380", ""},
		{"a=https://10.0.0.1:2380,b=https://10.0.0.2:2380,c=https://10.0.0.3:2380,d=https://10.0.0.4:2380", "d", "", false, false, "", "a new cluster of 4 members"},
	} {
		got, err := clusterPeer(tt.spec, tt.name, tt.peer, tt.given, !tt.joining)
		switch {
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("clusterPeer(%q, %q): err %v, want %q", tt.spec, tt.name, err, tt.err)
		case tt.err == "" && (err != nil || got != tt.want):
			t.Errorf("clusterPeer(%q, %q) = %q, %v; want %q", tt.spec, tt.name, got, err, tt.want)
		}
	}
}

// shardd ca creates the shared CA once, private, and keeps it after.
func TestCACommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	code, out, errOut := shardd(t, "ca", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "(created)") {
		t.Fatalf("first ca: exit %d: %s %s", code, out, errOut)
	}
	key := filepath.Join(dir, "tls", "ca.key")
	st, err := os.Stat(key)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("ca.key: %v %v, want mode 0600", st, err)
	}
	before, _ := os.ReadFile(key)
	code, out, _ = shardd(t, "ca", "--data-dir", dir)
	after, _ := os.ReadFile(key)
	if code != 0 || !strings.Contains(out, "already there, kept") || string(before) != string(after) {
		t.Errorf("second ca: exit %d, %s; key kept: %v", code, out, string(before) == string(after))
	}
}

// A member of a cluster without the shared CA is refused before anything
// starts: with a CA of its own it could never reach the others.
func TestEmbedClusterNeedsTheCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	cfg := filepath.Join(t.TempDir(), "jobs.yaml")
	if err := os.WriteFile(cfg, []byte("jobs:\n  - name: j\n    cron: \"@every 1m\"\n    script: \"true\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := shardd(t, "run", "--config", cfg, "--name", "a", "--data-dir", dir,
		"--embed-cluster", "a=https://127.0.0.1:1,b=https://127.0.0.1:2,c=https://127.0.0.1:3")
	if code != 2 || !strings.Contains(errOut, "no cluster CA in "+filepath.Join(dir, "tls")) || !strings.Contains(errOut, "shardd ca") {
		t.Fatalf("exit %d, stderr:\n%s\nwant exit 2 naming the missing CA and shardd ca", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "tls", "ca.key")); err == nil {
		t.Errorf("a CA of its own was made in %s", dir)
	}
}

// With --etcd (the production setup) the data directory is not prepared,
// but the run logs still live in it, or in --run-log-dir: shardd run
// checks their directory anyway, and refuses one another local user could
// have prepared, before it reaches etcd.
func TestRunChecksTheRunLogDirectoryWithAnExternalEtcd(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "jobs.yaml")
	if err := os.WriteFile(cfg, []byte("jobs:\n  - name: j\n    cron: \"@every 1m\"\n    script: \"true\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A job directory planted as a link (to where the token files are).
	data := filepath.Join(t.TempDir(), "shardd-data")
	os.MkdirAll(filepath.Join(data, "runs", "a"), 0o700)
	os.Symlink(t.TempDir(), filepath.Join(data, "runs", "a", "j"))
	// A --run-log-dir others can write.
	open := filepath.Join(t.TempDir(), "logs")
	os.Mkdir(open, 0o700)
	os.Chmod(open, 0o777)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"a link in the data dir's runs", []string{"--data-dir", data}, filepath.Join(data, "runs", "a", "j") + " is a symbolic link"},
		{"a --run-log-dir others can write", []string{"--data-dir", data, "--run-log-dir", open}, open + " is writable by other users"},
	} {
		args := append([]string{"run", "--config", cfg, "--name", "a", "--etcd", "http://127.0.0.1:1", "--etcd-dial-timeout", "1s"}, tc.args...)
		type result struct {
			code   int
			errOut string
		}
		done := make(chan result, 1)
		go func() { // a shardd run that does not refuse goes on, waiting for etcd
			code, _, errOut := shardd(t, args...)
			done <- result{code, errOut}
		}()
		var code int
		var errOut string
		select {
		case r := <-done:
			code, errOut = r.code, r.errOut
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: shardd run did not refuse its run log directory: it went on", tc.name)
		}
		if code != exitFailure || !strings.Contains(errOut, "run log directory") || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: exit %d, stderr:\n%s\nwant exit %d saying %q", tc.name, code, errOut, exitFailure, tc.want)
		}
	}
}

// Go's profiles, like the API, answer only to a Host no web page can
// rebind to their address (/debug/pprof/cmdline shows the command line),
// and only on loopback unless --pprof-listen-any says otherwise.
func TestPprofChecksHost(t *testing.T) {
	ln, h, err := listenPprof("127.0.0.1:0", false)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	get := func(host string) int {
		req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/debug/pprof/cmdline", nil)
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for host, want := range map[string]int{
		fmt.Sprintf("127.0.0.1:%d", port):          200,
		fmt.Sprintf("localhost:%d", port):          200,
		fmt.Sprintf("[::1]:%d", port):              200,
		fmt.Sprintf("rebound.example:%d", port):    421,
		fmt.Sprintf("10.0.0.1:%d", port):           421,
		fmt.Sprintf("localhost.evil.com:%d", port): 421,
	} {
		if got := get(host); got != want {
			t.Errorf("Host %s: %d, want %d", host, got, want)
		}
	}

	// Beyond loopback: refused without the flag; with it, the profiles
	// answer to an address, never to a name.
	if _, _, err := listenPprof("0.0.0.0:0", false); err == nil || !strings.Contains(err.Error(), "--pprof-listen-any") {
		t.Errorf("--pprof-listen 0.0.0.0:0 without --pprof-listen-any: %v, want a refusal naming the flag", err)
	}
	for _, tc := range []struct {
		host string
		ok   bool
	}{{"10.0.0.1:6060", true}, {"[fd00::1]:6060", true}, {"localhost:6060", true}, {"shardd-1:6060", false}, {"rebound.example", false}} {
		if got := api.AddressHosts.OK(tc.host); got != tc.ok {
			t.Errorf("an address beyond loopback, Host %s: answered %v, want %v", tc.host, got, tc.ok)
		}
	}
}

// --label is repeatable, takes several joined by commas (as SHARDD_LABEL
// gives them), and refuses a malformed label or one key given two values.
func TestRunLabels(t *testing.T) {
	parse := func(envLabel string, args ...string) (*runFlags, error) {
		e := &env{stdout: io.Discard, stderr: io.Discard, getenv: func(k string) string {
			if k == "SHARDD_LABEL" {
				return envLabel
			}
			return ""
		}}
		return parseRunFlags(e, append([]string{"--config", "jobs.yaml"}, args...))
	}
	f, err := parse("", "--label", "role=db", "--label", "zone=a,gpu=")
	if err != nil || f.labels.String() != "gpu=,role=db,zone=a" {
		t.Fatalf("labels %v, %v", f.labels, err)
	}
	if f, err := parse("role=db,zone=b"); err != nil || f.labels["zone"] != "b" {
		t.Errorf("SHARDD_LABEL: %v, %v", f, err)
	}
	for _, bad := range [][]string{{"--label", "role"}, {"--label", "role=a b"}, {"--label", "zone=a", "--label", "zone=b"}} {
		if _, err := parse("", bad...); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}
