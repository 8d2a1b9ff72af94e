package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/shard"
)

// jobFacts is what etcd holds of one job, read at one revision: what the
// operator commands validate their targets against.
type jobFacts struct {
	name      string
	exists    bool        // any key of the job exists
	def       *config.Job // the registered definition; nil when missing or malformed
	reg       keyspace.RegisteredConfig
	configRev int64 // ModRevision of the config key, 0 when missing
	shards    *keyspace.ShardMap
	members   []string // instances that define the job now (sorted)
	running   []int    // items with a running marker
	leaders   int      // election candidates (campaigns)
	jobOff    bool     // disabled/job exists
	// paused is the job's streak of failed fires when it paused the job
	// (pauseAfterFailures): its disable mark is the job's own.
	paused   *keyspace.PauseStreak
	offItems map[int]bool
	offInst  map[string]bool
}

// readJobFacts reads what the operator commands check, in one request,
// whose answers are taken by position: a new fact is a new Op at the end
// and its answer read at that index. A command that acts on a fact guards
// its write with a Compare of the key it came from, so that the write
// fails when the fact changed since (see Trigger, SetDisabled, Remove).
// Members are under their instances' leases: the members are the live
// instances that define the job.
func (c *Client) readJobFacts(ctx context.Context, job string) (*jobFacts, error) {
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpGet(c.keys.Config(job)),
		clientv3.OpGet(c.keys.Shards(job)),
		clientv3.OpGet(c.keys.Members(job), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(c.keys.Running(job), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(c.keys.Disabled(job), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(c.keys.JobPrefix(job), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(c.keys.Leader(job), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(c.keys.Pause(job)),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("read job %q from etcd: %w", job, err)
	}
	f := &jobFacts{name: job, offItems: map[int]bool{}, offInst: map[string]bool{}}
	f.exists = resp.Responses[5].GetResponseRange().Count > 0
	f.leaders = int(resp.Responses[6].GetResponseRange().Count)
	if kvs := resp.Responses[7].GetResponseRange().Kvs; len(kvs) > 0 {
		var st keyspace.PauseStreak
		if json.Unmarshal(kvs[0].Value, &st) == nil && !st.PausedAt.IsZero() {
			f.paused = &st
		}
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		f.configRev = kvs[0].ModRevision
		if j, err := keyspace.DecodeRegistered(c.keys.Config(job), job, kvs[0].Value, &f.reg, nil); err == nil {
			f.def = j
		}
	}
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		f.shards, _ = keyspace.DecodeShardMap(kvs[0].Value)
	}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		f.members = append(f.members, keyspace.LastSegment(string(kv.Key)))
	}
	sort.Strings(f.members)
	for _, kv := range resp.Responses[3].GetResponseRange().Kvs {
		if n, err := strconv.Atoi(keyspace.LastSegment(string(kv.Key))); err == nil {
			f.running = append(f.running, n)
		}
	}
	for _, kv := range resp.Responses[4].GetResponseRange().Kvs {
		key := string(kv.Key)
		switch {
		case key == c.keys.DisabledJob(job):
			f.jobOff = true
		case strings.HasPrefix(key, c.keys.DisabledItems(job)):
			if n, err := strconv.Atoi(keyspace.LastSegment(key)); err == nil {
				f.offItems[n] = true
			}
		case strings.HasPrefix(key, c.keys.DisabledInstances(job)):
			f.offInst[keyspace.LastSegment(key)] = true
		}
	}
	return f, nil
}

// knownJobs lists the jobs registered in the cluster, for "unknown job"
// messages: a read of every key name, so only on that error path.
func (c *Client) knownJobs(ctx context.Context) []string {
	resp, err := c.cli.Get(ctx, c.keys.Jobs(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil
	}
	var names []string
	for _, kv := range resp.Kvs {
		if name := c.keys.JobOf(string(kv.Key)); string(kv.Key) == c.keys.Config(name) {
			names = append(names, name)
		}
	}
	return names
}

// unknownJob returns the error for a job etcd does not know, naming the
// jobs it does.
func (c *Client) unknownJob(ctx context.Context, job string) error {
	known := c.knownJobs(ctx)
	if len(known) == 0 {
		return opErr(ErrUnknownJob, "no job %q in the cluster at prefix %s: it has no jobs", job, c.keys.Prefix())
	}
	if near, ok := config.Nearest(job, known); ok {
		return opErr(ErrUnknownJob, "no job %q in the cluster at prefix %s (did you mean %s?)", job, c.keys.Prefix(), near)
	}
	if len(known) > 20 {
		known = append(known[:20], fmt.Sprintf("and %d more", len(known)-20))
	}
	return opErr(ErrUnknownJob, "no job %q in the cluster at prefix %s (jobs: %s)", job, c.keys.Prefix(), strings.Join(known, ", "))
}

// requireJob returns the job's facts, or ErrUnknownJob when no key of it
// exists.
func (c *Client) requireJob(ctx context.Context, job string) (*jobFacts, error) {
	f, err := c.readJobFacts(ctx, job)
	if err != nil {
		return nil, err
	}
	if !f.exists {
		return nil, c.unknownJob(ctx, job)
	}
	return f, nil
}

// total is the number of items the job has now: the registered
// definition's shardingTotalCount, or, for BROADCAST (one item per
// instance), the current map's. ok is false when neither is known.
func (f *jobFacts) total() (n int, ok bool) {
	if f.def != nil && f.def.Strategy != shard.Broadcast {
		return f.def.ShardingTotalCount, true
	}
	if f.shards != nil {
		return f.shards.Total, true
	}
	return 0, false
}

// checkItem validates item (>= 0) against the job's items.
func (f *jobFacts) checkItem(item int) error {
	n, ok := f.total()
	switch {
	case !ok:
		return opErr(ErrRefused, "job %q has no readable definition or shard map in etcd; cannot check item %d", f.name, item)
	case item >= n && n == 0:
		return opErr(ErrBadTarget, "job %q has no items now (no instance runs it)", f.name)
	case item >= n:
		return opErr(ErrBadTarget, "job %q has items 0-%d; there is no item %d", f.name, n-1, item)
	}
	return nil
}

// disabledWhy says why the whole job is disabled ("" when it is not).
func (f *jobFacts) disabledWhy() string {
	switch {
	case f.def != nil && f.def.Disabled:
		return fmt.Sprintf("job %q is disabled in its definition (disabled: true, registered by %s at %s); remove it from the job's YAML and reload",
			f.name, f.reg.Writer, f.reg.Written.Format(time.RFC3339))
	case f.jobOff && f.paused != nil:
		return fmt.Sprintf("job %q paused itself after %d failed fires in a row (pauseAfterFailures, at %s); `shardd enable %s` resumes it",
			f.name, f.paused.FailedInARow, f.paused.PausedAt.Format(time.RFC3339), f.name)
	case f.jobOff:
		return fmt.Sprintf("job %q is disabled by an operator; `shardd enable %s` enables it", f.name, f.name)
	}
	return ""
}

// eligible returns the members not disabled for the job.
func (f *jobFacts) eligible() []string {
	var out []string
	for _, id := range f.members {
		if !f.offInst[id] {
			out = append(out, id)
		}
	}
	return out
}

// noInstancesWhy explains an empty eligible set.
func (f *jobFacts) noInstancesWhy() string {
	if len(f.members) == 0 {
		return "no live instance is a member of it: none defines it, or none its selector matches runs it (shardd status says why)"
	}
	return "every instance that defines it is disabled for it: " + strings.Join(f.members, ", ")
}

// requireItem checks that job exists and, when item >= 0, that it has
// that item (a disabled job or item is no error here: reads show them).
func (c *Client) requireItem(ctx context.Context, job string, item int) error {
	f, err := c.requireJob(ctx, job)
	if err != nil || item < 0 {
		return err
	}
	if err := f.checkItem(item); err != nil && !errors.Is(err, ErrRefused) {
		return err
	}
	return nil
}
