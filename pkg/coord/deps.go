package coord

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Dependencies (docs/dependencies.md). A child job C (dependsOn: [P, ...])
// fires once per completed fire of its parents. The pieces:
//
//   - jobs/<P>/children: every child of P with all its parents, written by
//     the children's registrations (indexChild), followed by every instance
//     of P into its JobView (Children);
//   - jobs/<P>/fires/<fire>: the fire's barrier (barrier.go), noted with
//     each item's final outcome; the note that completes it also, in the
//     same Txn, creates one upstream trigger per child
//     (jobs/<C>/triggers/u<...>, no lease), so a child fires exactly once
//     per parent fire whoever completes it, however often a note is
//     retried, whichever instance dies after it;
//   - jobs/<P>/lastsuccess and jobs/<C>/deps: the rule of several parents
//     (see childOps).
//
// The child's instances serve an upstream trigger like an operator's
// (engine), each item once; a trigger of a failed parent fire is served
// by recording the item SKIPPED with reason upstream-failed.

// indexChild makes the children index of every parent of def name def,
// and of every parent it no longer has (was) not: the registration of a
// child keeps its parents' indexes. It changes nothing when the indexes
// say so already.
func (n *Node) indexChild(ctx context.Context, def *config.Job, was []string) error {
	for _, p := range slices.Compact(slices.Sorted(slices.Values(append(slices.Clone(def.DependsOn), was...)))) {
		key := n.keys.Children(p)
		for attempt := 0; ; attempt++ {
			rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
			resp, err := n.opts.Client.Get(rctx, key)
			cancel()
			if err != nil {
				return fmt.Errorf("read children of %s: %w", p, err)
			}
			idx, cmp := keyspace.ParentsOf{}, clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
			if len(resp.Kvs) > 0 {
				if err := json.Unmarshal(resp.Kvs[0].Value, &idx); err != nil {
					n.log.Error("children index is malformed; rewriting it", "key", key, "err", err)
					idx = keyspace.ParentsOf{}
				}
				cmp = clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)
			}
			want := slices.Sorted(slices.Values(def.DependsOn))
			if !slices.Contains(def.DependsOn, p) {
				want = nil
			}
			had, ok := idx[def.Name]
			if ok && slices.Equal(had.Parents, want) || !ok && want == nil {
				break
			}
			switch {
			case want == nil:
				delete(idx, def.Name)
			case ok:
				idx[def.Name] = keyspace.ChildEntry{Parents: want, Since: had.Since} // another parent added or removed
			default:
				idx[def.Name] = keyspace.ChildEntry{Parents: want, Since: n.opts.Now().UTC()}
			}
			val, _ := json.Marshal(idx) // kept when empty: followers take puts
			wctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
			w, err := n.opts.Client.Txn(wctx).If(cmp).Then(clientv3.OpPut(key, string(val))).Commit()
			cancel()
			if err != nil {
				return fmt.Errorf("index %s as a child of %s: %w", def.Name, p, err)
			}
			if w.Succeeded {
				break
			}
			if attempt > 10 {
				return fmt.Errorf("index %s as a child of %s: the index keeps changing", def.Name, p)
			}
		}
	}
	return nil
}

// followChildren keeps the job's view of its children index current; the
// registration read it first (registerConfig).
func (n *Node) followChildren(ctx context.Context, job string) (stop func()) {
	return n.followKey(ctx, job, n.keys.Children(job), false, func(kv *mvccpb.KeyValue) { n.takeChildren(job, kv) },
		func(v *JobView) int64 { return v.childrenRev })
}

// takeChildren takes a children index newer than the view's.
func (n *Node) takeChildren(job string, kv *mvccpb.KeyValue) {
	idx := keyspace.ParentsOf{}
	if len(kv.Value) > 0 {
		if err := json.Unmarshal(kv.Value, &idx); err != nil {
			n.log.Error("ignoring malformed children index", "job", job, "key", string(kv.Key), "err", err)
			return
		}
	}
	n.updateView(job, func(v *JobView) {
		if kv.ModRevision >= v.childrenRev {
			v.Children, v.childrenRev = idx, kv.ModRevision
		}
	})
}

// childOps are the guards and writes that a barrier's completing note
// adds to its Txn: a trigger of each child of job (idx) that the fire
// triggers, or its UPSTREAM_FAILED record, and for a successful fire the
// job's lastsuccess. A child of several parents fires when every other
// parent has a successful fire (lastsuccess) it has not consumed (its
// deps); the Txn guards what it read of those, so two parents completing
// at once fire the child once.
func (n *Node) childOps(ctx context.Context, job, fire string, fireTime time.Time, b keyspace.Barrier, idx keyspace.ParentsOf) ([]clientv3.Cmp, []clientv3.Op, error) {
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	ok := b.Succeeded()
	if ok {
		ops = append(ops, clientv3.OpPut(n.keys.LastSuccess(job), fire))
	}
	children := slices.Sorted(maps.Keys(idx))
	if len(children) > keyspace.MaxChildren {
		n.log.Error("job has more children than a fire can trigger; the rest are not triggered", "job", job,
			"max", keyspace.MaxChildren, "not_triggered", children[keyspace.MaxChildren:])
		children = children[:keyspace.MaxChildren]
	}
	defs, err := n.childDefinitions(ctx, children)
	if err != nil {
		return nil, nil, err
	}
	now := n.opts.Now().UTC()
	asked := keyspace.FireAsked(fire, fireTime)
	for _, child := range children {
		def := defs[child]
		switch {
		case def == nil:
			continue // removed (shardd remove), or unreadable: nothing would serve its triggers
		case !slices.Contains(def.DependsOn, job):
			continue // the index is behind the child's definition: it no longer depends on job
		case asked.Before(idx[child].Since):
			continue // a fire from before the child depended on job
		}
		parents := def.DependsOn
		up := keyspace.Upstream{Job: job, Fire: fire, FireTime: fireTime.UTC()}
		switch {
		case !ok:
			up.Failed = barrierWhy(job, fire, fireTime, b)
		case len(parents) > 1:
			fires, c, err := n.otherParents(ctx, job, child, parents)
			if err != nil {
				return nil, nil, err
			}
			cmps = append(cmps, c...)
			if fires == nil {
				continue // another parent has no fresh success yet: its own completion fires the child
			}
			fires[job] = fire
			up.Parents = fires
			val, _ := json.Marshal(fires)
			ops = append(ops, clientv3.OpPut(n.keys.Deps(child), string(val)))
		}
		tr := keyspace.Trigger{ID: keyspace.UpstreamTriggerID(job, fire), Fire: now, By: "upstream:" + job, Upstream: &up}
		val, _ := json.Marshal(tr)
		ops = append(ops, clientv3.OpPut(n.keys.Trigger(child, tr.ID), string(val)))
	}
	return cmps, ops, nil
}

// oldBarriers are the deletes of job's barriers older than BarrierKeep,
// for a note's Txn that puts the barrier of fire: fire keys sort by time
// after their kind ("t" scheduled, "m" manual). A range holding fire's own
// key is left out (etcd refuses a Txn that puts and deletes one key): the
// next note of a younger fire takes it.
func (n *Node) oldBarriers(job, fire string) []clientv3.Op {
	cut := fmt.Sprintf("%019d", n.opts.Now().Add(-keyspace.BarrierKeep).UnixNano())
	own := n.keys.Fire(job, fire)
	var ops []clientv3.Op
	for _, kind := range []string{"t", "m"} {
		from, to := n.keys.Fires(job)+kind, n.keys.Fires(job)+kind+cut
		if own < from || own >= to {
			ops = append(ops, clientv3.OpDelete(from, clientv3.WithRange(to)))
		}
	}
	return ops
}

// childDefinitions reads the registered definitions of children; a child
// with none (removed) or an unreadable one is missing from the map.
func (n *Node) childDefinitions(ctx context.Context, children []string) (map[string]*config.Job, error) {
	ops := make([]clientv3.Op, len(children))
	for i, c := range children {
		ops[i] = clientv3.OpGet(n.keys.Config(c))
	}
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Txn(rctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("read the children's definitions: %w", err)
	}
	defs := map[string]*config.Job{}
	for i, c := range children {
		for _, kv := range resp.Responses[i].GetResponseRange().Kvs {
			var rc keyspace.RegisteredConfig
			if def, err := keyspace.DecodeRegistered(string(kv.Key), c, kv.Value, &rc, nil); err == nil {
				defs[c] = def
			}
		}
	}
	return defs, nil
}

// otherParents reads, for child of parents, each parent's lastsuccess but
// job's and what child consumed of them. It returns nil fires when one has
// nothing new, and the guards of what it read.
func (n *Node) otherParents(ctx context.Context, job, child string, parents []string) (map[string]string, []clientv3.Cmp, error) {
	ops := []clientv3.Op{clientv3.OpGet(n.keys.Deps(child))}
	others := slices.DeleteFunc(slices.Clone(parents), func(p string) bool { return p == job })
	for _, p := range others {
		ops = append(ops, clientv3.OpGet(n.keys.LastSuccess(p)))
	}
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	resp, err := n.opts.Client.Txn(rctx).Then(ops...).Commit()
	cancel()
	if err != nil {
		return nil, nil, fmt.Errorf("read the parents of %s: %w", child, err)
	}
	guard := func(key string, kvs []*mvccpb.KeyValue) clientv3.Cmp {
		if len(kvs) == 0 {
			return clientv3.Compare(clientv3.CreateRevision(key), "=", 0)
		}
		return clientv3.Compare(clientv3.ModRevision(key), "=", kvs[0].ModRevision)
	}
	consumed := map[string]string{}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	cmps := []clientv3.Cmp{guard(n.keys.Deps(child), kvs)}
	if len(kvs) > 0 {
		_ = json.Unmarshal(kvs[0].Value, &consumed) // malformed: nothing consumed
	}
	fires := map[string]string{}
	for i, p := range others {
		kvs := resp.Responses[i+1].GetResponseRange().Kvs
		cmps = append(cmps, guard(n.keys.LastSuccess(p), kvs))
		if len(kvs) == 0 || string(kvs[0].Value) == consumed[p] {
			fires = nil
			continue
		}
		if fires != nil {
			fires[p] = string(kvs[0].Value)
		}
	}
	return fires, cmps, nil
}

// barrierWhy says why a complete barrier did not succeed.
func barrierWhy(job, fire string, fireTime time.Time, b keyspace.Barrier) string {
	var parts []string
	if len(b.Failed) > 0 {
		parts = append(parts, fmt.Sprintf("item(s) %v failed", sortedInts(b.Failed)))
	}
	if len(b.Skipped) > 0 {
		parts = append(parts, fmt.Sprintf("item(s) %v were skipped", sortedInts(b.Skipped)))
	}
	if len(b.Stopped) > 0 {
		parts = append(parts, fmt.Sprintf("item(s) %v were killed", sortedInts(b.Stopped)))
	}
	return fmt.Sprintf("%s in fire %s of parent %s (fire key %s)", strings.Join(parts, ", "), fireTime.UTC().Format(time.RFC3339), job, fire)
}

func sortedInts(s []int) []int { return slices.Sorted(slices.Values(s)) }
