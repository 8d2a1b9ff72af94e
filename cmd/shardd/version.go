package main

import (
	"fmt"
	"runtime"

	"github.com/shardd/shardd/pkg/version"
)

func cmdVersion(e *env, args []string) error {
	fs := newFlagSet(e, "version")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "shardd %s %s %s/%s\n", version.String(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return nil
}
