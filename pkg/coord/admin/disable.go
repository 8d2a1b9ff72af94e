package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

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
			members := "no live instance runs it"
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
	var children []string
	var paused keyspace.PauseStreak // the pause an enable ended
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
		// The job's children, at the same revision: an item disabled
		// makes every fire of a parent fail for them.
		ops := []clientv3.Op{op, clientv3.OpGet(c.keys.Children(t.Job))}
		if !on && t.Item < 0 && t.Instance == "" {
			// Enabling the job ends a pause of pauseAfterFailures: its
			// streak starts again.
			ops = append(ops, clientv3.OpGet(c.keys.Pause(t.Job)), clientv3.OpDelete(c.keys.Pause(t.Job)))
		}
		resp, err := c.cli.Txn(ctx).If(guards...).Then(ops...).Commit()
		if err != nil {
			return Disabling{}, fmt.Errorf("update %s: %w", key, err)
		}
		if !resp.Succeeded {
			return Disabling{}, opErr(ErrRefused, "job %q changed meanwhile (its definition, or the mark); nothing changed, try again", t.Job)
		}
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
			var idx keyspace.ParentsOf
			if json.Unmarshal(kvs[0].Value, &idx) == nil {
				children = slices.Sorted(maps.Keys(idx))
			}
		}
		if len(resp.Responses) > 2 {
			if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) > 0 && json.Unmarshal(kvs[0].Value, &paused) == nil && paused.PausedAt.IsZero() {
				paused = keyspace.PauseStreak{}
			}
		}
	}
	verb := map[bool]string{true: "disabled", false: "enabled"}[on]
	if res.Changed {
		res.Message = fmt.Sprintf("%s %s", verb, t)
		if !paused.PausedAt.IsZero() {
			res.Message += fmt.Sprintf(" (it was paused by pauseAfterFailures after %d failed fires in a row; their count starts again)", paused.FailedInARow)
		}
		if on && t.Item < 0 && t.Instance == "" && f.def != nil && f.def.Disabled {
			res.Message += " (its definition disables it too: disabled: true)"
		}
		if on && t.Instance != "" && len(f.members) > 0 && !slices.ContainsFunc(f.members, func(id string) bool {
			return id != t.Instance && !f.offInst[id]
		}) {
			res.Message += fmt.Sprintf("; warning: no enabled instance is left to run job %s, so its fires are not run until one is (shardd enable %s --instance %s)", t.Job, t.Job, t.Instance)
		}
		if on && t.Item >= 0 && len(children) > 0 {
			res.Message += fmt.Sprintf("; warning: jobs run after %s's fires (%s); while item %d is disabled it is recorded SKIPPED/disabled at each fire, so no fire succeeds and they record upstream-failed for each (disable them too if that is noise)", t.Job, strings.Join(children, ", "), t.Item)
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
