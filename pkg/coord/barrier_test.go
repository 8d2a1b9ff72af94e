package coord

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// The outcomes of a fire's items, noted at once from many nodes, all count;
// exactly one note completes the barrier; a repeated note changes nothing.
func TestBarrierCompletesOnce(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	const total = 12
	fire := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	nodes := make([]*testNode, 3)
	for i := range nodes {
		nodes[i] = startNode(t, srv, string(rune('a'+i)), jobs(t, "jobs:\n"+job("parent", total)))
	}
	var mu sync.Mutex
	completions := 0
	var wg sync.WaitGroup
	for item := range total {
		wg.Add(1)
		go func() {
			defer wg.Done()
			state := keyspace.StateDone
			if item == 5 {
				state = keyspace.StateFailed
			}
			rec := keyspace.ItemRecord{Job: "parent", Item: item, Fire: fire, State: state, Fence: int64(100 + item)}
			_, completed, err := nodes[item%3].NoteOutcome(context.Background(), "parent", total, rec, nil)
			if err != nil {
				t.Error(err)
			}
			// The same note again (a retry after a lost reply): no change,
			// and only the completing note says it completed.
			_, again, err := nodes[item%3].NoteOutcome(context.Background(), "parent", total, rec, nil)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			if completed {
				completions++
			}
			if again != completed {
				t.Errorf("item %d: a repeated note says completed %v, the first %v", item, again, completed)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if completions != 1 {
		t.Fatalf("%d notes completed the barrier, want exactly 1", completions)
	}
	b, completed, err := nodes[0].NoteOutcome(context.Background(), "parent", total, keyspace.ItemRecord{Item: 3, Fire: fire, State: keyspace.StateDone, Fence: 999}, nil)
	if err != nil || completed || !b.Complete() || b.Succeeded() || len(b.Done) != total-1 || len(b.Failed) != 1 || b.Failed[0] != 5 {
		t.Errorf("barrier %+v (completed %v, %v): want complete, not succeeded, item 5 failed", b, completed, err)
	}
	// A manual fire of the same time has a barrier of its own.
	manual := keyspace.ItemRecord{Item: 0, Fire: fire, State: keyspace.StateDone, Fence: 500, FireKey: keyspace.ManualFireKey(keyspace.Trigger{Fire: fire, Rev: 77})}
	if b, _, err := nodes[1].NoteOutcome(context.Background(), "parent", total, manual, nil); err != nil || len(b.Done) != 1 {
		t.Errorf("manual fire's barrier %+v, %v: want its own, with one item", b, err)
	}
}

// Each note deletes the job's barriers older than BarrierKeep, scheduled
// and manual alike, and keeps the younger ones.
func TestOldBarriersAreDeleted(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	n := startNode(t, srv, "a", jobs(t, "jobs:\n"+job("parent", 2)))
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	now := time.Now()
	old, young := now.Add(-keyspace.BarrierKeep-time.Hour), now.Add(-keyspace.BarrierKeep+time.Hour)
	for _, k := range []string{
		keyspace.FireKey(&keyspace.ItemRecord{Fire: old}), keyspace.ManualFireKey(keyspace.Trigger{Fire: old, Rev: 9}),
		keyspace.FireKey(&keyspace.ItemRecord{Fire: young}), keyspace.ManualFireKey(keyspace.Trigger{Fire: young, Rev: 10}),
	} {
		if _, err := cli.Put(ctx, keys.Fire("parent", k), `{"total":2,"done":[0]}`); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := n.NoteOutcome(ctx, "parent", 2, keyspace.ItemRecord{Item: 0, Fire: now, State: keyspace.StateDone, Fence: 5}, nil); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, keys.Fires("parent"), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, kv := range resp.Kvs {
		got = append(got, strings.TrimPrefix(string(kv.Key), keys.Fires("parent")))
	}
	want := []string{keyspace.ManualFireKey(keyspace.Trigger{Fire: young, Rev: 10}), keyspace.FireKey(&keyspace.ItemRecord{Fire: young}), keyspace.FireKey(&keyspace.ItemRecord{Fire: now})}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("barriers after a note: %v, want %v (the two older than a day deleted)", got, want)
	}
}

// The children index's since is compared with when a fire happened: a
// manual fire's when it was asked for, whatever fire it re-runs.
func TestFireAskedOfAManualFireIsWhenItWasAskedFor(t *testing.T) {
	t.Parallel()
	asked := time.Date(2026, 12, 1, 10, 0, 0, 123e6, time.UTC)
	sched := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := keyspace.FireAsked(keyspace.ManualFireKey(keyspace.Trigger{Fire: asked, Rev: 4711}), sched); !got.Equal(asked) {
		t.Errorf("manual fire: %s, want %s", got, asked)
	}
	if got := keyspace.FireAsked(keyspace.FireKey(&keyspace.ItemRecord{Fire: sched}), sched); !got.Equal(sched) {
		t.Errorf("scheduled fire: %s, want %s", got, sched)
	}
}
