package engine

// Adoption: a claim whose reply was lost, a stale read, a job re-added
// while its run lives. Each test failed before its fix; its comment says
// the bug it guards against.

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/internal/ledger"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/runner"
)

// slowReads delays the reply of a ReadItems that shows a run of this
// session in progress (a slow etcd reply), and counts adoptions.
type slowReads struct {
	*coord.Node
	adopts atomic.Int32
	delay  time.Duration
}

func (s *slowReads) ReadItems(ctx context.Context, job string) (keyspace.JobItems, error) {
	it, err := s.Node.ReadItems(ctx, job)
	if err == nil {
		for _, st := range it.Items {
			if st.RunningMine && s.delay > 0 {
				time.Sleep(s.delay)
				break
			}
		}
	}
	return it, err
}

func (s *slowReads) Adopt(ctx context.Context, job string, item int, st keyspace.ItemState) (*coord.Grant, error) {
	s.adopts.Add(1)
	return s.Node.Adopt(ctx, job, item, st)
}

// A reconcile whose read shows item 0 RUNNING under this session, while the
// run ends (Complete lands, local cleared) before the loop looks at
// j.local: decide says adopt, Adopt trusts the stale snapshot, and the
// completed fire runs again under the same fence.
func TestRegressionStaleReadAdoptsCompletedRun(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	// item 1 ends at once (its end wakes the loop); item 0 runs 0.4s.
	body := strings.ReplaceAll(ledgerTo(path), "$1", "start") + `; if [ "$SHARDD_ITEM" = 0 ]; then sleep 0.4; fi; ` + strings.ReplaceAll(ledgerTo(path), "$1", "end")
	script := `sh -c '` + body + `'`
	yaml := "jobs:\n  - name: j\n    cron: \"@every 3s\"\n    shardingTotalCount: 2\n    script: " + etcdtest.YAMLQuote(script) + "\n"
	h := &slowReads{delay: 700 * time.Millisecond}
	instanceWith(t, srv.Client(), "a", yaml, func(o *Options) { h.Node = o.Node.(*coord.Node); o.Node = h })
	time.Sleep(10 * time.Second)
	evs := events(t, path)
	seen := map[string]int{}
	for _, ev := range evs {
		if ev.Kind != "start" {
			continue
		}
		k := ev.Fire.UTC().Format("15:04:05") + " item " + string(rune('0'+ev.Item))
		seen[k]++
		t.Logf("start: fire %s item %d fence %d attempt %d source %s", ev.Fire.UTC().Format("15:04:05.000"), ev.Item, ev.Fence, ev.Attempt, ev.Source)
	}
	r := ledger.Check(evs, ledger.Options{})
	t.Logf("adopts: %d; ledger: %s %v", h.adopts.Load(), r, r.Violations)
	for k, n := range seen {
		if n > 1 {
			t.Errorf("fire %s started %d times (no failure, no lost claim)", k, n)
		}
	}
}

// A job removed from the config and added back while one of its items
// runs: the old loop's run goes on; the new loop has an empty local map,
// sees the item RUNNING under this session and adopts it: a second,
// concurrent execution of the same (job, item) with the same fence.
func TestRegressionReaddedJobAdoptsLiveRun(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	body := strings.ReplaceAll(ledgerTo(path), "$1", "start") + `; sleep 4; ` + strings.ReplaceAll(ledgerTo(path), "$1", "end")
	script := `sh -c '` + body + `'`
	yaml := "jobs:\n  - name: j\n    cron: \"@every 1h\"\n    script: " + etcdtest.YAMLQuote(script) + "\n"
	c, err := config.Parse("jobs.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	node, err := coord.New(coord.Options{Client: srv.Client(), ID: "a", TTL: 2 * time.Second, Logger: log}, c.Jobs)
	if err != nil {
		t.Fatal(err)
	}
	wd, err := runner.StartWatchdog(os.Args[0], log)
	if err != nil {
		t.Fatal(err)
	}
	eng := New(Options{Node: node, Logger: log, TTL: 2 * time.Second, Watchdog: wd, Sweep: -1})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); eng.Run(ctx) }()
	go func() { defer wg.Done(); node.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait(); wd.Close() })

	// Trigger a run now rather than waiting for the cron.
	etcdtest.Eventually(t, 20*time.Second, "a map", func() bool { v, ok := node.View("j"); return ok && v.Map != nil && len(v.Map.Instances) == 1 })
	if _, err := admin.New(srv.Client(), node.Keys()).Trigger(context.Background(), admin.TriggerRequest{Job: "j", By: "test"}); err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 10*time.Second, "a first start", func() bool { return starts(path) >= 1 })
	node.SetJobs(nil)
	eng.Resync()
	time.Sleep(300 * time.Millisecond)
	node.SetJobs(c.Jobs)
	eng.Resync()
	time.Sleep(6 * time.Second)
	evs := events(t, path)
	for _, ev := range evs {
		t.Logf("%s: fire %s item %d fence %d source %s at %s", ev.Kind, ev.Fire.UTC().Format("15:04:05.000"), ev.Item, ev.Fence, ev.Source, ev.At.UTC().Format("15:04:05.000"))
	}
	r := ledger.Check(evs, ledger.Options{})
	t.Logf("ledger: %s %v", r, r.Violations)
	// A scheduled fire may come in the window too; the manual run's claim
	// must start once and nothing may overlap it.
	manual := 0
	for _, ev := range evs {
		if ev.Kind == "start" && ev.Source == keyspace.SourceManual {
			manual++
		}
	}
	if manual != 1 || r.Overlaps > 0 {
		t.Errorf("the one manual run started %d times; overlaps=%d", manual, r.Overlaps)
	}
}

// The same race without any injected delay: 32 items ending a few ms apart,
// every end waking the loop while the others are still RUNNING.
func TestRegressionStaleReadAdoptsNaturally(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	body := strings.ReplaceAll(ledgerTo(path), "$1", "start") + `; sleep 0.$(( SHARDD_ITEM * 3 % 10 ))$(( SHARDD_ITEM % 10 )); ` + strings.ReplaceAll(ledgerTo(path), "$1", "end")
	script := `sh -c '` + body + `'`
	yaml := "jobs:\n  - name: j\n    cron: \"@every 2s\"\n    shardingTotalCount: 32\n    script: " + etcdtest.YAMLQuote(script) + "\n"
	h := &slowReads{}
	instanceWith(t, srv.Client(), "a", yaml, func(o *Options) { h.Node = o.Node.(*coord.Node); o.Node = h })
	time.Sleep(12 * time.Second)
	evs := events(t, path)
	r := ledger.Check(evs, ledger.Options{})
	t.Logf("adopts: %d; ledger: %s", h.adopts.Load(), r)
	if h.adopts.Load() > 0 || r.Duplicates > 0 {
		t.Errorf("adopted %d runs with no lost claim reply; %v", h.adopts.Load(), r.Violations)
	}
}

// The stale-read adoption across instances: with ROUND (owner alternates per
// fire) the replayed run of fire F on one instance holds no marker (its
// Complete deleted it), so the other instance claims fire F+1 of the same
// item while the replay runs: two concurrent executions of (j, 0).
func TestRegressionStaleAdoptOverlapsOtherInstance(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	body := strings.ReplaceAll(ledgerTo(path), "$1", "start") + `; if [ "$SHARDD_ITEM" = 0 ]; then sleep 0.6; fi; ` + strings.ReplaceAll(ledgerTo(path), "$1", "end")
	script := `sh -c '` + body + `'`
	yaml := "jobs:\n  - name: j\n    cron: \"@every 1s\"\n    strategy: ROUND\n    shardingTotalCount: 2\n    script: " + etcdtest.YAMLQuote(script) + "\n"
	for _, id := range []string{"a", "b"} {
		h := &slowReads{delay: 700 * time.Millisecond}
		instanceWith(t, srv.Client(), id, yaml, func(o *Options) { h.Node = o.Node.(*coord.Node); o.Node = h })
	}
	time.Sleep(10 * time.Second)
	evs := events(t, path)
	type span struct {
		from, to time.Time
		who      string
		fence    int64
	}
	open := map[int64]span{}
	var spans []span
	for _, ev := range evs {
		if ev.Item != 0 {
			continue
		}
		k := ev.Fence*1000 + int64(len(ev.Instance))
		switch ev.Kind {
		case "start":
			if _, dup := open[ev.Fence]; dup {
				k = -ev.Fence
			}
			open[k] = span{from: ev.At, who: ev.Instance, fence: ev.Fence}
		case "end":
			for key, s := range open {
				if s.fence == ev.Fence && s.to.IsZero() {
					s.to = ev.At
					spans = append(spans, s)
					delete(open, key)
					break
				}
			}
		}
	}
	overlaps := 0
	for i := range spans {
		for j := i + 1; j < len(spans); j++ {
			a, b := spans[i], spans[j]
			if a.from.Before(b.to) && b.from.Before(a.to) {
				overlaps++
				t.Logf("overlap: %s fence %d [%s..%s] and %s fence %d [%s..%s]", a.who, a.fence, a.from.Format("05.000"), a.to.Format("05.000"), b.who, b.fence, b.from.Format("05.000"), b.to.Format("05.000"))
			}
		}
	}
	r := ledger.Check(evs, ledger.Options{})
	t.Logf("ledger: %s", r)
	if overlaps > 0 {
		t.Errorf("%d overlapping executions of item 0", overlaps)
	}
}

type idOnly struct {
	Node
	id string
}

func (n idOnly) ID() string { return n.id }

// A claim of this instance that applied after the item moved away (its
// reply lost, or etcd slow to apply it): the marker under this session
// wakes the job (OnChange's own), which adopts the run and ends it, even
// though the instance owns none of the job's items and so reads them at no
// fire. With no event (the sweep is off in these tests), the marker would
// hold the item until this session ends: no fire of it runs meanwhile.
func TestLateClaimOfAnItemThatMovedAwayIsAdopted(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	script := strings.ReplaceAll(ledgerTo(path), "$1", "start")
	yaml := "jobs:\n  - name: moved\n    script: " + etcdtest.YAMLQuote(script) + "\n"
	nodes := map[string]*coord.Node{"a": instance(t, srv, "a", yaml), "b": instance(t, srv, "b", yaml)}
	var owner string
	etcdtest.Eventually(t, 15*time.Second, "the map over a and b", func() bool {
		v, _ := nodes["a"].View("moved")
		if v.Map == nil || len(v.Map.Instances) != 2 {
			return false
		}
		for _, id := range []string{"a", "b"} {
			if len(v.Map.ItemsOf(id)) == 1 {
				owner = id
			}
		}
		return owner != ""
	})
	other := map[string]string{"a": "b", "b": "a"}[owner]
	late := nodes[other]
	ctx := context.Background()
	items, err := late.ReadItems(ctx, "moved")
	if err != nil {
		t.Fatal(err)
	}
	st := items.Items[0]
	// The claim the engine of `other` made for a fire of item 0 when it
	// owned it, applied now; its reply never reached the engine.
	g, err := late.Claim(ctx, coord.Claim{Job: "moved", Item: 0, Fire: time.Now().Truncate(time.Second), Source: keyspace.SourceManual, Prev: st})
	if err != nil {
		t.Fatal(err)
	}
	etcdtest.Eventually(t, 8*time.Second, "the late claim's run, adopted by "+other, func() bool {
		for _, ev := range events(t, path) {
			if ev.Instance == other && ev.Fence == g.Fence {
				return true
			}
		}
		return false
	})
	etcdtest.Eventually(t, 8*time.Second, "the adopted run's outcome", func() bool {
		items, err := late.ReadItems(ctx, "moved")
		return err == nil && items.Items[0].RunningBy == "" && items.Items[0].Record.Fence == g.Fence && items.Items[0].Record.State != keyspace.StateRunning
	})
}
