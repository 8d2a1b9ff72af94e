package shard

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

// checkAssignment verifies the invariants every strategy promises for in:
// every item has exactly one owner among the given instances, and computing
// the assignment again gives the same answer.
func checkAssignment(t testing.TB, s Strategy, in Input) Assignment {
	t.Helper()
	a, err := s.Assign(in)
	if err != nil {
		t.Fatalf("%s.Assign(%+v): %v", s.Name(), in, err)
	}
	wantTotal := in.Total
	if s.Name() == Broadcast {
		wantTotal = len(in.Instances)
	}
	if a.Total() != wantTotal {
		t.Fatalf("%s: %d items assigned, want %d", s.Name(), a.Total(), wantTotal)
	}
	given := map[string]bool{}
	for _, id := range in.Instances {
		given[id] = true
	}
	count := 0
	for id, items := range a.ByInstance() {
		if !given[id] {
			t.Fatalf("%s: owner %q was not given", s.Name(), id)
		}
		count += len(items)
		for _, item := range items {
			if a.Owner(item) != id {
				t.Fatalf("%s: item %d listed under %q but owned by %q", s.Name(), item, id, a.Owner(item))
			}
		}
	}
	if len(in.Instances) > 0 && count != wantTotal {
		t.Fatalf("%s: %d items listed, want %d", s.Name(), count, wantTotal)
	}
	again, _ := s.Assign(in)
	if !reflect.DeepEqual(a.Owners(), again.Owners()) {
		t.Fatalf("%s: not deterministic: %v then %v", s.Name(), a.Owners(), again.Owners())
	}
	switch s.Name() {
	case AvgAllocation, Odevity, RoundRobin:
		if len(in.Instances) == 0 {
			break
		}
		lo, hi := in.Total, 0
		for _, items := range a.ByInstance() {
			lo, hi = min(lo, len(items)), max(hi, len(items))
		}
		if hi-lo > 1 {
			t.Fatalf("%s: unbalanced: %d to %d items per instance", s.Name(), lo, hi)
		}
	}
	return a
}

func randomInput(r *rand.Rand) Input {
	n := r.IntN(12)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("node-%d-%d", i, r.IntN(1000))
	}
	job := make([]rune, r.IntN(20))
	for i := range job {
		job[i] = rune(r.IntN(0x2FFFF))
	}
	return Input{
		Instances: ids,
		Job:       string(job),
		Total:     1 + r.IntN(300),
		Fire:      Fire{Time: time.Unix(r.Int64N(1<<40), 0), Seq: r.Int64()},
	}
}

func TestStrategyInvariants(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 500; i++ {
		in := randomInput(r)
		for _, name := range Names() {
			checkAssignment(t, strategies[name], in)
		}
	}
}

func FuzzStrategies(f *testing.F) {
	f.Add("orders", uint8(3), uint16(10), int64(0), int64(0))
	f.Add("polygenelubricants", uint8(3), uint16(3), int64(-1), int64(-1))
	f.Add("", uint8(0), uint16(1), int64(7), int64(1700000000))
	f.Fuzz(func(t *testing.T, job string, n uint8, total uint16, seq, unix int64) {
		if total == 0 || total > 5000 {
			t.Skip()
		}
		in := Input{Instances: hosts(int(n % 64)), Job: job, Total: int(total), Fire: Fire{Time: time.Unix(unix, 0), Seq: seq}}
		for _, name := range Names() {
			checkAssignment(t, strategies[name], in)
		}
	})
}

// moved counts the items whose owner differs between a and b.
func moved(a, b Assignment) (n int, to, from map[string]int) {
	to, from = map[string]int{}, map[string]int{}
	for i := 0; i < a.Total(); i++ {
		if x, y := a.Owner(i), b.Owner(i); x != y {
			n++
			from[x]++
			to[y]++
		}
	}
	return n, to, from
}

func TestConsistentHashMovement(t *testing.T) {
	const total = 1200
	for n := 2; n <= 10; n++ {
		before := Input{Instances: hosts(n), Job: fmt.Sprintf("job-%d", n), Total: total}
		a := checkAssignment(t, strategies[ConsistentHash], before)

		// Join: only the newcomer gains items, about total/(n+1) of them.
		joined := before
		joined.Instances = append(hosts(n), "newcomer")
		b := checkAssignment(t, strategies[ConsistentHash], joined)
		count, to, _ := moved(a, b)
		if to["newcomer"] != count {
			t.Errorf("n=%d join: %d items moved, only %d to the newcomer (%v)", n, count, to["newcomer"], to)
		}
		if want := total / (n + 1); count < want/2 || count > want*3/2 {
			t.Errorf("n=%d join: %d items moved, want about %d", n, count, want)
		}

		// Leave: exactly the leaver's items move, about total/n of them.
		left := before
		left.Instances = hosts(n)[1:]
		c := checkAssignment(t, strategies[ConsistentHash], left)
		count, _, from := moved(a, c)
		if from["host0"] != count || count != len(a.ByInstance()["host0"]) {
			t.Errorf("n=%d leave: %d items moved, %d from the leaver, which owned %d", n, count, from["host0"], len(a.ByInstance()["host0"]))
		}
		if want := total / n; count < want/2 || count > want*3/2 {
			t.Errorf("n=%d leave: %d items moved, want about %d", n, count, want)
		}
	}
}

func TestConsistentHashIgnoresOrder(t *testing.T) {
	in := Input{Instances: []string{"c", "a", "b", "d"}, Job: "orders", Total: 100}
	a := checkAssignment(t, strategies[ConsistentHash], in)
	in.Instances = []string{"d", "b", "a", "c"}
	b := checkAssignment(t, strategies[ConsistentHash], in)
	if !reflect.DeepEqual(a.Owners(), b.Owners()) {
		t.Errorf("order changed the map:\n%v\n%v", a.Owners(), b.Owners())
	}
}

func FuzzConsistentHashMovement(f *testing.F) {
	f.Add("orders", uint8(3), uint16(100), uint8(1))
	f.Fuzz(func(t *testing.T, job string, n uint8, total uint16, leaver uint8) {
		if n < 2 || n > 32 || total == 0 || total > 2000 {
			t.Skip()
		}
		all := hosts(int(n))
		gone := all[int(leaver)%len(all)]
		var rest []string
		for _, h := range all {
			if h != gone {
				rest = append(rest, h)
			}
		}
		a := checkAssignment(t, strategies[ConsistentHash], Input{Instances: all, Job: job, Total: int(total)})
		b := checkAssignment(t, strategies[ConsistentHash], Input{Instances: rest, Job: job, Total: int(total)})
		count, _, from := moved(a, b)
		if from[gone] != count {
			t.Fatalf("leave of %s moved %d items, %d of them not its own", gone, count, count-from[gone])
		}
	})
}
