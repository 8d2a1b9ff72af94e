package embedetcd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Two embedded etcds in one process each log to their own file (with etcd's
// own log rotation the second wrote into the first's file, and under -race
// the two raced on its name), and Close closes it.
func TestEachServerWritesItsOwnLog(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dirs := []string{t.TempDir(), t.TempDir()}
	var srvs []*Server
	for i, dir := range dirs {
		u := func() string { return "http://" + strings.TrimPrefix(freeURL(t), "https://") }
		s, err := Start(ctx, Options{Dir: dir, ClientURL: u(), PeerURL: u(), Name: fmt.Sprintf("m%d", i), LogLevel: "info"})
		if err != nil {
			t.Fatal(err)
		}
		srvs = append(srvs, s)
	}
	for _, s := range srvs {
		s.Close()
	}
	for i, dir := range dirs {
		b, err := os.ReadFile(filepath.Join(dir, "etcd.log"))
		if err != nil {
			t.Fatal(err)
		}
		own, other := filepath.Join(dir, "etcd"), filepath.Join(dirs[1-i], "etcd")
		if !strings.Contains(string(b), `"data-dir":"`+own+`"`) {
			t.Errorf("member m%d's etcd.log does not mention its data dir %s:\n%s", i, own, b)
		}
		if strings.Contains(string(b), other) {
			t.Errorf("member m%d's etcd.log has the other member's lines (%s)", i, other)
		}
		// A clean stop is no error: etcd's "setting up serving ... failed"
		// for its closed listeners is written at info.
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, `"level":"error"`) {
				t.Errorf("member m%d's etcd.log has an error line after a clean stop: %.300s", i, line)
			}
		}
	}
	// Closed: a late line of etcd's is dropped, not written or an error.
	if n, err := srvs[0].log.Write([]byte("late\n")); n != 5 || err != nil {
		t.Errorf("write after Close = %d, %v; want 5, nil", n, err)
	}
}

func TestLogFileRotates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "etcd.log")
	os.WriteFile(path, []byte("old\n"), 0o644)
	l, err := openLogFile(path, 10, 2)
	if err != nil {
		t.Fatal(err)
	}
	// Lines from several goroutines (etcd's): none torn, none lost until
	// rotated out.
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 25 {
				fmt.Fprintf(l, "%d-%02d\n", g, i)
			}
		})
	}
	wg.Wait()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, name := range []string{"etcd.log", "etcd.log.1", "etcd.log.2"} {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(path), name))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(b) > 10 || len(b) == 0 {
			t.Errorf("%s has %d bytes, want 1..10", name, len(b))
		}
		for _, line := range strings.Split(strings.TrimSuffix(string(b), "\n"), "\n") {
			if len(line) != 4 || line[1] != '-' {
				t.Errorf("%s: torn line %q", name, line)
			}
		}
		got[name] = string(b)
		if st, _ := os.Stat(filepath.Join(filepath.Dir(path), name)); st.Mode().Perm() != 0o600 {
			t.Errorf("%s mode %v, want 0600", name, st.Mode().Perm())
		}
	}
	if _, err := os.Stat(path + ".3"); !os.IsNotExist(err) {
		t.Errorf("a third old file is kept (%v); want 2", err)
	}
	// A reopened file appends; the oldest kept file is the one before.
	l, err = openLogFile(path, 10, 2)
	if err != nil {
		t.Fatal(err)
	}
	l.Write([]byte("x\n"))
	l.Close()
	if b, _ := os.ReadFile(path); string(b) != got["etcd.log"]+"x\n" {
		t.Errorf("reopened log = %q, want %q", b, got["etcd.log"]+"x\n")
	}
}
