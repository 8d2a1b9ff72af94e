package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// Job statuses, after ElasticJob's.
const (
	StatusOK       = "OK"       // the map covers exactly the eligible instances
	StatusCrashed  = "CRASHED"  // items are owned by an instance that is gone
	StatusDisabled = "DISABLED" // the job is disabled
	// StatusPaused is how status and the console show a DISABLED job that
	// disabled itself (JobStatus.Paused: pauseAfterFailures); the job's
	// Status stays DISABLED.
	StatusPaused     = "PAUSED"
	StatusResharding = "RESHARDING" // the map does not yet match the eligible instances
	// StatusNoInstances: no live instance can run the job (none defines
	// it, or every one that does is disabled for it).
	StatusNoInstances = "NO INSTANCES"
)

// ClusterStatus is everything `shardd status` shows.
type ClusterStatus struct {
	// Endpoints and Prefix name the cluster read; the caller fills in the
	// endpoints it dialled.
	Endpoints []string         `json:"endpoints,omitempty"`
	Prefix    string           `json:"prefix"`
	Revision  int64            `json:"revision"`
	Jobs      []JobStatus      `json:"jobs"`
	Instances []InstanceStatus `json:"instances"`
	// Alarms are etcd's raised alarms ("NOSPACE on member 8e9e05c52164694d"):
	// while NOSPACE is raised etcd refuses every write, and no run starts or
	// is recorded.
	Alarms []string `json:"alarms,omitempty"`
	// Rewinds are what instances saw of etcd going back in time (a restore,
	// a wipe), from the last day or not yet recovered from.
	Rewinds []keyspace.RewindRecord `json:"rewinds,omitempty"`
	// Etcd is the etcd cluster's health: its members, the leader, their
	// databases' sizes, the fault tolerance left.
	Etcd *EtcdHealth `json:"etcd,omitempty"`
	// now is when the status was read: what health judges lateness by.
	now time.Time
}

// JobStatus is one job as etcd has it.
type JobStatus struct {
	Name     string `json:"name"`
	Status   string `json:"status"`
	Leader   string `json:"leader"`
	Epoch    int64  `json:"epoch"`
	Strategy string `json:"strategy"`
	Total    int    `json:"total"`
	// Eligible are the live members not disabled for the job;
	// DisabledInstances the instances disabled for it, live or not.
	Eligible          []string `json:"eligible"`
	DisabledInstances []string `json:"disabledInstances,omitempty"`
	// Definition is the registered definition, nil when missing or malformed.
	Definition *DefinitionStatus `json:"definition,omitempty"`
	// Items maps each item to its owner ("" for none).
	Items         []ItemStatus `json:"items"`
	PerFire       bool         `json:"perFire,omitempty"`
	ConfigHash    string       `json:"configHash,omitempty"`
	DisabledItems []int        `json:"disabledItems,omitempty"`
	Problems      []string     `json:"problems,omitempty"`
	// DependsOn are the job's parents (dependsOn), Children the jobs that
	// depend on it: the dependency graph.
	DependsOn []string `json:"dependsOn,omitempty"`
	Children  []string `json:"children,omitempty"`
	// Health says how its runs go (see health.go).
	Health *Health `json:"health,omitempty"`
	// Placement says which instances may run the job, for an applied job
	// or one with instances.selector (docs/applied.md).
	Placement *PlacementStatus `json:"placement,omitempty"`
	// Paused is set while the job is disabled by its own failed fires
	// (pauseAfterFailures): how many, and why.
	Paused *keyspace.PauseStreak `json:"paused,omitempty"`
	// Slots says how the job's cluster-wide slots are used, for a job with
	// clusterConcurrency.
	Slots          *SlotsStatus `json:"slots,omitempty"`
	itemParameters map[int]string
	// runs are its items' records and running markers, read with the rest.
	runs *JobRuns
}

// SlotsStatus is a job's cluster-wide slots (clusterConcurrency): its
// limit, how many runs hold one, and the items waiting for one.
type SlotsStatus struct {
	Limit   int   `json:"limit"`
	InUse   int   `json:"inUse"`
	Waiting []int `json:"waiting,omitempty"`
}

// DefinitionStatus identifies a job's registered definition.
type DefinitionStatus struct {
	Hash string `json:"hash"`
	// Generation is the config key's ModRevision: it grows with every
	// publication.
	Generation int64     `json:"generation"`
	Writer     string    `json:"writer"`
	Written    time.Time `json:"written"`
	// Job is the definition itself, as JSON.
	Job json.RawMessage `json:"job"`
	// Conflicts are the live instances whose own definition differs (they
	// run this one).
	Conflicts []string `json:"conflicts,omitempty"`
	// Source is "file" or "applied"; By who wrote it; Version its number.
	Source  string `json:"source"`
	By      string `json:"by,omitempty"`
	Version int64  `json:"version,omitempty"`
}

// PlacementStatus is which live instances may run a job.
type PlacementStatus struct {
	Selector string `json:"selector,omitempty"`
	// Matching are the live instances whose labels the selector matches
	// (every live instance without a selector).
	Matching []string `json:"matching"`
	// Refusing are the matching instances that do not run the applied
	// job, each with why (their acceptance of applied definitions).
	Refusing map[string]string `json:"refusing,omitempty"`
	// FilesBehind are the live instances whose files define the applied
	// job too: their files are behind it.
	FilesBehind []string `json:"filesBehind,omitempty"`
}

// ItemStatus is one item of a job.
type ItemStatus struct {
	Item      int    `json:"item"`
	Parameter string `json:"parameter,omitempty"`
	Instance  string `json:"instance"`
}

// InstanceStatus is one live instance.
type InstanceStatus struct {
	keyspace.InstanceInfo
	Lease string `json:"lease"`
}

// Status reads the cluster's state from etcd at one revision.
func (c *Client) Status(ctx context.Context) (*ClusterStatus, error) {
	if c.shown != nil {
		ctx = c.shown(ctx)
	}
	return c.readStatus(ctx, c.keys.Jobs())
}

// JobStatus reads the instances and one job, as Status does; the
// job is missing from Jobs when etcd has no key of it.
func (c *Client) JobStatus(ctx context.Context, job string) (*ClusterStatus, error) {
	return c.readStatus(ctx, c.keys.JobPrefix(job))
}

// EtcdProblems says, a line each, what keeps etcd from taking shardd's
// writes (its alarms) and what instances saw of its history going back.
func (st *ClusterStatus) EtcdProblems() []string {
	out := st.Etcd.Problems()
	for _, a := range st.Alarms {
		out = append(out, fmt.Sprintf("etcd alarm: %s: etcd refuses every write; no run starts or is recorded until it is compacted, defragmented and disarmed (docs/operations.md)", a))
	}
	for _, r := range st.Rewinds {
		what := fmt.Sprintf("etcd went back in time: %s saw it at %s (%s)", r.Instance, r.Detected.Format(time.RFC3339), r.Reason)
		switch {
		case !r.Recovered.IsZero():
			what += fmt.Sprintf("; recovered at %s, %d item record(s) written back", r.Recovered.Format(time.RFC3339), r.Repaired)
		case r.Waiting != "":
			what += "; NOT RECOVERED, it starts no run: " + r.Waiting
		default:
			what += "; recovering"
		}
		out = append(out, what)
	}
	return out
}

// recentRewinds decodes the rewind records not yet recovered from, or
// recovered from within the last day.
func recentRewinds(kvs []*mvccpb.KeyValue, now time.Time) []keyspace.RewindRecord {
	var out []keyspace.RewindRecord
	for _, kv := range kvs {
		var r keyspace.RewindRecord
		if json.Unmarshal(kv.Value, &r) != nil {
			continue
		}
		if r.Recovered.IsZero() || now.Sub(r.Recovered) < 24*time.Hour {
			out = append(out, r)
		}
	}
	return out
}

// readAlarms lists etcd's raised alarms; nothing when it cannot (a user
// without the right to list them).
func (c *Client) readAlarms(ctx context.Context) []string {
	resp, err := c.cli.AlarmList(ctx)
	if err != nil {
		return nil
	}
	var out []string
	for _, a := range resp.Alarms {
		out = append(out, fmt.Sprintf("%s on member %x (memberID:%d in etcdctl alarm list)", a.Alarm, a.MemberID, a.MemberID))
	}
	return out
}

// readStatus reads the instances and the jobs with keys under jobsPrefix.
func (c *Client) readStatus(ctx context.Context, jobsPrefix string) (*ClusterStatus, error) {
	// The etcd members' health, beside the rest, for the whole status only
	// (a job's page need not wait for a member that is down).
	var etcd *EtcdHealth
	members := make(chan struct{})
	if jobsPrefix == c.keys.Jobs() {
		go func() { defer close(members); etcd = c.EtcdHealth(ctx) }()
	} else {
		close(members)
	}
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpGet(c.keys.Instances(), clientv3.WithPrefix()),
		clientv3.OpGet(jobsPrefix, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(c.keys.Rewinds(), clientv3.WithPrefix()),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", c.keys.Prefix(), err)
	}
	rev := resp.Header.Revision
	cs := &ClusterStatus{Prefix: c.keys.Prefix(), Revision: rev, Jobs: []JobStatus{}, Instances: []InstanceStatus{},
		Rewinds: recentRewinds(resp.Responses[2].GetResponseRange().Kvs, time.Now()), Alarms: c.readAlarms(ctx), now: time.Now()}
	alive := cs.addInstances(resp.Responses[0].GetResponseRange().Kvs)
	byJob := c.groupJobKeys(resp.Responses[1].GetResponseRange().Kvs)
	names := make([]string, 0, len(byJob))
	for name := range byJob {
		names = append(names, name)
	}
	sort.Strings(names)
	perJob, err := c.readJobKeys(ctx, names, rev)
	if err != nil {
		return nil, err
	}
	decoded := decodeJobKeys(c.keys, names, perJob)
	for i, name := range names {
		cs.Jobs = append(cs.Jobs, cs.jobStatus(name, byJob[name], perJob[i], decoded[i], alive))
	}
	if err := c.readStreaks(ctx, cs, rev); err != nil {
		return nil, err
	}
	if err := c.readPauses(ctx, cs, byJob, rev); err != nil {
		return nil, err
	}
	<-members
	cs.Etcd = etcd
	if jobsPrefix == c.keys.Jobs() {
		linkChildren(cs.Jobs)
	} else {
		for i := range cs.Jobs {
			if err := c.linkOne(ctx, &cs.Jobs[i], rev); err != nil {
				return nil, err
			}
		}
	}
	return cs, nil
}

// addInstances adds the instances registered in kvs to cs, and returns
// which are alive (registered).
func (cs *ClusterStatus) addInstances(kvs []*mvccpb.KeyValue) map[string]bool {
	alive := map[string]bool{}
	for _, kv := range kvs {
		var info keyspace.InstanceInfo
		if err := json.Unmarshal(kv.Value, &info); err != nil {
			info.ID = keyspace.LastSegment(string(kv.Key))
		}
		alive[keyspace.LastSegment(string(kv.Key))] = true
		cs.Instances = append(cs.Instances, InstanceStatus{InstanceInfo: info, Lease: fmt.Sprintf("%x", kv.Lease)})
	}
	return alive
}

// jobKeys is what the names of a job's keys say: its members and what is
// disabled.
type jobKeys struct {
	members       []string
	disabledInst  map[string]bool
	disabledList  []string
	disabledItems []int
	jobOff        bool
	pause         bool  // it has a pause streak (pauseAfterFailures)
	slots         int   // cluster slots held (clusterConcurrency)
	waiting       []int // items waiting for one
}

// groupJobKeys sorts the keys of the jobs keyspace (keys only) by job.
func (c *Client) groupJobKeys(kvs []*mvccpb.KeyValue) map[string]*jobKeys {
	byJob := map[string]*jobKeys{}
	for _, kv := range kvs {
		key := string(kv.Key)
		name := c.keys.JobOf(key)
		if name == "" {
			continue
		}
		jk := byJob[name]
		if jk == nil {
			jk = &jobKeys{disabledInst: map[string]bool{}}
			byJob[name] = jk
		}
		switch {
		case strings.HasPrefix(key, c.keys.Members(name)):
			jk.members = append(jk.members, keyspace.LastSegment(key))
		case key == c.keys.DisabledJob(name):
			jk.jobOff = true
		case key == c.keys.Pause(name):
			jk.pause = true
		case strings.HasPrefix(key, c.keys.Slots(name)):
			jk.slots++
		case strings.HasPrefix(key, c.keys.Waiting(name)):
			if n, err := strconv.Atoi(keyspace.LastSegment(key)); err == nil {
				jk.waiting = append(jk.waiting, n)
			}
		case strings.HasPrefix(key, c.keys.DisabledInstances(name)):
			jk.disabledInst[keyspace.LastSegment(key)] = true
			jk.disabledList = append(jk.disabledList, keyspace.LastSegment(key))
		case strings.HasPrefix(key, c.keys.DisabledItems(name)):
			if n, err := strconv.Atoi(keyspace.LastSegment(key)); err == nil {
				jk.disabledItems = append(jk.disabledItems, n)
			}
		}
	}
	return byJob
}

// jobStatus is the status of job name from its keys (jk), the answers of
// its reads (r: see readJobKeys) and their decoding, given which
// instances are alive; cs's instances say which use a definition of
// their own.
func (cs *ClusterStatus) jobStatus(name string, jk *jobKeys, r []*etcdserverpb.ResponseOp, d decodedJob, alive map[string]bool) JobStatus {
	js := JobStatus{Name: name, Eligible: []string{}, Items: []ItemStatus{}, DisabledInstances: jk.disabledList}
	sort.Strings(jk.members)
	for _, id := range jk.members {
		if !jk.disabledInst[id] {
			js.Eligible = append(js.Eligible, id)
		}
	}
	sort.Ints(jk.disabledItems)
	js.DisabledItems = jk.disabledItems
	if kvs := r[2].GetResponseRange().Kvs; len(kvs) > 0 {
		js.Leader = string(kvs[0].Value)
	}
	configDisabled := false
	if kvs := r[1].GetResponseRange().Kvs; len(kvs) > 0 {
		rc, def, err := d.rc, d.def, d.defErr
		if err != nil {
			what := "registered definition is malformed: "
			if keyspace.DefinitionStateOf(err) == keyspace.DefinitionUnreadable {
				what = "registered definition cannot be read by this shardd version (written by a newer one?): "
			}
			js.Problems = append(js.Problems, what+err.Error())
		} else {
			configDisabled = def.Disabled
			js.itemParameters = def.ShardingItemParameters
			js.DependsOn = def.DependsOn
			source := rc.Source
			if source == "" {
				source = keyspace.SourceFile
			}
			js.Definition = &DefinitionStatus{Hash: rc.Hash, Generation: kvs[0].ModRevision, Writer: rc.Writer, Written: rc.Written, Job: rc.Job,
				Source: source, By: rc.By, Version: rc.Version}
			js.Placement = cs.placement(name, rc.Applied(), def)
		}
	} else {
		js.Problems = append(js.Problems, "no registered definition: no instance defines the job any more (shardd remove deletes what is left)")
	}
	m := d.m
	if d.mErr != nil {
		js.Problems = append(js.Problems, d.mErr.Error())
	}
	for _, in := range cs.Instances {
		if slices.Contains(in.Conflicts, name) {
			js.Problems = append(js.Problems, fmt.Sprintf("instance %s has a different local definition and uses the registered one", in.ID))
			if js.Definition != nil {
				js.Definition.Conflicts = append(js.Definition.Conflicts, in.ID)
			}
		}
	}
	if p := js.Placement; p != nil {
		for _, id := range slices.Sorted(maps.Keys(p.Refusing)) {
			what := "matches the selector but does not run the applied job"
			if p.Selector == "" {
				what = "does not run the applied job"
			}
			js.Problems = append(js.Problems, fmt.Sprintf("instance %s %s: %s", id, what, p.Refusing[id]))
		}
		if js.Definition != nil {
			js.Definition.Conflicts = append(js.Definition.Conflicts, p.FilesBehind...)
		}
		for _, id := range p.FilesBehind {
			js.Problems = append(js.Problems, fmt.Sprintf("instance %s's files define the job too; the applied definition stands (its files are behind: drop the job from them)", id))
		}
	}
	if d.def != nil && d.def.ClusterConcurrency > 0 {
		js.Slots = &SlotsStatus{Limit: d.def.ClusterConcurrency, InUse: jk.slots, Waiting: slices.Sorted(slices.Values(jk.waiting))}
	}
	js.Status = jobState(m, js.Eligible, alive, jk.jobOff || configDisabled)
	switch {
	case js.Status == StatusNoInstances && len(jk.members) == 0 && js.Placement != nil && js.Placement.Selector != "" && len(js.Placement.Matching) == 0:
		js.Problems = append(js.Problems, fmt.Sprintf("instances.selector %q matches no live instance", js.Placement.Selector))
	case js.Status == StatusNoInstances && len(jk.members) == 0 && js.Placement != nil && len(js.Placement.Refusing) > 0:
		js.Problems = append(js.Problems, "no live instance runs it: the ones it could run on refuse it (above)")
	case js.Status == StatusNoInstances && len(jk.members) == 0:
		js.Problems = append(js.Problems, "no live instance defines the job")
	case js.Status == StatusNoInstances:
		js.Problems = append(js.Problems, "every instance that defines the job is disabled for it")
	}
	jr := decodeJobRuns(r[3].GetResponseRange().Kvs, r[4].GetResponseRange().Kvs, r[5].GetResponseRange().Kvs)
	total := 0
	if m != nil {
		total = m.Total
	} else if d.def != nil {
		total = d.def.ShardingTotalCount
	}
	var registered time.Time
	if js.Definition != nil {
		registered = js.Definition.Written
	}
	js.Health = jobHealth(jr, d.def, registered, js.DisabledItems, jk.jobOff || configDisabled, total, cs.now)
	js.runs = &jr
	if m == nil && d.def != nil { // no map yet: what the definition says
		js.Strategy, js.Total = d.def.Strategy, d.def.ShardingTotalCount
	}
	if m != nil {
		js.Epoch, js.Strategy, js.Total, js.PerFire, js.ConfigHash = m.Epoch, m.Strategy, m.Total, m.PerFire, m.ConfigHash
		for item := 0; item < m.Total; item++ {
			owner := m.Owner(item)
			switch {
			case owner != "" && !alive[owner]:
				owner += " (gone)" // a map no leader has rewritten since
			case owner != "" && !slices.Contains(jk.members, owner):
				owner += " (left the job)" // likewise: the job moved away from it
			}
			js.Items = append(js.Items, ItemStatus{Item: item, Parameter: js.itemParameters[item], Instance: owner})
		}
	}
	return js
}

// placement is which live instances may run job (registered with def,
// applied or not), nil for a file job without a selector.
func (cs *ClusterStatus) placement(job string, applied bool, def *config.Job) *PlacementStatus {
	if !applied && def.Instances == nil {
		return nil
	}
	p := &PlacementStatus{Matching: []string{}}
	if def.Instances != nil {
		p.Selector = def.Instances.Selector
	}
	for _, in := range cs.Instances {
		if !def.Eligible(in.Labels) {
			continue
		}
		p.Matching = append(p.Matching, in.ID)
		why, ok := in.Refused[job]
		if !in.Accepts.Applied {
			// It says so once in its key, not once a job.
			why, ok = "this instance does not run applied definitions (start it with --accept-applied)", true
		}
		if ok && applied {
			if p.Refusing == nil {
				p.Refusing = map[string]string{}
			}
			p.Refusing[in.ID] = why
		}
	}
	for _, in := range cs.Instances {
		if applied && slices.Contains(in.AppliedOverFiles, job) {
			p.FilesBehind = append(p.FilesBehind, in.ID)
		}
	}
	return p
}

// decodedJob is a job's definition and map as status decodes them.
type decodedJob struct {
	rc     keyspace.RegisteredConfig
	def    *config.Job
	defErr error
	m      *keyspace.ShardMap
	mErr   error
}

// decodeJobKeys decodes each job's definition and map (the responses of
// readJobKeys), on every CPU: with 10,000 jobs, parsing the definitions
// was most of shardd status's own CPU.
func decodeJobKeys(keys keyspace.Keys, names []string, perJob [][]*etcdserverpb.ResponseOp) []decodedJob {
	out := make([]decodedJob, len(names))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1) - 1); i < len(names); i = int(next.Add(1) - 1) {
				d, r, name := &out[i], perJob[i], names[i]
				if kvs := r[1].GetResponseRange().Kvs; len(kvs) > 0 {
					d.def, d.defErr = keyspace.DecodeRegistered(keys.Config(name), name, kvs[0].Value, &d.rc, nil)
				}
				if kvs := r[0].GetResponseRange().Kvs; len(kvs) > 0 {
					d.m, d.mErr = keyspace.DecodeShardMap(kvs[0].Value)
				}
			}
		}()
	}
	wg.Wait()
	return out
}

// statusOpsPerJob are the reads of one job in readJobKeys: its map, its
// definition, its leader, and for its health its items' records, running
// markers and last failure.
const statusOpsPerJob = 6

// statusReaders is how many read Txns readJobKeys has in flight.
const statusReaders = 8

// readJobKeys reads each job's map, definition, leader and runs at rev,
// many jobs per Txn (within etcd's default --max-txn-ops of 128) and
// statusReaders Txns at a time: a cluster of 10,000 jobs takes about 480
// Txns, not 10,000 round trips. It returns the statusOpsPerJob responses
// of each job, in the order of names.
func (c *Client) readJobKeys(ctx context.Context, names []string, rev int64) ([][]*etcdserverpb.ResponseOp, error) {
	const perTxn = 128 / statusOpsPerJob
	out := make([][]*etcdserverpb.ResponseOp, len(names))
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	sem := make(chan struct{}, statusReaders)
	for from := 0; from < len(names); from += perTxn {
		chunk := names[from:min(from+perTxn, len(names))]
		var ops []clientv3.Op
		for _, name := range chunk {
			ops = append(ops,
				clientv3.OpGet(c.keys.Shards(name), clientv3.WithRev(rev)),
				clientv3.OpGet(c.keys.Config(name), clientv3.WithRev(rev)),
				clientv3.OpGet(c.keys.Leader(name), append(clientv3.WithFirstCreate(), clientv3.WithRev(rev))...),
				clientv3.OpGet(c.keys.Items(name), clientv3.WithPrefix(), clientv3.WithRev(rev)),
				clientv3.OpGet(c.keys.Running(name), clientv3.WithPrefix(), clientv3.WithRev(rev)),
				clientv3.OpGet(c.keys.LastFailure(name), clientv3.WithRev(rev)))
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
			if err != nil {
				cancel(fmt.Errorf("read jobs %s to %s: %w", chunk[0], chunk[len(chunk)-1], err))
				return
			}
			for i := range chunk {
				out[from+i] = resp.Responses[i*statusOpsPerJob : (i+1)*statusOpsPerJob]
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && ctx.Err() != nil {
		return nil, err
	}
	return out, nil
}

func jobState(m *keyspace.ShardMap, eligible []string, alive map[string]bool, disabled bool) string {
	switch {
	case disabled || m != nil && m.Disabled:
		return StatusDisabled
	case len(eligible) == 0:
		return StatusNoInstances
	case m == nil:
		return StatusResharding
	}
	for id := range m.Items {
		if !alive[id] && len(m.Items[id]) > 0 {
			return StatusCrashed
		}
	}
	if !slices.Equal(m.Instances, eligible) {
		return StatusResharding
	}
	return StatusOK
}

// Maps reads every job's published shard map in one request, keyed by job
// name. A malformed map is left out: its leader replaces it.
func (c *Client) Maps(ctx context.Context) (map[string]*keyspace.ShardMap, error) {
	resp, err := c.cli.Get(ctx, c.keys.Jobs(), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", c.keys.Jobs(), err)
	}
	maps := map[string]*keyspace.ShardMap{}
	for _, kv := range resp.Kvs {
		job := c.keys.JobOf(string(kv.Key))
		if job == "" || string(kv.Key) != c.keys.Shards(job) {
			continue
		}
		var m keyspace.ShardMap
		if json.Unmarshal(kv.Value, &m) == nil {
			maps[job] = &m
		}
	}
	return maps, nil
}

// FollowMaps calls fn with every version of every job's shard map from
// revision from on (1: all of etcd's history that is not compacted; m is
// nil where the map was deleted), in order, until fn returns false, ctx
// ends or the watch fails. A benchmark follows a cluster's convergence
// this way without reading every map again at each look.
func (c *Client) FollowMaps(ctx context.Context, from int64, fn func(job string, m *keyspace.ShardMap) bool) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range c.cli.Watch(wctx, c.keys.Jobs(), clientv3.WithPrefix(), clientv3.WithRev(from)) {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch %s: %w", c.keys.Jobs(), err)
		}
		for _, ev := range wr.Events {
			job := c.keys.JobOf(string(ev.Kv.Key))
			if job == "" || string(ev.Kv.Key) != c.keys.Shards(job) {
				continue
			}
			var m *keyspace.ShardMap
			if ev.Type == clientv3.EventTypePut {
				m = &keyspace.ShardMap{}
				if json.Unmarshal(ev.Kv.Value, m) != nil {
					m = nil
				}
			}
			if !fn(job, m) {
				return nil
			}
		}
	}
	return ctx.Err()
}

// JobRuns is what a job's items did last: each item's latest record and
// the instance running it now, if any.
type JobRuns struct {
	Records map[int]keyspace.ItemRecord
	Running map[int]string
	// LastFailure is the job's latest failed run (any item), nil if none.
	LastFailure *keyspace.ItemRecord
}

// runsPerTxn bounds the jobs of one JobRuns Txn (3 reads each, within
// etcd's default --max-txn-ops of 128).
const runsPerTxn = 42

// JobRuns reads the latest record and running marker of every item of
// jobs, in Txns of runsPerTxn jobs, four at a time. A RUNNING record's
// Fence is set to its claim's revision.
func (c *Client) JobRuns(ctx context.Context, jobs []string) (map[string]JobRuns, error) {
	out := make(map[string]JobRuns, len(jobs))
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		first error
		slots = make(chan struct{}, 4)
	)
	for from := 0; from < len(jobs); from += runsPerTxn {
		chunk := jobs[from:min(from+runsPerTxn, len(jobs))]
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			ops := make([]clientv3.Op, 0, 3*len(chunk))
			for _, job := range chunk {
				ops = append(ops, clientv3.OpGet(c.keys.Items(job), clientv3.WithPrefix()), clientv3.OpGet(c.keys.Running(job), clientv3.WithPrefix()),
					clientv3.OpGet(c.keys.LastFailure(job)))
			}
			resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if first == nil {
					first = fmt.Errorf("read the items of %d jobs: %w", len(chunk), err)
				}
				return
			}
			for i, job := range chunk {
				r := resp.Responses
				jr := decodeJobRuns(r[3*i].GetResponseRange().Kvs, r[3*i+1].GetResponseRange().Kvs, r[3*i+2].GetResponseRange().Kvs)
				out[job] = jr
			}
		}()
	}
	wg.Wait()
	return out, first
}

// Runs returns the job's items' records and running markers as the status
// read them (at its revision), and false for a JobStatus not read by
// Status or JobStatus.
func (js *JobStatus) Runs() (JobRuns, bool) {
	if js.runs == nil {
		return JobRuns{}, false
	}
	return *js.runs, true
}

// decodeJobRuns decodes a job's item records, running markers and last
// failure (the keys under Items, Running and LastFailure). A RUNNING
// record's Fence is set to its claim's revision.
func decodeJobRuns(items, running, lastFailure []*mvccpb.KeyValue) JobRuns {
	jr := JobRuns{Records: map[int]keyspace.ItemRecord{}, Running: map[int]string{}}
	for _, kv := range items {
		var rec keyspace.ItemRecord
		if n, err := strconv.Atoi(keyspace.LastSegment(string(kv.Key))); err == nil && json.Unmarshal(kv.Value, &rec) == nil {
			rec.Fence = keyspace.RunFence(&rec, kv.ModRevision)
			jr.Records[n] = rec
		}
	}
	for _, kv := range running {
		if n, err := strconv.Atoi(keyspace.LastSegment(string(kv.Key))); err == nil {
			jr.Running[n] = string(kv.Value)
		}
	}
	if len(lastFailure) > 0 {
		var rec keyspace.ItemRecord
		if json.Unmarshal(lastFailure[0].Value, &rec) == nil {
			jr.LastFailure = &rec
		}
	}
	return jr
}

// linkChildren fills each job's Children from the others' DependsOn, and
// notes a parent no instance defines as a problem of its child.
func linkChildren(jobs []JobStatus) {
	at := map[string]int{}
	for i, j := range jobs {
		at[j.Name] = i
	}
	for i, j := range jobs {
		for _, p := range j.DependsOn {
			if k, ok := at[p]; ok {
				jobs[k].Children = append(jobs[k].Children, j.Name)
			} else {
				jobs[i].Problems = append(jobs[i].Problems, fmt.Sprintf("depends on job %s, which no instance defines: it never fires from it", p))
			}
		}
	}
}

// linkOne does linkChildren's work for one job read alone: its children
// from its children index, its parents checked by their config keys.
func (c *Client) linkOne(ctx context.Context, js *JobStatus, rev int64) error {
	ops := []clientv3.Op{clientv3.OpGet(c.keys.Children(js.Name), clientv3.WithRev(rev))}
	for _, p := range js.DependsOn {
		ops = append(ops, clientv3.OpGet(c.keys.Config(p), clientv3.WithRev(rev), clientv3.WithCountOnly()))
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("read the dependencies of %s: %w", js.Name, err)
	}
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		var idx keyspace.ParentsOf
		if json.Unmarshal(kvs[0].Value, &idx) == nil {
			js.Children = slices.Sorted(maps.Keys(idx))
		}
	}
	for i, p := range js.DependsOn {
		if resp.Responses[i+1].GetResponseRange().Count == 0 {
			js.Problems = append(js.Problems, fmt.Sprintf("depends on job %s, which no instance defines: it never fires from it", p))
		}
	}
	return nil
}

// readPauses sets Paused on the disabled jobs whose pause streak paused
// them: only those are read (a job's streak key is in the keys listing).
func (c *Client) readPauses(ctx context.Context, cs *ClusterStatus, byJob map[string]*jobKeys, rev int64) error {
	for i := range cs.Jobs {
		jk := byJob[cs.Jobs[i].Name]
		if jk == nil || !jk.pause || !jk.jobOff {
			continue
		}
		resp, err := c.cli.Get(ctx, c.keys.Pause(cs.Jobs[i].Name), clientv3.WithRev(rev))
		if err != nil {
			return fmt.Errorf("read the pause of job %s: %w", cs.Jobs[i].Name, err)
		}
		var st keyspace.PauseStreak
		if len(resp.Kvs) == 1 && json.Unmarshal(resp.Kvs[0].Value, &st) == nil && !st.PausedAt.IsZero() {
			cs.Jobs[i].Paused = &st
		}
	}
	return nil
}
