package coord

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
)

// The outcomes of a fire's items, noted at once from many nodes, all count;
// exactly one note completes the barrier; a repeated note changes nothing.
func TestBarrierCompletesOnce(t *testing.T) {
	srv := etcdtest.Start(t)
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
			state := StateDone
			if item == 5 {
				state = StateFailed
			}
			rec := ItemRecord{Job: "parent", Item: item, Fire: fire, State: state, Fence: int64(100 + item)}
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
	b, completed, err := nodes[0].NoteOutcome(context.Background(), "parent", total, ItemRecord{Item: 3, Fire: fire, State: StateDone, Fence: 999}, nil)
	if err != nil || completed || !b.Complete() || b.Succeeded() || len(b.Done) != total-1 || len(b.Failed) != 1 || b.Failed[0] != 5 {
		t.Errorf("barrier %+v (completed %v, %v): want complete, not succeeded, item 5 failed", b, completed, err)
	}
	// A manual fire of the same time has a barrier of its own.
	manual := ItemRecord{Item: 0, Fire: fire, State: StateDone, Fence: 500, FireKey: ManualFireKey(Trigger{Fire: fire, Rev: 77})}
	if b, _, err := nodes[1].NoteOutcome(context.Background(), "parent", total, manual, nil); err != nil || len(b.Done) != 1 {
		t.Errorf("manual fire's barrier %+v, %v: want its own, with one item", b, err)
	}
}
