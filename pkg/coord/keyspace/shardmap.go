package keyspace

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// ShardMap is the value of a job's shards key: which instance owns which item.
type ShardMap struct {
	// Epoch grows by one with every write of the map; a malformed or deleted
	// map is replaced by one whose epoch is above any epoch before it.
	Epoch int64 `json:"epoch"`
	// Total is the number of items (for BROADCAST, the number of instances).
	Total    int    `json:"total"`
	Strategy string `json:"strategy"`
	// Instances are the eligible instances the map was computed from, sorted.
	Instances []string `json:"instances"`
	// Items lists each instance's items, ascending. Empty for per-fire
	// strategies (ROUND, RANDOM), whose owner every instance computes from
	// Instances at each fire.
	Items   map[string][]int `json:"items"`
	PerFire bool             `json:"perFire,omitempty"`
	// Disabled is set when the whole job is disabled; no instance runs it.
	Disabled bool `json:"disabled,omitempty"`
	// Leader is the instance that wrote the map; ConfigHash the job definition it used.
	Leader     string    `json:"leader"`
	ConfigHash string    `json:"configHash"`
	Written    time.Time `json:"written"`
}

// ItemsOf returns the items owned by id.
func (m *ShardMap) ItemsOf(id string) []int {
	if m == nil {
		return nil
	}
	return m.Items[id]
}

// Owner returns the instance owning item, or "".
func (m *ShardMap) Owner(item int) string {
	for id, items := range m.Items {
		if slices.Contains(items, item) {
			return id
		}
	}
	return ""
}

// SameAssignment reports whether m and o assign the same items to the same
// instances from the same inputs, ignoring epoch, writer and time.
func (m *ShardMap) SameAssignment(o *ShardMap) bool {
	if m.Total != o.Total || m.Strategy != o.Strategy || m.PerFire != o.PerFire || m.Disabled != o.Disabled ||
		m.ConfigHash != o.ConfigHash || !slices.Equal(m.Instances, o.Instances) || len(m.Items) != len(o.Items) {
		return false
	}
	for id, items := range m.Items {
		other, ok := o.Items[id]
		if !ok || !slices.Equal(items, other) {
			return false
		}
	}
	return true
}

// check reports what is wrong with a map decoded from etcd.
func (m *ShardMap) check() error {
	if m.Epoch < 1 {
		return fmt.Errorf("epoch %d < 1", m.Epoch)
	}
	if m.Total < 0 {
		return fmt.Errorf("total %d < 0", m.Total)
	}
	seen := make(map[int]bool, m.Total)
	for id, items := range m.Items {
		if !slices.Contains(m.Instances, id) {
			return fmt.Errorf("items of %q, which is not in instances", id)
		}
		for _, item := range items {
			if item < 0 || item >= m.Total || seen[item] {
				return fmt.Errorf("item %d of %q is out of range or owned twice", item, id)
			}
			seen[item] = true
		}
	}
	return nil
}

// DecodeShardMap parses and checks a shards value.
func DecodeShardMap(data []byte) (*ShardMap, error) {
	var m ShardMap
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("malformed shard map: %w", err)
	}
	if err := m.check(); err != nil {
		return nil, fmt.Errorf("malformed shard map: %w", err)
	}
	return &m, nil
}
