package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

func cmdKill(e *env, args []string) error {
	fs := newFlagSet(e, "kill")
	var o opsFlags
	o.register(fs)
	var item itemFlag
	fs.Var(&item, "item", "kill only this `item`'s run (default every running item)")
	fence := fs.Int64("fence", 0, "kill the item's run only if it is the one with this `fence` (as history or the console shows it); else nothing is killed (needs --item)")
	wait := fs.Duration("wait", 10*time.Second, "wait this long for the runs to end and say how each ended (0: do not wait)")
	job, err := o.parseJob(e, fs, args)
	if err != nil {
		return err
	}
	if *wait < 0 {
		return usageError("--wait must not be negative, got %s", *wait)
	}
	switch {
	case *fence < 0:
		return usageError("--fence must be positive, got %d", *fence)
	case *fence > 0 && !item.set:
		return usageError("--fence names the run of one item: give --item N too")
	}
	var items []int
	target := "job " + job
	if item.set {
		items = []int{item.n}
		target = fmt.Sprintf("item %d of job %s", item.n, job)
	}
	var detail string
	if *fence > 0 {
		detail = fmt.Sprintf("fence %d", *fence)
	}
	adm, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	k, err := adm.Kill(ctx, admin.KillRequest{Job: job, Items: items, Fence: *fence, By: cliActor()})
	if err != nil {
		o.audit(ctx, adm, keyspace.AuditEntry{Action: "kill", Job: job, Target: target, Detail: detail}, err)
		return o.opError(err)
	}
	runs := make([]string, len(k.Runs))
	for i, r := range k.Runs {
		runs[i] = fmt.Sprintf("item %d (fence %d on %s)", r.Item, r.Fence, r.Instance)
	}
	msg := fmt.Sprintf("asked to kill %s of job %s", strings.Join(runs, ", "), job)
	o.audit(ctx, adm, keyspace.AuditEntry{Action: "kill", Job: job, Target: target, Detail: detail, Message: msg}, nil)
	fmt.Fprintln(e.stdout, msg)
	if *wait == 0 {
		return nil
	}
	wctx, cancel := context.WithTimeout(context.Background(), *wait)
	defer cancel()
	res, err := adm.WaitKill(wctx, job, k.Kill)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ITEM\tFENCE\tINSTANCE\tRESULT")
	pending := 0
	for _, r := range res {
		result := r.State
		switch {
		case r.State == "":
			result, pending = "still running", pending+1
		case r.State == keyspace.StateKilled && r.Reason == keyspace.ReasonOperator:
			result = "KILLED/operator: " + r.Error
		case r.State == "ENDED":
			result = "ended before the kill: " + r.Error
		default:
			if r.Reason != "" {
				result += "/" + r.Reason
			}
			result = "ended before the kill: " + result
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\n", r.Item, r.Fence, r.Instance, result)
	}
	tw.Flush()
	if pending > 0 {
		if err == nil {
			err = wctx.Err()
		}
		return fmt.Errorf("%d run(s) had not ended within --wait %s (%v); `shardd history %s` shows how they end", pending, *wait, err, job)
	}
	return nil
}

func cmdAudit(e *env, args []string) error {
	fs := newFlagSet(e, "audit")
	var o opsFlags
	o.register(fs)
	job := fs.String("job", "", "only the entries of this `job`")
	actor := fs.String("actor", "", "only the entries of this `actor`: token:NAME, cli:USER@HOST, instance:ID, or a kind or start of one (cli, token, cli:root)")
	limit := fs.Int("n", 50, "show the newest `N` entries")
	output := fs.String("o", "table", "output `format`: table or json")
	if err := applyEnv(e, fs, etcdFlagNames...); err != nil {
		return err
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError("no arguments expected, got %s (use --job JOB)", strings.Join(pos, " "))
	}
	if *output != "table" && *output != "json" {
		return usageError("-o must be table or json, got %q", *output)
	}
	if *limit <= 0 {
		return usageError("-n must be positive, got %d", *limit)
	}
	adm, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	entries, err := adm.Audit(ctx, admin.AuditFilter{Job: *job, Actor: *actor, Limit: *limit})
	if err != nil {
		return o.opError(err)
	}
	if *output == "json" {
		return writeJSON(e.stdout, entries)
	}
	if len(entries) == 0 {
		fmt.Fprintln(e.stdout, "no audit entries match")
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tACTOR\tACTION\tTARGET\tOUTCOME\tDETAIL\tMESSAGE")
	for _, a := range entries {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Time.Format(time.RFC3339), a.Actor, a.Action, a.Target, a.Outcome, dash(a.Detail), dash(a.Message))
	}
	return tw.Flush()
}
