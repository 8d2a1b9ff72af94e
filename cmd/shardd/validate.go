package main

import (
	"fmt"

	"github.com/shardd/shardd/pkg/config"
)

func cmdValidate(e *env, args []string) error {
	fs := newFlagSet(e, "validate")
	path := fs.String("config", e.getenv("SHARDD_CONFIG"), "job definitions: a YAML `file` or a directory of *.yaml (env SHARDD_CONFIG)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *path == "" {
		return usageError("--config is required")
	}
	c, err := config.Load(*path)
	if err != nil {
		problems := config.Errors(err)
		for _, p := range problems {
			fmt.Fprintln(e.stderr, p)
		}
		return &exitError{exitFailure, fmt.Errorf("%d problem(s) in %s", len(problems), *path)}
	}
	fmt.Fprintf(e.stdout, "%s: %d job(s) in %d file(s), valid\n", *path, len(c.Jobs), len(c.Files))
	return nil
}
