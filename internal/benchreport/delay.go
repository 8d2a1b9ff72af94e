package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// delayResult is the delay from a scheduled fire to the first instruction
// of its script, measured the way a user feels it: the script (bash, no
// fork) writes $EPOCHREALTIME and $SHARDD_FIRE_TIME.
type delayResult struct {
	Scenario string  `json:"scenario"`
	Command  string  `json:"command"`
	Samples  int     `json:"samples"`
	P50ms    float64 `json:"p50Ms"`
	P99ms    float64 `json:"p99Ms"`
	MaxMs    float64 `json:"maxMs"`
	// FloorP50ms and FloorP99ms are the same delay with nothing of shardd
	// in it: from just before Go starts the same bash command to its
	// $EPOCHREALTIME (fork, exec, bash's start-up). A cron daemon cannot
	// go below it; the rest is shardd's.
	FloorP50ms float64 `json:"floorP50Ms"`
	FloorP99ms float64 `json:"floorP99Ms"`
	Error      string  `json:"error,omitempty"`
}

// fireDelay runs the shardd binary in bin on its embedded etcd (its own
// data dir and ports) with one one-item job firing every second, and
// measures samples fires after a warm-up of 5.
func fireDelay(bin string, samples int) (delayResult, error) {
	const warmup = 5
	r := delayResult{Scenario: "1 job, fire -> script start (embedded etcd)", Samples: samples,
		Command: "shardd run on its embedded etcd; a bash script writes $EPOCHREALTIME and $SHARDD_FIRE_TIME every second"}
	work, err := os.MkdirTemp("", "shardd-bench-delay")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(work)
	out := filepath.Join(work, "began")
	cfg := filepath.Join(work, "jobs.yaml")
	job := fmt.Sprintf(`jobs:
  - name: delay
    cron: "* * * * * ?"
    script: ["/bin/bash", "-c", 'echo "$EPOCHREALTIME $SHARDD_FIRE_TIME" >> %s']
`, out)
	if err := os.WriteFile(cfg, []byte(job), 0o644); err != nil {
		return r, err
	}
	cmd := exec.Command(filepath.Join(bin, "shardd"), "run", "--config", cfg, "--data-dir", filepath.Join(work, "data"),
		"--embed-client-url", "https://"+freeAddr(), "--embed-peer-url", "https://"+freeAddr(), "--listen", "", "--log-level", "warn")
	cmd.Stderr = nil
	if err := cmd.Start(); err != nil {
		return r, err
	}
	defer func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() }()
	deadline := time.Now().Add(time.Duration(samples+warmup+60) * time.Second)
	var delays []float64
	for time.Now().Before(deadline) {
		time.Sleep(time.Second)
		d, err := readDelays(out)
		if err != nil {
			return r, err
		}
		if len(d) >= samples+warmup {
			delays = d[warmup : warmup+samples]
			break
		}
	}
	if delays == nil {
		return r, fmt.Errorf("fewer than %d fires ran in time", samples+warmup)
	}
	slices.Sort(delays)
	r.P50ms, r.P99ms, r.MaxMs = pct(delays, 0.50), pct(delays, 0.99), delays[len(delays)-1]
	floor, err := execFloor(samples)
	if err != nil {
		return r, err
	}
	r.FloorP50ms, r.FloorP99ms = pct(floor, 0.50), pct(floor, 0.99)
	return r, nil
}

// execFloor measures, samples times, from just before starting the
// script's bash command to its first instruction, with no shardd.
func execFloor(samples int) ([]float64, error) {
	var out []float64
	for range samples {
		t0 := time.Now()
		b, err := exec.Command("/bin/bash", "-c", `echo "$EPOCHREALTIME"`).Output()
		if err != nil {
			return nil, fmt.Errorf("bash: %w", err)
		}
		began, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		if err != nil {
			return nil, fmt.Errorf("bash's EPOCHREALTIME %q: %w", b, err)
		}
		out = append(out, (began-float64(t0.UnixNano())/1e9)*1000)
		time.Sleep(100 * time.Millisecond)
	}
	slices.Sort(out)
	return out, nil
}

// readDelays reads the script's lines: each is its start and its fire.
func readDelays(path string) ([]float64, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []float64
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) != 2 {
			continue
		}
		began, err1 := strconv.ParseFloat(fields[0], 64)
		fire, err2 := time.Parse(time.RFC3339, fields[1])
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, (began-float64(fire.UnixNano())/1e9)*1000)
	}
	return out, s.Err()
}

// pct is the p-th percentile of sorted v (nearest rank).
func pct(v []float64, p float64) float64 {
	i := int(float64(len(v))*p+0.5) - 1
	return v[min(max(i, 0), len(v)-1)]
}
