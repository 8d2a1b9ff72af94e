package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// registerJob registers the job's definition (see registerConfig) and then
// the membership key. applied says local is an applied definition.
func (n *Node) registerJob(ctx context.Context, s *session, local *config.Job, applied bool) error {
	was, err := n.registerConfig(ctx, local, applied)
	if err != nil {
		return err
	}
	// Whether this instance may run the job is decided on the definition
	// the registration just read, not on what the catalog or the files
	// said before it (applied.go).
	if v, ok := n.View(local.Name); ok && v.Refusal != nil {
		return &notEligibleError{v.Refusal}
	}
	if v, ok := n.View(local.Name); ok && v.Job != nil && (len(v.Job.DependsOn) > 0 || len(was) > 0) {
		if err := n.indexChild(ctx, v.Job, was); err != nil {
			return err
		}
	}
	n.mu.Lock()
	leaving := n.leaving
	n.mu.Unlock()
	if leaving {
		return nil // shutting down: no new membership
	}
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	key := n.keys.Member(local.Name, n.opts.ID)
	resp, err := n.txns.Txn(rctx, nil, []clientv3.Op{clientv3.OpPut(key, "", clientv3.WithLease(s.lease)), clientv3.OpGet(key)}, nil)
	if err != nil {
		return fmt.Errorf("put member key: %w", err)
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	n.mu.Lock()
	if n.session == s && len(kvs) == 1 {
		n.members[local.Name] = kvs[0].CreateRevision // the guard of this session's claims
	}
	leaving = n.leaving
	n.mu.Unlock()
	if leaving {
		// Leave deleted the member keys while this put was on its way:
		// take it back, or the instance would stay a member of the job.
		if _, err := n.opts.Client.Delete(rctx, key); err != nil {
			return fmt.Errorf("withdraw member key put during Leave: %w", err)
		}
	}
	return nil
}

// loadedState is this instance's loaded record as registration reads it.
type loadedState struct {
	hash string // "" when there is none
	// seen is the generation (config ModRevision) the registered
	// definition had when the record was written.
	seen int64
}

// publishDecision says whether an instance publishes its local definition
// of a job over the registered one (reg, at generation gen), and why (the
// rule of docs/design.md, "Job definitions"). first is set when this
// process has not registered this local definition before.
//
// A definition is published when it is new to the cluster: edited on this
// host (its loaded record names another definition) into one the cluster
// never superseded, or rolled back on this host to a superseded one while
// the cluster has not moved on since this host last loaded (a host that
// was away while others deployed and rolled back is behind, not editing);
// brought by a host with no record and not superseded; or overwrite: true,
// once per process and local definition.
func publishDecision(local *config.Job, reg *keyspace.RegisteredConfig, state keyspace.DefinitionState, gen int64, loaded loadedState, first bool) (publish bool, why string) {
	hash := local.Hash()
	switch state {
	case keyspace.DefinitionMissing:
		return true, "registered job definition"
	case keyspace.DefinitionGarbage:
		return true, "replaced malformed registered job definition"
	}
	if reg.Applied() {
		// An operator applied the job (docs/applied.md): no host's file
		// publishes over it, overwrite or not; shardd delete gives the job
		// back to the files.
		return false, ""
	}
	switch state {
	case keyspace.DefinitionUnreadable:
		if local.Overwrite && first {
			return true, "published job definition over one this version cannot read (overwrite: true)"
		}
		return false, ""
	}
	superseded := slices.Contains(reg.Superseded, hash)
	switch {
	case reg.Hash == hash:
		return false, ""
	case loaded.hash != "" && loaded.hash != hash && !superseded:
		return true, "published job definition edited on this host"
	case loaded.hash != "" && loaded.hash != hash && loaded.seen == gen:
		return true, "published job definition rolled back on this host"
	case loaded.hash == "" && !superseded:
		return true, "published job definition new to the cluster"
	case local.Overwrite && first:
		return true, "published job definition (overwrite: true)"
	}
	return false, ""
}

// registerConfig applies publishDecision to local and the registered
// definition, publishes local if it says so, records local in this
// instance's loaded key, and takes the resulting registered definition
// into the job's view. One Txn, guarded by the ModRevisions it read, does
// all the writes; a concurrent change makes it read and decide again.
//
// It returns the parents (dependsOn) of the definition it replaced, if it
// published over one: their children indexes are to lose the job.
func (n *Node) registerConfig(ctx context.Context, local *config.Job, fromApplied bool) (was []string, err error) {
	key, lkey := n.keys.Config(local.Name), n.keys.Loaded(local.Name, n.opts.ID)
	hash := local.Hash()
	n.mu.Lock()
	first := n.registered[local.Name] != hash
	n.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	for attempt := 0; ; attempt++ {
		resp, err := n.txns.Txn(rctx, nil, []clientv3.Op{clientv3.OpGet(key), clientv3.OpGet(lkey), clientv3.OpGet(n.keys.Children(local.Name))}, nil)
		if err != nil {
			return nil, fmt.Errorf("read job definition %s: %w", key, err)
		}
		// The children index is in the view before the map is followed:
		// no decision on the job's items is made without it (deps.go).
		for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
			n.takeChildren(local.Name, kv)
		}
		r := readRegistration(key, lkey, local, resp)
		publish, why := publishDecision(local, r.reg, r.state, r.configRev, r.loaded, first)
		if fromApplied {
			// An applied definition (applied.go) is registered already:
			// the task never publishes it (not even when it is gone), nor
			// records it as loaded from a file.
			if r.state == keyspace.DefinitionMissing || !r.reg.Applied() {
				return nil, &notEligibleError{errors.New("its applied definition was deleted or given back to the files")}
			}
			publish = false
			r.loaded.hash = hash // no loaded record of it
		}
		ops, err := n.registrationOps(local, r, publish, why)
		if err != nil {
			return nil, err
		}
		w, err := n.txns.Txn(rctx, []clientv3.Cmp{r.configCmp, r.loadedCmp}, ops, nil)
		if err != nil {
			return nil, fmt.Errorf("register job definition %s: %w", key, err)
		}
		if !w.Succeeded {
			if attempt < 5 {
				continue // changed since read: decide again
			}
			return nil, fmt.Errorf("register job definition %s: it keeps changing; retrying", key)
		}
		n.mu.Lock()
		n.registered[local.Name] = hash
		n.mu.Unlock()
		n.tookRegistration(local, r, publish, why, w.Responses[len(w.Responses)-1].GetResponseRange().Kvs[0])
		if publish && r.registered != nil {
			was = r.registered.DependsOn
		}
		return was, nil
	}
}

// registration is what registerConfig read of a job's config key and of
// this instance's loaded key, with the Compares that guard its write on
// them.
type registration struct {
	reg                  *keyspace.RegisteredConfig // nil when the key is missing
	state                keyspace.DefinitionState
	regErr               error
	registered           *config.Job // the registered definition, when it decodes
	configRev            int64
	loaded               loadedState
	configCmp, loadedCmp clientv3.Cmp
}

// readRegistration decodes the answers of registerConfig's read of key
// (job's config) and lkey (this instance's loaded record).
func readRegistration(key, lkey string, local *config.Job, resp *clientv3.TxnResponse) registration {
	job := local.Name
	r := registration{
		state:     keyspace.DefinitionMissing,
		configCmp: clientv3.Compare(clientv3.CreateRevision(key), "=", 0),
		loadedCmp: clientv3.Compare(clientv3.CreateRevision(lkey), "=", 0),
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		r.configRev = kvs[0].ModRevision
		r.configCmp = clientv3.Compare(clientv3.ModRevision(key), "=", r.configRev)
		r.reg = &keyspace.RegisteredConfig{}
		r.registered, r.regErr = keyspace.DecodeRegistered(key, job, kvs[0].Value, r.reg, local)
		r.state = keyspace.DefinitionStateOf(r.regErr)
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		r.loadedCmp = clientv3.Compare(clientv3.ModRevision(lkey), "=", kvs[0].ModRevision)
		var rec keyspace.LoadedRecord
		if json.Unmarshal(kvs[0].Value, &rec) == nil {
			r.loaded = loadedState{hash: rec.Hash, seen: rec.Seen}
			if rec.Seen == 0 {
				r.loaded.seen = kvs[0].ModRevision // written with the publication itself
			}
		}
	}
	return r
}

// registrationOps are the writes of a registration: the publication of
// local (audited when it changes the cluster's definition), this
// instance's loaded record when it changed, and a read of the config key
// as the Txn leaves it.
func (n *Node) registrationOps(local *config.Job, r registration, publish bool, why string) ([]clientv3.Op, error) {
	key, lkey, hash := n.keys.Config(local.Name), n.keys.Loaded(local.Name, n.opts.ID), local.Hash()
	var ops []clientv3.Op
	if publish {
		rc := n.newRegistered(local, r.reg)
		val, err := json.Marshal(rc)
		if err != nil {
			return nil, err
		}
		ops = append(ops, clientv3.OpPut(key, string(val)))
		ops = append(ops, versionOps(n.keys, local.Name, rc, "publish", 0)...)
		if r.state != keyspace.DefinitionMissing { // a change of the cluster's definition
			ops = append(ops, auditOp(n.keys, &keyspace.AuditEntry{Actor: "instance:" + n.opts.ID, Action: "definition", Job: local.Name,
				Target: "job " + local.Name, Detail: "hash " + hash, Outcome: keyspace.AuditOK, Message: why}))
		}
	}
	if r.loaded.hash != hash {
		rec := keyspace.LoadedRecord{Hash: hash, At: n.opts.Now().UTC(), Seen: r.configRev}
		if publish {
			rec.Seen = 0 // the generation this Txn writes: the record's own ModRevision
		}
		val, _ := json.Marshal(rec)
		ops = append(ops, clientv3.OpPut(lkey, string(val)))
	}
	return append(ops, clientv3.OpGet(key)), nil
}

// versionOps are the writes of keyspace.Keys.VersionWrite.
func versionOps(keys keyspace.Keys, job string, rc keyspace.RegisteredConfig, change string, of int64) []clientv3.Op {
	key, val, from, end := keys.VersionWrite(job, rc, change, of)
	ops := []clientv3.Op{clientv3.OpPut(key, val)}
	if end != "" {
		ops = append(ops, clientv3.OpDelete(from, clientv3.WithRange(end)))
	}
	return ops
}

// tookRegistration takes the definition a registration left registered
// (kv, the config key after its Txn) into the job's view, and says what
// happened.
func (n *Node) tookRegistration(local *config.Job, r registration, publish bool, why string, kv *mvccpb.KeyValue) {
	log := n.log.With("job", local.Name)
	if r.state == keyspace.DefinitionGarbage && publish {
		log.Error("registered job definition is malformed; replacing it with the local one", "key", n.keys.Config(local.Name), "err", r.regErr)
	}
	switch {
	case publish && r.state == keyspace.DefinitionGood && r.loaded.hash != "" && r.loaded.seen != r.configRev && r.reg.Writer != n.opts.ID:
		// An edit of a file that was behind: the whole definition wins,
		// including what it lacks of the one it replaces.
		log.Warn(why+"; it replaces a newer definition this host's file did not have: check that nothing of it was lost",
			"hash", local.Hash(), "generation", kv.ModRevision, "replaced_hash", r.reg.Hash, "replaced_writer", r.reg.Writer, "replaced_written", r.reg.Written)
		n.takeDefinition(local.Name, local, kv.ModRevision, keyspace.SourceFile)
	case publish:
		log.Info(why, "hash", local.Hash(), "generation", kv.ModRevision)
		n.takeDefinition(local.Name, local, kv.ModRevision, keyspace.SourceFile)
	case r.state == keyspace.DefinitionUnreadable:
		n.unreadableDefinition(local.Name, kv.ModRevision, r.regErr)
	default:
		n.takeDefinition(local.Name, r.registered, kv.ModRevision, r.reg.Source)
	}
}

// newRegistered returns the config value that publishes local over reg
// (nil when there is none).
func (n *Node) newRegistered(local *config.Job, reg *keyspace.RegisteredConfig) keyspace.RegisteredConfig {
	rc := keyspace.RegisteredConfig{Hash: local.Hash(), Job: local.JSON(), Writer: n.opts.ID, Written: n.opts.Now().UTC(),
		Source: keyspace.SourceFile, By: "instance:" + n.opts.ID, Version: 1}
	if reg != nil {
		rc.Follow(reg)
	}
	return rc
}

// takeDefinition makes def, registered at generation gen from source,
// the job's effective definition if gen is newer than the one the view
// has; the engine and the API read it from the view. A change wakes the
// job's task: whether this instance may run the job depends on it
// (eligible).
func (n *Node) takeDefinition(job string, def *config.Job, gen int64, source string) {
	var changed, conflictChanged, conflict bool
	var was string
	var task *jobTask
	n.updateView(job, func(v *JobView) {
		if gen < v.Generation {
			return // an older event than the view's
		}
		was = ""
		if v.Job != nil && v.Generation > 0 {
			was = v.Job.Hash()
		}
		changed = was != def.Hash()
		if changed || v.Source != source {
			task = v.task
		}
		conflict = def.Hash() != v.Local.Hash()
		conflictChanged = conflict != v.Conflict
		v.Job, v.Generation, v.Conflict, v.Source = def, gen, conflict, source
		v.Refusal = n.mayRun(def, source) // with the definition: see sessionFor
	})
	if task != nil {
		task.wake()
	}
	if conflictChanged {
		n.republish() // the instance key lists conflicts, for shardd status
		if conflict {
			n.log.Warn("this host's definition of the job differs from the registered one; running the registered one",
				"job", job, "registered_hash", def.Hash(), "generation", gen)
		} else {
			n.log.Info("this host's definition of the job is the registered one again", "job", job, "generation", gen)
		}
	}
	if changed && was != "" {
		n.log.Info("job definition changed", "job", job, "hash", def.Hash(), "was", was, "generation", gen)
		n.notifyChange(job)
	}
}

// followConfig keeps the job's view on the registered definition until
// stop is called: every put of the config key with a newer, well-formed
// definition is taken. A missing or malformed key keeps the last good
// definition; the job's leader (or the next registration) repairs it.
func (n *Node) followConfig(ctx context.Context, job string) (stop func()) {
	key := n.keys.Config(job)
	take := func(kv *mvccpb.KeyValue) {
		var rc keyspace.RegisteredConfig
		v, _ := n.View(job)
		def, err := keyspace.DecodeRegistered(key, job, kv.Value, &rc, v.Local)
		switch keyspace.DefinitionStateOf(err) {
		case keyspace.DefinitionUnreadable:
			n.unreadableDefinition(job, kv.ModRevision, err)
		case keyspace.DefinitionGarbage:
			n.log.Error("ignoring malformed registered job definition; keeping the last good one", "job", job, "key", key, "err", err)
		default:
			n.takeDefinition(job, def, kv.ModRevision, rc.Source)
		}
	}
	return n.followKey(ctx, job, key, false, take, func(v *JobView) int64 { return v.Generation })
}

// unreadableDefinition records that the registered definition of job, at
// generation gen, cannot be read here: the view keeps its last good
// definition and shows a conflict, and nothing replaces the registered one.
func (n *Node) unreadableDefinition(job string, gen int64, err error) {
	var changed bool
	n.updateView(job, func(v *JobView) {
		if gen < v.Generation {
			return
		}
		changed = !v.Conflict || v.Generation != gen
		v.Generation, v.Conflict = gen, true
	})
	if changed {
		n.republish()
		n.log.Error("the registered definition of the job cannot be read by this shardd version; running the last good one, showing a conflict (upgrade this host)",
			"job", job, "generation", gen, "err", err)
	}
}

// parseRegistered decodes a config key's value; local, if set, is this
// host's definition of job (see keyspace.DecodeRegistered).
func (n *Node) parseRegistered(key, job string, data []byte, local *config.Job) (*config.Job, error) {
	return keyspace.DecodeRegistered(key, job, data, &keyspace.RegisteredConfig{}, local)
}

var errNotLeader = errors.New("coord: not the leader")
