package keyspace

import (
	"time"

	"github.com/shardd/shardd/pkg/config"
)

// Upstream is where an upstream trigger comes from: a completed fire of
// a parent job.
type Upstream struct {
	// Job is the parent whose fire completed; Fire its fire's key
	// (FireKey), FireTime its time (for a manual fire, the completing
	// item's start of it).
	Job      string    `json:"job"`
	Fire     string    `json:"fire"`
	FireTime time.Time `json:"fireTime"`
	// Failed, when set, says why the parent fire does not trigger the
	// child: an item of it failed or was skipped. The child's items record
	// it (SKIPPED, reason upstream-failed) instead of running.
	Failed string `json:"failed,omitempty"`
	// Parents are, for a child of several parents, the fire of each that
	// this trigger consumed.
	Parents map[string]string `json:"parents,omitempty"`
}

// ParentsOf is the children index of a job: each child with all its
// parents and since when it depends on the job.
type ParentsOf map[string]ChildEntry

// ChildEntry is one child in a job's children index.
type ChildEntry struct {
	Parents []string `json:"parents"`
	// Since is when the child began to depend on the job: fires of the
	// job before it do not trigger the child (a child deployed today does
	// not run for yesterday's fire).
	Since time.Time `json:"since"`
}

// MaxChildren bounds a job's children: a completing note puts a trigger
// for each in one Txn, within etcd's default limit of 128 operations.
const MaxChildren = config.MaxChildren

// BarrierKeep is how long fires' barriers are kept: each note deletes
// older ones (oldBarriers).
const BarrierKeep = 24 * time.Hour

// UpstreamTriggerID names the trigger a child gets from parent's fire.
func UpstreamTriggerID(parent, fire string) string { return "u" + fire + "-" + parent }
