package admin

import (
	"fmt"
	"testing"
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
