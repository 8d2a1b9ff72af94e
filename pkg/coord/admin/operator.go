package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/schedule"
	"github.com/shardd/shardd/pkg/shard"
)

// The operator commands (trigger, disable, enable, remove, history) check
// their target against what etcd holds before they change anything, and
// refuse with one of these errors (errors.Is), whose message says exactly
// what is wrong. The API answers 404, 400 and 409 for them.
var (
	// ErrUnknownJob: no job of that name is registered in the cluster.
	ErrUnknownJob = errors.New("unknown job")
	// ErrBadTarget: the item or instance named does not exist for the job.
	ErrBadTarget = errors.New("no such target")
	// ErrRefused: the target exists but the command cannot act on it now
	// (a disabled job, a job no instance runs, a job still defined).
	ErrRefused = errors.New("refused")
)

// opError is an operator error of one of the kinds above.
type opError struct {
	kind error
	msg  string
}

func (e *opError) Error() string { return e.msg }

func (e *opError) Unwrap() error { return e.kind }

func opErr(kind error, format string, args ...any) error {
	return &opError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

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
	offItems  map[int]bool
	offInst   map[string]bool
	live      map[string]bool // live instance ids
}

// readJobFacts reads what the operator commands check, in one request.
func (c *Client) readJobFacts(ctx context.Context, job string) (*jobFacts, error) {
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpGet(c.keys.Config(job)),
		clientv3.OpGet(c.keys.Shards(job)),
		clientv3.OpGet(c.keys.Members(job), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(c.keys.Running(job), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(c.keys.Disabled(job), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(c.keys.Instances(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(c.keys.JobPrefix(job), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(c.keys.Leader(job), clientv3.WithPrefix(), clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return nil, fmt.Errorf("read job %q from etcd: %w", job, err)
	}
	f := &jobFacts{name: job, offItems: map[int]bool{}, offInst: map[string]bool{}, live: map[string]bool{}}
	f.exists = resp.Responses[6].GetResponseRange().Count > 0
	f.leaders = int(resp.Responses[7].GetResponseRange().Count)
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		f.configRev = kvs[0].ModRevision
		if j, err := keyspace.DecodeRegistered(c.keys.Config(job), job, kvs[0].Value, &f.reg); err == nil {
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
	for _, kv := range resp.Responses[5].GetResponseRange().Kvs {
		f.live[keyspace.LastSegment(string(kv.Key))] = true
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

// TriggerTTL is how long a trigger request stays in etcd at most (its
// lease): it is deleted sooner once every item it names served it. A run
// queued behind a long one waits for it, on whichever instance then owns
// its item, up to this long.
const TriggerTTL = time.Hour

// Triggered says what a trigger request will run.
type Triggered struct {
	keyspace.Trigger
	// Runs are the items that will run; Disabled those left out because
	// they are disabled.
	Runs     []int `json:"runs"`
	Disabled []int `json:"disabled,omitempty"`
	// Children are the jobs that run after the job's fires (dependsOn);
	// NoPropagate says this trigger's runs will not trigger them.
	Children []string `json:"children,omitempty"`
}

// TriggerRequest is a manual run an operator asks for.
type TriggerRequest struct {
	Job string
	// Items to run; empty runs every item.
	Items []int
	// Param is a one-off parameter for the run (at most MaxTriggerParam
	// bytes of UTF-8, no NUL: it goes into the run's environment).
	Param string
	// Fire, if set, is a past scheduled fire of the job to run again: RFC
	// 3339 ("2026-12-01T02:00:00Z", "...+08:00"), or a date and time
	// without an offset ("2026-12-01 02:00[:00]", "2026-12-01T02:00:00"),
	// read in the job's time zone.
	Fire string
	// By names who asks (see Trigger.By).
	By string
	// NoPropagate keeps the runs' outcome from triggering the job's
	// children (dependsOn). A trigger of some items never does, nor one
	// that leaves disabled items out: its fire is not the whole job's.
	NoPropagate bool
}

// Detail is what the audit log keeps of the request's arguments.
func (r TriggerRequest) Detail() string {
	var d []string
	if r.Fire != "" {
		d = append(d, "fire="+r.Fire)
	}
	if r.Param != "" {
		d = append(d, "param="+strconv.Quote(r.Param))
	}
	if r.NoPropagate {
		d = append(d, "no-propagate")
	}
	return strings.Join(d, " ")
}

// MaxTriggerParam bounds a trigger's parameter: it travels in the item's
// record and history and in the run's environment.
const MaxTriggerParam = 16 << 10

// Trigger asks the cluster to run the job's items (every item when
// none is named) once, as source MANUAL: now, or for a past scheduled fire
// (r.Rerun). It refuses an unknown job or item, a disabled job or item, a
// job no instance can run, a bad parameter, and a rerun time that is not a
// past fire of the job's schedule. The owners of the items run them; the
// request is deleted once every item served it, or expires after
// TriggerTTL.
func (c *Client) Trigger(ctx context.Context, r TriggerRequest) (Triggered, error) {
	job, items := r.Job, r.Items
	if err := checkParam(r.Param); err != nil {
		return Triggered{}, err
	}
	f, err := c.requireJob(ctx, job)
	if err != nil {
		return Triggered{}, err
	}
	if f.configRev == 0 {
		return Triggered{}, opErr(ErrRefused, "job %q has no registered definition: no instance defines it any more (`shardd remove %s` deletes what is left)", job, job)
	}
	if why := f.disabledWhy(); why != "" {
		return Triggered{}, opErr(ErrRefused, "%s", why)
	}
	if len(f.eligible()) == 0 {
		return Triggered{}, opErr(ErrRefused, "no live instance can run job %q (%s); the trigger would expire unserved", job, f.noInstancesWhy())
	}
	var res Triggered
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(c.keys.Config(job)), "=", f.configRev),
		clientv3.Compare(clientv3.CreateRevision(c.keys.DisabledJob(job)), "=", 0),
	}
	if len(items) == 0 {
		n, _ := f.total()
		for i := range n {
			if f.offItems[i] {
				res.Disabled = append(res.Disabled, i)
			} else {
				res.Runs = append(res.Runs, i)
			}
		}
		if len(res.Runs) == 0 {
			return Triggered{}, opErr(ErrRefused, "every item of job %q is disabled", job)
		}
	}
	for _, item := range items {
		if item < 0 {
			return Triggered{}, opErr(ErrBadTarget, "item %d: items are numbered from 0", item)
		}
		if err := f.checkItem(item); err != nil {
			return Triggered{}, err
		}
		if f.offItems[item] {
			return Triggered{}, opErr(ErrRefused, "item %d of job %q is disabled; `shardd enable %s --item %d` enables it", item, job, job, item)
		}
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(c.keys.DisabledItem(job, item)), "=", 0))
		res.Runs = append(res.Runs, item)
	}
	var rerun time.Time
	if r.Fire != "" {
		if rerun, err = f.checkRerun(r.Fire, time.Now()); err != nil {
			return Triggered{}, err
		}
	}
	lease, err := c.cli.Grant(ctx, int64(TriggerTTL/time.Second))
	if err != nil {
		return Triggered{}, fmt.Errorf("trigger job %q: %w", job, err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	// A key of its own: two triggers in one millisecond must not share one.
	tr := keyspace.Trigger{ID: keyspace.NewRequestID(now), Items: items, Fire: now, By: r.By, Param: r.Param, NoPropagate: r.NoPropagate || len(r.Items) > 0 || len(res.Disabled) > 0}
	if !rerun.IsZero() {
		tr.Rerun = rerun.UTC()
	}
	val, _ := json.Marshal(tr)
	cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(c.keys.Trigger(job, tr.ID)), "=", 0))
	resp, err := c.cli.Txn(ctx).If(cmps...).
		Then(clientv3.OpPut(c.keys.Trigger(job, tr.ID), string(val), clientv3.WithLease(lease.ID)), clientv3.OpGet(c.keys.Children(job))).Commit()
	if err != nil {
		return Triggered{}, fmt.Errorf("trigger job %q: %w", job, err)
	}
	if !resp.Succeeded {
		return Triggered{}, opErr(ErrRefused, "job %q changed while the trigger was checked (its definition, or an item or the job was disabled); nothing triggered, try again", job)
	}
	tr.Rev = resp.Header.Revision
	res.Trigger = tr
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		var idx keyspace.ParentsOf
		if json.Unmarshal(kvs[0].Value, &idx) == nil {
			res.Children = slices.Sorted(maps.Keys(idx))
		}
	}
	return res, nil
}

// checkParam validates a trigger's parameter.
func checkParam(p string) error {
	switch {
	case len(p) > MaxTriggerParam:
		return opErr(ErrBadTarget, "the parameter is %d bytes; at most %d are allowed", len(p), MaxTriggerParam)
	case !utf8.ValidString(p):
		return opErr(ErrBadTarget, "the parameter is not valid UTF-8")
	case strings.IndexByte(p, 0) >= 0:
		return opErr(ErrBadTarget, "the parameter contains a NUL byte, which no environment variable can hold")
	}
	return nil
}

// fireLayouts are the layouts of a rerun's fire without an offset, read
// in the job's time zone.
var fireLayouts = []string{"2006-01-02T15:04:05", "2006-01-02 15:04:05", "2006-01-02T15:04", "2006-01-02 15:04"}

// checkRerun reads and validates a rerun's fire: a scheduled fire of the
// job that is not in the future. A wrong time is refused naming the fires
// around it.
func (f *jobFacts) checkRerun(text string, now time.Time) (time.Time, error) {
	if f.def == nil {
		return time.Time{}, opErr(ErrRefused, "job %q has no readable definition in etcd; cannot check the fire %s", f.name, text)
	}
	if f.def.Schedule == nil {
		return time.Time{}, opErr(ErrBadTarget, "job %q has no cron schedule: it has no fires to run again (trigger it without a fire)", f.name)
	}
	loc := f.def.Location
	if loc == nil {
		loc = time.UTC
	}
	fire, err := time.Parse(time.RFC3339Nano, text)
	if err != nil {
		if fire, err = localFire(text, loc, f.def.Schedule); err != nil {
			return time.Time{}, err
		}
	}
	return fire, f.checkFire(fire, loc, now)
}

// localFire reads a date and time without an offset in loc, for a job of
// schedule s. A wall-clock time that loc has twice (the clocks went back)
// names the instant the job fired at, when it fired at only one of them (a
// fixed-time job fires the first time only); else both are named, for the
// operator to choose. One that loc skips (a daylight-saving gap) names no
// instant: the error says whether the job fired when the clocks jumped.
func localFire(text string, loc *time.Location, s schedule.Schedule) (time.Time, error) {
	isFire := func(t time.Time) bool { return s != nil && s.Next(t.Add(-time.Nanosecond)).Equal(t) }
	for _, layout := range fireLayouts {
		wall, err := time.Parse(layout, text)
		if err != nil {
			continue
		}
		at, jump := schedule.Instants(loc, wall)
		switch {
		case len(at) == 0 && !schedule.FollowsTheClock(s) && isFire(jump):
			return time.Time{}, opErr(ErrBadTarget, "fire %q does not exist in time zone %s (the clocks skipped it; the job's fire for it ran when they jumped, at %s): give that, %s", text, loc, jump.Format(time.RFC3339), jump.Format(time.RFC3339))
		case len(at) == 0:
			return time.Time{}, opErr(ErrBadTarget, "fire %q does not exist in time zone %s (the clocks skipped it, from %s, and the job, which follows the clock, did not fire in the gap)", text, loc, jump.Format(time.RFC3339))
		case len(at) == 1:
			return at[0], nil
		case isFire(at[0]) != isFire(at[1]):
			if isFire(at[0]) {
				return at[0], nil // the time the job fired at, of the two
			}
			return at[1], nil
		default:
			return time.Time{}, opErr(ErrBadTarget, "fire %q happens twice in time zone %s (the clocks went back): give its offset, %s or %s", text, loc, at[0].Format(time.RFC3339), at[1].Format(time.RFC3339))
		}
	}
	return time.Time{}, opErr(ErrBadTarget, "fire %q: want RFC 3339 (2026-12-01T02:00:00Z) or a date and time in the job's time zone %s (2026-12-01 02:00:00)", text, loc)
}

// checkFire validates fire as a past scheduled fire of the job.
func (f *jobFacts) checkFire(fire time.Time, loc *time.Location, now time.Time) error {
	if fire.After(now) {
		return opErr(ErrBadTarget, "fire %s of job %q is in the future; --fire runs a past fire again", fire.In(loc).Format(time.RFC3339), f.name)
	}
	if next := f.def.Schedule.Next(fire.Add(-time.Nanosecond)); !next.Equal(fire) {
		prev := previousFire(f.def.Schedule, fire)
		near := "next " + next.In(loc).Format(time.RFC3339)
		if !prev.IsZero() {
			near = "previous " + prev.In(loc).Format(time.RFC3339) + ", " + near
		}
		return opErr(ErrBadTarget, "%s is not a fire of job %q (cron %q, time zone %s); the fires around it: %s",
			fire.In(loc).Format(time.RFC3339), f.name, f.def.Cron, loc, near)
	}
	return nil
}

// previousFire is the schedule's last fire before t, searched back up to
// a year; zero when none.
func previousFire(s interface{ Next(time.Time) time.Time }, t time.Time) time.Time {
	for span := time.Minute; span <= 366*24*time.Hour; span *= 4 {
		var last time.Time
		for next := s.Next(t.Add(-span)); !next.IsZero() && next.Before(t); next = s.Next(next) {
			last = next
		}
		if !last.IsZero() {
			return last
		}
	}
	return time.Time{}
}

// noInstancesWhy explains an empty eligible set.
func (f *jobFacts) noInstancesWhy() string {
	if len(f.members) == 0 {
		return "no live instance defines it"
	}
	return "every instance that defines it is disabled for it: " + strings.Join(f.members, ", ")
}

// Target names what disable and enable act on: a whole job, one item of it
// (Item >= 0) or one instance for it (Instance != "").
type Target struct {
	Job      string
	Item     int
	Instance string
}

// String names the target as the commands print it.
func (t Target) String() string {
	switch {
	case t.Item >= 0:
		return fmt.Sprintf("item %d of job %s", t.Item, t.Job)
	case t.Instance != "":
		return fmt.Sprintf("instance %s for job %s", t.Instance, t.Job)
	}
	return "job " + t.Job
}

// Disabling is what SetDisabled did.
type Disabling struct {
	Target Target `json:"-"`
	// Changed is false when the target already was as asked.
	Changed bool `json:"changed"`
	// Disabled is the target's state afterwards.
	Disabled bool `json:"disabled"`
	// Message says what happened, for a person.
	Message string `json:"message"`
}

// SetDisabled disables (on) or enables a job, one item of it or one
// instance for it, after checking that the target exists: an unknown job,
// an item out of range or an instance that does not run the job is
// refused; force lets an operator disable an instance before it first
// starts. Enabling a job whose definition says disabled: true removes an
// operator's mark but is refused, since the job stays disabled.
func (c *Client) SetDisabled(ctx context.Context, t Target, on, force bool) (Disabling, error) {
	if t.Item >= 0 && t.Instance != "" {
		return Disabling{}, opErr(ErrBadTarget, "an item and an instance exclude each other")
	}
	f, err := c.requireJob(ctx, t.Job)
	if err != nil {
		return Disabling{}, err
	}
	var key string
	var was bool
	switch {
	case t.Item >= 0:
		if err := f.checkItem(t.Item); err != nil && !(errors.Is(err, ErrBadTarget) && !on && f.offItems[t.Item]) {
			return Disabling{}, err // enabling an item that no longer exists is allowed: it cleans up
		}
		key, was = c.keys.DisabledItem(t.Job, t.Item), f.offItems[t.Item]
	case t.Instance != "":
		if err := config.CheckName(t.Instance); err != nil {
			return Disabling{}, opErr(ErrBadTarget, "instance %v", err)
		}
		known := slices.Contains(f.members, t.Instance) || f.offInst[t.Instance]
		if !known && !force {
			members := "no live instance defines it"
			if len(f.members) > 0 {
				members = "its instances: " + strings.Join(f.members, ", ")
			}
			hint := ""
			if on {
				hint = "; to disable it before it starts, force it (--force; force=true in the API)"
			}
			return Disabling{}, opErr(ErrBadTarget, "instance %s does not run job %s (%s)%s", t.Instance, t.Job, members, hint)
		}
		key, was = c.keys.DisabledInstance(t.Job, t.Instance), f.offInst[t.Instance]
	default:
		key, was = c.keys.DisabledJob(t.Job), f.jobOff
	}
	res := Disabling{Target: t, Changed: was != on, Disabled: on}
	if res.Changed {
		// Guarded by what was checked: the definition the item was checked
		// against, and the mark as it was read.
		guards := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(c.keys.Config(t.Job)), "=", f.configRev)}
		if was {
			guards = append(guards, clientv3.Compare(clientv3.CreateRevision(key), ">", 0))
		} else {
			guards = append(guards, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
		}
		op := clientv3.OpDelete(key)
		if on {
			op = clientv3.OpPut(key, time.Now().UTC().Format(time.RFC3339))
		}
		resp, err := c.cli.Txn(ctx).If(guards...).Then(op).Commit()
		if err != nil {
			return Disabling{}, fmt.Errorf("update %s: %w", key, err)
		}
		if !resp.Succeeded {
			return Disabling{}, opErr(ErrRefused, "job %q changed meanwhile (its definition, or the mark); nothing changed, try again", t.Job)
		}
	}
	verb := map[bool]string{true: "disabled", false: "enabled"}[on]
	if res.Changed {
		res.Message = fmt.Sprintf("%s %s", verb, t)
		if on && t.Item < 0 && t.Instance == "" && f.def != nil && f.def.Disabled {
			res.Message += " (its definition disables it too: disabled: true)"
		}
		if on && t.Instance != "" && len(f.members) > 0 && !slices.ContainsFunc(f.members, func(id string) bool {
			return id != t.Instance && !f.offInst[id]
		}) {
			res.Message += fmt.Sprintf("; warning: no enabled instance is left to run job %s, so its fires are not run until one is (shardd enable %s --instance %s)", t.Job, t.Job, t.Instance)
		}
	} else {
		res.Message = fmt.Sprintf("%s was already %s; nothing changed", t, verb)
	}
	if !on && t.Item < 0 && t.Instance == "" && f.def != nil && f.def.Disabled {
		res.Disabled = true
		msg := "job %q stays disabled: its definition says disabled: true (registered by %s at %s); remove it from the job's YAML and reload"
		if res.Changed {
			msg = "removed the operator's disable mark, but " + msg
		}
		return res, opErr(ErrRefused, msg, t.Job, f.reg.Writer, f.reg.Written.Format(time.RFC3339))
	}
	return res, nil
}

// Remove deletes every key of a job that no instance defines any more
// (its definition, map, records, history, disable marks). It refuses while
// any live instance is a member of the job or runs one of its items: such
// an instance would register the job again at once. It returns the number
// of c.keys deleted.
func (c *Client) Remove(ctx context.Context, job string) (int64, error) {
	f, err := c.requireJob(ctx, job)
	if err != nil {
		return 0, err
	}
	if len(f.members) > 0 {
		return 0, opErr(ErrRefused, "job %q is still defined by live instances (%s); remove it from their config first", job, strings.Join(f.members, ", "))
	}
	if len(f.running) > 0 {
		return 0, opErr(ErrRefused, "items of job %q are still running (%v); wait for them to end", job, f.running)
	}
	if f.leaders > 0 {
		return 0, opErr(ErrRefused, "an instance still leads or campaigns for job %q (it is stopping); try again in a moment", job)
	}
	resp, err := c.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.CreateRevision(c.keys.Members(job)), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(c.keys.Running(job)), "=", 0).WithPrefix(),
		clientv3.Compare(clientv3.CreateRevision(c.keys.Leader(job)), "=", 0).WithPrefix(),
	).Then(clientv3.OpDelete(c.keys.JobPrefix(job), clientv3.WithPrefix())).Commit()
	if err != nil {
		return 0, fmt.Errorf("remove job %q: %w", job, err)
	}
	if !resp.Succeeded {
		return 0, opErr(ErrRefused, "an instance joined job %q or ran one of its items meanwhile; nothing removed", job)
	}
	return resp.Responses[0].GetResponseDeleteRange().Deleted, nil
}

// History reads a job's history (Records), only item's when item
// >= 0, after checking that the job and the item exist.
func (c *Client) History(ctx context.Context, job string, item int) ([]keyspace.ItemRecord, error) {
	f, err := c.requireJob(ctx, job)
	if err != nil {
		return nil, err
	}
	if item >= 0 {
		if err := f.checkItem(item); err != nil && !errors.Is(err, ErrRefused) {
			return nil, err
		}
	}
	recs, err := c.Records(ctx, job)
	if err != nil || item < 0 {
		return recs, err
	}
	return slices.DeleteFunc(recs, func(r keyspace.ItemRecord) bool { return r.Item != item }), nil
}
