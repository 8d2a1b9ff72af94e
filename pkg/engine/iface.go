package engine

import (
	"context"
	"time"

	"github.com/shardd/shardd/pkg/coord"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// The engine's view of coord.Node, in small interfaces, each what one part
// of the engine needs: the instance (every part), reading items (the
// reconcile), claims and outcomes (a run), the records of fires that do
// not run (the reconcile), kill requests (kill.go), triggers
// (triggers.go), barriers (deps.go), and what wakes a job's loop.
// coord.Node implements them all; tests use an in-memory fake.

// Instance is this instance in the cluster.
type Instance interface {
	ID() string
	// Jobs are the local jobs; View what the instance knows of one.
	Jobs() []string
	View(job string) (coord.JobView, bool)
	// Session is cancelled when the current session ends; false: none.
	Session() (context.Context, bool)
	// FenceDeadline is when the session fences itself unless etcd
	// acknowledges another keepalive; false: no session.
	FenceDeadline() (time.Time, bool)
}

// ItemReader reads the state of a job's items in etcd, and their history
// (a runtime route's order).
type ItemReader interface {
	ReadItems(ctx context.Context, job string) (keyspace.JobItems, error)
	History(ctx context.Context, job string) ([]keyspace.ItemRecord, error)
}

// Claims claims items for their runs (or adopts a claim of this session
// that applied late) and records the runs' outcomes.
type Claims interface {
	Claim(ctx context.Context, c coord.Claim) (*coord.Grant, error)
	// ClaimAll makes claims of one job together (coord.Node.ClaimAll).
	ClaimAll(ctx context.Context, claims []coord.Claim) []coord.ClaimResult
	Adopt(ctx context.Context, job string, item int, st keyspace.ItemState) (*coord.Grant, error)
	Complete(ctx context.Context, g *coord.Grant, o coord.Outcome) error
}

// Records writes the item records a reconcile decides on without a run:
// their beginning, fires skipped by a policy, and a run cut by a failure
// that is not run again.
type Records interface {
	Begin(ctx context.Context, job string, items []int, sched time.Time, mapRev int64) error
	Skip(ctx context.Context, s coord.Skip) error
	Settle(ctx context.Context, job string, item int, st keyspace.ItemState) error
}

// KillRequests are the operators' kill requests of a job still in etcd;
// SettleKilled records a cut run one of them named as killed.
type KillRequests interface {
	Kills(ctx context.Context, job string) (map[keyspace.KillKey]keyspace.KillBy, error)
	SettleKilled(ctx context.Context, job string, item int, st keyspace.ItemState, k keyspace.KillBy) error
	// Replace asks for the run of item with fence to be stopped for a
	// newer fire (overlap replace; coord.Node.Replace).
	Replace(ctx context.Context, job string, item int, fence int64, instance string, fire time.Time) (bool, error)
}

// ClusterSlots are a job's cluster-wide slots (clusterConcurrency; see
// coord/slots.go): which are held, which items wait for one; Wait records
// an item waiting, Unwait deletes a waiting key still at the revision read.
type ClusterSlots interface {
	ReadClusterSlots(ctx context.Context, job string) (coord.ClusterSlots, error)
	Wait(ctx context.Context, job string, item int, since time.Time) error
	Unwait(ctx context.Context, job string, item int, rev int64) error
}

// Triggers reads a job's waiting triggers; DeleteTrigger deletes one no
// item is left to serve, if etcd says so still (its guard).
type Triggers interface {
	ReadTriggers(ctx context.Context, job string) ([]keyspace.Trigger, error)
	DeleteTrigger(ctx context.Context, job string, tr keyspace.Trigger, g coord.TriggerGuard) (bool, error)
}

// Barriers notes an item's final record in its fire's barrier; the
// completing note triggers the job's children (coord/deps.go).
type Barriers interface {
	NoteOutcome(ctx context.Context, job string, total int, rec keyspace.ItemRecord, children keyspace.ParentsOf) (keyspace.Barrier, bool, error)
}

// Events delivers what wakes a job's loop. Callbacks must not block.
type Events interface {
	// OnChange: fn on a newer map, a running marker deleted, an item
	// disabled or enabled, or events possibly lost; own on a running
	// marker put under this instance's session.
	OnChange(job string, fn func(), own func(item int)) (cancel func())
	// OnTrigger: a trigger key put or deleted; lost: the watch may have
	// lost some.
	OnTrigger(job string, fn func(keyspace.TriggerEvent), lost func()) (cancel func())
	OnKill(job string, fn func(keyspace.Kill)) (cancel func())
}

// Node is everything the engine needs of coord.Node.
type Node interface {
	Instance
	ItemReader
	Claims
	Records
	KillRequests
	ClusterSlots
	Triggers
	Barriers
	Events
}

var _ Node = (*coord.Node)(nil)
