package keyspace

import "time"

// Trigger is a one-off run of a job requested by an operator, or by a
// parent's completed fire (Upstream).
type Trigger struct {
	ID string `json:"id"`
	// Items to run; empty runs every item.
	Items []int `json:"items,omitempty"`
	// Fire is the run's fire time: when it was requested.
	Fire time.Time `json:"fire"`
	// By names who asked: a token's name (API, console) or user@host (CLI).
	By string `json:"by,omitempty"`
	// Param is the operator's one-off parameter, given to the run as
	// SHARDD_TRIGGER_PARAMETER (and in SHARDD_CONTEXT).
	Param string `json:"param,omitempty"`
	// Rerun, when set, is a past scheduled fire to run again: the run's
	// fire is Rerun instead of the time it is served. It is still a MANUAL
	// run with a claim (and fence) of its own; it does not move the item's
	// watermark, so it is never taken for the original fire.
	Rerun time.Time `json:"rerun,omitzero"`
	// Upstream is set on a trigger a parent's completed fire put (no
	// lease: it stays until every item served it).
	Upstream *Upstream `json:"upstream,omitempty"`
	// NoPropagate: the runs of this trigger do not trigger the job's
	// children.
	NoPropagate bool `json:"noPropagate,omitempty"`
	// Rev is the etcd revision that created the request: the identity of
	// the manual fire, ordered cluster-wide without trusting any host's
	// clock (Fire is only the requester's note of when it asked).
	Rev int64 `json:"-"`
	// ModRev is the revision of the key's last change (triggers are not
	// rewritten: its creation), by which a read and events fold together.
	ModRev int64 `json:"-"`
}

// TriggerEvent is a change of one of a job's trigger keys.
type TriggerEvent struct {
	// ID is the trigger's key's last segment.
	ID string
	// Trigger is the trigger put; nil when the key was deleted (served,
	// dropped, or its lease ended).
	Trigger *Trigger
	// Rev is the revision of the change.
	Rev int64
}
