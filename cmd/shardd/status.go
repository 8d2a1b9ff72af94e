package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/history"
)

func cmdStatus(e *env, args []string) error {
	fs := newFlagSet(e, "status")
	var o opsFlags
	o.register(fs)
	output := fs.String("o", "table", "output `format`: table or json")
	failing := fs.Bool("failing", false, "only the jobs whose health is FAILING (an item's last run failed) or LATE (a due fire went unrecorded)")
	running := fs.Bool("running", false, "only the jobs that run items now, with where and since when")
	if err := applyEnv(e, fs, etcdFlagNames...); err != nil {
		return err
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *output != "table" && *output != "json" {
		return usageError("-o must be table or json, got %q", *output)
	}
	adm, ctx, done, err := o.connect()
	if err != nil {
		return err
	}
	defer done()
	st, err := adm.Status(ctx)
	if err != nil {
		return o.opError(err)
	}
	if *failing || *running {
		st.Jobs = slices.DeleteFunc(st.Jobs, func(j admin.JobStatus) bool {
			h := j.Health
			return h == nil || (*failing && h.State == admin.HealthOK) || (*running && len(h.Running) == 0)
		})
	}
	if *output == "json" {
		st.Endpoints = o.copts.Endpoints
		return writeJSON(e.stdout, st)
	}
	fmt.Fprintf(e.stdout, "cluster: %s, revision %d: %d job(s), %d instance(s)\n", o.cluster(), st.Revision, len(st.Jobs), len(st.Instances))
	writeEtcdHealth(e.stdout, st)
	fmt.Fprintln(e.stdout)
	if len(st.Jobs) == 0 && len(st.Instances) == 0 {
		fmt.Fprintln(e.stdout, "nothing here: no shardd instance has joined this cluster (or it uses another --prefix)")
		return nil
	}
	return writeStatus(e.stdout, st)
}

// writeEtcdHealth says what keeps etcd from taking shardd's writes, and
// what instances saw of its history going back.
func writeEtcdHealth(w io.Writer, st *admin.ClusterStatus) {
	if h := st.Etcd; h != nil && h.Error == "" {
		leader := "none"
		for _, m := range h.Members {
			if m.Leader {
				leader = m.Name
			}
		}
		tolerance := fmt.Sprintf("tolerates %d more failure(s)", h.FaultTolerance)
		if h.FaultTolerance < 0 {
			tolerance = "NO QUORUM"
		}
		fmt.Fprintf(w, "etcd: %d voting member(s), %d up (quorum %d): %s; leader %s\n", h.Voters, h.Up, h.Quorum, tolerance, leader)
		if len(h.Members) > 1 || h.Up < h.Voters {
			for _, m := range h.Members {
				state := "up"
				switch {
				case !m.Up:
					state = "DOWN"
				case m.Leader:
					state = "up, leader"
				case m.NoLeader:
					state = "up, NO LEADER"
				}
				if m.Learner {
					state += ", learner"
				}
				db := ""
				if m.Up {
					db = fmt.Sprintf(", db %s (%s in use), etcd %s", byteSize(m.DBSize), byteSize(m.DBSizeInUse), m.Version)
				}
				fmt.Fprintf(w, "  member %s (%s): %s%s, %s\n", m.Name, m.ID, state, db, strings.Join(m.ClientURLs, ","))
			}
		}
	}
	for _, p := range st.EtcdProblems() {
		fmt.Fprintln(w, p)
	}
}

// byteSize is n bytes in KiB, MiB or GiB.
func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

func writeStatus(w io.Writer, st *admin.ClusterStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tSTATUS\tHEALTH\tLEADER\tEPOCH\tSTRATEGY\tITEMS\tELIGIBLE\tDEFINITION\tCONFLICTS")
	for _, j := range st.Jobs {
		def, conflicts := "-", "-"
		if d := j.Definition; d != nil {
			def = fmt.Sprintf("gen %d by %s", d.Generation, d.Writer)
			if d.Source == "applied" {
				def = fmt.Sprintf("applied v%d by %s", d.Version, d.By)
			}
			if len(d.Conflicts) > 0 {
				conflicts = strings.Join(d.Conflicts, ",")
			}
		}
		status := j.Status
		if j.Paused != nil {
			status = admin.StatusPaused
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s\n", j.Name, status, j.Health.Brief(j.Total), dash(j.Leader), j.Epoch, dash(j.Strategy), j.Total,
			dash(strings.Join(j.Eligible, ",")), def, conflicts)
	}
	tw.Flush()
	for _, j := range st.Jobs {
		fmt.Fprintf(w, "\njob %s\n", j.Name)
		if sl := j.Slots; sl != nil {
			waiting := "none waiting"
			if len(sl.Waiting) > 0 {
				waiting = fmt.Sprintf("waiting: item(s) %v", sl.Waiting)
			}
			fmt.Fprintf(w, "  cluster slots (clusterConcurrency): %d of %d in use; %s\n", sl.InUse, sl.Limit, waiting)
		}
		if p := j.Paused; p != nil {
			fmt.Fprintf(w, "  PAUSED after %d failed fires in a row, %s (pauseAfterFailures); shardd enable %s resumes it\n", p.FailedInARow, "since "+p.PausedAt.Format(time.RFC3339), j.Name)
			for _, why := range p.Reasons {
				fmt.Fprintf(w, "    %s\n", why)
			}
		}
		if d := j.Definition; d != nil {
			verb := "published"
			if d.Source == "applied" {
				verb = "applied"
			}
			ver := ""
			if d.Version > 0 {
				ver = fmt.Sprintf("version %d, ", d.Version)
			}
			fmt.Fprintf(w, "  definition: %sgeneration %d, hash %s, %s by %s at %s\n", ver, d.Generation, d.Hash, verb, firstOf(d.By, d.Writer), d.Written.Format(time.RFC3339))
		}
		if p := j.Placement; p != nil {
			sel := "every instance"
			if p.Selector != "" {
				sel = "instances.selector " + p.Selector
			}
			fmt.Fprintf(w, "  placement: %s; matching: %s\n", sel, dash(strings.Join(p.Matching, ",")))
		}
		for _, p := range j.Problems {
			fmt.Fprintf(w, "  problem: %s\n", p)
		}
		writeHealth(w, j.Health, time.Now())
		if len(j.DependsOn) > 0 {
			how := "runs after each of its fires whose every item succeeded"
			if len(j.DependsOn) > 1 {
				how = "runs when each has a successful fire it has not run after yet"
			}
			fmt.Fprintf(w, "  depends on: %s (%s)\n", strings.Join(j.DependsOn, ", "), how)
		}
		if len(j.Children) > 0 {
			fmt.Fprintf(w, "  children: %s (run after each successful fire of this job)\n", strings.Join(j.Children, ", "))
		}
		if len(j.DisabledInstances) > 0 {
			fmt.Fprintf(w, "  disabled instances: %s\n", strings.Join(j.DisabledInstances, ","))
		}
		if j.PerFire {
			fmt.Fprintf(w, "  %s picks the owner at each fire among the eligible instances\n", j.Strategy)
			continue
		}
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  ITEM\tPARAMETER\tINSTANCE")
		for _, it := range j.Items {
			fmt.Fprintf(tw, "  %d\t%s\t%s\n", it.Item, dash(it.Parameter), dash(it.Instance))
		}
		tw.Flush()
		if len(j.DisabledItems) > 0 {
			var s []string
			for _, i := range j.DisabledItems {
				s = append(s, strconv.Itoa(i))
			}
			fmt.Fprintf(w, "  disabled items: %s\n", strings.Join(s, ","))
		}
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tHOST\tPID\tVERSION\tSTARTED\tAPI\tLABELS\tACCEPTS\tJOBS")
	for _, in := range st.Instances {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", in.ID, in.Host, in.PID, dash(in.Version), in.Started.Format(time.RFC3339), dash(in.API),
			dash(labelsFlag(in.Labels).String()), accepts(in.Accepts), dash(strings.Join(in.Jobs, ",")))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, in := range st.Instances {
		if in.ReloadRejected != "" {
			fmt.Fprintf(w, "instance %s is DEGRADED: its last configuration reload was rejected (%s); it runs its previous configuration (its log, and GET /api/v1/config/problems on its API, say what is wrong)\n", in.ID, in.ReloadRejected)
		}
	}
	return nil
}

// writeHealth says what the job runs now, which items fail and since
// when, which are late, and when it last succeeded.
func writeHealth(w io.Writer, h *admin.Health, now time.Time) {
	if h == nil {
		return
	}
	ago := func(t time.Time) string {
		return fmt.Sprintf("%s (%s ago)", t.Format(time.RFC3339), now.Sub(t).Round(time.Second))
	}
	for _, r := range h.Running {
		since := ""
		if !r.Since.IsZero() {
			since = ", since " + ago(r.Since)
		}
		fence := ""
		if r.Fence > 0 {
			fence = fmt.Sprintf(", fence %d (shardd logs --run %d-%d -f)", r.Fence, r.Fence, r.Item)
		}
		fmt.Fprintf(w, "  running: item %d on %s%s%s\n", r.Item, r.Instance, since, fence)
	}
	for _, f := range h.Failing {
		what := f.Last.State
		if f.Last.Reason != "" {
			what += "/" + f.Last.Reason
		}
		runs := "its last run"
		if f.InARow > 1 {
			runs = fmt.Sprintf("its last %s runs", f.Runs())
		}
		since := ""
		if !f.Since.IsZero() && !f.AtLeast {
			since = " since " + ago(f.Since)
		} else if f.AtLeast {
			since = fmt.Sprintf(" (every run etcd keeps; before %s too: shardd history --result DONE reads the run logs)", f.Since.Format(time.RFC3339))
		}
		fmt.Fprintf(w, "  failing: item %d, %s %s%s: %s\n", f.Item, runs, what, since, historyCell(history.FromRecord(f.Last)))
	}
	for _, l := range h.Late {
		fmt.Fprintf(w, "  late: item %d, its fire of %s has not run nor been recorded skipped\n", l.Item, ago(l.Due))
	}
	switch {
	case !h.LastSuccess.IsZero():
		fmt.Fprintf(w, "  last success: %s\n", ago(h.LastSuccess))
	case len(h.Failing) > 0:
		fmt.Fprintf(w, "  last success: none in etcd's records (the last %d runs of each item; shardd history --result DONE reads the run logs)\n", keyspace.HistoryPerItem)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// accepts says in a word what an instance accepts of applied definitions:
// "-" (none), "applied", or "applied(dirs ...; hosts ...)".
func accepts(p config.AcceptPolicy) string {
	if !p.Applied {
		return "-"
	}
	var r []string
	if len(p.CommandDirs) > 0 {
		r = append(r, "dirs "+strings.Join(p.CommandDirs, ","))
	}
	if len(p.HookHosts) > 0 {
		r = append(r, "hosts "+strings.Join(p.HookHosts, ","))
	}
	if len(r) == 0 {
		return "applied"
	}
	return "applied(" + strings.Join(r, "; ") + ")"
}
