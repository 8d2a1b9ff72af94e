package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/admin"
)

// The commands that define jobs through etcd (docs/applied.md): apply,
// diff, get, delete, rollback, and history --definitions. Each reads
// definitions exactly as the daemon reads its files (the same errors, at
// file:line), and each write is audited, refusals included.

// loadDefinitions reads path (a file, a directory, or "-" for stdin) as
// job definitions, validated as files are, without requiring the hooks'
// secrets in this environment: they are the running hosts'.
func loadDefinitions(e *env, path string) ([]*config.Job, error) {
	if path == "" {
		return nil, usageError("-f FILE (or DIR, or - for stdin) is required")
	}
	var c *config.Config
	var err error
	if path == "-" {
		data, rerr := io.ReadAll(e.input())
		if rerr != nil {
			return nil, rerr
		}
		c, err = config.ParseWithoutEnv("stdin", data)
	} else {
		c, err = config.LoadWithoutEnv(path)
	}
	if err != nil {
		problems := config.Errors(err)
		for _, p := range problems {
			fmt.Fprintln(e.stderr, p)
		}
		return nil, &exitError{exitFailure, fmt.Errorf("%d problem(s) in %s; nothing written", len(problems), path)}
	}
	if len(c.Jobs) == 0 {
		return nil, &exitError{exitFailure, fmt.Errorf("%s defines no job", path)}
	}
	return c.Jobs, nil
}

func cmdApply(e *env, args []string) error { return applyOrDiff(e, "apply", args) }
func cmdDiff(e *env, args []string) error  { return applyOrDiff(e, "diff", args) }

func applyOrDiff(e *env, name string, args []string) error {
	fs := newFlagSet(e, name)
	var o opsFlags
	o.register(fs)
	file := fs.String("f", "", "the definitions: a YAML `file`, a directory of them, or - for stdin")
	takeOver := fs.Bool("take-over", false, "apply jobs the hosts' files define: they become applied, and no file publishes over them")
	dry := new(bool)
	if name == "apply" {
		dry = fs.Bool("dry-run", false, "show what would change, write nothing (as shardd diff)")
	}
	output := fs.String("o", "text", "output `format`: text or json")
	if err := applyEnv(e, fs, etcdFlagNames...); err != nil {
		return err
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError("unexpected argument %q: the definitions are given with -f", pos[0])
	}
	if *output != "text" && *output != "json" {
		return usageError("-o must be text or json, got %q", *output)
	}
	jobs, err := loadDefinitions(e, *file)
	if err != nil {
		return err
	}
	adm, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	res, err := adm.Apply(ctx, jobs, admin.ApplyOptions{By: cliActor(), TakeOver: *takeOver, DryRun: *dry || name == "diff"})
	if err != nil && !errors.Is(err, admin.ErrRefused) {
		return o.opError(err)
	}
	if *output == "json" {
		if werr := writeJSON(e.stdout, res); werr != nil {
			return werr
		}
	} else {
		writeApplied(e.stdout, res, *dry || name == "diff")
	}
	changed, refused := false, 0
	for _, r := range res {
		if r.Err != "" {
			refused++
		}
		changed = changed || (r.Action != "" && r.Action != "unchanged")
	}
	switch {
	case err != nil && (*dry || name == "diff"):
		return &exitError{exitFailure, fmt.Errorf("%d of %d job(s) would be refused", refused, len(res))}
	case err != nil:
		return &exitError{exitFailure, err}
	case name == "diff" && changed:
		return &exitError{exitFailure, errors.New("")} // as diff(1): 1 when something differs
	}
	return nil
}

// writeApplied prints what apply did (or, dry, would do) to each job.
func writeApplied(w io.Writer, res []admin.ApplyResult, dry bool) {
	for _, r := range res {
		if r.Err != "" {
			fmt.Fprintf(w, "job %s: refused: %s\n", r.Job, strings.TrimPrefix(r.Err, "refused: "))
			continue
		}
		for _, n := range r.Notes {
			fmt.Fprintf(w, "job %s: %s\n", r.Job, n)
		}
		verb := map[string]string{"create": "created", "update": "updated", "take-over": "taken over from the files", "unchanged": "unchanged"}[r.Action]
		if dry {
			verb = map[string]string{"create": "would be created", "update": "would be updated", "take-over": "would be taken over from the files", "unchanged": "unchanged"}[r.Action]
		}
		switch {
		case dry || r.Action == "unchanged":
			fmt.Fprintf(w, "job %s: %s\n", r.Job, verb)
		default:
			fmt.Fprintf(w, "job %s: %s (version %d, generation %d)\n", r.Job, verb, r.Version, r.Generation)
		}
		if r.Action != "create" {
			for _, c := range r.Diff {
				fmt.Fprintf(w, "  %s\n", c)
			}
		}
	}
}

func cmdGet(e *env, args []string) error {
	fs := newFlagSet(e, "get")
	var o opsFlags
	o.register(fs)
	output := fs.String("o", "yaml", "output `format`: yaml (what shardd apply takes back) or json")
	version := fs.Int64("version", 0, "a kept `version` of the definition instead of the registered one (shardd history --definitions JOB lists them)")
	job, err := o.parseJob(e, fs, args)
	if err != nil {
		return err
	}
	if *output != "yaml" && *output != "json" {
		return usageError("-o must be yaml or json, got %q", *output)
	}
	adm, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	if *version > 0 {
		vs, err := adm.Versions(ctx, job)
		if err != nil {
			return o.opError(err)
		}
		for _, v := range vs {
			if v.Version != *version {
				continue
			}
			if v.Def == nil {
				return &exitError{exitFailure, fmt.Errorf("job %s: version %d does not validate in this shardd: %s", job, v.Version, v.Err)}
			}
			if *output == "json" {
				_, err := e.stdout.Write(append(v.Def.JSON(), '\n'))
				return err
			}
			fmt.Fprintf(e.stdout, "# job %s: version %d (generation %d), %s by %s at %s\n", job, v.Version, v.Generation, v.Change, v.By, v.Written.UTC().Format(time.RFC3339))
			_, err := e.stdout.Write(config.YAML(v.Def))
			return err
		}
		return &exitError{exitFailure, fmt.Errorf("job %s has no version %d kept (shardd history --definitions %s lists them)", job, *version, job)}
	}
	d, err := adm.Definition(ctx, job)
	if err != nil {
		return o.opError(err)
	}
	if d.Job == nil {
		return &exitError{exitFailure, fmt.Errorf("job %s: its registered definition cannot be read by this shardd: %v", job, d.Err)}
	}
	if *output == "json" {
		_, err := e.stdout.Write(append(d.Job.JSON(), '\n'))
		return err
	}
	source := d.Registered.Source
	if source == "" {
		source = "file"
	}
	fmt.Fprintf(e.stdout, "# job %s: %s by %s at %s; version %d, generation %d\n", job, source, firstOf(d.Registered.By, d.Registered.Writer),
		d.Registered.Written.UTC().Format(time.RFC3339), d.Registered.Version, d.Generation)
	_, err = e.stdout.Write(config.YAML(d.Job))
	return err
}

func cmdDelete(e *env, args []string) error {
	fs := newFlagSet(e, "delete")
	var o opsFlags
	o.register(fs)
	wait := fs.Duration("wait", 30*time.Second, "wait this long for the instances to leave the job before deleting the rest of its keys")
	job, err := o.parseJob(e, fs, args)
	if err != nil {
		return err
	}
	o.timeout = max(o.timeout, *wait+5*time.Second)
	adm, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	removed, err := adm.DeleteApplied(ctx, job, cliActor(), *wait)
	if err != nil {
		return o.opError(err)
	}
	if removed {
		fmt.Fprintf(e.stdout, "deleted job %s: its instances left it, and its keys are gone from %s\n", job, o.cluster())
	} else {
		fmt.Fprintf(e.stdout, "deleted job %s: no instance runs it any more once its runs in progress end; its other keys (records, history) stay until shardd remove %s\n", job, job)
	}
	return nil
}

func cmdRollback(e *env, args []string) error {
	fs := newFlagSet(e, "rollback")
	var o opsFlags
	o.register(fs)
	to := fs.Int64("to", 0, "the `version` to restore (shardd history --definitions JOB lists them; a generation finds its version too)")
	job, err := o.parseJob(e, fs, args)
	if err != nil {
		return err
	}
	if *to <= 0 {
		return usageError("--to VERSION is required (shardd history --definitions %s lists them)", job)
	}
	adm, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	r, err := adm.Rollback(ctx, job, *to, cliActor())
	if err != nil {
		return o.opError(err)
	}
	if r.Action == "unchanged" {
		fmt.Fprintf(e.stdout, "job %s: version %d is the registered definition already\n", job, *to)
		return nil
	}
	fmt.Fprintf(e.stdout, "job %s: rolled back to version %d, registered as version %d (generation %d)\n", job, *to, r.Version, r.Generation)
	for _, c := range r.Diff {
		fmt.Fprintf(e.stdout, "  %s\n", c)
	}
	return nil
}

// definitionHistory is shardd history --definitions JOB.
func definitionHistory(e *env, o *opsFlags, job, output string) error {
	adm, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	vs, err := adm.Versions(ctx, job)
	if err != nil {
		return o.opError(err)
	}
	if output == "json" {
		return writeJSON(e.stdout, vs)
	}
	if len(vs) == 0 {
		fmt.Fprintf(e.stdout, "job %s has no versions kept (its definition has not changed since versions are kept)\n", job)
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tGENERATION\tWRITTEN\tBY\tCHANGE\tWHAT CHANGED")
	for _, v := range vs {
		ver := fmt.Sprint(v.Version)
		if v.Current {
			ver += "*"
		}
		change := v.Change
		if v.Of > 0 {
			change += fmt.Sprintf(" to %d", v.Of)
		}
		var fields []string
		for _, c := range v.Diff {
			fields = append(fields, c.Field)
		}
		what := strings.Join(fields, ", ")
		switch {
		case v.Err != "":
			what = "unreadable here: " + v.Err
		case what == "" && v.Diff == nil:
			what = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", ver, v.Generation, v.Written.UTC().Format(time.RFC3339), v.By, change, what)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "* the registered one. shardd get %s shows it; shardd rollback %s --to VERSION restores one\n", job, job)
	return nil
}

func firstOf(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return "?"
}
