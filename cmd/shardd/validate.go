package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/schedule"
)

func cmdValidate(e *env, args []string) error {
	fs := newFlagSet(e, "validate")
	path := fs.String("config", e.getenv("SHARDD_CONFIG"), "job definitions: a YAML `file` or a directory of *.yaml (or the PATH argument; env SHARDD_CONFIG)")
	noEnv := fs.Bool("no-env", false, "do not require the environment variables that http.headers name (${API_TOKEN}) to be set: for linting job files where the hooks' secrets are not, as in CI")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) > 1:
		return usageError("one PATH argument, got %d", len(pos))
	case len(pos) == 1 && *path != "" && *path != e.getenv("SHARDD_CONFIG"):
		return usageError("both --config %s and the argument %s", *path, pos[0])
	case len(pos) == 1:
		*path = pos[0]
	case *path == "":
		return usageError("a config PATH is required (shardd validate jobs.yaml)")
	}
	load := config.Load
	if *noEnv {
		load = config.LoadWithoutEnv
	}
	c, err := load(*path)
	if err != nil {
		problems := config.Errors(err)
		for _, p := range problems {
			fmt.Fprintln(e.stderr, p)
		}
		return &exitError{exitFailure, fmt.Errorf("%d problem(s) in %s", len(problems), *path)}
	}
	if len(c.Jobs) == 0 {
		return &exitError{exitFailure, fmt.Errorf("%s: 0 jobs in %d file(s); shardd run refuses a config without jobs", *path, len(c.Files))}
	}
	fmt.Fprintf(e.stdout, "%s: %d job(s) in %d file(s), valid\n", *path, len(c.Jobs), len(c.Files))
	writeNextFires(e.stdout, c, 3, e.clock())
	return nil
}

// writeNextFires prints each job's next n fire times after now in its time
// zone (a Quartz day of week 1 is SUNDAY: seeing the dates catches such
// slips) and, under a job, each daylight-saving change of the next year
// that skips or repeats one of its times, with the fires it leaves.
func writeNextFires(w io.Writer, c *config.Config, n int, now time.Time) {
	for _, j := range c.Jobs {
		after, stream := "", ""
		if len(j.DependsOn) > 0 {
			after = "; also runs " + dependencyRule(j)
		}
		if d := j.Dataflow; d != nil && d.Streaming {
			stream = fmt.Sprintf(" [streaming: a run repeats while the work says more, up to %d iterations or %s]", d.MaxIterations, d.MaxDuration)
		}
		if j.FixedDelay > 0 {
			fmt.Fprintf(w, "  %s: fixedDelay %s: each item runs %s after its previous run ends, the first when the job starts%s%s\n", j.Name, j.FixedDelay, j.FixedDelay, after, stream)
			continue
		}
		if j.Schedule == nil {
			if after != "" {
				fmt.Fprintf(w, "  %s: no cron; runs %s, or when triggered%s\n", j.Name, dependencyRule(j), stream)
				continue
			}
			fmt.Fprintf(w, "  %s: no cron; runs only when triggered%s\n", j.Name, stream)
			continue
		}
		var fires []string
		t, excluded := now, 0
		for range n {
			if t = j.Schedule.Next(t); t.IsZero() {
				break
			}
			fire := t.In(j.Location).Format("Mon 2006-01-02 15:04:05 MST")
			if by := j.Exclusion.ExcludedBy(t); by != "" {
				fire += " (excluded: calendar " + by + ")"
				excluded++
			}
			fires = append(fires, fire)
		}
		if len(fires) == 0 {
			switch w, ok := j.Schedule.(schedule.Window); {
			case ok && !w.Until.IsZero() && w.Until.Before(now):
				fires = []string{fmt.Sprintf("never: activeUntil %s has passed", j.ActiveUntil)}
			default:
				fires = []string{"never (the expression matches no future time)"}
			}
		}
		if excluded > 0 && excluded == len(fires) {
			// Every fire shown is excluded: the first that will run.
			if f := j.Exclusion.NextIncluded(j.Schedule, now, now.AddDate(2, 0, 0)); !f.IsZero() {
				fires = append(fires, "first not excluded: "+f.In(j.Location).Format("Mon 2006-01-02 15:04:05 MST"))
			}
		}
		off := ""
		if j.Disabled {
			off = " [disabled: true, so none of these runs]"
		}
		fmt.Fprintf(w, "  %s (%s, %s): next %s%s%s%s\n", j.Name, j.Cron, j.Location, strings.Join(fires, ", "), after, stream, off)
		if first := j.Schedule.Next(now); j.Jitter > 0 && !first.IsZero() {
			var starts []string
			for item := range min(j.ShardingTotalCount, 4) {
				starts = append(starts, fmt.Sprintf("item %d +%s", item, schedule.JitterOffset(j.Name, item, first, time.Duration(j.Jitter))))
			}
			if j.ShardingTotalCount > 4 {
				starts = append(starts, "...")
			}
			fmt.Fprintf(w, "    jitter %s: the next fire's items start at %s\n", j.Jitter, strings.Join(starts, ", "))
		}
		if j.ActiveFrom != "" || j.ActiveUntil != "" {
			fmt.Fprintf(w, "    active %s to %s\n", dash(j.ActiveFrom), dash(j.ActiveUntil))
		}
		for i, ch := range schedule.Changes(j.Schedule, now, now.AddDate(1, 0, 0)) {
			if i == maxChanges {
				fmt.Fprintf(w, "    DST: and more within the year\n")
				break
			}
			fmt.Fprintf(w, "    DST: %s\n", ch)
		}
	}
}

// maxChanges bounds the daylight-saving changes shown per job.
const maxChanges = 4

// dependencyRule says when a job with dependsOn runs after its parents.
func dependencyRule(j *config.Job) string {
	if len(j.DependsOn) == 1 {
		return "after each successful fire of " + j.DependsOn[0]
	}
	return "when each of " + strings.Join(j.DependsOn, ", ") + " has a new successful fire"
}
