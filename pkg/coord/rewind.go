package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Recovering from an etcd whose history went back (History says how that
// is seen). What went back is etcd's state: item records, shard maps,
// definitions as of the snapshot, or nothing at all after a wipe. What did
// not go back is what ran: a fire recorded DONE before the restore ran,
// whatever the restored record says; and downstream systems saw its fence.
//
// The node recovers in Run, between sessions (the rewind fences the current
// one: no run starts, running items are killed as on any session loss):
//
//  1. forget: every view's map and definition generation, every item cache
//     (their revisions belong to the history that went), and restart the
//     hub's watch from the current revision;
//  2. raise the floor: new fences must be above every fence this instance
//     knew, and every revision-ordered structure (the hub's delivered
//     revision, the item cache's, the views') must see the new history as
//     newer. So the node waits until etcd's revision passes the highest it
//     saw (plus rewindMargin), writing the floor key to get there when the
//     gap is at most maxRevisionBump; a larger gap is an operator's to close
//     (restore again with --bump-revision), said every 30 s;
//  3. repair: every item record this instance knew that is ahead of etcd's
//     (a later record, or the same one ended) is written back, so that no
//     fire that ran is run again, by this instance or any other;
//  4. resume: a new session; registration, elections, maps and the item
//     reconcile start from what etcd says now.
//
// The first instance to see a rewind says so: its rewind record
// (rewinds/<id>, at detection and once recovered) reaches every instance
// through the jobs watch, which covers rewinds/ too. An instance that has
// not seen the rewind itself, such as one whose next answer came after the
// first one raised the revision, takes the report as its own rewind when
// what the reporter saw go back is past this instance's floor (its start
// revision, or where it last recovered): a report of the rewind it
// recovered from already is below it, by rewindMargin at least. What went
// back is the revision the proof showed (RewindError.Seen: the highest seen
// before an answer below it, a key's revision), not the highest the
// reporter saw: that may be of the new history, when the reporter's answers
// all came after the first one's recovery and only a key it read since
// showed the rewind; the first one would take such a report, past its
// floor, for a new rewind, and fence itself and recover again (at the same
// moment as the reporter, both raising etcd's revision to about the same
// target).
//
// The records it knows are the newest value of each item key of its local
// jobs the hub delivered or a read returned (learnRecord), kept across cache
// invalidations and rewinds. An answer that shows a key at a lower revision
// than one known, at a read revision covering it, is itself proof of a
// rewind (an etcd restored with --bump-revision goes up, not back).

// maxRevisionBump is the largest gap between etcd's revision and the
// highest one seen that an instance closes by writing.
const maxRevisionBump = 200_000

// rewindMargin is how far past the highest revision it saw an instance
// raises etcd's: far enough that the others, which saw about as far, find
// etcd past every revision they saw too, and that their reports of the same
// rewind (rewind records whose Seen is below the margin) are told from a
// new one.
const rewindMargin = 1000

// knownRecord is the newest value of an item key seen, with the era (the
// number of rewinds recovered from before it was seen).
type knownRecord struct {
	kv  *mvccpb.KeyValue
	era uint64
}

// records is what a node knows of its jobs' item records.
type records struct {
	mu   sync.Mutex
	era  uint64
	jobs map[string]map[int]knownRecord
}

// learnRecord folds an item record's key as an event (readRev 0) or a read
// at readRev into what the node knows. A read showing a key at a lower
// revision than one known of this era at or below readRev proves a rewind,
// which it reports.
func (n *Node) learnRecord(job string, item int, kv *mvccpb.KeyValue, deleted bool, readRev int64) {
	r := &n.known
	r.mu.Lock()
	items := r.jobs[job]
	if items == nil {
		items = map[int]knownRecord{}
		r.jobs[job] = items
	}
	old, had := items[item]
	switch {
	case had && readRev > 0 && old.era == r.era && kv.ModRevision < old.kv.ModRevision && old.kv.ModRevision <= readRev:
		r.mu.Unlock()
		n.revs.noteKeyRevision(string(kv.Key), old.kv.ModRevision, kv.ModRevision)
		return
	case had && old.era == r.era && kv.ModRevision <= old.kv.ModRevision:
	case deleted:
		delete(items, item)
	default:
		items[item] = knownRecord{kv: kv, era: r.era}
	}
	r.mu.Unlock()
}

// outcomes are the outcomes this node is writing (Complete), by item. A run
// that ended while etcd was away or going back has its claim's record in
// the node's known records, RUNNING; the repair writes the outcome instead,
// and Complete, whose guard (the claim's revision) the repair's write
// moved, returns as written.
type outcomes struct {
	mu sync.Mutex
	m  map[outcomeKey]*pendingOutcome
}

type outcomeKey struct {
	job  string
	item int
}

type pendingOutcome struct {
	rec   keyspace.ItemRecord
	fence int64
	done  atomic.Bool // written by a repair
}

func (p *pendingOutcome) written() bool { return p.done.Load() }

func (o *outcomes) add(rec keyspace.ItemRecord, fence int64) *pendingOutcome {
	p := &pendingOutcome{rec: rec, fence: fence}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[outcomeKey]*pendingOutcome{}
	}
	o.m[outcomeKey{rec.Job, rec.Item}] = p
	return p
}

func (o *outcomes) remove(p *pendingOutcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if k := (outcomeKey{p.rec.Job, p.rec.Item}); o.m[k] == p {
		delete(o.m, k)
	}
}

// of returns job's outcomes being written, by item.
func (o *outcomes) of(job string) map[int]*pendingOutcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[int]*pendingOutcome{}
	for k, p := range o.m {
		if k.job == job {
			out[k.item] = p
		}
	}
	return out
}

// learnWrite folds a record this node wrote (val, at rev) into what it
// knows at once, not when the watch delivers it: an outcome etcd
// acknowledged and then lost with its history must be written back.
func (n *Node) learnWrite(job string, item int, val []byte, rev int64) {
	n.mu.Lock()
	_, local := n.jobs[job]
	n.mu.Unlock()
	if local {
		n.learnRecord(job, item, &mvccpb.KeyValue{Key: []byte(n.keys.Item(job, item)), Value: val, ModRevision: rev}, false, 0)
	}
}

// learnRead folds a read at readRev of job's item records (of every item,
// or of item alone when item >= 0) into what the node knows. Besides the
// revision checks of learnRecord, a record known at or below readRev that
// the read does not return proves a rewind: the records of a local job are
// never deleted (remove refuses a job an instance defines), so etcd lost it
// (a wipe, or a restore from before it was written).
func (n *Node) learnRead(job string, kvs []*mvccpb.KeyValue, readRev int64, item int) {
	present := map[int]bool{}
	for _, kv := range kvs {
		if i, err := strconv.Atoi(keyspace.LastSegment(string(kv.Key))); err == nil {
			present[i] = true
			n.learnRecord(job, i, kv, false, readRev)
		}
	}
	r := &n.known
	r.mu.Lock()
	var lost *mvccpb.KeyValue
	for i, k := range r.jobs[job] {
		if (item < 0 || i == item) && !present[i] && k.era == r.era && k.kv.ModRevision <= readRev {
			lost = k.kv
			break
		}
	}
	r.mu.Unlock()
	if lost != nil {
		n.revs.noteKeyRevision(string(lost.Key), lost.ModRevision, 0)
	}
}

// forgetRecords drops what the node knows of job's records (the job is no
// longer local).
func (n *Node) forgetRecords(job string) {
	n.known.mu.Lock()
	defer n.known.mu.Unlock()
	delete(n.known.jobs, job)
}

// knownRecords returns the records known of job.
func (n *Node) knownRecords(job string) map[int]*mvccpb.KeyValue {
	n.known.mu.Lock()
	defer n.known.mu.Unlock()
	out := make(map[int]*mvccpb.KeyValue, len(n.known.jobs[job]))
	for item, k := range n.known.jobs[job] {
		out[item] = k.kv
	}
	return out
}

// Rewound returns what showed that etcd's history went back while the
// instance has not recovered from it, nil otherwise.
func (n *Node) Rewound() *RewindError { return n.revs.Rewound() }

// NoSpace returns etcd's NOSPACE alarm as this instance's last write saw
// it: nil when that write went through.
func (n *Node) NoSpace() *NoSpaceError { return n.revs.NoSpace() }

// Impaired says why the instance can start no run or record no outcome
// although it may hold a session: etcd went back in time and the instance
// has not recovered, or etcd refused its last write for its NOSPACE alarm.
func (n *Node) Impaired() error {
	if rw := n.Rewound(); rw != nil {
		return rw
	}
	if ns := n.NoSpace(); ns != nil {
		return ns
	}
	return nil
}

// recoverRewind brings the node back from a rewind (see the steps above).
// It returns when the node may start a session, or ctx is done.
func (n *Node) recoverRewind(ctx context.Context, rw *RewindError) error {
	high := n.revs.Highest()
	target := high + rewindMargin
	n.log.Error("etcd went back in time (restored from a snapshot, wiped, or another cluster): this instance stops starting runs, "+
		"fences itself and drops what it knew; it resumes by itself once etcd's revision passes every one it saw, "+
		"after writing back the item records it knew (see docs/operations.md)", "err", rw, "seen", high)
	n.forgetState()
	rctx := recovering(ctx)
	// Seen: what went back, not high, so that the others, which have
	// recovered past that, do not take this record for a new rewind.
	rec := keyspace.RewindRecord{Instance: n.opts.ID, Detected: rw.At, Reason: rw.Error(), Seen: rw.Seen}
	if rw.By != "" {
		// A report passed on: the first to see it, and what it saw.
		rec.By, rec.Reason = rw.By, rw.Reason
	}
	said, warned, reported := time.Time{}, time.Time{}, false
	b := backoff{min: 200 * time.Millisecond, max: 5 * time.Second}
	for {
		rev, cluster, err := n.currentRevision(rctx)
		if err == nil && !reported {
			rec.Revision = rev
			if err = n.putRewind(rctx, rec); err == nil {
				reported = true
			}
		}
		switch {
		case err != nil:
		case rev > target:
			if rec.Repaired, err = n.repairRecords(rctx); err == nil {
				rec.Recovered, rec.Waiting = n.opts.Now(), ""
				if err = n.putRewind(rctx, rec); err == nil {
					n.revokeOwnPast(rctx)
					// The floor first: the hub, which resumes once the
					// history is recovered, may deliver a report of this
					// rewind at once.
					n.rewindFloor.Store(rev)
					n.revs.recovered(cluster, rev)
					n.log.Warn("recovered from etcd going back: resuming with a new session; fences rise above every one seen",
						"revision", rev, "seen", high, "repaired_records", rec.Repaired)
					return nil
				}
			}
		case target-rev >= maxRevisionBump:
			rec.Waiting = fmt.Sprintf("etcd is at revision %d, %d below the highest this instance saw (%d): too far to close by writing (at most %d); restore again with `etcdutl snapshot restore --bump-revision %d --mark-compacted`, or see docs/operations.md",
				rev, high-rev, high, maxRevisionBump, roundUp(target-rev))
			if n.opts.Now().Sub(said) >= 30*time.Second {
				said = n.opts.Now()
				n.log.Error("etcd went back in time and this instance cannot recover by itself: it starts no run", "err", rw, "why", rec.Waiting)
				n.putRewind(rctx, rec)
			}
		default:
			n.log.Warn("etcd went back in time: raising its revision past every one seen, so that new fences are above old ones",
				"revision", rev, "seen", high, "writes", target-rev+1, "key", n.keys.Floor())
			err = n.bumpRevision(rctx, target-rev+1)
			continue
		}
		if err != nil && ctx.Err() == nil {
			// A step that keeps failing (not etcd away for a moment) is
			// why the instance does not resume: said every 30 s.
			if n.opts.Now().Sub(warned) >= 30*time.Second {
				warned = n.opts.Now()
				n.log.Warn("rewind recovery: a step failed; retrying", "err", err)
			} else {
				n.log.Debug("rewind recovery; retrying", "err", err)
			}
		}
		if !sleep(ctx, b.next()) {
			return ctx.Err()
		}
	}
}

// onRewindRecord takes another instance's report of a rewind (a put of its
// rewind record the hub delivered) as this instance's own when what the
// reporter saw go back is past this instance's floor (see above).
func (n *Node) onRewindRecord(ev *clientv3.Event) {
	var rec keyspace.RewindRecord
	if json.Unmarshal(ev.Kv.Value, &rec) != nil || rec.Instance == n.opts.ID || rec.Seen <= n.rewindFloor.Load() {
		return
	}
	n.mu.Lock()
	if n.reports == nil {
		n.reports = map[string]time.Time{}
	}
	seen := n.reports[rec.Instance].Equal(rec.Detected)
	n.reports[rec.Instance] = rec.Detected
	n.mu.Unlock()
	if !seen { // the record of a rewind already taken, rewritten while its instance waits
		n.revs.noteReport(rec)
	}
}

// checkEtcd runs until ctx is done: a linearizable read whenever a watch
// stream was opened again, which History checks against every revision seen
// (an idle instance's only traffic after etcd came back restored would
// otherwise be its watch, resumed silently at a revision etcd no longer
// has); and, while etcd's NOSPACE alarm is on, a look at etcd's alarms every
// 5 s, so that an instance that writes nothing does not say NOSPACE after
// the alarm is gone.
func (n *Node) checkEtcd(ctx context.Context) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.probes:
			if n.revs.Rewound() == nil {
				n.currentRevision(ctx) // the interceptor judges the answer
			}
		case <-t.C:
			if n.revs.NoSpace() == nil {
				continue
			}
			actx, cancel := context.WithTimeout(ctx, n.opts.TTL)
			resp, err := n.opts.Client.AlarmList(actx)
			cancel()
			if err == nil && !hasNoSpace(resp.Alarms) {
				n.revs.clearNoSpace()
			}
		}
	}
}

func hasNoSpace(alarms []*etcdserverpb.AlarmMember) bool {
	for _, a := range alarms {
		if a.Alarm == etcdserverpb.AlarmType_NOSPACE {
			return true
		}
	}
	return false
}

// revokeOwnPast revokes the lease of this process's instance key as etcd
// has it, when a restore brought back one of its earlier sessions: that
// session's keys (its instance key, member keys, running markers) would
// hold the id and the items until the lease expired.
func (n *Node) revokeOwnPast(ctx context.Context) {
	gctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Get(gctx, n.keys.Instance(n.opts.ID))
	if err != nil || len(resp.Kvs) == 0 {
		return
	}
	kv := resp.Kvs[0]
	var info keyspace.InstanceInfo
	if json.Unmarshal(kv.Value, &info) != nil || info.PID != n.opts.Info.PID || info.Host != n.opts.Info.Host || !info.Started.Equal(n.started) {
		return // another process's (the duplicate-id check decides)
	}
	if lease := clientv3.LeaseID(kv.Lease); lease != n.currentLease() {
		n.opts.Client.Revoke(gctx, lease)
	}
}

// roundUp rounds a revision gap up to a round number an operator may type.
func roundUp(gap int64) int64 {
	r := int64(1000)
	for r < gap*2 {
		r *= 10
	}
	return r
}

// forgetState drops every view's map and definition generation and every
// item cache, and restarts the hub from the current revision: all of them
// hold revisions of the history that went.
func (n *Node) forgetState() {
	n.mu.Lock()
	for _, v := range n.views {
		v.Map, v.MapRev, v.Generation, v.Leading = nil, 0, 0, false
		v.Children, v.childrenRev = nil, 0
	}
	caches := make([]*itemCache, 0, len(n.itemCaches))
	for _, c := range n.itemCaches {
		caches = append(caches, c)
	}
	n.mu.Unlock()
	for _, c := range caches {
		c.invalidate()
	}
	n.lastItemWrite.Store(0)
	n.known.mu.Lock()
	n.known.era++
	n.known.mu.Unlock()
	n.hub.restart()
}

// currentRevision reads etcd's revision and cluster id.
func (n *Node) currentRevision(ctx context.Context) (int64, uint64, error) {
	gctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Get(gctx, n.keys.Rewind(n.opts.ID), clientv3.WithCountOnly())
	if err != nil {
		return 0, 0, err
	}
	return resp.Header.Revision, resp.Header.ClusterId, nil
}

// putRewind writes the node's rewind record.
func (n *Node) putRewind(ctx context.Context, rec keyspace.RewindRecord) error {
	val, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	_, err = n.opts.Client.Put(pctx, n.keys.Rewind(n.opts.ID), string(val))
	return err
}

// bumpRevision writes the floor key count times, 16 writes at a time: each
// write raises etcd's revision by one.
func (n *Node) bumpRevision(ctx context.Context, count int64) error {
	put := func() error {
		pctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
		defer cancel()
		_, err := n.opts.Client.Put(pctx, n.keys.Floor(), n.opts.ID)
		return err
	}
	next := make(chan struct{})
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				if err := put(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := int64(0); i < count; i++ {
		select {
		case next <- struct{}{}:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	return err
}

// repairRecords writes back every item record of the local jobs that this
// node knows and etcd has behind it, and the outcomes it is writing in
// place of their claims' records. It returns how many it wrote.
func (n *Node) repairRecords(ctx context.Context) (int, error) {
	total := 0
	for _, job := range n.Jobs() {
		known, pending := n.knownRecords(job), n.outcomes.of(job)
		if len(known) == 0 && len(pending) == 0 {
			continue
		}
		for attempt := 0; ; attempt++ {
			wrote, conflict, err := n.repairJob(ctx, job, known, pending)
			total += wrote
			if err != nil {
				return total, err
			}
			if !conflict {
				break
			}
			if attempt == 5 {
				return total, fmt.Errorf("repair records of job %q: they keep changing", job)
			}
		}
	}
	return total, nil
}

// repairJob is one round of repairRecords for one job: read etcd's records,
// write back in Txns those known ahead of them, each guarded by the record
// as read. conflict is set when a guard failed (another instance repaired
// first): the caller reads again.
func (n *Node) repairJob(ctx context.Context, job string, known map[int]*mvccpb.KeyValue, pending map[int]*pendingOutcome) (wrote int, conflict bool, err error) {
	gctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	resp, err := n.opts.Client.Get(gctx, n.keys.Items(job), clientv3.WithPrefix())
	cancel()
	if err != nil {
		return 0, false, fmt.Errorf("read records of job %q: %w", job, err)
	}
	current := map[int]*mvccpb.KeyValue{}
	for _, kv := range resp.Kvs {
		if item, err := strconv.Atoi(keyspace.LastSegment(string(kv.Key))); err == nil {
			current[item] = kv
		}
	}
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	var outs []*pendingOutcome
	items := 0
	flush := func() error {
		if items == 0 {
			return nil
		}
		tctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
		defer cancel()
		r, err := n.opts.Client.Txn(tctx).If(cmps...).Then(oneLastFailure(n.keys, ops)...).Commit()
		if err != nil {
			return fmt.Errorf("repair records of job %q: %w", job, err)
		}
		if r.Succeeded {
			wrote += items
			for _, p := range outs {
				p.done.Store(true)
			}
		} else {
			conflict = true
		}
		cmps, ops, outs, items = cmps[:0], ops[:0], outs[:0], 0
		return nil
	}
	for item := range union(known, pending) {
		cur := current[item]
		var curRev int64 // 0: absent, which a ModRevision compare of 0 matches
		var c *keyspace.ItemRecord
		if cur != nil {
			curRev, c = cur.ModRevision, decodeRecord(cur.Value)
		}
		if p := pending[item]; p != nil && ahead(&p.rec, c) {
			// The run's outcome, as Complete would write it, guarded by
			// etcd's record as read.
			_, o, err := n.finishTxn(p.rec, curRev, false)
			if err != nil {
				return wrote, conflict, err
			}
			o = append(o, n.clearRunningOps(p.rec, true)...)
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(n.keys.Item(job, item)), "=", curRev))
			ops, outs = append(ops, o...), append(outs, p)
		} else if kv := known[item]; kv != nil && ahead(decodeRecord(kv.Value), c) {
			val := kv.Value
			if r := decodeRecord(kv.Value); r != nil && r.State == keyspace.StateRunning && r.Fence == 0 {
				// Put back, its revision is the repair's: the record keeps
				// its claim's, which is its run's fence (keyspace.RunFence).
				r.Fence = kv.ModRevision
				if b, err := json.Marshal(r); err == nil {
					val = b
				}
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", curRev))
			ops = append(ops, clientv3.OpPut(string(kv.Key), string(val)))
		} else {
			continue
		}
		if items++; len(ops) > 100 { // within etcd's 128 operations per Txn
			if err := flush(); err != nil {
				return wrote, conflict, err
			}
		}
	}
	return wrote, conflict, flush()
}

// union is the set of items of a and b.
func union(a map[int]*mvccpb.KeyValue, b map[int]*pendingOutcome) map[int]bool {
	out := make(map[int]bool, len(a)+len(b))
	for item := range a {
		out[item] = true
	}
	for item := range b {
		out[item] = true
	}
	return out
}

// decodeRecord decodes an item record; nil when it is malformed.
func decodeRecord(val []byte) *keyspace.ItemRecord {
	var r keyspace.ItemRecord
	if json.Unmarshal(val, &r) != nil {
		return nil
	}
	return &r
}

// ahead reports whether a record known from before the rewind (k) is ahead
// of etcd's (c; nil: none, or malformed): it accounts for a later scheduled
// fire (its watermark), or it is the same run ended where etcd's is still
// RUNNING. Times, not counters: Seq, fences and trigger revisions start
// again from the restored record, and a record an instance wrote since
// (one that never knew the old history) may carry a lower Seq for a later
// fire.
func ahead(k, c *keyspace.ItemRecord) bool {
	switch {
	case k == nil:
		return false
	case c == nil:
		return true
	case !k.Watermark().Equal(c.Watermark()):
		return k.Watermark().After(c.Watermark())
	default:
		return k.Fire.Equal(c.Fire) && k.Attempt == c.Attempt && k.Source == c.Source &&
			c.State == keyspace.StateRunning && k.State != keyspace.StateRunning
	}
}

// ShownContext marks ctx for reads that are shown, never acted on
// (admin.Client.WithShown): while etcd is seen to have gone back in time,
// the API and the console still show what etcd holds now, with the
// instances' rewind records (what is being done, or what the operator
// must do), though the node refuses every answer it would act on.
func (n *Node) ShownContext(ctx context.Context) context.Context {
	if n.revs.Rewound() != nil {
		return recovering(ctx)
	}
	return ctx
}
