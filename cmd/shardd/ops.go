package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
)

// opsFlags are the flags of the commands that act on one job through etcd.
type opsFlags struct {
	ef      etcdFlags
	timeout time.Duration
}

func (o *opsFlags) register(fs *flag.FlagSet) {
	o.ef.register(fs, "etcd endpoint `URLs`, comma-separated (default "+defaultEmbedURL+", the embedded default)")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Second, "give up on etcd after this long")
}

// connect returns a client and a context bounded by --timeout.
func (o *opsFlags) connect() (*coord.Client, context.Context, func(), error) {
	endpoints := o.ef.list()
	if len(endpoints) == 0 {
		endpoints = []string{defaultEmbedURL}
	}
	cli, err := coord.NewClient(o.ef.clientOptions(endpoints))
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	return cli, ctx, func() { cancel(); cli.Close() }, nil
}

// jobArg parses the one positional JOB argument that leads these commands,
// so that flags may follow it (shardd trigger orders --item 2).
func jobArg(fs *flag.FlagSet, args []string) (string, error) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if err := parseFlags(fs, args); err != nil {
			return "", err
		}
		return "", usageError("a JOB argument is required")
	}
	job := args[0]
	if err := config.CheckName(job); err != nil {
		return "", usageError("job name %v", err)
	}
	return job, parseFlags(fs, args[1:])
}

func cmdTrigger(e *env, args []string) error {
	fs := newFlagSet(e, "trigger")
	var o opsFlags
	o.register(fs)
	item := fs.Int("item", -1, "run only this `item` (default every item)")
	if err := applyEnv(e, fs); err != nil {
		return err
	}
	job, err := jobArg(fs, args)
	if err != nil {
		return err
	}
	var items []int
	if *item >= 0 {
		items = []int{*item}
	}
	cli, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	tr, err := coord.RequestTrigger(ctx, cli, coord.NewKeys(o.ef.prefix), job, items, hostname())
	if err != nil {
		return err
	}
	what := "every item"
	if len(items) > 0 {
		what = "item " + strconv.Itoa(items[0])
	}
	fmt.Fprintf(e.stdout, "triggered %s of job %s (fire %s); see shardd history %s\n", what, job, tr.Fire.Format(time.RFC3339Nano), job)
	return nil
}

func cmdDisable(e *env, args []string) error { return setDisabled(e, "disable", args, true) }
func cmdEnable(e *env, args []string) error  { return setDisabled(e, "enable", args, false) }

func setDisabled(e *env, name string, args []string, on bool) error {
	fs := newFlagSet(e, name)
	var o opsFlags
	o.register(fs)
	item := fs.Int("item", -1, "only this `item`")
	instance := fs.String("instance", "", "only this instance `id` (its items move to the others)")
	if err := applyEnv(e, fs); err != nil {
		return err
	}
	job, err := jobArg(fs, args)
	if err != nil {
		return err
	}
	if *item >= 0 && *instance != "" {
		return usageError("--item and --instance exclude each other")
	}
	cli, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	if err := coord.SetDisabled(ctx, cli, coord.NewKeys(o.ef.prefix), job, *item, *instance, on); err != nil {
		return err
	}
	what := "job " + job
	switch {
	case *item >= 0:
		what = fmt.Sprintf("item %d of job %s", *item, job)
	case *instance != "":
		what = fmt.Sprintf("instance %s for job %s", *instance, job)
	}
	fmt.Fprintf(e.stdout, "%sd %s\n", name, what)
	return nil
}

func cmdHistory(e *env, args []string) error {
	fs := newFlagSet(e, "history")
	var o opsFlags
	o.register(fs)
	item := fs.Int("item", -1, "only this `item`")
	output := fs.String("o", "table", "output `format`: table or json")
	if err := applyEnv(e, fs); err != nil {
		return err
	}
	job, err := jobArg(fs, args)
	if err != nil {
		return err
	}
	if *output != "table" && *output != "json" {
		return usageError("-o must be table or json, got %q", *output)
	}
	cli, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	recs, err := coord.ReadHistory(ctx, cli, coord.NewKeys(o.ef.prefix), job)
	if err != nil {
		return err
	}
	if *item >= 0 {
		kept := recs[:0]
		for _, r := range recs {
			if r.Item == *item {
				kept = append(kept, r)
			}
		}
		recs = kept
	}
	if *output == "json" {
		if recs == nil {
			recs = []coord.ItemRecord{}
		}
		return writeJSON(e.stdout, recs)
	}
	return writeHistory(e.stdout, recs)
}

func writeHistory(w io.Writer, recs []coord.ItemRecord) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ITEM\tFIRE\tINSTANCE\tATTEMPT\tSOURCE\tSTART\tDURATION\tRESULT\tEXIT\tSKIPPED\tOUTPUT")
	for _, r := range recs {
		dur := "-"
		if !r.End.IsZero() && !r.Start.IsZero() {
			dur = r.End.Sub(r.Start).Round(time.Millisecond).String()
		}
		out := strings.TrimSpace(r.Output)
		if i := strings.LastIndexByte(out, '\n'); i >= 0 {
			out = out[i+1:]
		}
		if r.Error != "" && out == "" {
			out = r.Error
		}
		if len(out) > 60 {
			out = out[:57] + "..."
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", r.Item, r.Fire.Format(time.RFC3339), r.Instance, r.Attempt, dash(r.Source),
			r.Start.Format(time.RFC3339), dur, r.State, r.ExitCode, r.Skipped, dash(out))
	}
	return tw.Flush()
}
