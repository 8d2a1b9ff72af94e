package shard_test

import (
	"fmt"

	"github.com/shardd/shardd/pkg/shard"
)

func ExampleStrategy_Assign() {
	s, err := shard.Lookup(shard.AvgAllocation)
	if err != nil {
		panic(err)
	}
	a, err := s.Assign(shard.Input{Instances: []string{"host0", "host1", "host2"}, Job: "orders", Total: 8})
	if err != nil {
		panic(err)
	}
	for _, id := range []string{"host0", "host1", "host2"} {
		fmt.Println(id, a.ByInstance()[id])
	}
	// Output:
	// host0 [0 1 6]
	// host1 [2 3 7]
	// host2 [4 5]
}
