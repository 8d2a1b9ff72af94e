package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/shard"
)

// leader holds one leadership of one job.
type leader struct {
	n        *Node
	job      string
	local    *config.Job
	applied  bool   // local is an applied definition: never put back (reconcile)
	key      string // election key
	rev      int64  // its CreateRevision: the fence
	interval int    // reconcileIntervalMinutes of the effective config
	// wrote is the revision of the leader's last map write, whose event
	// need not wake it (the task's subscription reads it concurrently).
	wrote atomic.Int64
	// unreadable is the generation of a registered definition this
	// version cannot read, once logged.
	unreadable int64
	// parsed is the registered definition last read, by its ModRevision:
	// a leadership reconciles many times (every member that joins) on one
	// definition, and parsing and hashing it was a tenth of a cold start's
	// CPU with 10,000 jobs.
	parsed struct {
		rev int64
		job *config.Job
		err error
	}
}

// state is what one reconcile reads, at one revision.
type state struct {
	rev       int64
	members   []string
	disabled  map[string]bool // instance ids disabled for the job
	jobOff    bool            // disabled/job exists
	config    *config.Job     // effective; nil when missing or malformed
	configRev int64           // ModRevision of the config key, 0 when missing
	configBad error
	shards    *keyspace.ShardMap // nil when missing or malformed
	shardsRev int64              // ModRevision of the shards key, 0 when missing
	shardsBad error
	// candidates are the keys campaigning for the job, the leader's
	// included, oldest first.
	candidates []candidateKey
}

// read gets everything the reconcile needs in one transaction. A
// candidate's full look (elect.go) is this read too: it judges its
// election from the candidates, and leads on the rest.
func (l *leader) read(ctx context.Context) (*state, error) {
	k := l.n.keys
	rctx, cancel := context.WithTimeout(ctx, l.n.opts.TTL)
	defer cancel()
	resp, err := l.n.txns.Txn(rctx, nil, []clientv3.Op{
		clientv3.OpGet(k.Members(l.job), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(k.Disabled(l.job), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(k.Config(l.job)),
		clientv3.OpGet(k.Shards(l.job)),
		clientv3.OpGet(k.Leader(l.job), clientv3.WithPrefix()),
	}, nil)
	if err != nil {
		return nil, fmt.Errorf("read job state: %w", err)
	}
	st := &state{rev: resp.Header.Revision, disabled: map[string]bool{}}
	st.candidates = candidateKeys(resp.Responses[4].GetResponseRange().Kvs)
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		st.members = append(st.members, keyspace.LastSegment(string(kv.Key)))
	}
	sort.Strings(st.members)
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		key := string(kv.Key)
		switch {
		case key == k.DisabledJob(l.job):
			st.jobOff = true
		case strings.HasPrefix(key, k.DisabledInstances(l.job)):
			st.disabled[strings.TrimPrefix(key, k.DisabledInstances(l.job))] = true
		}
	}
	if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) > 0 {
		st.configRev = kvs[0].ModRevision
		if l.parsed.rev != st.configRev {
			l.parsed.job, l.parsed.err = l.n.parseRegistered(k.Config(l.job), l.job, kvs[0].Value, l.local)
			l.parsed.rev = st.configRev
		}
		st.config, st.configBad = l.parsed.job, l.parsed.err
	}
	if kvs := resp.Responses[3].GetResponseRange().Kvs; len(kvs) > 0 {
		st.shardsRev = kvs[0].ModRevision
		st.shards, st.shardsBad = keyspace.DecodeShardMap(kvs[0].Value)
	}
	return st, nil
}

// reconcile writes the desired map when the stored one differs.
func (l *leader) reconcile(ctx context.Context, st *state) error {
	log := l.n.log.With("job", l.job)
	job := st.config
	if job == nil && keyspace.DefinitionStateOf(st.configBad) == keyspace.DefinitionUnreadable {
		// A definition this version cannot read (a newer shardd wrote it):
		// neither replace it nor compute a map from a guess; the job
		// keeps its map until a host that reads it leads.
		if l.unreadable != st.configRev {
			l.unreadable = st.configRev
			log.Error("the registered definition of the job cannot be read by this shardd version; not writing its shard map while leading (upgrade this host)", "err", st.configBad)
		}
		return l.yieldToPreferred(st)
	}
	if job == nil && l.applied {
		// An applied definition is never put back from this task's copy
		// of it: missing, it was deleted (shardd delete), and the catalog
		// ends the task (applied.go); malformed, its writer repairs it.
		return nil
	}
	if job == nil {
		// Missing or malformed: the local definition takes its place.
		if st.configBad != nil {
			log.Error("registered job config is malformed; replacing it with the local definition", "key", l.n.keys.Config(l.job), "err", st.configBad)
		}
		if err := l.putConfig(ctx, st.configRev); err != nil {
			return err
		}
		job = l.local
	}
	l.interval = job.ReconcileIntervalMinutes

	desired, err := l.desired(job, st)
	if err != nil {
		return err
	}
	if st.shards != nil && st.shards.SameAssignment(desired) {
		return l.yieldToPreferred(st)
	}
	if st.shardsBad != nil {
		log.Error("stored shard map is malformed; rewriting it", "key", l.n.keys.Shards(l.job), "err", st.shardsBad)
	}
	// The epoch grows by one; a missing or malformed map restarts above
	// every epoch it could have had (each earlier write used a revision).
	desired.Epoch = st.rev + 1
	if st.shards != nil {
		desired.Epoch = st.shards.Epoch + 1
	}
	val, err := json.Marshal(desired)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, l.n.opts.TTL)
	defer cancel()
	resp, err := l.n.txns.Txn(wctx,
		[]clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.rev),
			clientv3.Compare(clientv3.ModRevision(l.n.keys.Shards(l.job)), "=", st.shardsRev),
		},
		[]clientv3.Op{clientv3.OpPut(l.n.keys.Shards(l.job), string(val))},
		[]clientv3.Op{clientv3.OpGet(l.key)})
	if err != nil {
		// Unknown outcome: the next reconcile reads the map back.
		return fmt.Errorf("write shard map: %w", err)
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 0 || kvs[0].CreateRevision != l.rev {
			return fmt.Errorf("%w: shard map write rejected: election key %s is gone", errNotLeader, l.key)
		}
		return fmt.Errorf("shard map changed while writing; retrying")
	}
	l.wrote.Store(resp.Header.Revision)
	// The one INFO line of a new map, by the leader that wrote it; every
	// instance's view of it is at DEBUG ("shard map").
	log.Info("wrote shard map", "epoch", desired.Epoch, "instances", desired.Instances, "total", desired.Total, "strategy", desired.Strategy, "items", desired.Items)
	if l.n.opts.OnMapWritten != nil {
		l.n.opts.OnMapWritten(l.job)
	}
	// The stored map is current now: hand over here, as a reconcile that
	// found it current would. A burst that brought the preferred candidate
	// with a member (one settle, one read) wakes the leader no more; its own
	// write's event does not.
	return l.yieldToPreferred(st)
}

// errYield ends a leadership so that the preferred candidate can lead.
var errYield = errors.New("coord: yielding leadership to the preferred instance")

// yieldToPreferred returns errYield when another campaigning instance is
// the job's preferred leader. Without it the first instance to start would
// lead every job; with it, leaderships spread over the instances (by
// rendezvous hash of job and id), and move only when candidates come or go.
// It is called only once the stored map is current (found so, or just
// written), so a handover never leaves a stale map behind.
//
// Only a candidate that is also a member counts: one that is leaving
// (Leave deletes its member key first, then withdraws its candidate key in
// answer to the same event) would be handed a leadership it then drops.
func (l *leader) yieldToPreferred(st *state) error {
	var staying []string
	for _, c := range st.candidates {
		if _, member := slices.BinarySearch(st.members, c.id); member {
			staying = append(staying, c.id)
		}
	}
	if p := shard.Pick(l.job, staying); p != "" && p != l.n.opts.ID {
		return fmt.Errorf("%w %s", errYield, p)
	}
	return nil
}

// putConfig registers the local definition where the config key is missing
// (rev 0) or malformed (its ModRevision is rev).
func (l *leader) putConfig(ctx context.Context, rev int64) error {
	key := l.n.keys.Config(l.job)
	val, err := json.Marshal(l.n.newRegistered(l.local, nil))
	if err != nil {
		return err
	}
	cmp := clientv3.Compare(clientv3.ModRevision(key), "=", rev)
	if rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
	}
	wctx, cancel := context.WithTimeout(ctx, l.n.opts.TTL)
	defer cancel()
	resp, err := l.n.opts.Client.Txn(wctx).
		If(clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.rev), cmp).
		Then(clientv3.OpPut(key, string(val))).
		Else(clientv3.OpGet(l.key)).Commit()
	if err != nil {
		return fmt.Errorf("register config %s: %w", key, err)
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 0 || kvs[0].CreateRevision != l.rev {
			return fmt.Errorf("%w: config write rejected: election key %s is gone", errNotLeader, l.key)
		}
		return fmt.Errorf("register config %s: changed concurrently; retrying", key)
	}
	l.n.log.Info("registered job config", "job", l.job, "hash", l.local.Hash())
	return nil
}

// desired computes the map the job should have now.
func (l *leader) desired(job *config.Job, st *state) (*keyspace.ShardMap, error) {
	m := &keyspace.ShardMap{
		Strategy:   job.Strategy,
		Total:      job.ShardingTotalCount,
		Instances:  []string{},
		Items:      map[string][]int{},
		Leader:     l.n.opts.ID,
		ConfigHash: job.Hash(),
		Written:    l.n.opts.Now().UTC(),
	}
	if job.Disabled || st.jobOff {
		m.Disabled = true
		return m, nil
	}
	for _, id := range st.members {
		if !st.disabled[id] {
			m.Instances = append(m.Instances, id)
		}
	}
	m.PerFire = job.Shard.PerFire()
	if m.PerFire || len(m.Instances) == 0 {
		if job.Strategy == shard.Broadcast {
			m.Total = len(m.Instances)
		}
		return m, nil
	}
	a, err := job.Shard.Assign(shard.Input{Instances: m.Instances, Job: job.Name, Total: job.ShardingTotalCount})
	if err != nil {
		return nil, fmt.Errorf("compute shard map: %w", err)
	}
	m.Total = a.Total()
	m.Items = a.ByInstance()
	return m, nil
}
