package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/shardd/shardd/pkg/api"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/history"
)

// opsFlags are the flags of the commands that talk to a cluster through etcd.
type opsFlags struct {
	ef      etcdFlags
	timeout time.Duration
	copts   coord.ClientOptions // as connect made them, for opError
	// unreachable says why no endpoint can answer, when connect's early
	// look found that out before --timeout; nil otherwise.
	unreachable atomic.Pointer[[]string]
}

func (o *opsFlags) register(fs *flag.FlagSet) {
	o.ef.register(fs, "etcd endpoint `URLs` with their scheme (https://host:2379), comma-separated (default: the embedded etcd of --data-dir, at the URL it recorded; "+defaultEmbedURL+" unless --embed-client-url chose another)")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Second, "give up on etcd after this long")
}

// parse applies the connection flags' environment variables, then parses
// args, which must hold exactly one positional argument, JOB.
func (o *opsFlags) parseJob(e *env, fs *flag.FlagSet, args []string) (string, error) {
	if err := applyEnv(e, fs, etcdFlagNames...); err != nil {
		return "", err
	}
	pos, err := parseArgs(fs, args)
	switch {
	case err != nil:
		return "", err
	case len(pos) == 0:
		return "", usageError("a JOB argument is required")
	case len(pos) > 1:
		return "", usageError("one JOB argument, got %d: %s", len(pos), strings.Join(pos, " "))
	}
	if err := config.CheckName(pos[0]); err != nil {
		return "", usageError("job name %v", err)
	}
	return pos[0], nil
}

// cluster names the cluster the command talks to, for its messages.
func (o *opsFlags) cluster() string {
	eps := o.copts.Endpoints // as connect chose them
	if len(eps) == 0 {
		eps = o.ef.list()
	}
	if len(eps) == 0 {
		eps = []string{defaultEmbedURL}
	}
	return fmt.Sprintf("etcd %s, prefix %s", strings.Join(eps, ","), keyspace.NewKeys(o.ef.prefix).Prefix())
}

// connect returns the operator client of the cluster and a context
// bounded by --timeout.
func (o *opsFlags) connect() (*admin.Client, context.Context, func(), error) {
	if o.timeout <= 0 {
		return nil, nil, nil, usageError("--timeout must be positive, got %s", o.timeout)
	}
	dir, implicit := o.ef.dir(true)
	copts, err := o.ef.clientOptions(o.ef.list(), dir, implicit)
	if err != nil {
		return nil, nil, nil, err
	}
	o.copts = copts
	cli, err := coord.NewClient(copts)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout)
	ctx, giveUp := context.WithCancel(ctx)
	looked := make(chan struct{})
	go func() { // no need to wait out --timeout for an etcd that cannot answer
		defer close(looked)
		select {
		case <-time.After(min(time.Second, o.timeout/2)):
		case <-ctx.Done():
			return
		}
		var why []string
		for _, ep := range copts.Endpoints {
			d := coord.Diagnose(ctx, ep, copts)
			if d == "" || ctx.Err() != nil {
				return // this one may answer: let the command wait for it
			}
			why = append(why, d)
		}
		o.unreachable.Store(&why)
		giveUp()
	}()
	return admin.New(cli, keyspace.NewKeys(o.ef.prefix)), ctx, func() { giveUp(); cancel(); <-looked; cli.Close() }, nil
}

// opError turns an error of an etcd operation into the command's error,
// naming the cluster when etcd could not be reached.
func (o *opsFlags) opError(err error) error {
	if errors.Is(err, admin.ErrUnknownJob) || errors.Is(err, admin.ErrBadTarget) || errors.Is(err, admin.ErrRefused) {
		return err
	}
	if why := o.unreachable.Load(); why != nil && errors.Is(err, context.Canceled) {
		return fmt.Errorf("no answer from %s: %s", o.cluster(), strings.Join(*why, "; "))
	}
	if errors.Is(err, context.DeadlineExceeded) {
		var why []string
		for _, ep := range o.copts.Endpoints {
			if d := coord.Diagnose(context.Background(), ep, o.copts); d != "" {
				why = append(why, d)
			} else if d := coord.Leaderless(context.Background(), ep, o.copts); d != "" {
				why = append(why, d)
			}
		}
		if len(why) > 0 {
			return fmt.Errorf("%w\nno answer from %s within --timeout %s: %s", err, o.cluster(), o.timeout, strings.Join(why, "; "))
		}
		return fmt.Errorf("%w\nno answer from %s within --timeout %s; is shardd or etcd running there? (--etcd or SHARDD_ETCD chooses the cluster)", err, o.cluster(), o.timeout)
	}
	return fmt.Errorf("%w (%s)", err, o.cluster())
}

// itemFlag is an --item flag: unset, or a number checked by the command.
type itemFlag struct {
	set bool
	n   int
}

func (f *itemFlag) String() string {
	if !f.set {
		return ""
	}
	return strconv.Itoa(f.n)
}

func (f *itemFlag) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return fmt.Errorf("want an item number, got %q", s)
	}
	if n < 0 {
		return fmt.Errorf("items are numbered from 0, got %d", n)
	}
	f.set, f.n = true, n
	return nil
}

// value is the item, or -1 when unset.
func (f *itemFlag) value() int {
	if !f.set {
		return -1
	}
	return f.n
}

func cmdTrigger(e *env, args []string) error {
	fs := newFlagSet(e, "trigger")
	var o opsFlags
	o.register(fs)
	var item itemFlag
	fs.Var(&item, "item", "run only this `item` (default every item)")
	param := fs.String("param", "", "a one-off `text` for this run: SHARDD_TRIGGER_PARAMETER (and triggerParameter in SHARDD_CONTEXT)")
	fire := fs.String("fire", "", "run this past scheduled fire of the job again, as MANUAL with a fence of its own: `TIME` in RFC 3339, or 'YYYY-MM-DD HH:MM[:SS]' in the job's time zone")
	noPropagate := fs.Bool("no-propagate", false, "do not trigger the job's children (jobs with dependsOn on it) with this run's outcome; a run of one --item never does")
	job, err := o.parseJob(e, fs, args)
	if err != nil {
		return err
	}
	var items []int
	if item.set {
		items = []int{item.n}
	}
	adm, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	req := admin.TriggerRequest{Job: job, Items: items, Param: *param, Fire: *fire, By: cliActor(), NoPropagate: *noPropagate}
	tr, err := adm.Trigger(ctx, req)
	target := "job " + job
	if item.set {
		target = fmt.Sprintf("item %d of job %s", item.n, job)
	}
	detail := req.Detail()
	if err != nil {
		o.audit(ctx, adm, keyspace.AuditEntry{Action: "trigger", Job: job, Target: target, Detail: detail}, err)
		return o.opError(err)
	}
	what := "every item (" + joinInts(tr.Runs) + ")"
	switch {
	case item.set:
		what = "item " + strconv.Itoa(item.n)
	case len(tr.Runs) == 1 && len(tr.Disabled) == 0:
		what = "its one item (" + joinInts(tr.Runs) + ")"
	}
	how := "now"
	if !tr.Rerun.IsZero() {
		how = "for its fire " + tr.Rerun.Format(time.RFC3339)
	}
	if *param != "" {
		how += fmt.Sprintf(" with parameter %q", *param)
	}
	when := "its owners run it now"
	switch {
	case len(tr.Busy) == 0:
	case len(tr.Busy) == len(tr.Runs) && len(tr.Runs) == 1:
		when = "it is running now: the trigger runs after that run ends"
	default:
		when = fmt.Sprintf("its owners run it now, except item(s) %s, running now: each runs it after that run ends", joinInts(tr.Busy))
	}
	msg := fmt.Sprintf("triggered %s of job %s %s (trigger %s, revision %d); %s, see `shardd history %s`", what, job, how, tr.ID, tr.Rev, when, job)
	switch {
	case len(tr.Children) == 0:
	case *noPropagate:
		msg += fmt.Sprintf("; not propagated: its children (%s) do not run after it", strings.Join(tr.Children, ", "))
	case item.set:
		msg += fmt.Sprintf("; a run of one item is not a fire of the job: its children (%s) do not run after it", strings.Join(tr.Children, ", "))
	case len(tr.Disabled) > 0:
		msg += fmt.Sprintf("; with disabled items left out it is not a whole fire of the job: its children (%s) do not run after it", strings.Join(tr.Children, ", "))
	default:
		msg += fmt.Sprintf("; once every item succeeded, its children run after it: %s (--no-propagate to not)", strings.Join(tr.Children, ", "))
	}
	fmt.Fprintln(e.stdout, msg)
	if len(tr.Disabled) > 0 {
		fmt.Fprintf(e.stdout, "not triggered: disabled item(s) %s\n", joinInts(tr.Disabled))
	}
	o.audit(ctx, adm, keyspace.AuditEntry{Action: "trigger", Job: job, Target: target, Detail: detail, Message: msg}, nil)
	return nil
}

// cliActor names the user of the CLI in the audit log: the OS user and
// the host.
func cliActor() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	return "cli:" + name + "@" + hostname()
}

// audit records a write command in the cluster's audit log with its
// outcome (err). A failure to record it does not change the command's
// result (etcd that refused the command may refuse the record too).
func (o *opsFlags) audit(ctx context.Context, adm *admin.Client, a keyspace.AuditEntry, err error) {
	a.Actor, a.Outcome = cliActor(), admin.AuditOutcome(err)
	if err != nil {
		a.Message = err.Error()
	}
	adm.RecordAudit(ctx, a)
}

func cmdDisable(e *env, args []string) error { return setDisabled(e, "disable", args, true) }
func cmdEnable(e *env, args []string) error  { return setDisabled(e, "enable", args, false) }

func setDisabled(e *env, name string, args []string, on bool) error {
	fs := newFlagSet(e, name)
	var o opsFlags
	o.register(fs)
	var item itemFlag
	fs.Var(&item, "item", "only this `item`")
	instance := fs.String("instance", "", "only this instance `id` (its items move to the others)")
	var force *bool
	if on {
		force = fs.Bool("force", false, "with --instance: disable an instance that does not run the job yet")
	} else {
		force = new(bool)
	}
	job, err := o.parseJob(e, fs, args)
	if err != nil {
		return err
	}
	if item.set && *instance != "" {
		return usageError("--item and --instance exclude each other")
	}
	if *instance != "" {
		if err := config.CheckName(*instance); err != nil {
			return usageError("--instance %v", err)
		}
	}
	adm, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	t := admin.Target{Job: job, Item: item.value(), Instance: *instance}
	res, err := adm.SetDisabled(ctx, t, on, *force)
	if err == nil || res.Changed {
		fmt.Fprintln(e.stdout, res.Message)
	}
	o.audit(ctx, adm, keyspace.AuditEntry{Action: name, Job: job, Target: t.String(), Detail: forceDetail(*force), Message: res.Message}, err)
	if err != nil {
		return o.opError(err)
	}
	return nil
}

func cmdRemove(e *env, args []string) error {
	fs := newFlagSet(e, "remove")
	var o opsFlags
	o.register(fs)
	job, err := o.parseJob(e, fs, args)
	if err != nil {
		return err
	}
	adm, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	n, err := adm.Remove(ctx, job)
	msg := fmt.Sprintf("removed job %s: deleted its %d keys from %s", job, n, o.cluster())
	if err != nil {
		msg = ""
	}
	if err == nil {
		fmt.Fprintln(e.stdout, msg)
	}
	o.audit(ctx, adm, keyspace.AuditEntry{Action: "remove", Job: job, Target: "job " + job, Message: msg}, err)
	if err != nil {
		return o.opError(err)
	}
	return nil
}

func cmdHistory(e *env, args []string) error {
	fs := newFlagSet(e, "history")
	var o opsFlags
	o.register(fs)
	var af apiFlags
	af.register(fs)
	var item itemFlag
	fs.Var(&item, "item", "only this `item`")
	since := fs.String("since", "", "only runs since this `time`: RFC 3339 (2026-12-04T02:00:00Z), a date (2026-12-04), or a duration back from now (10m, 36h, 7d)")
	result := fs.String("result", "", "only runs with this `result`: "+strings.Join(history.Results, ", "))
	limit := fs.Int("limit", history.DefaultLimit, fmt.Sprintf("at most this many runs (`N`, up to %d), newest first", history.MaxLimit))
	before := fs.String("before", "", "the page below this `cursor` (the one the previous page ends with)")
	output := fs.String("o", "table", "output `format`: table or json")
	definitions := fs.Bool("definitions", false, "the job's kept definitions (versions) instead of its executions")
	if err := applyEnv(e, fs, apiFlagNames...); err != nil {
		return err
	}
	job, err := o.parseJob(e, fs, args)
	if err != nil {
		return err
	}
	if *output != "table" && *output != "json" {
		return usageError("-o must be table or json, got %q", *output)
	}
	if *definitions {
		return definitionHistory(e, &o, job, *output)
	}
	v := url.Values{"since": {*since}, "result": {*result}, "before": {*before}, "limit": {strconv.Itoa(*limit)}}
	if item.set {
		v.Set("item", strconv.Itoa(item.n))
	}
	q, err := history.ParseQuery(v, time.Now())
	if err != nil {
		return usageError("--%v", err)
	}
	token, err := cliToken(af.tokenFile)
	if err != nil {
		return &exitError{exitFailure, fmt.Errorf("--api-token-file: %w", err)}
	}
	tlsCfg, err := clientTLS(af.ca, af.cert, af.key, "--api-ca", "--api-cert")
	if err != nil {
		return err
	}
	adm, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	recs, err := adm.RecentRuns(ctx, job, item.value())
	if err != nil {
		return o.opError(err)
	}
	peers, err := adm.Instances(ctx)
	if err != nil {
		return o.opError(err)
	}
	client := &http.Client{Transport: apiTransport(tlsCfg, o.timeout), Timeout: o.timeout}
	fetch := func(ctx context.Context, in keyspace.InstanceInfo, q history.Query) ([]history.Run, error) {
		return api.FetchRuns(ctx, client, in, token, hostname(), "", job, q)
	}
	ans := history.Gather(ctx, recs, peers, fetch, q)
	if *output == "json" {
		err = writeJSON(e.stdout, ans.Runs)
	} else if len(ans.Runs) == 0 {
		what := "yet"
		if *since != "" || *result != "" || *before != "" {
			what = "that match --since, --result and --before"
		}
		fmt.Fprintf(e.stdout, "job %s has no executions recorded %s\n", job, what)
	} else {
		err = writeHistory(e.stdout, ans.Runs)
	}
	if ans.Next != "" {
		fmt.Fprintf(e.stderr, "shardd history: %d runs shown, newest first; older ones: --before %s\n", len(ans.Runs), ans.Next)
	}
	for _, id := range slices.Sorted(maps.Keys(ans.Unreachable)) {
		fmt.Fprintf(e.stderr, "shardd history: instance %s not reached, its runs older than etcd's records (the last %d of each item) are missing: %s%s\n",
			id, keyspace.HistoryPerItem, ans.Unreachable[id], apiHint(ans.Unreachable[id]))
	}
	return err
}

// apiHint says which flag fixes an API's refusal: a token, or the CA.
func apiHint(why string) string {
	switch {
	case strings.Contains(why, "401"):
		return " (--api-token-file names a file with a read token)"
	case strings.Contains(why, "certificate"):
		return " (--api-ca names the CA of the instances' API certificates)"
	}
	return ""
}

// writeHistory prints records as a table. RESULT is the state with its
// reason (KILLED/timeout, SKIPPED/disabled) and a streaming run's
// iterations; CODE is a script's exit code
// ("exit 1") or a hook's HTTP status ("http 503").
// historyCell is the ERROR/OUTPUT cell of r: its error or, when the error
// only repeats the exit code (exit status 3) or there is none, the last
// line of its output (the script's "db timeout for AMER", or "...: not
// found" for exit 127). It is one line of at most 60 characters, with no
// tab or control character to break the table's columns.
func historyCell(r history.Run) string {
	out := strings.TrimSpace(r.Output)
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = strings.TrimSpace(out[i+1:])
	}
	if r.LastLine != "" { // from the run log: stderr's last line, else stdout's
		out = strings.TrimSpace(r.LastLine)
	}
	if r.Error != "" && (out == "" || r.Error != "exit status "+strconv.Itoa(r.ExitCode)) {
		out = r.Error
		if r.HTTPStatus > 0 { // "POST https://...: status 503: queue full": the status and the answer's start
			if i := strings.Index(out, "status "+strconv.Itoa(r.HTTPStatus)); i >= 0 {
				out = out[i:]
			}
		}
	}
	out = strings.Map(func(c rune) rune {
		if unicode.IsControl(c) {
			return ' '
		}
		return c
	}, out)
	if rs := []rune(out); len(rs) > 60 {
		out = string(rs[:57]) + "..."
	}
	return out
}

func writeHistory(w io.Writer, recs []history.Run) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ITEM\tFIRE\tINSTANCE\tFENCE\tATTEMPT\tSOURCE\tSTART\tDURATION\tRESULT\tCODE\tSKIPPED\tERROR/OUTPUT")
	for _, r := range recs {
		dur := "-"
		if !r.End.IsZero() && !r.Start.IsZero() {
			dur = r.End.Sub(r.Start).Round(time.Millisecond).String()
		}
		start := "-"
		if !r.Start.IsZero() {
			start = r.Start.Format(time.RFC3339)
		}
		result := r.State
		if r.Reason != "" {
			result += "/" + r.Reason
		}
		if r.Iterations > 0 { // a streaming run
			result += fmt.Sprintf(" (%d iterations)", r.Iterations)
		}
		if len(r.Tries) > 1 { // START is the first try's
			result += fmt.Sprintf(" (%d tries)", len(r.Tries))
		}
		code := "-"
		switch {
		case r.HTTPStatus > 0:
			code = "http " + strconv.Itoa(r.HTTPStatus)
		case r.ExitCode >= 0:
			code = "exit " + strconv.Itoa(r.ExitCode)
		}
		out := historyCell(r)
		source := dash(r.Source)
		switch {
		case r.Upstream != nil: // the parent fire an UPSTREAM run (or its record) serves
			source += " after " + r.Upstream.Job + "@" + r.Upstream.FireTime.Format(time.RFC3339)
		case r.By != "":
			source += " by " + r.By // who triggered a MANUAL run (and its re-runs)
		}
		skipped := strconv.Itoa(r.Skipped)
		switch { // fires a calendar excluded, accounted for by this record
		case r.Excluded > 0 && r.Skipped == 0:
			skipped = fmt.Sprintf("%d calendar", r.Excluded)
		case r.Excluded > 0:
			skipped += fmt.Sprintf(" +%d calendar", r.Excluded)
		}
		fence := "-" // a record the run did not write (SKIPPED) has none
		if r.Fence > 0 {
			fence = strconv.FormatInt(r.Fence, 10)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Item, r.Fire.Format(time.RFC3339), r.Instance, fence, r.Attempt, source,
			start, dur, result, code, skipped, dash(out))
	}
	return tw.Flush()
}

// forceDetail is the audit detail of disable's --force.
func forceDetail(force bool) string {
	if force {
		return "force"
	}
	return ""
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
