package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/shardd/shardd/pkg/embedetcd"
)

// cmdCA creates the CA of an embedded etcd cluster (--embed-cluster) in a
// data dir: every member's data dir holds the same one, so that members
// trust each other (docs/deployment.md).
func cmdCA(e *env, args []string) error {
	flags := newFlagSet(e, "ca")
	dataDir := flags.String("data-dir", systemdDataDir, "`directory` of shardd's state on this host; the CA goes into its tls/")
	if err := applyEnv(e, flags, "data-dir"); err != nil {
		return err
	}
	if err := parseFlags(flags, args); err != nil {
		return err
	}
	dir, err := filepath.Abs(*dataDir)
	if err != nil {
		return err
	}
	f := embedetcd.Files(dir)
	_, statErr := os.Stat(f.CA)
	existed := statErr == nil
	if statErr != nil && !errors.Is(statErr, fs.ErrNotExist) {
		return statErr
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	// The member's own certificates come with it; run re-issues them for
	// the names of its URLs.
	if _, err := embedetcd.EnsureTLS(dir, []string{"127.0.0.1"}, time.Now()); err != nil {
		return err
	}
	what := "created"
	if existed {
		what = "already there, kept"
	}
	fmt.Fprintf(e.stdout, "the embedded etcd cluster's CA: %s and %s (%s)\n", f.CA, f.CAKey, what)
	fmt.Fprintf(e.stdout, "copy both to the same place in every other member's --data-dir (owner: the user shardd runs as; files 0600, directory 0700) before its first start; %s can sign members: keep it as secret as the data dir\n", filepath.Base(f.CAKey))
	return nil
}
