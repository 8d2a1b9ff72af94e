package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/config"
)

// runJob is one job's worker under session s: register the job's config and
// membership, then watch its map and campaign for its leadership until ctx
// is done.
func (n *Node) runJob(ctx context.Context, s *session, local *config.Job, removed *atomic.Bool) {
	log := n.log.With("job", local.Name)
	b := backoff{min: 100 * time.Millisecond, max: 2 * time.Second}
	for {
		if !n.admit(ctx) {
			return
		}
		err := n.registerJob(ctx, s, local)
		n.release()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return
		}
		log.Warn("register job", "err", err)
		if !sleep(ctx, b.next()) {
			return
		}
	}
	defer func() {
		if removed.Load() && s.ctx.Err() == nil { // the job left the config: leave it now
			dctx, cancel := context.WithTimeout(s.ctx, time.Second)
			n.opts.Client.Delete(dctx, n.keys.Member(local.Name, n.opts.ID))
			cancel()
			n.log.Info("left job", "job", local.Name)
		}
	}()

	stopFollowing := n.followMap(ctx, local.Name)
	defer stopFollowing()
	n.campaign(ctx, s, local)
}

// registerJob publishes the job's definition with ElasticJob's overwrite
// semantics (the registered copy wins unless the local job says overwrite:
// true; a malformed copy is replaced) and then the membership key.
func (n *Node) registerJob(ctx context.Context, s *session, local *config.Job) error {
	effective, conflict, err := n.registerConfig(ctx, local)
	if err != nil {
		return err
	}
	var republish bool
	n.updateView(local.Name, func(v *JobView) {
		republish = v.Conflict != conflict
		v.Job, v.Conflict = effective, conflict
	})
	if republish {
		n.republish() // the instance key lists conflicts, for shardd status
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
	resp, err := n.opts.Client.Txn(rctx).Then(clientv3.OpPut(key, "", clientv3.WithLease(s.lease)), clientv3.OpGet(key)).Commit()
	if err != nil {
		return fmt.Errorf("put member key: %w", err)
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	n.mu.Lock()
	if n.session == s && len(kvs) == 1 {
		n.members[local.Name] = kvs[0].CreateRevision // the guard of this session's claims
	}
	n.mu.Unlock()
	return nil
}

// registerConfig returns the effective definition of local's job and whether
// the local one conflicts with it.
func (n *Node) registerConfig(ctx context.Context, local *config.Job) (*config.Job, bool, error) {
	key := n.keys.Config(local.Name)
	log := n.log.With("job", local.Name)
	mine, err := json.Marshal(registeredConfig{Hash: local.Hash(), Job: local.JSON(), Writer: n.opts.ID, Written: n.opts.Now().UTC()})
	if err != nil {
		return nil, false, err
	}
	rctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
	defer cancel()
	resp, err := n.opts.Client.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(mine))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return nil, false, fmt.Errorf("register config %s: %w", key, err)
	}
	if resp.Succeeded {
		log.Info("registered job config", "hash", local.Hash())
		return local, false, nil
	}
	kv := resp.Responses[0].GetResponseRange().Kvs[0]
	registered, perr := n.parseRegistered(key, local.Name, kv.Value)
	replace := func(why string) (*config.Job, bool, error) {
		r, err := n.opts.Client.Txn(rctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
			Then(clientv3.OpPut(key, string(mine))).Commit()
		if err != nil {
			return nil, false, fmt.Errorf("replace config %s: %w", key, err)
		}
		if !r.Succeeded {
			return nil, false, fmt.Errorf("replace config %s: changed concurrently; retrying", key)
		}
		log.Info(why, "hash", local.Hash())
		return local, false, nil
	}
	switch {
	case perr != nil:
		log.Error("registered job config is malformed; replacing it with the local definition", "key", key, "err", perr)
		return replace("replaced malformed job config")
	case registered.Hash() == local.Hash():
		return local, false, nil
	case local.Overwrite:
		return replace("overwrote registered job config (overwrite: true)")
	default:
		log.Warn("local job definition differs from the registered one; using the registered one (set overwrite: true to replace it)",
			"local_hash", local.Hash(), "registered_hash", registered.Hash())
		return registered, true, nil
	}
}

// parseRegistered decodes a config key's value.
func (n *Node) parseRegistered(key, job string, data []byte) (*config.Job, error) {
	var rc registeredConfig
	if err := json.Unmarshal(data, &rc); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	j, err := config.ParseJobJSON(key, rc.Job)
	if err != nil {
		return nil, err
	}
	if j.Name != job {
		return nil, fmt.Errorf("defines job %q, not %q", j.Name, job)
	}
	return j, nil
}

// followMap keeps the node's view of job's shard map current until ctx is
// done or stop is called: it reads the map, takes every newer map the hub
// delivers, and reads again when the hub may have lost events. It holds no
// goroutine between reads: with thousands of jobs, a goroutine per job
// and purpose is most of an instance's memory.
func (n *Node) followMap(ctx context.Context, job string) (stop func()) {
	var (
		mu      sync.Mutex
		stopped bool
		reads   sync.WaitGroup
	)
	read := func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		reads.Add(1)
		go func() {
			defer reads.Done()
			n.readMap(ctx, job)
		}()
	}
	unsubscribe := n.hub.subscribe(job, n.keys.Shards(job), func(ev *clientv3.Event) {
		if ev.Type == clientv3.EventTypePut {
			n.observeMap(job, ev.Kv)
		}
	}, read)
	read()
	return func() {
		unsubscribe()
		mu.Lock()
		stopped = true
		mu.Unlock()
		reads.Wait()
	}
}

// readMap reads job's shard map into the view, retrying until it succeeds
// or ctx is done.
func (n *Node) readMap(ctx context.Context, job string) {
	b := backoff{min: 100 * time.Millisecond, max: 2 * time.Second}
	for {
		gctx, cancel := context.WithTimeout(ctx, n.opts.TTL)
		resp, err := n.opts.Client.Get(gctx, n.keys.Shards(job))
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			for _, kv := range resp.Kvs {
				n.observeMap(job, kv)
			}
			return
		}
		n.log.Debug("read shard map", "job", job, "err", err)
		sleep(ctx, b.next())
	}
}

// observeMap takes a newer, well-formed map into the job's view.
func (n *Node) observeMap(job string, kv *mvccpb.KeyValue) {
	m, err := decodeShardMap(kv.Value)
	if err != nil {
		n.log.Error("ignoring shard map; keeping the last good one", "job", job, "key", string(kv.Key), "err", err)
		return
	}
	var changed bool
	n.updateView(job, func(v *JobView) {
		if v.Map == nil || m.Epoch > v.Map.Epoch {
			v.Map, v.MapRev, changed = m, kv.ModRevision, true
		}
	})
	if !changed {
		return
	}
	n.log.Info("shard map", "job", job, "epoch", m.Epoch, "items", m.ItemsOf(n.opts.ID), "instances", m.Instances, "leader", m.Leader)
	if n.opts.OnMap != nil {
		n.opts.OnMap(job, m)
	}
	n.mu.Lock()
	subs := make([]func(), 0, len(n.mapSubs[job]))
	for _, fn := range n.mapSubs[job] {
		subs = append(subs, fn)
	}
	n.mu.Unlock()
	for _, fn := range subs {
		fn()
	}
}

func poke(c chan<- struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

var errNotLeader = errors.New("coord: not the leader")
