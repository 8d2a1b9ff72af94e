package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/schedule"
	"github.com/shardd/shardd/pkg/selector"
	"github.com/shardd/shardd/pkg/shard"
)

func cmdPlan(e *env, args []string) error {
	fs := newFlagSet(e, "plan")
	var (
		strategy  = fs.String("strategy", "", "sharding `strategy`: "+strings.Join(shard.Names(), ", ")+"; default as a job that names none: ROUND_ROBIN for one item, AVG_ALLOCATION for several")
		job       = fs.String("job", "", "job `name` (ODEVITY and ROUND_ROBIN hash it)")
		total     = fs.Int("total", 1, "shardingTotalCount: the number of items")
		instances = fs.String("instances", "", "comma-separated instance `ids`, in the order the leader would use (sorted)")
		cfgPath   = fs.String("config", "", "preview every job of this config `path` instead of --strategy/--job/--total")
		output    = fs.String("o", "table", "output `format`: table or json")
		fireTime  = fs.String("fire-time", "", "fire `time` (RFC 3339) for RANDOM, and for ROUND with --config; default now")
		fireSeq   = fs.Int64("fire-seq", 0, "fire sequence `number` for ROUND without --config")
		labels    = instanceLabels{}
	)
	fs.Var(labels, "label", "with --config, give an instance a label, `ID:KEY=VALUE` (repeatable): a job's instances.selector takes only the instances it matches")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *output != "table" && *output != "json" {
		return usageError("-o must be table or json, got %q", *output)
	}
	ids, err := splitInstances(*instances)
	if err != nil {
		return usageError("--instances: %v", err)
	}
	now := e.clock()
	fire := shard.Fire{Time: now.Truncate(time.Second), Seq: *fireSeq}
	if *fireTime != "" {
		if fire.Time, err = time.Parse(time.RFC3339, *fireTime); err != nil {
			return usageError("--fire-time: want RFC 3339 like 2026-01-02T15:04:05Z, got %q", *fireTime)
		}
	}

	if *cfgPath != "" {
		c, err := config.Load(*cfgPath)
		if err != nil {
			return fmt.Errorf("load %s:\n%w", *cfgPath, err)
		}
		for id := range labels {
			if !slices.Contains(ids, id) {
				return usageError("--label %s:...: %s is not one of --instances", id, id)
			}
		}
		return planConfig(e.stdout, c, ids, labels, fire, *output == "json", *fireTime != "", now)
	}
	if *job == "" {
		return usageError("--job is required (or --config)")
	}
	if len(labels) > 0 {
		return usageError("--label is for --config, whose jobs' selectors match labels")
	}
	if *strategy == "" {
		*strategy = shard.DefaultFor(*total)
	}
	s, err := shard.Lookup(*strategy)
	if err != nil {
		return usageError("--strategy: unknown strategy %s", strings.TrimPrefix(err.Error(), shard.ErrUnknown.Error()+": "))
	}
	a, err := s.Assign(shard.Input{Instances: ids, Job: *job, Total: *total, Fire: fire})
	if err != nil {
		return usageError("%v", err)
	}
	if *output == "json" {
		return writeJSON(e.stdout, a.ByInstance())
	}
	return writeTable(e.stdout, ids, a, nil)
}

// planConfig previews every job of c. Per-fire strategies use the job's next
// fire at or after fire.Time (its sequence number from the schedule); the
// next fires listed are those after now.
func planConfig(w io.Writer, c *config.Config, every []string, labels instanceLabels, fire shard.Fire, asJSON, fireGiven bool, now time.Time) error {
	all := map[string]map[string][]int{}
	for i, j := range c.Jobs {
		ids := every
		if j.Instances != nil { // its selector chooses among them
			ids = nil
			for _, id := range every {
				if j.Eligible(labels[id]) {
					ids = append(ids, id)
				}
			}
		}
		f := fire
		if j.Shard.PerFire() && j.Schedule != nil {
			if !fireGiven {
				f.Time = j.Schedule.Next(fire.Time)
			}
			f.Seq = schedule.Seq(j.Schedule, f.Time)
		}
		a, err := j.Shard.Assign(shard.Input{Instances: ids, Job: j.Name, Total: j.ShardingTotalCount, Fire: f})
		if err != nil {
			return fmt.Errorf("job %q: %w", j.Name, err)
		}
		if asJSON {
			all[j.Name] = a.ByInstance()
			continue
		}
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "job %s  strategy %s  items %d", j.Name, j.Strategy, a.Total())
		if j.Shard.PerFire() {
			fmt.Fprintf(w, "  fire %s", f.Time.Format(time.RFC3339))
		}
		fmt.Fprintln(w)
		if j.Instances != nil {
			match := strings.Join(ids, ", ")
			if match == "" {
				match = "none (give instances labels with --label ID:KEY=VALUE)"
			}
			fmt.Fprintf(w, "instances.selector %s matches: %s\n", j.Instances.Selector, match)
		}
		if err := writeTable(w, ids, a, j.ShardingItemParameters); err != nil {
			return err
		}
	}
	if asJSON {
		return writeJSON(w, all)
	}
	fmt.Fprintln(w, "\nnext fires:")
	writeNextFires(w, c, 3, now)
	writeGraph(w, c)
	return nil
}

// writeGraph prints the jobs' dependencies, parents first: each child with
// the parents whose fires run it.
func writeGraph(w io.Writer, c *config.Config) {
	var lines []string
	for _, j := range c.Jobs {
		if len(j.DependsOn) == 0 {
			continue
		}
		lines = append(lines, fmt.Sprintf("  %s -> %s  (%s runs %s)", strings.Join(j.DependsOn, ", "), j.Name, j.Name, dependencyRule(j)))
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintln(w, "\ndependencies:")
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}

func writeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// writeTable prints one line per instance, in the given order, with its items
// and their parameters.
func writeTable(w io.Writer, ids []string, a shard.Assignment, params config.ItemParameters) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tCOUNT\tITEMS")
	by := a.ByInstance()
	for _, id := range ids {
		items := make([]string, len(by[id]))
		for i, item := range by[id] {
			items[i] = strconv.Itoa(item)
			if p, ok := params[item]; ok {
				items[i] += "=" + p
			}
		}
		sep := ","
		if len(params) > 0 {
			sep = " " // parameters may contain commas
		}
		list := strings.Join(items, sep)
		if list == "" {
			list = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\n", id, len(by[id]), list)
	}
	if len(ids) == 0 {
		fmt.Fprintf(tw, "(no instances)\t0\t%d item(s) unowned\n", a.Total())
	}
	return tw.Flush()
}

// instanceLabels is plan's --label ID:KEY=VALUE, repeatable.
type instanceLabels map[string]map[string]string

func (l instanceLabels) String() string { return "" }

func (l instanceLabels) Set(v string) error {
	id, label, ok := strings.Cut(v, ":")
	if !ok || id == "" {
		return fmt.Errorf("want ID:KEY=VALUE, got %q", v)
	}
	k, val, err := selector.ParseLabel(label)
	if err != nil {
		return err
	}
	if l[id] == nil {
		l[id] = map[string]string{}
	}
	l[id][k] = val
	return nil
}

// splitInstances parses "a,b,c", keeping the order and refusing empty or repeated ids.
func splitInstances(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("at least one instance id is required, like host0,host1,host2")
	}
	var ids []string
	seen := map[string]bool{}
	for _, id := range strings.Split(s, ",") {
		id = strings.TrimSpace(id)
		if id == "" {
			return nil, fmt.Errorf("empty instance id in %q", s)
		}
		if seen[id] {
			return nil, fmt.Errorf("instance %q given twice", id)
		}
		seen[id] = true
		ids = append(ids, id)
	}
	return ids, nil
}
