package coord

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// The completer's flusher is a caller of Complete: it writes other runs'
// outcomes until none is pending, long after its own outcome landed. Under
// a steady stream of completions (many jobs ending), its caller (a run's
// goroutine, which holds its item "running" and its concurrency slots)
// does not return.
func TestCompleteIsNotHeldByOthersOutcomes(t *testing.T) {
	t.Parallel()
	n := ordersNode(t, 1)
	ctx := context.Background()
	var c completer
	rec := func(item int) keyspace.ItemRecord {
		return keyspace.ItemRecord{Job: "orders", Item: item, State: keyspace.StateDone, Instance: "a", Attempt: 1, End: time.Now().UTC()}
	}
	// More than completionsPerTxn outcomes always pending, for 3 s.
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	var item atomic.Int64
	item.Store(1000)
	mine := make(chan time.Duration, 1)
	var ownLanded atomic.Int64
	wg.Add(1)
	go func() { // the first to come: it becomes the flusher
		defer wg.Done()
		begun := time.Now()
		go func() {
			for time.Since(begun) < 10*time.Second {
				r, err := n.cli.Get(ctx, n.keys.Item("orders", 0))
				if err == nil && len(r.Kvs) > 0 {
					ownLanded.Store(int64(time.Since(begun)))
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
		if err := c.do(ctx, n.Node, rec(0), 0); err != nil && !errors.Is(err, ErrClaimLost) {
			t.Errorf("own outcome: %v", err)
		}
		mine <- time.Since(begun)
	}()
	time.Sleep(time.Millisecond)
	for range 200 { // 200 runs ending, each followed by its item's next run
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				c.do(ctx, n.Node, rec(int(item.Add(1))), 0)
			}
		}()
	}
	took := <-mine
	wg.Wait()
	t.Logf("own outcome in etcd after %s; Complete returned after %s", time.Duration(ownLanded.Load()), took)
	if took > time.Second {
		t.Errorf("the flusher's Complete returned after %s (its own outcome landed after %s): its run was held by others' outcomes",
			took, time.Duration(ownLanded.Load()))
	}
}
