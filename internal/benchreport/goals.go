package main

import (
	"fmt"
	"strings"
)

// goal is one figure of the performance goals (docs/performance.md):
// what is measured, how, and the bound it must meet.
type goal struct {
	figure  string
	command string
	// measure returns the measured values (each "<= its bound" to meet the
	// goal), as text, and whether the figure was measured at all.
	measure func(report) (got []float64, text string, ok bool)
	bounds  []float64
	goal    string
}

// bench returns the metrics of the benchmark named name.
func (r report) bench(name string) (map[string]float64, bool) {
	for _, x := range r.Benchmarks {
		if x.Name == name {
			return x.Metrics, x.Metrics["p50-ms"] > 0
		}
	}
	return nil, false
}

// resource returns the resource scenario of jobs jobs.
func (r report) resource(jobs int) (resourceResult, bool) {
	for _, x := range r.Resources {
		if x.Jobs == jobs && x.Error == "" {
			return x, true
		}
	}
	return resourceResult{}, false
}

func benchGoal(figure, name string, bounds ...float64) goal {
	return goal{figure: figure, command: "go test -run '^$' -bench 'FireDelay/" + name + "' -benchtime 20x ./pkg/engine",
		bounds: bounds,
		measure: func(r report) ([]float64, string, bool) {
			m, ok := r.bench("FireDelay/" + name)
			if !ok {
				return nil, "", false
			}
			if len(bounds) == 1 {
				return []float64{m["p99-ms"]}, fmt.Sprintf("p50 %.1f ms, p99 %.1f ms", m["p50-ms"], m["p99-ms"]), true
			}
			return []float64{m["p50-ms"], m["p99-ms"]}, fmt.Sprintf("p50 %.1f ms, p99 %.1f ms", m["p50-ms"], m["p99-ms"]), true
		}}
}

// goals are the figures the performance work set out to reach, in the
// order of docs/performance.md's table.
var goals = []goal{
	{figure: "1 job, fire -> script's first instruction (outside view, embedded etcd)", command: "go run ./internal/benchreport -delay 60",
		goal: "p50 <= 2 ms, p99 <= 5 ms", bounds: []float64{2, 5},
		measure: func(r report) ([]float64, string, bool) {
			if len(r.Delays) == 0 || r.Delays[0].Error != "" {
				return nil, "", false
			}
			d := r.Delays[0]
			return []float64{d.P50ms, d.P99ms}, fmt.Sprintf("p50 %.1f ms, p99 %.1f ms (of which fork+exec+bash, no shardd: p50 %.1f, p99 %.1f)", d.P50ms, d.P99ms, d.FloorP50ms, d.FloorP99ms), true
		}},
	withGoal(benchGoal("100 script jobs/s, 3 instances (fire -> child started)", "100jobs-script", 25), "p99 <= 25 ms"),
	withGoal(benchGoal("1,000 HTTP jobs/s, 3 instances (fire -> request sent)", "1000jobs-http", 50), "p99 <= 50 ms"),
	{figure: "etcd requests per item execution, 1 job of 6 items", command: "go test -run '^$' -bench 'FireDelay/1job-script' -benchtime 20x ./pkg/engine",
		goal: "<= 1.5", bounds: []float64{1.5},
		measure: func(r report) ([]float64, string, bool) {
			m, ok := r.bench("FireDelay/1job-script")
			if !ok {
				return nil, "", false
			}
			var per []string
			for _, x := range r.Benchmarks {
				if v, ok := x.Metrics["etcd-req/exec"]; ok {
					per = append(per, fmt.Sprintf("%s %.2f", x.Name, v))
				}
			}
			return []float64{m["etcd-req/exec"]}, fmt.Sprintf("%.2f, of which lease keepalives %.2f (each instance's, every TTL/3 whatever runs; TTL 2 s here) (per scenario: %s)",
				m["etcd-req/exec"], m["keepalive-req/exec"], strings.Join(per, "; ")), true
		}},
	resourceGoal("10,000 jobs over 3 instances: cold start to converged maps", 10000, "<= 15 s", []float64{15},
		func(x resourceResult) ([]float64, string) {
			return []float64{x.ConvergeSecs}, fmt.Sprintf("%.1f s", x.ConvergeSecs)
		}),
	resourceGoal("same: RSS per instance / idle CPU", 10000, "<= 120 MiB / <= 1 %", []float64{120, 1},
		func(x resourceResult) ([]float64, string) {
			return []float64{x.RSSMiBPerInst, x.CPUPctPerInst}, fmt.Sprintf("%.0f MiB / %.2f %%", x.RSSMiBPerInst, x.CPUPctPerInst)
		}),
	resourceGoal("idle daemon with 100 jobs: RSS", 100, "<= 30 MiB", []float64{30},
		func(x resourceResult) ([]float64, string) {
			return []float64{x.RSSMiBPerInst}, fmt.Sprintf("%.1f MiB", x.RSSMiBPerInst)
		}),
	resourceGoal("`shardd status` with 10,000 jobs", 10000, "<= 1 s", []float64{1},
		func(x resourceResult) ([]float64, string) {
			return []float64{x.StatusSecs}, fmt.Sprintf("%.2f s", x.StatusSecs)
		}),
}

func withGoal(g goal, text string) goal { g.goal = text; return g }

func resourceGoal(figure string, jobs int, text string, bounds []float64, f func(resourceResult) ([]float64, string)) goal {
	n := 3
	if jobs == 100 {
		n = 1
	}
	return goal{figure: figure, command: fmt.Sprintf("go run ./internal/benchreport -resources %dx%d", jobs, n), goal: text, bounds: bounds,
		measure: func(r report) ([]float64, string, bool) {
			x, ok := r.resource(jobs)
			if !ok {
				return nil, "", false
			}
			got, text := f(x)
			return got, text, true
		}}
}

// goalsTable is the markdown table of the goals: each figure measured,
// its goal, whether it is met, and the command that measures it alone.
func goalsTable(r report, goals []goal) string {
	var b strings.Builder
	b.WriteString("| figure | measured | goal | met | command |\n|---|---|---|---|---|\n")
	for _, g := range goals {
		got, text, ok := g.measure(r)
		met := "yes"
		switch {
		case !ok:
			text, met = "not measured (see below)", "-"
		default:
			for i, v := range got {
				if v > g.bounds[i] {
					met = "**no**"
				}
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | `%s` |\n", g.figure, text, g.goal, met, g.command)
	}
	return b.String()
}

// stormGoal is the goal of a BenchmarkStorm case (make bench-scale).
func stormGoal(figure, name, text string, bound float64, floor bool) goal {
	return goal{figure: figure, command: "SHARDD_BENCH_SCALE=1 go test -run '^$' -bench 'Storm/" + name + "' -benchtime 3x ./pkg/engine",
		goal: text, bounds: []float64{bound, 0},
		measure: func(r report) ([]float64, string, bool) {
			m, ok := r.bench("Storm/" + name)
			if !ok {
				return nil, "", false
			}
			text := fmt.Sprintf("%.0f runs, %.0f fires missed; p50 %.1f ms, p99 %.1f ms", m["runs"], m["missed-fires"], m["p50-ms"], m["p99-ms"])
			got := m["p99-ms"]
			if floor {
				text += fmt.Sprintf(" (floor, 1,000 shells by a plain loop: p99 %.1f ms; ratio %.2f)", m["p99-floor-ms"], m["p99/floor"])
				got = m["p99/floor"]
			}
			return []float64{got, m["missed-fires"]}, text, true
		}}
}

// scaleGoals are make bench-scale's figures (docs/performance.md).
func scaleGoals(short bool) []goal {
	big, restartJobs, storm := 100000, 10000, "10000jobs-http-3instances"
	if short {
		big, restartJobs, storm = 10000, 2000, "2000jobs-http-3instances"
	}
	bigGoal := func(figure, text string, bounds []float64, f func(resourceResult) ([]float64, string)) goal {
		g := resourceGoal(figure, big, text, bounds, f)
		g.command = fmt.Sprintf("go run ./internal/benchreport -resources %dx3 -items 1", big)
		return g
	}
	return []goal{
		bigGoal(fmt.Sprintf("%d jobs (1 item) over 3 instances: converge", big), "<= 120 s", []float64{120}, func(x resourceResult) ([]float64, string) {
			return []float64{x.ConvergeSecs}, fmt.Sprintf("%.1f s", x.ConvergeSecs)
		}),
		bigGoal("same: RSS per instance; idle CPU; etcd DB size", "<= 600 MiB; <= 3 %; report", []float64{600, 3}, func(x resourceResult) ([]float64, string) {
			return []float64{x.RSSMiBPerInst, x.CPUPctPerInst}, fmt.Sprintf("%.0f MiB; %.2f %%; etcd DB %.0f MiB", x.RSSMiBPerInst, x.CPUPctPerInst, x.EtcdDBMiB)
		}),
		stormGoal(fmt.Sprintf("storm: %s one-item HTTP jobs due at the same second, 3 instances (fire -> request)", strings.TrimSuffix(storm, "jobs-http-3instances")), storm,
			"every fire runs; p99 <= 2 s", 2000, false),
		stormGoal("storm: 1,000 script jobs due at the same second, 1 instance (fire -> script let go)", "1000jobs-script-1instance",
			"p99 <= floor + 10 %", 1.1, true),
		{figure: fmt.Sprintf("a kill -9 and restart of one instance at %d jobs: until its items run again (TTL 10 s)", restartJobs),
			command: fmt.Sprintf("go run ./internal/benchreport -resources %dx3 -restart", restartJobs), goal: "<= TTL + 5 s", bounds: []float64{15},
			measure: func(r report) ([]float64, string, bool) {
				for _, x := range r.Resources {
					if x.Jobs == restartJobs && x.RestartSecs > 0 {
						return []float64{x.RestartSecs}, fmt.Sprintf("%.1f s", x.RestartSecs), true
					}
				}
				return nil, "", false
			}},
	}
}
