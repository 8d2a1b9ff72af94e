package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestClusterPeer(t *testing.T) {
	three := "a=https://10.0.0.1:2380,b=https://10.0.0.2:2380,c=https://10.0.0.3:2380"
	for _, tt := range []struct {
		spec, name, peer string
		given            bool
		want, err        string
	}{
		{three, "b", "", false, "https://10.0.0.2:2380", ""},
		{three, "b", "https://10.0.0.2:2380", true, "https://10.0.0.2:2380", ""},
		{three, "b", "https://10.0.0.9:2380", true, "", "--embed-peer-url https://10.0.0.9:2380 differs from member b's URL in the list, https://10.0.0.2:2380"},
		{three, "d", "", false, "", "this instance's --name d is not one of the members"},
		{"a=https://10.0.0.1:2380,b=https://10.0.0.2:2380", "a", "", false, "", "2 members tolerate no more member failures than 1: use 3 or 5"},
		{"a=https://10.0.0.1:2380,a=https://10.0.0.2:2380,c=https://x:1", "a", "", false, "", "member a is listed twice"},
		{"a=http://10.0.0.1:2380,b=https://10.0.0.2:2380,c=https://x:1", "a", "", false, "", `member a: peer URL "http://10.0.0.1:2380" must be https://HOST:PORT`},
		{"a,b=https://x:1,c=https://y:1", "b", "", false, "", `"a" is not NAME=PEER_URL`},
		{"solo=https://127.0.0.1:2380", "solo", "", false, "https://127.0.0.1:2380", ""},
	} {
		got, err := clusterPeer(tt.spec, tt.name, tt.peer, tt.given)
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
