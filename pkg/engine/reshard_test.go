package engine

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

type claimHook struct {
	*coord.Node
	mu     sync.Mutex
	normal int
	hook   func(n int, c coord.Claim)
}

func (h *claimHook) Claim(ctx context.Context, c coord.Claim) (*coord.Grant, error) {
	if c.Source == keyspace.SourceNormal {
		h.mu.Lock()
		h.normal++
		n := h.normal
		h.mu.Unlock()
		h.hook(n, c)
	}
	g, err := h.Node.Claim(ctx, c)
	if err != nil {
		h.hook(-1, c)
	}
	return g, err
}

// A reshard that leaves this instance's item where it was, landing between
// a fire's read and its claim, makes the claim fail on the map revision.
// The fire is decided again and runs (it was once dropped).
func TestClaimLostToUnchangedReshardIsRetried(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	path := filepath.Join(t.TempDir(), "ledger")
	script := `sh -c '` + strings.ReplaceAll(ledgerTo(path), "$1", "start") + `'`
	yaml := "jobs:\n  - name: j\n    cron: \"@every 4s\"\n    script: " + etcdtest.YAMLQuote(script) + "\n"
	direct := srv.Client()
	var lost time.Time
	var lostMu sync.Mutex
	h := &claimHook{}
	h.hook = func(n int, c coord.Claim) {
		if n == -1 {
			t.Logf("claim of fire %s lost", c.Fire.UTC())
			return
		}
		if n != 2 {
			return
		}
		lostMu.Lock()
		lost = c.Fire
		lostMu.Unlock()
		memberOnly(t, srv, "z", yaml) // joins; "a" keeps item 0
		for i := 0; i < 300; i++ {
			resp, err := direct.Get(context.Background(), keyspace.NewKeys("").Shards("j"))
			if err == nil && len(resp.Kvs) == 1 && resp.Kvs[0].ModRevision != c.MapRev {
				t.Logf("map rewritten (rev %d -> %d): %s", c.MapRev, resp.Kvs[0].ModRevision, resp.Kvs[0].Value)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	instanceWith(t, srv.Client(), "a", yaml, func(o *Options) { h.Node = o.Node.(*coord.Node); o.Node = h })
	etcdtest.Eventually(t, 40*time.Second, "two fires after the reshard", func() bool {
		lostMu.Lock()
		defer lostMu.Unlock()
		if lost.IsZero() {
			return false
		}
		for _, ev := range events(t, path) {
			if ev.Fire.After(lost.Add(5 * time.Second)) {
				return true
			}
		}
		return false
	})
	ran := false
	for _, ev := range events(t, path) {
		t.Logf("run: fire %s on %s source %s", ev.Fire.UTC(), ev.Instance, ev.Source)
		if ev.Fire.Equal(lost) {
			ran = true
		}
	}
	recs, _ := admin.New(direct, keyspace.NewKeys("")).Records(context.Background(), "j")
	for _, r := range recs {
		t.Logf("history: fire %s %s source %s skipped %d on %s", r.Fire.UTC(), r.State, r.Source, r.Skipped, r.Instance)
	}
	if !ran {
		t.Errorf("fire %s was never run (misfire: true, no failure; the owner kept the item)", lost.UTC())
	}
}
