package engine

import (
	"context"
	"slices"
	"time"

	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/shard"
)

// routeStep is how long each instance waits after the one ranked before it
// at a runtime route's fire before it claims the items itself.
const routeStep = 250 * time.Millisecond

// routeOrder ranks the eligible instances for a runtime route (XXL-JOB's):
//
//	FAILOVER  in order: the first healthy instance runs; an instance that
//	          does not claim in its turn (dead, stuck, partitioned) is passed over
//	BUSYOVER  in order, but a busy instance lets its turn pass
//	LFU       fewest executions in the job's recent history first
//	LRU       least recently started first (never started: first of all)
//
// Ties keep the instances' order. Every instance computes the same ranking
// from the same history; when two disagree (history read at different
// moments), the claim's guard still lets only one run each fire.
func routeOrder(route string, instances []string, history []coord.ItemRecord) []string {
	order := slices.Clone(instances)
	count := map[string]int{}
	last := map[string]time.Time{}
	for _, r := range history {
		if r.State == coord.StateSkipped {
			continue
		}
		count[r.Instance]++
		if r.Start.After(last[r.Instance]) {
			last[r.Instance] = r.Start
		}
	}
	switch route {
	case shard.LFU:
		slices.SortStableFunc(order, func(a, b string) int { return count[a] - count[b] })
	case shard.LRU:
		slices.SortStableFunc(order, func(a, b string) int { return last[a].Compare(last[b]) })
	}
	return order
}

// route runs a runtime route's fire: this instance waits for its turn, then
// dispatches every item; the claims let only the first taker run them.
func (e *Engine) route(ctx context.Context, js *jobState, v coord.JobView, fire time.Time) {
	m := v.Map
	me := e.opts.Node.ID()
	if m == nil || m.Disabled || !slices.Contains(m.Instances, me) {
		return
	}
	var history []coord.ItemRecord
	if r := v.Job.Strategy; r == shard.LFU || r == shard.LRU {
		h, err := e.opts.Node.History(ctx, v.Job.Name)
		if err != nil {
			e.log.Warn("read history for the route", "job", v.Job.Name, "err", err)
		}
		history = h
	}
	rank := slices.Index(routeOrder(v.Job.Strategy, m.Instances, history), me)
	if rank > 0 && !sleepCtx(ctx, time.Duration(rank)*routeStep) {
		return
	}
	if v.Job.Strategy == shard.Busyover {
		js.mu.Lock()
		busy := len(js.busy) > 0
		js.mu.Unlock()
		if busy {
			e.log.Debug("busy: letting the next instance take the fire", "job", v.Job.Name, "fire", fire)
			return
		}
	}
	items := make([]int, v.Job.ShardingTotalCount)
	for i := range items {
		items[i] = i
	}
	e.dispatch(ctx, js, v, items, fire)
}
