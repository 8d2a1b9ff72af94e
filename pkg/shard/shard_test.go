package shard

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func hosts(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("host%d", i)
	}
	return out
}

func mustAssign(t testing.TB, name string, in Input) Assignment {
	t.Helper()
	s, err := Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.Assign(in)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestJavaHashCode(t *testing.T) {
	tests := []struct {
		in   string
		want int32
	}{
		{"", 0},
		{"a", 97},
		{"hello", 99162322},
		{"Hello World", -862545276},
		{"Aa", 2112},
		{"BB", 2112},
		{"polygenelubricants", math.MinInt32}, // Math.abs overflows in Java
		{"中文", 646394},
		{"😀", 1772899}, // surrogate pair D83D DE00
	}
	for _, tt := range tests {
		if got := JavaHashCode(tt.in); got != tt.want {
			t.Errorf("JavaHashCode(%q) = %d, want %d", tt.in, got, tt.want)
		}
	}
}

// ElasticJob's published examples and its own unit tests, plus edge cases.
func TestStrategies(t *testing.T) {
	tests := []struct {
		strategy  string
		job       string
		instances []string
		total     int
		fire      Fire
		want      map[string][]int
	}{
		// AverageAllocationJobShardingStrategy javadoc.
		{AvgAllocation, "any", hosts(3), 9, Fire{}, map[string][]int{"host0": {0, 1, 2}, "host1": {3, 4, 5}, "host2": {6, 7, 8}}},
		{AvgAllocation, "any", hosts(3), 8, Fire{}, map[string][]int{"host0": {0, 1, 6}, "host1": {2, 3, 7}, "host2": {4, 5}}},
		{AvgAllocation, "any", hosts(3), 10, Fire{}, map[string][]int{"host0": {0, 1, 2, 9}, "host1": {3, 4, 5}, "host2": {6, 7, 8}}},
		{AvgAllocation, "any", hosts(1), 4, Fire{}, map[string][]int{"host0": {0, 1, 2, 3}}},
		{AvgAllocation, "any", hosts(4), 2, Fire{}, map[string][]int{"host0": {0}, "host1": {1}, "host2": {}, "host3": {}}},
		{AvgAllocation, "any", nil, 3, Fire{}, map[string][]int{}},
		// OdevitySortByNameJobShardingStrategy javadoc: 3 servers, 2 items.
		// "1" has hashCode 49 (odd): ascending.
		{Odevity, "1", hosts(3), 2, Fire{}, map[string][]int{"host0": {0}, "host1": {1}, "host2": {}}},
		// "0" has hashCode 48 (even): descending.
		{Odevity, "0", hosts(3), 2, Fire{}, map[string][]int{"host2": {0}, "host1": {1}, "host0": {}}},
		// Negative even hash: "Hello World" = -862545276, descending.
		{Odevity, "Hello World", hosts(3), 4, Fire{}, map[string][]int{"host2": {0, 3}, "host1": {1}, "host0": {2}}},
		{Odevity, "polygenelubricants", hosts(2), 3, Fire{}, map[string][]int{"host1": {0, 2}, "host0": {1}}},
		// RotateServerByNameJobShardingStrategy: offset = |hash| % n.
		// "hello" = 99162322, % 3 = 1: order host1, host2, host0.
		{RoundRobin, "hello", hosts(3), 9, Fire{}, map[string][]int{"host1": {0, 1, 2}, "host2": {3, 4, 5}, "host0": {6, 7, 8}}},
		// "Hello World" = -862545276, |.| % 3 = 0: unrotated.
		{RoundRobin, "Hello World", hosts(3), 8, Fire{}, map[string][]int{"host0": {0, 1, 6}, "host1": {2, 3, 7}, "host2": {4, 5}}},
		// "Hello World" |.| % 5 = 1.
		{RoundRobin, "Hello World", hosts(5), 5, Fire{}, map[string][]int{"host1": {0}, "host2": {1}, "host3": {2}, "host4": {3}, "host0": {4}}},
		// MinInt32: Java's Math.abs stays negative, -2147483648 % 3 = -2; shardd uses 1.
		{RoundRobin, "polygenelubricants", hosts(3), 3, Fire{}, map[string][]int{"host1": {0}, "host2": {1}, "host0": {2}}},
		{RoundRobin, "中文", hosts(4), 4, Fire{}, map[string][]int{"host2": {0}, "host3": {1}, "host0": {2}, "host1": {3}}},
		// XXL-JOB routes.
		{First, "j", hosts(3), 2, Fire{}, map[string][]int{"host0": {0, 1}, "host1": {}, "host2": {}}},
		{Last, "j", hosts(3), 1, Fire{}, map[string][]int{"host0": {}, "host1": {}, "host2": {0}}},
		// "a" = 97, 97 % 3 = 1; seq 1 -> host2.
		{Round, "a", hosts(3), 1, Fire{Seq: 1}, map[string][]int{"host0": {}, "host1": {}, "host2": {0}}},
		{Round, "a", hosts(3), 1, Fire{Seq: 2}, map[string][]int{"host0": {0}, "host1": {}, "host2": {}}},
		{Round, "a", hosts(3), 1, Fire{Seq: -1}, map[string][]int{"host0": {0}, "host1": {}, "host2": {}}},
		{Broadcast, "j", hosts(3), 1, Fire{}, map[string][]int{"host0": {0}, "host1": {1}, "host2": {2}}},
		{Broadcast, "j", nil, 5, Fire{}, map[string][]int{}},
	}
	for _, tt := range tests {
		name := fmt.Sprintf("%s/%s/%d-of-%d/seq%d", tt.strategy, tt.job, tt.total, len(tt.instances), tt.fire.Seq)
		t.Run(name, func(t *testing.T) {
			a := mustAssign(t, tt.strategy, Input{Instances: tt.instances, Job: tt.job, Total: tt.total, Fire: tt.fire})
			if got := a.ByInstance(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestRoundRotatesEveryFire(t *testing.T) {
	in := Input{Instances: hosts(4), Job: "report", Total: 1}
	seen := map[string]int{}
	prev := ""
	for seq := int64(0); seq < 40; seq++ {
		in.Fire.Seq = seq
		owner := mustAssign(t, Round, in).Owner(0)
		if owner == prev {
			t.Fatalf("seq %d: owner %s repeated", seq, owner)
		}
		seen[owner]++
		prev = owner
	}
	for _, h := range hosts(4) {
		if seen[h] != 10 {
			t.Errorf("%s owned %d of 40 fires, want 10", h, seen[h])
		}
	}
}

func TestRandomSpreadsOverFires(t *testing.T) {
	in := Input{Instances: hosts(4), Job: "report", Total: 1}
	seen := map[string]int{}
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := 0; i < 4000; i++ {
		in.Fire.Time = base.Add(time.Duration(i) * time.Second)
		seen[mustAssign(t, Random, in).Owner(0)]++
	}
	for _, h := range hosts(4) {
		if seen[h] < 800 || seen[h] > 1200 {
			t.Errorf("%s owned %d of 4000 fires, want about 1000", h, seen[h])
		}
	}
}

func TestAssignRejectsBadInput(t *testing.T) {
	tests := []struct {
		in   Input
		want string
	}{
		{Input{Instances: hosts(2), Total: 0}, "total must be >= 1, got 0"},
		{Input{Instances: []string{"a", ""}, Total: 1}, "empty instance name"},
		{Input{Instances: []string{"a", "b", "a"}, Total: 1}, `instance "a" given twice`},
	}
	for _, tt := range tests {
		_, err := strategies[AvgAllocation].Assign(tt.in)
		if err == nil || err.Error() != "AVG_ALLOCATION: "+tt.want {
			t.Errorf("Assign(%+v) error = %v, want %q", tt.in, err, tt.want)
		}
	}
}

func TestLookup(t *testing.T) {
	for _, name := range Names() {
		if s, err := Lookup(name); err != nil || s.Name() != name {
			t.Errorf("Lookup(%q) = %v, %v", name, s.Name(), err)
		}
	}
	for _, name := range []string{LFU, LRU, Failover, Busyover} {
		if s, err := Lookup(name); err != nil || !s.Runtime() || !s.PerFire() {
			t.Errorf("Lookup(%q) = %+v, %v: want a runtime route", name, s, err)
		}
	}
	if _, err := Lookup("avg_allocation"); !errors.Is(err, ErrUnknown) || !strings.Contains(err.Error(), "did you mean AVG_ALLOCATION") {
		t.Errorf("Lookup(lower case) error = %v", err)
	}
	if _, err := Lookup("NOPE"); !errors.Is(err, ErrUnknown) {
		t.Errorf("Lookup(NOPE) error = %v", err)
	}
}

func TestPick(t *testing.T) {
	if Pick("job", nil) != "" {
		t.Error("Pick of no candidates")
	}
	counts := map[string]int{}
	for i := 0; i < 300; i++ {
		key := fmt.Sprintf("job-%d", i)
		p := Pick(key, []string{"a", "b", "c"})
		if q := Pick(key, []string{"c", "a", "b"}); q != p {
			t.Fatalf("order changed the pick: %s vs %s", p, q)
		}
		// Removing a candidate that was not picked keeps the pick.
		for _, gone := range []string{"a", "b", "c"} {
			if gone == p {
				continue
			}
			var rest []string
			for _, c := range []string{"a", "b", "c"} {
				if c != gone {
					rest = append(rest, c)
				}
			}
			if q := Pick(key, rest); q != p {
				t.Fatalf("%s: removing %s moved the pick from %s to %s", key, gone, p, q)
			}
		}
		counts[p]++
	}
	for _, c := range []string{"a", "b", "c"} {
		if counts[c] < 60 {
			t.Errorf("%s picked %d of 300 times", c, counts[c])
		}
	}
}

// Lookup's refusals suggest the strategy meant: another case, or the only
// name the given one begins.
func TestLookupSuggests(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"avg_allocation", "did you mean AVG_ALLOCATION?"},
		{"AVG", "did you mean AVG_ALLOCATION?"},
		{"avg", "did you mean AVG_ALLOCATION?"},
		{"ROUND", ""},     // a strategy of its own
		{"RO", "one of "}, // begins ROUND and ROUND_ROBIN
		{"NOPE", "one of "},
	} {
		_, err := Lookup(tc.name)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("Lookup(%q): %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("Lookup(%q) = %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}
