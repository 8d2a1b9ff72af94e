package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/schedule"
)

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
	// Busy are the items of Runs that were running when the trigger was
	// put: each runs it after its current run ends.
	Busy []int `json:"busy,omitempty"`
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
		Then(clientv3.OpPut(c.keys.Trigger(job, tr.ID), string(val), clientv3.WithLease(lease.ID)), clientv3.OpGet(c.keys.Children(job)),
			clientv3.OpGet(c.keys.Running(job), clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
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
	running := map[int]bool{}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		if item, err := strconv.Atoi(keyspace.LastSegment(string(kv.Key))); err == nil {
			running[item] = true
		}
	}
	for _, item := range res.Runs {
		if running[item] {
			res.Busy = append(res.Busy, item)
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
