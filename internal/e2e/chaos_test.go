package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/ledger"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runner"
	"github.com/shardd/shardd/pkg/schedule"
)

// TestChaos is the chaos suite: 3 shardd on a 3-member etcd cluster, every
// process on its own loopback ports, several every-second jobs that write
// the ledger (scripts with failover on and off, one whose runs outlast the
// TTL, an HTTP hook), and randomized faults from a seed. It runs only when
// SHARDD_CHAOS_ROUNDS is set (make chaos; .ci/run runs a short form).
// Jobs whose period is longer than the bound (every 10s, every minute, at
// fixed calendar times) sit beside the every-second ones, and G3 is checked
// per due fire: a later fire's run never hides a lost one. Cut runs of
// failover jobs must be re-run within the bound of the fault that cut them.
//
//	SHARDD_CHAOS_ROUNDS  fault rounds (make chaos: 200)
//	SHARDD_CHAOS_SEED    seed of the fault sequence (default: the time; printed)
//	SHARDD_CHAOS_OUT     where to write the JSON summary (default: not written)
//	SHARDD_CHAOS_JOBS    that many more one-item jobs, each firing once a
//	                     minute (at second i mod 60), checked by the ledger
//	                     like the others (make chaos-scale: 2,000)
//
// A failure prints the seed; SHARDD_CHAOS_SEED=<seed> replays the same faults.
//
// G1, G2 and G4 are checked over the whole run. G3's bound (every due fire
// starts within TTL + 2s) is promised while etcd has a leader and for one
// failure at a time. Around an etcd leader election (a member kill, or one
// the monitor saw on a loaded machine) and across overlapping faults (a
// quarter of the rounds let the next fault start before the bound has
// passed), a due fire must still start, by the fault window's end: the
// window runs from the bound before the first fault to the bound after the
// last. The summary counts the fires checked that way.
func TestChaos(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("SHARDD_CHAOS_ROUNDS"))
	if rounds <= 0 {
		t.Skip("set SHARDD_CHAOS_ROUNDS to run the chaos suite (make chaos)")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("SHARDD_CHAOS_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("chaos: seed %d, %d rounds (replay with SHARDD_CHAOS_SEED=%d)", seed, rounds, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	const sessionTTL = 3 * time.Second

	dir := t.TempDir()
	hook := ledgerHook(t, filepath.Join(dir, "ledger"))
	cfg := filepath.Join(dir, "jobs.yaml")
	writeChaosConfig(t, cfg, dir, hook.URL, false)

	members := startEtcdCluster(t, 3)
	names := []string{"a", "b", "c"}
	procs := map[string]*proc{}
	var every []*proc // every process started, for their logs
	start := func(name string) {
		procs[name] = startSharddOn(t, members, sessionTTL, name, cfg, "--reload-interval", "1s")
		every = append(every, procs[name])
	}
	for _, n := range names {
		start(n)
	}
	cli := members[0].client()
	etcdtest.Eventually(t, 30*time.Second, "the cluster to agree", func() bool {
		m := etcdtest.StoredMap(cli, "tick")
		return m != nil && len(m.Instances) == 3
	})
	time.Sleep(3 * time.Second)
	from := time.Now()

	bound := sessionTTL + 2*time.Second // G3's bound: TTL + reshard + slack
	elections := watchElections(t, members, 200*time.Millisecond)
	counts := map[string]int{}
	extraJob := false
	// Fault windows, in which G3's deadline stretches to the window's end:
	// etcd leader elections (member kills, and any other the monitor sees)
	// and chains of overlapping faults (two failures in a row may take one
	// bound each).
	var faults []ledger.Window
	var failures []ledger.Failure // the faults that can cut a run, and when
	var memberKills []ledger.Window
	var chainFrom time.Time // start of a chain of overlapping faults
	overlapping := 0
	for round := 1; round <= rounds; round++ {
		victim := names[rng.IntN(len(names))]
		p := procs[victim]
		fault := []string{"kill9", "sigstop", "partition", "etcd-member", "rolling-restart", "reload", "disable", "kill-before-fire"}[rng.IntN(8)]
		overlap := rng.IntN(4) == 0
		counts[fault]++
		if fault == "kill-before-fire" {
			// The owner of a calendar item dies 1s before its fire.
			due := nextCalendarFire(time.Now().Add(2 * time.Second))
			time.Sleep(time.Until(due.Add(-time.Second)))
			if m := etcdtest.StoredMap(cli, "calendar"); m != nil && procs[m.Owner(rng.IntN(2))] != nil {
				victim = m.Owner(rng.IntN(2))
				p = procs[victim]
			}
		}
		faultStart := time.Now()
		switch fault {
		case "kill9", "kill-before-fire", "sigstop", "partition":
			failures = append(failures, ledger.Failure{At: faultStart, Instance: victim})
		case "etcd-member":
			failures = append(failures, ledger.Failure{At: faultStart})
		}
		t.Logf("round %d/%d at %s: %s %s (overlap %v)", round, rounds, faultStart.UTC().Format("15:04:05.000"), fault, victim, overlap)
		switch fault {
		case "kill9", "kill-before-fire":
			p.stop(syscall.SIGKILL)
			start(victim) // at once: it waits for its old registration to expire
		case "sigstop":
			p.signal(syscall.SIGSTOP)
			time.Sleep(sessionTTL + time.Duration(rng.IntN(2000))*time.Millisecond)
			p.signal(syscall.SIGCONT)
		case "partition":
			p.cut()
			time.Sleep(sessionTTL + time.Duration(rng.IntN(2000))*time.Millisecond)
			p.heal()
		case "etcd-member":
			m := members[rng.IntN(len(members))]
			w := ledger.Window{From: time.Now().Add(-bound)}
			m.signal(syscall.SIGKILL)
			time.Sleep(time.Duration(500+rng.IntN(2000)) * time.Millisecond)
			m.start()
			w.To = time.Now().Add(bound)
			faults = append(faults, w)
			memberKills = append(memberKills, w)
		case "rolling-restart":
			for _, n := range names {
				// A graceful stop lets runs finish for the shutdown grace
				// (10s), then kills them: that is when they are cut.
				failures = append(failures, ledger.Failure{At: time.Now().Add(shutdownGrace), Instance: n, StartedBefore: time.Now()})
				procs[n].stop(syscall.SIGTERM)
				start(n)
				etcdtest.Eventually(t, 30*time.Second, n+" to rejoin", func() bool { return len(procs[n].find(msg("session up"))) > 0 })
			}
		case "reload":
			extraJob = !extraJob
			writeChaosConfig(t, cfg, dir, hook.URL, extraJob)
			for _, n := range names {
				procs[n].signal(syscall.SIGHUP)
			}
		case "disable":
			shardd(t, members[0], "disable", "tick", "--instance", victim)
			time.Sleep(time.Duration(1000+rng.IntN(2000)) * time.Millisecond)
			shardd(t, members[0], "enable", "tick", "--instance", victim)
		}
		faultEnd := time.Now()
		switch {
		case overlap && chainFrom.IsZero():
			chainFrom = faultStart.Add(-bound)
		case !overlap && !chainFrom.IsZero():
			faults = append(faults, ledger.Window{From: chainFrom, To: faultEnd.Add(bound)})
			chainFrom = time.Time{}
		}
		settle := bound + time.Duration(rng.IntN(1500))*time.Millisecond
		if overlap {
			overlapping++
			settle = time.Duration(1000+rng.IntN(1500)) * time.Millisecond
		}
		time.Sleep(settle)
	}
	to := time.Now()
	if !chainFrom.IsZero() {
		faults = append(faults, ledger.Window{From: chainFrom, To: to.Add(bound)})
	}
	electionWindows := elections.stop(bound)
	spontaneous := 0 // elections no member kill explains
	for _, e := range electionWindows {
		injected := false
		for _, k := range memberKills {
			injected = injected || e.From.Before(k.To) && k.From.Before(e.To)
		}
		if !injected {
			spontaneous++
		}
	}
	faults = append(faults, electionWindows...)
	time.Sleep(4 * time.Second) // runs started before `to` end
	for _, n := range names {
		procs[n].stop(syscall.SIGTERM)
	}

	f, err := os.Open(filepath.Join(dir, "ledger"))
	if err != nil {
		t.Fatal(err)
	}
	events, err := ledger.Parse(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	r := ledger.Check(events, ledger.Options{Jobs: chaosJobs(t), Bound: bound, From: from, To: to, Faults: faults, Failures: failures,
		Records: policyRecords(t, every)})
	fires := map[string]int{}
	for _, ev := range events {
		if ev.Kind == "start" && !ev.At.Before(from) && !ev.At.After(to) {
			fires[ev.Job]++
		}
	}
	// The run history must agree with the ledger: every run recorded DONE
	// left its start in the ledger, under the same fence.
	started := map[string]bool{}
	for _, ev := range events {
		if ev.Kind == "start" {
			started[fmt.Sprintf("%s/%d/%d", ev.Job, ev.Item, ev.Fence)] = true
		}
	}
	historyChecked, historyMismatches := 0, 0
	for _, job := range []string{"tick", "tock", "hook", "ten", "minute", "calendar"} {
		var recs []keyspace.ItemRecord
		_, hist, _ := logsCLI(t, members[0], nil, "history", job, "-o", "json", "--limit", "1000")
		if err := json.Unmarshal([]byte(hist), &recs); err != nil {
			t.Fatal(err)
		}
		for _, rec := range recs {
			if rec.State != keyspace.StateDone {
				continue
			}
			historyChecked++
			if !started[fmt.Sprintf("%s/%d/%d", rec.Job, rec.Item, rec.Fence)] {
				historyMismatches++
				t.Errorf("history says %s item %d fence %d ran, the ledger has no such start", rec.Job, rec.Item, rec.Fence)
			}
		}
	}
	summary := map[string]any{
		"historyRecordsChecked": historyChecked, "historyMismatches": historyMismatches,
		"seed": seed, "rounds": rounds, "faults": counts, "seconds": to.Sub(from).Seconds(),
		"starts": r.Starts, "ends": r.Ends, "startsByJob": fires, "dueFiresCheckedByJob": r.FiresByJob,
		"dueFiresChecked": r.FiresChecked, "dueFiresRun": r.FiresRun, "dueFiresCoalesced": r.FiresCoalesced, "dueFiresRecordedNotRun": r.FiresRecorded,
		"cutRunsUnattributed":    r.CutRunsUnattributed,
		"dueFiresInFaultWindows": r.FiresInFaults, "dueFiresUnjudged": r.FiresUnjudged,
		"cutRunsJudged": r.CutRuns, "failoverLatencyP50Seconds": ledger.Percentile(r.FailoverLatencies, 50).Seconds(),
		"failoverLatencyP99Seconds": ledger.Percentile(r.FailoverLatencies, 99).Seconds(), "failoverLatencyMaxSeconds": ledger.Percentile(r.FailoverLatencies, 100).Seconds(),
		"overlappingFaults": overlapping, "etcdLeaderElectionsSeen": len(electionWindows), "etcdElectionsWithoutMemberKill": spontaneous, "failovers": r.Failovers,
		"failoversOfRunsThatHadEnded": r.RerunsAfterEnd, "misfireRuns": r.Misfires,
		"g1Overlaps": r.Overlaps, "g2Duplicates": r.Duplicates, "g3Misses": r.Misses, "g4FenceInversions": r.FenceInversions,
		"violations": r.Violations, "ok": r.OK(), "ttlSeconds": sessionTTL.Seconds(), "g3BoundSeconds": bound.Seconds(),
	}
	out, _ := json.MarshalIndent(summary, "", "  ")
	t.Logf("chaos summary:\n%s", out)
	if path := os.Getenv("SHARDD_CHAOS_OUT"); path != "" {
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Error(err)
		}
	}
	for _, v := range r.Violations {
		t.Error(v)
	}
	if !r.OK() {
		t.Errorf("violations found; replay with SHARDD_CHAOS_SEED=%d SHARDD_CHAOS_ROUNDS=%d", seed, rounds)
	}
}

// The chaos jobs' schedules. Besides the every-second jobs, three have
// periods longer than G3's bound, where a lost fire cannot hide behind the
// next one: every 10s with 4s runs, every minute, and fixed calendar times
// (:07 and :37 of each minute) whose owner a fault kills 1s before the fire.
const (
	shutdownGrace = 10 * time.Second // shardd run's default --shutdown-grace
	calendarCron  = "7,37 * * * * ?"
	minuteCron    = "0 * * * * ?"
)

func nextCalendarFire(after time.Time) time.Time {
	s, _ := schedule.Parse(calendarCron, nil)
	return s.Next(after)
}

// bulkJobs is SHARDD_CHAOS_JOBS: the one-item jobs of the scale variant.
func bulkJobs() int {
	n, _ := strconv.Atoi(os.Getenv("SHARDD_CHAOS_JOBS"))
	return max(n, 0)
}

// bulkJob is the name and schedule of the i-th of bulkJobs.
func bulkJob(i int) (name, cron string) {
	return fmt.Sprintf("bulk-%05d", i), fmt.Sprintf("%d * * * * ?", i%60)
}

// chaosJobs is what the ledger checker is told of the chaos jobs.
func chaosJobs(t *testing.T) map[string]ledger.Job {
	sched := func(spec string) schedule.Schedule { return mustSchedule(t, spec) }
	every := sched("@every 1s")
	jobs := map[string]ledger.Job{
		"tick":     {Items: 6, Schedule: every, Failover: true},
		"tock":     {Items: 4, Schedule: every},
		"hook":     {Items: 2, Schedule: every, Failover: true},
		"ten":      {Items: 3, Schedule: sched("@every 10s"), Failover: true},
		"minute":   {Items: 2, Schedule: sched(minuteCron), Failover: true},
		"calendar": {Items: 2, Schedule: sched(calendarCron), Failover: true},
	}
	for i := range bulkJobs() {
		name, cron := bulkJob(i)
		jobs[name] = ledger.Job{Items: 1, Schedule: sched(cron), Failover: true}
	}
	return jobs
}

// writeChaosConfig writes the chaos jobs; extra adds a job that reloads toggle.
func writeChaosConfig(t *testing.T, path, dir, hookURL string, extra bool) {
	cfg := "jobs:\n" +
		ledgerJob(dir, "tick", "    failover: true\n", 6, "0.3") +
		ledgerJob(dir, "tock", "    failover: false\n", 4, "0.2") +
		ledgerJob(dir, "slow", "    failover: true\n", 2, "4") +
		cronLedgerJob(dir, "ten", "@every 10s", 3, "4") +
		cronLedgerJob(dir, "minute", minuteCron, 2, "20") +
		cronLedgerJob(dir, "calendar", calendarCron, 2, "1") +
		`  - name: hook
    cron: "@every 1s"
    shardingTotalCount: 2
    failover: true
    http: {url: '` + hookURL + `', timeout: 5s}
`
	if extra {
		cfg += ledgerJob(dir, "extra", "", 1, "0.1")
	}
	var bulk strings.Builder
	for i := range bulkJobs() {
		name, cron := bulkJob(i)
		bulk.WriteString(cronLedgerJob(dir, name, cron, 1, "0"))
	}
	cfg += bulk.String()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // atomic: a reload never sees half a file
		t.Fatal(err)
	}
}

// cronLedgerJob is a failover job on cron that writes the ledger.
func cronLedgerJob(dir, name, cron string, items int, sleep string) string {
	return fmt.Sprintf(`  - name: %s
    cron: "%s"
    shardingTotalCount: %d
    failover: true
    script:
      command: %s
      env: {LEDGER_DIR: %s, LEDGER_SLEEP: "%s"}
`, name, cron, items, etcdtest.YAMLQuote(ledgerScript), etcdtest.YAMLQuote(dir), sleep)
}

// ledgerHook is an HTTP hook that writes the ledger as the scripts do, and
// records an overlap when a run of an item arrives while one is in progress.
// Like a well-behaved hook it stops its work when shardd cancels the call
// (its run was killed): shardd cannot stop remote work any other way.
func ledgerHook(t *testing.T, path string) *httptest.Server {
	var mu sync.Mutex
	running := map[int]bool{}
	write := func(kind string, c runner.Context) {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return
		}
		defer f.Close()
		fmt.Fprintf(f, "%s %s %d %s %d %d %s %s %d %d\n", kind, c.Job, c.Item, c.Fire.UTC().Format(time.RFC3339), c.Attempt, c.Fence, c.Instance, c.Source, time.Now().UnixNano(), c.Skipped)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c runner.Context
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		if running[c.Item] {
			write("overlap", c)
		}
		running[c.Item] = true
		write("start", c)
		mu.Unlock()
		select {
		case <-time.After(200 * time.Millisecond):
		case <-r.Context().Done():
		}
		mu.Lock()
		running[c.Item] = false
		write("end", c)
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	return srv
}

// electionMonitor polls every etcd member's raft term. A term that grew is
// an etcd leader election, during which etcd has no leader to serve: G3
// does not hold across it. Member kills cause elections, and so can a
// leader starved of CPU on a loaded machine; the monitor sees both.
type electionMonitor struct {
	stopc   chan struct{}
	done    chan struct{}
	mu      sync.Mutex
	changes []ledger.Window // From: last poll at the old term; To: first at the new
}

func watchElections(t *testing.T, members []*etcdProc, every time.Duration) *electionMonitor {
	m := &electionMonitor{stopc: make(chan struct{}), done: make(chan struct{})}
	clients := make([]*clientv3.Client, len(members))
	for i, e := range members {
		clients[i] = e.client()
	}
	go func() {
		defer close(m.done)
		var term uint64
		last := time.Now()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-m.stopc:
				return
			case <-tick.C:
			}
			var max uint64
			for i, cli := range clients {
				ctx, cancel := context.WithTimeout(context.Background(), every)
				if st, err := cli.Status(ctx, members[i].clientURL); err == nil && st.RaftTerm > max {
					max = st.RaftTerm
				}
				cancel()
			}
			now := time.Now()
			if max == 0 {
				continue // no member answered: the next answer tells
			}
			if term != 0 && max > term {
				m.mu.Lock()
				m.changes = append(m.changes, ledger.Window{From: last, To: now})
				m.mu.Unlock()
			}
			if max >= term {
				term, last = max, now
			}
		}
	}()
	t.Cleanup(func() { m.stop(0) })
	return m
}

// stop ends the monitor and returns each election widened by bound on
// both sides.
func (m *electionMonitor) stop(bound time.Duration) []ledger.Window {
	select {
	case <-m.stopc:
	default:
		close(m.stopc)
	}
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]ledger.Window, len(m.changes))
	for i, w := range m.changes {
		out[i] = ledger.Window{From: w.From.Add(-bound), To: w.To.Add(bound)}
	}
	return out
}
