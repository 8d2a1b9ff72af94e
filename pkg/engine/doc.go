// Package engine runs the items an instance owns, on schedule, once each.
//
// It ties the job's schedule, coord's shard maps and fenced claims, and the
// runner together. Like the leader's map work, item work is
// level-triggered: each job's reconcile (job.go) makes what should be true
// of every item match what etcd says, whenever something may have changed,
// and never relies on having seen every event. The engine's scheduler
// (pkg/steps) runs the reconciles: one timer heap for all jobs, a worker
// per reconcile in progress and none per idle job, and a job's reconciles
// never overlap.
//
// The engine sees coord's runtime through small interfaces (iface.go), each
// what one part of it needs: Instance (its id, its jobs' views, its
// session), ItemReader, Claims (a run's claim and outcome), Records (the
// records of fires that do not run), KillRequests, Triggers, Barriers and
// Events (what wakes a job's loop); Node is all of them. *coord.Node
// implements Node, and so does the in-memory fake of the engine's tests.
//
// # The reconcile
//
// A job's reconcile runs when something may have changed what it should
// do (see What wakes a job, below). Each wake reads the job's items from etcd
// in one request and decides, per item, with decide (reconcile.go), a pure
// function of the item's record and marker, whether this process runs the
// item now, the job's policies and the time:
//
//	disabled, or a run of it in progress here        nothing
//	marker under this session, no run here            adopt: a claim whose reply was lost
//	                                                  applied late; run it under its fence
//	marker held by another (or an old) session        wait: its deletion wakes the loop
//	a won claim whose work never started              run that fire again, attempt+1
//	record cut by a failure, failover: true           re-run its fire at once, attempt+1 (FAILOVER)
//	RUNNING, no marker, failover: false               record it KILLED/lost: at most once
//	scheduled fires after the record's watermark      run the latest one (NORMAL on time, MISFIRE
//	                                                  late), the older ones counted as skipped;
//	                                                  or record them all SKIPPED (below)
//	a manual trigger newer than the record's          run it (MANUAL)
//	no record and nothing due                         begin the record: fires are due from now
//
// A record is cut by a failure when it says RUNNING and no marker exists
// (its instance died, paused past its lease, or was cut off), or KILLED at
// a shutdown or fence. The watermark is the latest scheduled fire the record
// accounts for; manual runs do not move it, so a trigger never hides a
// scheduled fire.
//
// Missed fires are all recorded, never silently dropped: the latest missed
// fire runs once (coalesced) unless it is older than the catch-up window
// (max(1 min, 3 x TTL)), or it came while the item's previous run was still
// going and the job says misfire: false; then every missed fire is recorded
// SKIPPED. Fires at or before the watermark never run again (G2), except a
// failover re-run.
//
// An item runs here only if this instance owns it for that fire in the
// shard map it acts on (per-fire strategies compute the owner of each fire;
// runtime routes rank the instances and give each a turn after the fire;
// a manual run of a per-fire strategy may be claimed by any member).
//
// Adoption is the one decision with no etcd guard of its own, so it is
// made only from a read that no run of this process overlapped, and
// coord.Adopt reads the item again. The runs of a job are the engine's, not
// its loop's: a job removed and added back while an item runs still knows
// the run.
//
// Triggers (triggers.go) are served from etcd, not from memory: each job
// loop keeps the job's trigger keys from the watch and a read that follows
// its subscription, serves none until that read is in (nor after a gap of
// the watch until it has read again), and serves, per item it owns and
// oldest first, those newer than the item's record says it served; the
// claim that serves one writes that, so a trigger is served once per item
// by whichever instance owns the item when it is free. A trigger no item
// is left to serve is deleted by a Txn that checks, as etcd has them then,
// the disable marks it counted on (docs/design.md, Triggers).
//
// Concurrency slots (the job's maxConcurrency, --max-concurrency) are taken
// when the reconcile decides, the items whose fires have waited longest
// first, and never waited for: an item without a slot is decided again,
// with what is true then, when a slot is given back.
//
// # One run
//
//	decide --run--> slots (job's maxConcurrency, --max-concurrency) --> claim --won--> gate --> exec --> record
//	                 |none free: decided again when one is given back   |lost: re-read, decide again
//
// A claim is one Txn (coord.Claim) guarded by the item record read, the
// absence of a marker, the member key of the session and the map revision
// acted on; its revision is the run's fence token (G4). The run stops at
// once when the session fences itself (it may no longer own the item), and
// the watchdog process kills the script if shardd cannot. The outcome is
// written by coord.Complete, which retries until it lands or another
// instance has taken the item over: a run that ended is never left
// RUNNING while its instance lives. Every run leaves a record, killed ones
// as KILLED with a reason (shutdown, fence, timeout, operator, or
// not-started when the work never began). A run whose work ended by itself
// is DONE or FAILED, whatever happened to its session after.
//
// # Failure cases
//
//   - owner killed: its lease expires after at most the TTL, the leader
//     reshards, the new owner's loop wakes on the map and fails over the cut
//     run or runs the fire that came meanwhile, at once.
//   - owner paused (SIGSTOP) or cut off: its session fences before its lease
//     can expire; its runs are killed (by it or by its watchdog) and recorded
//     KILLED/fence when etcd can be reached; the new owner re-runs them.
//   - claim reply lost: read back; if it applied late anyway, its marker
//     under this session is adopted by the next reconcile.
//   - completion write fails: retried with backoff; the item stays held by
//     its marker, so nobody runs it meanwhile.
//   - this host's clock beyond maxTimeDiffSeconds: nothing fires.
//
// # What wakes a job
//
// An idle job costs nothing: no timer, no read. Its reconcile runs on each
// of these events, and on nothing else but the safety net below. The
// engine's tests run with no safety net, and the test beside an event is
// one that fails when the event is removed (each was checked so):
//
//	event                                        delivered by              a test that needs it
//	its schedule's next fire (a lead before it)  the reconcile's next wake every scheduled test
//	a newer shard map (a member joined or left)  OnChange (the view)       TestUnnotedOutcomesAreNotedByTheNextOwner
//	a running marker deleted (a run ended        OnChange (running/)       TestTriggerQueuedBehindARunIsServedByTheItemsNewOwner
//	  elsewhere, a lease expired under one)
//	a marker of this session no run here holds   OnChange's own            TestLateClaimOfAnItemThatMovedAwayIsAdopted
//	  (a claim that applied after its reply
//	  was lost, perhaps after the item moved)
//	an item disabled or enabled                  OnChange (disabled/)      TestEnabledItemServesAWaitingTrigger
//	a trigger put (an operator's, a parent's)    OnTrigger                 TestChildRunsOncePerParentFire
//	a new session                                followSession (wakeAll)   TestFireDuringFenceIsCaughtUp
//	a run of its own ending (its current loop:   launch (wakeCurrent)      TestKillOfACutOffOwnerIsNotFailedOver,
//	  a reload may have replaced the one that                              TestTriggerQueuedBehindARunSurvivesAReload
//	  started it)
//	a concurrency slot given back                releaseSlots              TestSlotGivenBackWakesAnotherJob
//	this host's clock refused to fire it         a wake every clockRetry   TestClockSkewMendedFiresAgain
//	a gap of the watch (events lost to a         every subscription's      coord's TestHubResyncsAfterCompaction;
//	  compaction)                                resync                    TestDepsUpstreamTriggerInACompactedWatchGap
//	                                                                       (make e2e-long)
//	a claim lost or of unknown outcome, a read   a wake after a backoff    TestMustReadOutlivesAFailedRead,
//	  or write failed (a claim's: a forced read,                           TestClaimOfUnknownOutcomeIsAdoptedAfterTheItemMoved
//	  to adopt it if it applied)                                           (on the fake; against etcd another wake follows)
//
// The safety net (sweep.go) is for an event this process misses all the
// same (a bug): it wakes each job for a reconcile that reads its items
// even where it owns none, round-robin, each job at most once per
// Options.Sweep (10 s) and at most Options.SweepRate (50) jobs a second,
// so that its cost per second does not grow with the job count.
package engine
