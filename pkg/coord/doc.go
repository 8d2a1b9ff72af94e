// Package coord is the runtime that coordinates shardd instances through
// etcd: one session (lease) per instance, one elected leader per job, and
// one fenced shard map per job that every instance watches; the claims and
// outcomes of the items it runs.
//
// It and the operator client (package admin) are the only packages that
// import the etcd client, and neither imports the other; they read and
// write the keys and values of package keyspace, which builds every key
// name. docs/design.md describes the keyspace, the state machines and the
// guarantees for users and contributors.
//
// # Where things are
//
// One concept per file:
//
//   - node.go: Node, its Options and Run loop (the lifecycle below), the
//     job set (SetJobs), membership, Leave; session.go: the lease, its
//     keepalives and the fence.
//   - task.go: a job's task under a session (register, campaign, lead);
//     elect.go: waiting for the candidates ahead and checking a won
//     election; leader.go: the leader's reconcile that writes the shard map.
//   - definition.go: registering and following a job's definition
//     (jobs/<job>/config); views.go: JobView, following the map and config
//     keys, and OnChange, the calls that wake the engine when a map, a
//     running marker or a disabled marker changes.
//   - applied.go: the catalog of applied definitions (placement/<job>,
//     docs/applied.md): which applied jobs this instance runs, refuses
//     (and why) or is not selected for; mayRun, the one rule of whether
//     an instance may run a definition (its selector, its AcceptPolicy),
//     whose answer a JobView carries as Refusal.
//   - hub.go: the one watch and its subscribers; pacer.go: how many jobs
//     register at once.
//   - items.go: reading item records (ReadItems); itemcache.go: the cache
//     of them kept from the watch.
//   - claim.go: claims (Claim, ClaimAll), the fenced Txn that writes a
//     RUNNING record and the running marker; outcome.go: every other
//     record write (Complete, Skip, Settle, Begin) and the run history
//     (History); completer.go: group commit of outcomes.
//   - trigger.go, kill.go, barrier.go, deps.go: manual triggers, kill
//     requests, the barriers of dependent jobs and the index of children.
//   - revisions.go: what the client saw of etcd's revisions (Revisions:
//     the answers that show history went back); rewind.go: recovering
//     from it.
//   - client.go: the etcd client (NewClient); clock.go, exposure.go,
//     diagnose.go: checks of clock skew, of etcd's exposure, of a failed
//     connection.
//
// The keys and stored values are in package keyspace; the ItemRecord doc
// comment there names every writer and reader of a record.
//
// # Instance lifecycle
//
// A Node is one instance. Its Run loop goes through these states:
//
//		connecting --grant lease, register--> up --fence--> fenced --etcd answers--> connecting
//		     ^  |                              |
//		     |  +-- name held by a live        +-- ctx cancelled (shutdown) --> leaving --> stopped
//		     |      instance: retry, give up
//		     +----- after 2 x TTL
//
//	  - connecting: grant a lease; revoke the previous lease if there was one
//	    (an old lease can come back after an outage, and its keys with it);
//	    create instances/<id> with the lease in a Txn that fails if the key
//	    exists (two live processes may not share an id); for every local
//	    job, register its definition (below), then put jobs/<job>/members/<id>.
//	  - up: keepalives every TTL/3. The session knows the time it sent the last
//	    keepalive that etcd acknowledged; the lease cannot expire on the server
//	    before sent+TTL. At sent+TTL-margin with no newer acknowledgement the
//	    session fences itself: Fenced() closes, every leadership and every
//	    job task started under the session is stopped. It does not wait for the
//	    client's Session.Done(), which fires late.
//	  - fenced: keep no state; retry with backoff until etcd answers, then
//	    back to connecting with a fresh lease. A session loss never stops a job
//	    for good.
//	  - leaving (SIGTERM): stop the job tasks, resign leaderships, revoke the lease,
//	    so the other instances reshard at once instead of after the TTL.
//
// # Per-job leader
//
// Under each session, every local job has a task (task.go: plain data
// stepped by the node's scheduler, no goroutine while it waits) that
// registers it and campaigns on concurrency.Election's keys, jobs/<job>/leader/<lease>: the oldest
// candidate key leads. A candidate waits for the keys ahead of it to go on
// the instance's one watch (elect.go), not on a watch of its own as
// concurrency.Election's Campaign would; the won election is a
// concurrency.Election (ResumeElection) from then on. A campaign may be
// won after the lease has expired (etcd #11051), so a won campaign is
// checked against the session and the election key before acting, and
// every leader write is a Txn whose If compares the election key's
// CreateRevision: a deposed leader's write fails, and the leader steps down.
//
// The leader's reconcile is level-triggered: read members, disabled markers,
// the registered config and the stored map at one revision; compute the
// desired map with the job's strategy over the eligible instances (members
// not disabled, sorted by id); write it with epoch+1 when it differs, guarded
// by the election key and the map's ModRevision. Changes of those keys only
// wake the reconcile (the task's next step); a step every
// reconcileIntervalMinutes bounds what a missed event could cost. A
// malformed stored map is logged and replaced.
//
// # Job definitions
//
// The cluster runs one registered definition per job, the value of
// jobs/<job>/config; every instance follows that key (followConfig) and
// runs what it says, whatever its own files say. An instance publishes its
// local definition when it registers the job and the definition is new to
// the cluster (publishDecision): the key is missing or malformed; this
// host's file changed since it last loaded the job (jobs/<job>/loaded/<id>
// names another definition) into one the cluster never superseded, or back
// to a superseded one while the cluster has not moved on since (a
// rollback); a host with no such record brings a definition the registered
// one did not supersede; or the job says overwrite: true and this process
// has not registered it before. Otherwise the host is behind: it runs the
// registered definition and reports a conflict. A registered definition
// this version cannot read (a newer shardd wrote it) is kept, never
// replaced; the host runs its last good one and reports a conflict. The
// config key's ModRevision is the definition's generation.
//
// # Views and the watches
//
// Every instance, leader or not, follows every local job's shard map and
// keeps the last good one: non-leaders never wait for a leader, they act on
// the last published map.
//
// An instance holds one etcd watch on the jobs keyspace (hub.go), whatever
// the number of jobs, and routes its events to per-job subscribers: map
// and definition views, leaders' reconcile wake-ups, item changes, manual
// triggers. Subscribers subscribe first and read second, which the hub's
// ordering makes complete; when the watch resumes at a compacted revision
// every subscriber re-reads. The watch uses WithRequireLeader. One watch
// per job and purpose, as an earlier version had, put ~40,000 watchers per
// instance on etcd for 10,000 jobs; campaigns waiting with
// concurrency.Election's Campaign put one more per job on every instance
// that did not lead it. Besides it, an instance watches the instances/
// prefix to log joins and leaves: two watchers per instance, whatever the
// number of jobs (TestWatchersDoNotGrowWithJobs).
//
// # Failure cases
//
//   - instance crash: its lease expires after at most TTL; the member keys go;
//     leaders reshard. Graceful stop: the lease is revoked, resharding is
//     immediate.
//   - leader crash or pause: its election key goes with the lease; the next
//     campaigner leads. A paused leader that wakes up cannot write: its Txn
//     compares an election key that no longer exists.
//   - etcd unreachable or black-holed: keepalives stop being acknowledged,
//     the instance fences itself before its lease can expire on the server,
//     then reconnects with a new lease.
//   - etcd restart: leases are refreshed to full TTL by the new server; the
//     instance keeps its session if keepalives resume in time, else it fences
//     and re-registers.
//   - etcd going back in time (a snapshot restored, the data wiped, another
//     cluster): Revisions refuses every answer once one shows it, the session
//     fences, and Run recovers before the next session (rewind.go).
//   - malformed values in the shard map or config keys: logged with the key;
//     the leader rewrites the map, a malformed config is replaced by the
//     local definition; followers keep the last good definition meanwhile.
package coord
