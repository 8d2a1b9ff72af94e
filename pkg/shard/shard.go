// Package shard holds shardd's sharding strategies: pure functions that decide
// which instance owns which item of a job.
//
// A strategy is a deterministic function of its Input: the eligible instances in
// a given order, the job name, the number of items and, for the strategies that
// rotate per fire, the fire. It does no I/O, reads no clock and keeps no state,
// so every instance that computes it from the same Input gets the same answer.
//
// Instance order is part of the input. shardd's leader passes the eligible
// instances sorted by instance id (byte-wise ascending); `shardd plan` passes
// them in the order the user gave. ElasticJob's strategies are reproduced
// exactly for the same order and job name.
//
// The strategies:
//
//	AVG_ALLOCATION   ElasticJob's default: contiguous blocks, remainder to the first instances
//	ODEVITY          ElasticJob: AVG_ALLOCATION, instances reversed when the job's Java hashCode is even
//	ROUND_ROBIN      ElasticJob: AVG_ALLOCATION on instances rotated by |hashCode| mod n
//	CONSISTENT_HASH  rendezvous hashing: a join or leave moves only about total/n items
//	FIRST, LAST      XXL-JOB routes: every item to the first / last instance
//	ROUND            XXL-JOB route: every item to one instance, rotating by fire sequence
//	RANDOM           XXL-JOB route: every item to one instance picked by a hash of the fire time
//	BROADCAST        XXL-JOB sharding broadcast: one item per instance, item i on instance i
//	FAILOVER, BUSYOVER, LFU, LRU
//	                 XXL-JOB routes decided at run time, from state a pure function
//	                 does not have (health, idleness, execution counts): Runtime
//	                 reports them, and Assign previews them as FIRST. The engine
//	                 ranks the instances at each fire (see package engine).
package shard

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Strategy names as they appear in job configuration.
const (
	AvgAllocation  = "AVG_ALLOCATION"
	Odevity        = "ODEVITY"
	RoundRobin     = "ROUND_ROBIN"
	ConsistentHash = "CONSISTENT_HASH"
	First          = "FIRST"
	Last           = "LAST"
	Round          = "ROUND"
	Random         = "RANDOM"
	Broadcast      = "BROADCAST"

	// Runtime routes: decided by the engine at each fire.
	LFU      = "LFU"
	LRU      = "LRU"
	Failover = "FAILOVER"
	Busyover = "BUSYOVER"
)

// Default is the strategy of a job of several items that names none:
// ElasticJob's default.
const Default = AvgAllocation

// DefaultFor is the strategy of a job of total items that names none:
// AVG_ALLOCATION for several items; ROUND_ROBIN for one, so that a fleet of
// one-item jobs spreads over the instances by the jobs' names, rather than
// AVG_ALLOCATION's piling every one on the first instance.
func DefaultFor(total int) string {
	if total == 1 {
		return RoundRobin
	}
	return Default
}

// ErrUnknown is returned by Lookup for a name that is no strategy.
var ErrUnknown = errors.New("shard: unknown strategy")

// Fire identifies one scheduled run for the strategies that vary per fire.
type Fire struct {
	// Time is the scheduled fire time; RANDOM hashes it.
	Time time.Time
	// Seq is the fire's sequence number: it grows by one per fire and is the
	// same on every instance. ROUND rotates by it.
	Seq int64
}

// Input is everything a strategy decides from.
type Input struct {
	// Instances are the eligible instances, in order. They must be unique and non-empty strings.
	Instances []string
	// Job is the job name.
	Job string
	// Total is the job's shardingTotalCount, >= 1. BROADCAST ignores it.
	Total int
	// Fire is used only by strategies whose PerFire is true.
	Fire Fire
}

// Strategy is one named sharding strategy.
type Strategy struct {
	name    string
	perFire bool
	runtime bool
	assign  func(in Input) []int
}

// Runtime reports whether the owner is decided at run time by the engine
// (FAILOVER, BUSYOVER, LFU, LRU); Assign then previews it as FIRST.
func (s Strategy) Runtime() bool { return s.runtime }

// Name returns the strategy's configuration name.
func (s Strategy) Name() string { return s.name }

// PerFire reports whether the assignment depends on the fire, so that it must
// be computed again for every fire from the instance list.
func (s Strategy) PerFire() bool { return s.perFire }

// Assign computes the assignment for in. It fails only for invalid input:
// a total below 1, or an empty or duplicate instance name. With no instances
// the assignment has no owners.
func (s Strategy) Assign(in Input) (Assignment, error) {
	if err := in.validate(); err != nil {
		return Assignment{}, fmt.Errorf("%s: %w", s.name, err)
	}
	if len(in.Instances) == 0 {
		total := in.Total
		if s.name == Broadcast {
			total = 0
		}
		owners := make([]int, total)
		for i := range owners {
			owners[i] = -1
		}
		return Assignment{instances: in.Instances, owners: owners}, nil
	}
	return Assignment{instances: in.Instances, owners: s.assign(in)}, nil
}

func (in Input) validate() error {
	if in.Total < 1 {
		return fmt.Errorf("total must be >= 1, got %d", in.Total)
	}
	seen := make(map[string]bool, len(in.Instances))
	for _, id := range in.Instances {
		if id == "" {
			return errors.New("empty instance name")
		}
		if seen[id] {
			return fmt.Errorf("instance %q given twice", id)
		}
		seen[id] = true
	}
	return nil
}

var strategies = map[string]Strategy{
	AvgAllocation:  {name: AvgAllocation, assign: func(in Input) []int { return avgAllocation(identity(len(in.Instances)), in.Total) }},
	Odevity:        {name: Odevity, assign: odevity},
	RoundRobin:     {name: RoundRobin, assign: roundRobin},
	ConsistentHash: {name: ConsistentHash, assign: consistentHash},
	First:          {name: First, assign: func(in Input) []int { return single(0, in.Total) }},
	Last:           {name: Last, assign: func(in Input) []int { return single(len(in.Instances)-1, in.Total) }},
	Round:          {name: Round, perFire: true, assign: round},
	Random:         {name: Random, perFire: true, assign: random},
	Broadcast:      {name: Broadcast, assign: func(in Input) []int { return identity(len(in.Instances)) }},
	Failover:       {name: Failover, perFire: true, runtime: true, assign: firstAll},
	Busyover:       {name: Busyover, perFire: true, runtime: true, assign: firstAll},
	LFU:            {name: LFU, perFire: true, runtime: true, assign: firstAll},
	LRU:            {name: LRU, perFire: true, runtime: true, assign: firstAll},
}

func firstAll(in Input) []int { return single(0, in.Total) }

// Lookup returns the strategy called name (case-sensitive, as configured).
func Lookup(name string) (Strategy, error) {
	if s, ok := strategies[name]; ok {
		return s, nil
	}
	if s, ok := strategies[strings.ToUpper(name)]; ok {
		return Strategy{}, fmt.Errorf("%w: %q (did you mean %s?)", ErrUnknown, name, s.name)
	}
	// A unique prefix: AVG for AVG_ALLOCATION.
	var prefixed []string
	for _, n := range Names() {
		if len(name) >= 2 && strings.HasPrefix(n, strings.ToUpper(name)) {
			prefixed = append(prefixed, n)
		}
	}
	if len(prefixed) == 1 {
		return Strategy{}, fmt.Errorf("%w: %q (did you mean %s?)", ErrUnknown, name, prefixed[0])
	}
	return Strategy{}, fmt.Errorf("%w: %q (one of %s)", ErrUnknown, name, strings.Join(Names(), ", "))
}

// Names lists the implemented strategies, sorted.
func Names() []string {
	names := make([]string, 0, len(strategies))
	for n := range strategies {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Assignment is the outcome of a strategy: the owner of every item.
type Assignment struct {
	instances []string
	owners    []int // item -> index into instances, -1 for none
}

// Total is the number of items assigned. It equals Input.Total except for
// BROADCAST, where it is the number of instances.
func (a Assignment) Total() int { return len(a.owners) }

// Owner returns the instance that owns item, or "" when there is none.
func (a Assignment) Owner(item int) string {
	if item < 0 || item >= len(a.owners) || a.owners[item] < 0 {
		return ""
	}
	return a.instances[a.owners[item]]
}

// Owners returns, for every item in order, its owning instance ("" for none).
func (a Assignment) Owners() []string {
	out := make([]string, len(a.owners))
	for i := range a.owners {
		out[i] = a.Owner(i)
	}
	return out
}

// ByInstance returns each given instance's items in ascending order. Every
// instance of the input is a key, with an empty (non-nil) list when it owns
// nothing.
func (a Assignment) ByInstance() map[string][]int {
	out := make(map[string][]int, len(a.instances))
	for _, id := range a.instances {
		out[id] = []int{}
	}
	for item, idx := range a.owners {
		if idx >= 0 {
			id := a.instances[idx]
			out[id] = append(out[id], item)
		}
	}
	return out
}

// identity returns [0, 1, ..., n-1].
func identity(n int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	return order
}

// single gives all total items to the instance at index owner.
func single(owner, total int) []int {
	owners := make([]int, total)
	for i := range owners {
		owners[i] = owner
	}
	return owners
}

// avgAllocation is ElasticJob's AverageAllocationJobShardingStrategy over the
// instances listed by index in order: each gets total/n contiguous items, and
// the remaining total%n items go one each to the first instances.
func avgAllocation(order []int, total int) []int {
	n := len(order)
	per := total / n
	owners := make([]int, total)
	for pos, idx := range order {
		for item := pos * per; item < (pos+1)*per; item++ {
			owners[item] = idx
		}
	}
	for pos := 0; pos < total%n; pos++ {
		owners[per*n+pos] = order[pos]
	}
	return owners
}

// odevity is ElasticJob's OdevitySortByNameJobShardingStrategy: instances are
// reversed when the job name's Java hashCode is even.
func odevity(in Input) []int {
	order := identity(len(in.Instances))
	if JavaHashCode(in.Job)%2 == 0 {
		for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
			order[i], order[j] = order[j], order[i]
		}
	}
	return avgAllocation(order, in.Total)
}

// roundRobin is ElasticJob's RotateServerByNameJobShardingStrategy: the
// instance list is rotated left by Math.abs(hashCode) % n. Java's Math.abs
// leaves math.MinInt32 negative, which makes ElasticJob throw; here the
// offset is taken modulo n into [0, n) instead, the only change.
func roundRobin(in Input) []int {
	n := len(in.Instances)
	h := JavaHashCode(in.Job)
	if h < 0 {
		h = -h // math.MinInt32 stays negative, as in Java
	}
	offset := int(h) % n
	if offset < 0 {
		offset += n
	}
	order := make([]int, n)
	for i := range order {
		order[i] = (i + offset) % n
	}
	return avgAllocation(order, in.Total)
}

// round gives every item to one instance, rotating by the fire sequence
// number from a start that depends on the job name, so that jobs firing
// together do not all start on the same instance.
func round(in Input) []int {
	n := int64(len(in.Instances))
	start := int64(uint32(JavaHashCode(in.Job))) % n
	owner := (start + in.Fire.Seq%n + n) % n
	return single(int(owner), in.Total)
}

// random gives every item to one instance chosen by a hash of the job and the
// fire time, so every instance picks the same one without talking.
func random(in Input) []int {
	h := newHash().str(in.Job).u64(uint64(in.Fire.Time.UnixNano())).sum()
	return single(int(h%uint64(len(in.Instances))), in.Total)
}

// consistentHash is rendezvous (highest random weight) hashing: item i goes
// to the instance with the highest hash of (instance, job, i). When an
// instance leaves, exactly its items move; when one joins, only the items it
// now wins move to it, about total/(n+1) of them.
func consistentHash(in Input) []int {
	owners := make([]int, in.Total)
	seeds := make([]hash64, len(in.Instances))
	for i, id := range in.Instances {
		seeds[i] = newHash().str(in.Job).str(id)
	}
	for item := range owners {
		best, bestScore := 0, uint64(0)
		for i, seed := range seeds {
			score := seed.u64(uint64(item)).sum()
			// Ties (vanishingly rare) go to the smaller id, so the result
			// does not depend on instance order.
			if i == 0 || score > bestScore || score == bestScore && in.Instances[i] < in.Instances[best] {
				best, bestScore = i, score
			}
		}
		owners[item] = best
	}
	return owners
}

// Pick returns the candidate with the highest rendezvous hash for key ("" if
// there is none). Every caller with the same key and candidates, in any
// order, picks the same one; removing another candidate never changes the
// pick. shardd uses it to spread job leaderships over instances.
func Pick(key string, candidates []string) string {
	best, bestScore := "", uint64(0)
	for _, c := range candidates {
		score := newHash().str(key).str(c).sum()
		if best == "" || score > bestScore || score == bestScore && c < best {
			best, bestScore = c, score
		}
	}
	return best
}
