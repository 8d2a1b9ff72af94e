package engine

import (
	"slices"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
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
func routeOrder(route string, instances []string, history []keyspace.ItemRecord) []string {
	order := slices.Clone(instances)
	count := map[string]int{}
	last := map[string]time.Time{}
	for _, r := range history {
		if r.State == keyspace.StateSkipped {
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
