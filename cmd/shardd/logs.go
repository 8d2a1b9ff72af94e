package main

// shardd logs: a run's log, read from the instance that ran it through its
// API.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/api"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/history"
	"github.com/shardd/shardd/pkg/runlog"
	"github.com/shardd/shardd/pkg/trust"
)

func cmdLogs(e *env, args []string) error {
	var f logsFlags
	job, err := f.parse(e, args)
	if err != nil {
		return err
	}
	fence, runItem, err := f.run(job)
	if err != nil {
		return err
	}
	token, err := cliToken(f.api.tokenFile)
	if err != nil {
		return &exitError{exitFailure, fmt.Errorf("--api-token-file: %w", err)}
	}
	tlsCfg, err := clientTLS(f.api.ca, f.api.cert, f.api.key, "--api-ca", "--api-cert")
	if err != nil {
		return err
	}

	adm, ctx, done, err := f.ops.connect()
	if err != nil {
		return err
	}
	defer done()
	client := &http.Client{Transport: apiTransport(tlsCfg, f.ops.timeout), Timeout: f.ops.timeout}
	fetch := func(ctx context.Context, in keyspace.InstanceInfo, q history.Query) ([]history.Run, error) {
		return api.FetchRuns(ctx, client, in, token, hostname(), "", job, q)
	}
	rec, err := f.findRun(ctx, adm, fetch, job, runItem, fence)
	if err != nil {
		return err
	}
	r := loggedRun{job: job, rec: rec, id: runlog.RunID{Fence: rec.Fence, Item: int32(rec.Item)}}
	r.what = fmt.Sprintf("run %s of job %s (item %d, fire %s, attempt %d, %s) on instance %s", r.id, job, rec.Item, rec.Fire.Format(time.RFC3339), rec.Attempt, rec.Source, rec.Instance)

	if r.info, r.live, err = adm.Instance(ctx, rec.Instance); err != nil {
		return f.ops.opError(err)
	}
	if why := r.noAPI(); why != "" {
		return f.printFile(e, r, why)
	}
	return f.printFromAPI(e, r, token, tlsCfg)
}

// logsFlags are the flags of shardd logs.
type logsFlags struct {
	ops    opsFlags
	api    apiFlags
	item   itemFlag
	runArg string // --run
	follow bool
	raw    bool
}

// parse parses the command line, and returns its job.
func (f *logsFlags) parse(e *env, args []string) (string, error) {
	fs := newFlagSet(e, "logs")
	f.ops.register(fs)
	f.api.register(fs)
	fs.Var(&f.item, "item", "the `item` whose run to show (default: the job's only item; required when it has several, unless --run names one)")
	fs.StringVar(&f.runArg, "run", "", "the run: its `FENCE`, or FENCE-ITEM (the FENCE and ITEM columns of shardd history); default: the item's latest run")
	fs.BoolVar(&f.follow, "f", false, "follow: print the run's output as it comes, until the run ends")
	fs.BoolVar(&f.raw, "raw", false, "print the log's records as stored (<time> <tag> <text>, shardd's own included), all on stdout")
	if err := applyEnv(e, fs, apiFlagNames...); err != nil {
		return "", err
	}
	return f.ops.parseJob(e, fs, args)
}

// run returns the run --run and --item name: its fence (0: the latest
// run) and item (-1: not named).
func (f *logsFlags) run(job string) (fence int64, item int, err error) {
	fence, item = 0, -1
	if f.runArg != "" {
		var ok bool
		if fence, item, ok = runlog.ParseRun(f.runArg); !ok {
			return 0, 0, usageError("--run %q: a run is FENCE or FENCE-ITEM (the FENCE and ITEM columns of shardd history %s)", f.runArg, job)
		}
		if item >= 0 && f.item.set && f.item.n != item {
			return 0, 0, usageError("--run %s is a run of item %d, not of --item %d", f.runArg, item, f.item.n)
		}
	}
	if f.item.set {
		item = f.item.n
	}
	return fence, item, nil
}

// findRun returns the record of the run of job's item (-1: not named)
// with fence (0: the latest run), or says why there is not one run.
// A run etcd no longer records is looked for in the live instances' run
// logs (fetch).
func (f *logsFlags) findRun(ctx context.Context, adm *admin.Client, fetch history.Fetch, job string, runItem int, fence int64) (keyspace.ItemRecord, error) {
	recs, err := adm.FindRuns(ctx, job, runItem, fence)
	if err != nil {
		return keyspace.ItemRecord{}, f.ops.opError(err)
	}
	var unreached map[string]string
	if len(recs) == 0 && fence > 0 { // rotated out of etcd: do the instances' logs know it?
		peers, err := adm.Instances(ctx)
		if err != nil {
			return keyspace.ItemRecord{}, f.ops.opError(err)
		}
		ans := history.Gather(ctx, nil, peers, fetch, history.Query{Item: runItem, Fence: fence})
		for _, r := range ans.Runs {
			recs = append(recs, r.ItemRecord)
		}
		unreached = ans.Unreachable
	}
	if fence == 0 && runItem < 0 { // the latest run: of which item?
		n, ok, err := adm.ItemCount(ctx, job)
		if err != nil {
			return keyspace.ItemRecord{}, f.ops.opError(err)
		}
		if !ok || n != 1 {
			what := "several items"
			if ok {
				what = fmt.Sprintf("items 0-%d", n-1)
			}
			return keyspace.ItemRecord{}, &exitError{exitFailure, fmt.Errorf("job %s has %s: give --item N (the latest run of item N), or --run FENCE-ITEM (the FENCE and ITEM columns of `shardd history %s`)", job, what, job)}
		}
		runItem, recs = 0, keepItem(recs, 0)
	}
	if len(recs) == 0 {
		switch {
		case fence > 0:
			where := ""
			if found := f.localLogs(job, fence, runItem); len(found) > 0 {
				where = "; this host has its log: " + strings.Join(found, ", ")
			}
			for _, id := range slices.Sorted(maps.Keys(unreached)) {
				where += fmt.Sprintf("; instance %s, whose logs were not read: %s%s", id, unreached[id], apiHint(unreached[id]))
			}
			return keyspace.ItemRecord{}, &exitError{exitFailure, fmt.Errorf("job %s has no run %s that etcd records (the last %d runs of each item) or a live instance's run logs know (kept for the job's logRetention; the log of a run stays on the instance that ran it%s): `shardd history %s` lists its runs", job, runName(fence, runItem), keyspace.HistoryPerItem, where, job)}
		default:
			return keyspace.ItemRecord{}, &exitError{exitFailure, fmt.Errorf("item %d of job %s has no recorded run yet: `shardd history %s` lists the job's runs", runItem, job, job)}
		}
	}
	if runItem < 0 { // --run FENCE: one run, or which?
		var names []string
		for _, r := range recs {
			names = append(names, runName(r.Fence, r.Item))
		}
		if len(recs) > 1 {
			return keyspace.ItemRecord{}, &exitError{exitFailure, fmt.Errorf("fence %d of job %s is the claim of several items, runs %s: give --item N, or --run FENCE-ITEM", fence, job, strings.Join(names, ", "))}
		}
	}
	return recs[0], nil
}

// localLogs lists the log files of job's run (fence, item; -1: any item)
// in this host's data dir, of any instance: a run etcd does not record can
// still have one.
func (f *logsFlags) localLogs(job string, fence int64, item int) []string {
	dataDir, _ := f.ops.ef.dataDirOrDefault()
	name := runName(fence, item)
	if item < 0 {
		name += "-*"
	}
	found, _ := filepath.Glob(filepath.Join(dataDir, "runs", "*", job, name+".log"))
	return found
}

// loggedRun is the run whose log shardd logs prints, and the instance
// that ran it.
type loggedRun struct {
	job  string
	rec  keyspace.ItemRecord
	id   runlog.RunID
	what string // the run, as the messages name it
	info keyspace.InstanceInfo
	live bool // the instance is registered in etcd
}

// noAPI says why the API of the run's instance cannot be asked; "" when
// it can.
func (r loggedRun) noAPI() string {
	switch {
	case !r.live:
		return fmt.Sprintf("instance %s is not live (not registered in etcd), so no API serves its logs", r.rec.Instance)
	case r.info.API == "":
		return fmt.Sprintf("instance %s (host %s) serves no API (--listen \"\")", r.info.ID, r.info.Host)
	case api.LoopbackOfAnotherHost(r.info, hostname()):
		return fmt.Sprintf("instance %s's API listens on %s, a loopback address of host %s, which only that host reaches", r.info.ID, r.info.API, r.info.Host)
	}
	return ""
}

// printFile prints the run's log from this host's file, when it is
// there and the run's instance is not live elsewhere; otherwise it says
// where the log is. why is why the API cannot be asked.
func (f *logsFlags) printFile(e *env, r loggedRun, why string) error {
	dataDir, implicit := f.ops.ef.dataDirOrDefault()
	localDir := filepath.Join(dataDir, "runs", r.rec.Instance)
	local := filepath.Join(localDir, r.job, r.id.String()+".log")
	if _, err := os.Lstat(local); err == nil && (!r.live || r.info.Host == hostname()) {
		if implicit { // found in the working directory, which another user may have prepared
			if err := trust.Owned(dataDir); err != nil {
				return fmt.Errorf("%s: %s; its log would be in %s, but: %w", r.what, why, local, err)
			}
		}
		fmt.Fprintf(e.stderr, "shardd logs: %s; reading its log from this host's file %s\n", why, local)
		lr, err := runlog.OpenFile(localDir, r.job, r.id, 0)
		if err != nil {
			return err
		}
		defer lr.Close()
		p := &logPrinter{e: e, raw: f.raw}
		next := lr.Next
		if f.follow {
			next = func() ([]byte, error) { return lr.Follow(context.Background()) }
		}
		err = p.copyLines(next)
		p.summary(r.what, "the file "+local, f.follow, false)
		return err
	}
	host := r.info.Host
	if host == "" {
		host = "its host (an instance's id is its host name unless --name chose another)"
	}
	return &exitError{exitFailure, fmt.Errorf("%s: %s; its log is on %s, in %s's run log directory (by default <data-dir>/runs/%s/%s/%s.log)",
		r.what, why, host, r.rec.Instance, r.rec.Instance, r.job, r.id)}
}

// printFromAPI prints the run's log as the API of its instance serves it.
func (f *logsFlags) printFromAPI(e *env, r loggedRun, token string, tlsCfg *tls.Config) error {
	scheme := "http"
	if r.info.APITLS {
		scheme = "https"
	}
	u := url.URL{Scheme: scheme, Host: api.APIHost(r.info), Path: "/api/v1/jobs/" + r.job + "/runs/" + r.id.String() + "/log"}
	if f.follow {
		u.RawQuery = "follow=1"
	}
	req, err := http.NewRequest("GET", u.String(), nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := &http.Client{Transport: apiTransport(tlsCfg, f.ops.timeout)}
	resp, err := client.Do(req)
	if err != nil {
		hint := ""
		var uerr x509.UnknownAuthorityError
		if errors.As(err, &uerr) || strings.Contains(err.Error(), "certificate") {
			hint = " (--api-ca names the CA of the instances' API certificates)"
		}
		return &exitError{exitFailure, fmt.Errorf("%s: its API at %s did not answer: %v%s; its log is on host %s, in %s's run log directory (by default <data-dir>/runs/%s/%s/%s.log)",
			r.what, u.Scheme+"://"+u.Host, err, hint, r.info.Host, r.rec.Instance, r.rec.Instance, r.job, r.id)}
	}
	defer resp.Body.Close()
	served := resp.Header.Get(api.ServedByHeader)
	if resp.StatusCode != http.StatusOK {
		return &exitError{exitFailure, fmt.Errorf("%s: its API at %s answered %s", r.what, u.Scheme+"://"+u.Host, apiRefusal(resp))}
	}
	p := &logPrinter{e: e, raw: f.raw}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	err = p.copyLines(func() ([]byte, error) {
		line, err := br.ReadBytes('\n')
		if err == io.EOF && len(line) > 0 {
			err = nil // a last line without its newline
		}
		return bytes.TrimSuffix(line, []byte("\n")), err
	})
	if served == "" {
		served = r.info.ID
	}
	if stopped := resp.Header.Get(api.StoppedHeader); stopped != "" {
		p.stopped = stopped // the record saying so is not in the file yet
	} else if stopped := resp.Trailer.Get(api.StoppedHeader); stopped != "" {
		p.stopped = stopped // known when the followed log closed
	}
	p.summary(r.what, "instance "+served+"'s API", f.follow, resp.Header.Get(api.WritingHeader) == "true")
	if err != nil {
		return &exitError{exitFailure, fmt.Errorf("%s: the answer broke off: %v", r.what, err)}
	}
	return nil
}

// apiRefusal says what an answer other than 200 OK says: its status, its
// error, and a hint for 401.
func apiRefusal(resp *http.Response) string {
	var ae struct {
		Error string `json:"error"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	msg := strings.TrimSpace(string(b))
	if json.Unmarshal(b, &ae) == nil && ae.Error != "" {
		msg = ae.Error
	}
	hint := ""
	if resp.StatusCode == http.StatusUnauthorized {
		hint = " (--api-token-file or SHARDD_API_TOKEN_FILE names a file with the API's read token)"
	}
	return fmt.Sprintf("%s: %s%s", resp.Status, msg, hint)
}

// keepItem keeps the records of item.
func keepItem(recs []keyspace.ItemRecord, item int) []keyspace.ItemRecord {
	var out []keyspace.ItemRecord
	for _, r := range recs {
		if r.Item == item {
			out = append(out, r)
		}
	}
	return out
}

func runName(fence int64, item int) string {
	if item < 0 {
		return strconv.FormatInt(fence, 10)
	}
	return runlog.RunID{Fence: fence, Item: int32(item)}.String()
}

// logPrinter prints a run log's records: by default the run's stdout to
// stdout and its stderr to stderr, as the run wrote them; raw, every
// record as stored, on stdout.
type logPrinter struct {
	e       *env
	raw     bool
	records int    // records read
	lines   [2]int // stdout's and stderr's lines printed
	bytes   [2]int // and their bytes
	open    bool   // the last output printed did not end its line
	end     string // the run's end, as its last shardd record says
	stopped string // why the log stopped early (lack of space), as a record or its instance says
	bad     int    // lines that are not records
}

// copyLines prints the lines next returns, to io.EOF.
func (p *logPrinter) copyLines(next func() ([]byte, error)) error {
	stdout, stderr := bufio.NewWriter(p.e.stdout), bufio.NewWriter(p.e.stderr)
	defer stdout.Flush()
	defer stderr.Flush()
	for {
		line, err := next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		p.records++
		rec, perr := runlog.ParseRecord(line)
		if perr != nil {
			p.bad++
		} else if rec.Tag == "shardd" && strings.HasPrefix(string(rec.Text), "end ") {
			p.end = string(rec.Text)
			if e, ok := runlog.ParseEnd(p.end); ok {
				p.end = e.Brief() // the times and the last line are in what was printed
			}
		} else if rec.Tag == "shardd" && strings.HasPrefix(string(rec.Text), runlog.StoppedPrefix) {
			p.stopped = string(rec.Text)
		}
		if p.raw {
			stdout.Write(line)
			stdout.WriteByte('\n')
			stdout.Flush()
			continue
		}
		if perr != nil {
			continue
		}
		n, w := 0, stdout
		switch rec.Tag {
		case "out", "out+":
		case "err", "err+":
			n, w = 1, stderr
		default:
			continue
		}
		w.Write(rec.Text)
		p.bytes[n] += len(rec.Text)
		p.open = strings.HasSuffix(rec.Tag, "+") && len(rec.Text) > 0
		if !strings.HasSuffix(rec.Tag, "+") {
			w.WriteByte('\n')
			p.bytes[n]++
			p.lines[n]++
		}
		w.Flush()
	}
}

// summary says on stderr what was printed, from where, and how the run
// stands.
func (p *logPrinter) summary(what, from string, followed, writing bool) {
	var printed string
	switch {
	case p.raw:
		printed = fmt.Sprintf("printed its %d records as stored", p.records)
	default:
		printed = fmt.Sprintf("printed its stdout on stdout (%s) and its stderr on stderr (%s)", lines(p.lines[0], p.bytes[0]), lines(p.lines[1], p.bytes[1]))
	}
	var state string
	stop := strings.TrimPrefix(p.stopped, runlog.StoppedPrefix)
	switch {
	case p.end != "" && stop != "":
		state = "the run ended: " + p.end + "; the log stopped: " + stop + " (the output after that was not kept)"
	case p.end != "":
		state = "the run ended: " + p.end
	case writing && !followed && stop != "":
		state = "the run is still going, but its log stopped: " + stop
	case writing && !followed:
		state = "the run is still going (its log is being written): -f follows it to its end"
	case stop != "":
		state = "the log stopped: " + stop + "; how the run ended is in its history (shardd history)"
	case followed:
		state = "the log ended without the run's end record (its instance stopped mid-run, or the log was cut)"
	default:
		state = "its log has no end record: the run was cut (its instance stopped mid-run) or its log stopped"
	}
	bad := ""
	if p.bad > 0 {
		bad = fmt.Sprintf(" (%d lines were not records)", p.bad)
	}
	if p.open { // on a terminal, the summary starts a line of its own
		fmt.Fprintln(p.e.stderr)
	}
	fmt.Fprintf(p.e.stderr, "shardd logs: %s, from %s: %s%s; %s\n", what, from, printed, bad, state)
}

// dataDirOrDefault is --data-dir as the operator commands resolve it, and
// whether it was found in the working directory rather than named.
func (f *etcdFlags) dataDirOrDefault() (string, bool) {
	dir, implicit := f.dir(true)
	if abs, err := filepath.Abs(dir); err == nil {
		return abs, implicit
	}
	return dir, implicit
}

func lines(n, bytes int) string {
	s := "s"
	if n == 1 {
		s = ""
	}
	return fmt.Sprintf("%d line%s, %d bytes", n, s, bytes)
}
