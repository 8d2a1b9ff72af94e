package admin

import (
	"context"
	"fmt"
	"testing"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Status links each parent to its children, and says so when a parent is
// not defined anywhere.
func TestLinkChildren(t *testing.T) {
	jobs := []JobStatus{
		{Name: "extract"},
		{Name: "load", DependsOn: []string{"extract"}},
		{Name: "report", DependsOn: []string{"load", "gone"}},
	}
	linkChildren(jobs)
	if got := fmt.Sprint(jobs[0].Children, jobs[1].Children, jobs[2].Children); got != "[load] [report] []" {
		t.Errorf("children = %s, want [load] [report] []", got)
	}
	if len(jobs[2].Problems) != 1 || jobs[2].Problems[0] != "depends on job gone, which no instance defines: it never fires from it" {
		t.Errorf("report's problems = %q", jobs[2].Problems)
	}
	if len(jobs[0].Problems)+len(jobs[1].Problems) != 0 {
		t.Errorf("problems where there are none: %q %q", jobs[0].Problems, jobs[1].Problems)
	}
}

// FollowMaps hands over every version of every job's map, in order, from
// the revision asked, and skips the other keys of the jobs.
func TestFollowMapsSeesEveryVersion(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	puts := []struct{ job, val string }{
		{"a", `{"epoch":1,"instances":["x"]}`},
		{"b", `{"epoch":1,"instances":["x"]}`},
		{"a", `{"epoch":2,"instances":["x","y"]}`},
	}
	for _, p := range puts {
		if _, err := cli.Put(ctx, keys.Shards(p.job), p.val); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, keys.Config(p.job), "{}"); err != nil { // not a map: skipped
			t.Fatal(err)
		}
	}
	if _, err := cli.Delete(ctx, keys.Shards("b")); err != nil {
		t.Fatal(err)
	}
	var got []string
	err := New(cli, keys).FollowMaps(ctx, 1, func(job string, m *keyspace.ShardMap) bool {
		if m == nil {
			got = append(got, job+" deleted")
		} else {
			got = append(got, fmt.Sprintf("%s %d %v", job, m.Epoch, m.Instances))
		}
		return len(got) < 4
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "[a 1 [x] b 1 [x] a 2 [x y] b deleted]"; fmt.Sprint(got) != want {
		t.Errorf("followed %v, want %s", got, want)
	}
}
