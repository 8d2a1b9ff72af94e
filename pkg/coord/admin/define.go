package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// Defining jobs through etcd (docs/applied.md): apply, get, delete,
// versions and rollback of a job's registered definition. Each write is
// one Txn guarded by the config key's revision as read (a change meanwhile
// refuses it, saying so), writes the job's version record and its audit
// entry with it, and is refused whole on any error. Refusals are audited
// too.

// Definition is a job's registered definition as etcd holds it.
type Definition struct {
	Name       string
	Job        *config.Job // nil when this version cannot read it (Err)
	Err        error
	Registered keyspace.RegisteredConfig
	// Generation is the config key's ModRevision.
	Generation int64
	// Selector is the applied job's placement selector ("" for none).
	Selector string
}

// Applied reports whether the definition was applied.
func (d *Definition) Applied() bool { return d.Registered.Applied() }

// Definition reads job's registered definition; ErrUnknownJob when there
// is none.
func (c *Client) Definition(ctx context.Context, job string) (*Definition, error) {
	d, err := c.readDefinition(ctx, job)
	if err == nil && d == nil {
		return nil, c.unknownJob(ctx, job)
	}
	return d, err
}

// readDefinition reads job's config key; nil, nil when it has none.
func (c *Client) readDefinition(ctx context.Context, job string) (*Definition, error) {
	resp, err := c.cli.Get(ctx, c.keys.Config(job))
	if err != nil {
		return nil, fmt.Errorf("read the definition of job %q: %w", job, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	kv := resp.Kvs[0]
	d := &Definition{Name: job, Generation: kv.ModRevision}
	d.Job, d.Err = keyspace.DecodeRegistered(c.keys.Config(job), job, kv.Value, &d.Registered, nil)
	if d.Job != nil && d.Job.Instances != nil {
		d.Selector = d.Job.Instances.Selector
	}
	return d, nil
}

// ApplyOptions say who applies and how.
type ApplyOptions struct {
	By string // the actor, as in the audit log
	// TakeOver lets apply replace a definition a host's file published:
	// the job becomes applied, and the hosts whose files define it show
	// the conflict until their files drop it.
	TakeOver bool
	// DryRun computes every change without writing.
	DryRun bool
	// Change names the kind of change in the version record: "apply"
	// (default) or "import".
	Change string
}

// ApplyResult is what apply did (or would do) to one job.
type ApplyResult struct {
	Job string `json:"job"`
	// Action: "create", "update", "take-over", "unchanged"; "" when Err.
	Action string               `json:"action,omitempty"`
	Diff   []config.FieldChange `json:"diff,omitempty"`
	// Version and Generation of the definition written (0 in a dry run,
	// or when unchanged: the registered one's).
	Version    int64  `json:"version,omitempty"`
	Generation int64  `json:"generation,omitempty"`
	Err        string `json:"error,omitempty"`
	// Notes say what apply changed of the definition given (an
	// overwrite: true it left out).
	Notes []string `json:"notes,omitempty"`
}

// Apply registers each job as its applied definition, one Txn per job.
// It returns a result per job and an error that says how many were
// refused (the others are applied: each job stands alone).
func (c *Client) Apply(ctx context.Context, jobs []*config.Job, o ApplyOptions) ([]ApplyResult, error) {
	if o.Change == "" {
		o.Change = "apply"
	}
	var out []ApplyResult
	refused := 0
	for _, j := range jobs {
		r, err := c.applyOne(ctx, j, o)
		if err != nil {
			r.Err, r.Action = err.Error(), ""
			refused++
			if !o.DryRun {
				c.auditDefine(ctx, o.By, o.Change, j.Name, "", err)
			}
		}
		out = append(out, r)
	}
	if refused > 0 {
		return out, opErr(ErrRefused, "%d of %d job(s) not applied", refused, len(jobs))
	}
	return out, nil
}

// refuseApplied says why job j cannot be applied at all, whatever is
// registered.
func refuseApplied(j *config.Job) error {
	if len(j.DependsOn) > 0 {
		return opErr(ErrRefused, "job %q: dependsOn is not supported in applied definitions yet: define the job and its parents in the hosts' files (docs/applied.md)", j.Name)
	}
	return nil
}

// withoutOverwrite returns j with overwrite off, and whether it was on:
// overwrite says how a host publishes its file, and an applied definition
// replaces the registered one by itself (it is not in the hash).
func withoutOverwrite(j *config.Job) (*config.Job, bool) {
	if !j.Overwrite {
		return j, false
	}
	c := *j
	c.Overwrite = false
	if k, err := config.ParseJobJSON("apply", c.JSON()); err == nil {
		return k, true
	}
	return j, false
}

func (c *Client) applyOne(ctx context.Context, j *config.Job, o ApplyOptions) (ApplyResult, error) {
	r := ApplyResult{Job: j.Name}
	if err := refuseApplied(j); err != nil {
		return r, err
	}
	var dropped bool
	if j, dropped = withoutOverwrite(j); dropped {
		r.Notes = append(r.Notes, "overwrite: true left out: an applied definition replaces the registered one by itself")
	}
	cur, err := c.readDefinition(ctx, j.Name)
	if err != nil {
		return r, err
	}
	var old *config.Job
	cmp := clientv3.Compare(clientv3.CreateRevision(c.keys.Config(j.Name)), "=", 0)
	var prev keyspace.RegisteredConfig
	switch {
	case cur == nil:
		r.Action = "create"
		// Versions left by an earlier life of the job (its config key
		// deleted by other means): numbering goes on past them, so that
		// no record is written over and the newest stays the newest.
		last, err := c.lastVersion(ctx, j.Name)
		if err != nil {
			return r, err
		}
		prev.Version = last
	case cur.Err != nil && keyspace.DefinitionStateOf(cur.Err) == keyspace.DefinitionUnreadable:
		return r, opErr(ErrRefused, "job %q: its registered definition cannot be read by this shardd (%v): upgrade this shardd, or shardd remove the job", j.Name, cur.Err)
	case !cur.Applied() && !o.TakeOver:
		return r, opErr(ErrRefused, "job %q is defined in the hosts' files (registered by %s); apply --take-over makes it applied, and then no file publishes over it", j.Name, dash(cur.Registered.By, cur.Registered.Writer))
	default:
		old, prev = cur.Job, cur.Registered
		cmp = clientv3.Compare(clientv3.ModRevision(c.keys.Config(j.Name)), "=", cur.Generation)
		r.Action = "update"
		if !cur.Applied() {
			r.Action = "take-over"
		}
	}
	r.Diff = config.Diff(old, j)
	if old != nil && old.Hash() == j.Hash() && cur.Applied() {
		r.Action, r.Diff, r.Version, r.Generation = "unchanged", nil, cur.Registered.Version, cur.Generation
		return r, nil
	}
	if o.DryRun {
		return r, nil
	}
	change := o.Change
	if r.Action == "take-over" {
		change = "take-over"
	}
	rc := newRegistered(j, &prev, cur != nil, keyspace.SourceApplied, o.By)
	if cur == nil {
		rc.Version = prev.Version + 1
	}
	detail := r.Action
	if r.Action != "create" {
		detail += " " + summarize(r.Diff)
	}
	gen, err := c.writeDefinition(ctx, j.Name, rc, cmp, change, 0, detail)
	if err != nil {
		return r, err
	}
	r.Version, r.Generation = rc.Version, gen
	return r, nil
}

// lastVersion is the number of job's newest version record, 0 for none.
func (c *Client) lastVersion(ctx context.Context, job string) (int64, error) {
	resp, err := c.cli.Get(ctx, c.keys.Versions(job), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1), clientv3.WithKeysOnly())
	if err != nil {
		return 0, fmt.Errorf("read the versions of job %q: %w", job, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	n, _ := strconv.ParseInt(keyspace.LastSegment(string(resp.Kvs[0].Key)), 10, 64)
	return n, nil
}

// newRegistered is the config value that registers j over prev (when
// had), from source, by who.
func newRegistered(j *config.Job, prev *keyspace.RegisteredConfig, had bool, source, by string) keyspace.RegisteredConfig {
	rc := keyspace.RegisteredConfig{Hash: j.Hash(), Job: j.JSON(), Writer: by, Written: time.Now().UTC(), Source: source, By: by, Version: 1}
	if had {
		rc.Follow(prev)
	}
	return rc
}

// writeDefinition writes rc as job's registered definition, guarded by
// cmp: the config key, its version record, the applied job's placement
// (or its removal, for a file job's rollback), and the audit entry. It
// returns the generation written.
func (c *Client) writeDefinition(ctx context.Context, job string, rc keyspace.RegisteredConfig, cmp clientv3.Cmp, change string, of int64, detail string) (int64, error) {
	val, err := json.Marshal(rc)
	if err != nil {
		return 0, err
	}
	ops := []clientv3.Op{clientv3.OpPut(c.keys.Config(job), string(val))}
	vkey, vval, from, end := c.keys.VersionWrite(job, rc, change, of)
	ops = append(ops, clientv3.OpPut(vkey, vval))
	if end != "" {
		ops = append(ops, clientv3.OpDelete(from, clientv3.WithRange(end)))
	}
	if rc.Applied() {
		var sel string
		if def, err := config.ParseJobJSON(c.keys.Config(job), rc.Job); err == nil && def.Instances != nil {
			sel = def.Instances.Selector
		}
		p, _ := json.Marshal(keyspace.Placement{Selector: sel})
		ops = append(ops, clientv3.OpPut(c.keys.Placement(job), string(p)))
	}
	ops = append(ops, c.auditOp(keyspace.AuditEntry{Actor: rc.By, Action: change, Job: job, Target: "job " + job,
		Detail: fmt.Sprintf("version %d, hash %s", rc.Version, rc.Hash), Outcome: keyspace.AuditOK, Message: detail}))
	resp, err := c.cli.Txn(ctx).If(cmp).Then(ops...).Commit()
	if err != nil {
		return 0, fmt.Errorf("write the definition of job %q: %w", job, err)
	}
	if !resp.Succeeded {
		return 0, opErr(ErrRefused, "job %q: its registered definition changed while this was being written (someone else applied, a host published, or it was deleted); nothing written: look at shardd diff again", job)
	}
	return resp.Header.Revision, nil
}

// auditOp is the put of the audit entry e, for a Txn.
func (c *Client) auditOp(e keyspace.AuditEntry) clientv3.Op {
	e.Stamp(time.Now())
	val, _ := json.Marshal(e)
	return clientv3.OpPut(c.keys.Audit()+e.ID, string(val))
}

// auditDefine records a refused or failed definition change.
func (c *Client) auditDefine(ctx context.Context, by, action, job, detail string, err error) {
	c.RecordAudit(ctx, keyspace.AuditEntry{Actor: by, Action: action, Job: job, Target: "job " + job, Detail: detail, Outcome: AuditOutcome(err), Message: err.Error()})
}

// summarize is a diff in one bounded line, for the audit log.
func summarize(d []config.FieldChange) string {
	fields := make([]string, 0, len(d))
	for _, c := range d {
		fields = append(fields, c.Field)
	}
	s := strings.Join(fields, ", ")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	if s == "" {
		return "(no field changed)"
	}
	return "(" + s + ")"
}

func dash(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return "?"
}

// Version is one kept definition of a job.
type Version struct {
	keyspace.VersionRecord
	// Generation is the version record's ModRevision: the generation of
	// the definition it registered.
	Generation int64 `json:"generation"`
	// Current is set on the registered one.
	Current bool `json:"current,omitempty"`
	// Diff is what it changed from the version before it (nil for the
	// oldest kept).
	Diff []config.FieldChange `json:"diff,omitempty"`
	// Job is the definition, when this version reads it.
	Def *config.Job `json:"-"`
	Err string      `json:"error,omitempty"`
}

// Versions lists job's kept definitions, newest first, each with its diff
// from the one before.
func (c *Client) Versions(ctx context.Context, job string) ([]Version, error) {
	resp, err := c.cli.Txn(ctx).Then(clientv3.OpGet(c.keys.Versions(job), clientv3.WithPrefix()), clientv3.OpGet(c.keys.Config(job))).Commit()
	if err != nil {
		return nil, fmt.Errorf("read the versions of job %q: %w", job, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	cfg := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 && len(cfg) == 0 {
		return nil, c.unknownJob(ctx, job)
	}
	var cur keyspace.RegisteredConfig
	if len(cfg) > 0 {
		json.Unmarshal(cfg[0].Value, &cur)
	}
	out := make([]Version, 0, len(kvs))
	var before *config.Job
	for _, kv := range kvs { // oldest first
		var v Version
		if err := json.Unmarshal(kv.Value, &v.VersionRecord); err != nil {
			continue
		}
		v.Generation = kv.ModRevision
		v.Current = len(cfg) > 0 && v.Version == cur.Version && v.Hash == cur.Hash
		def, err := config.ParseJobJSON(string(kv.Key), v.Job)
		if err != nil {
			v.Err = err.Error()
		} else {
			v.Def = def
			if before != nil {
				v.Diff = config.Diff(before, def)
			}
		}
		before = def
		out = append(out, v)
	}
	slices.Reverse(out)
	return out, nil
}

// Rollback registers again the definition of job's version `to` (a
// version number; a generation also finds it), as a new version.
func (c *Client) Rollback(ctx context.Context, job string, to int64, by string) (ApplyResult, error) {
	r, err := c.rollback(ctx, job, to, by)
	if err != nil {
		c.auditDefine(ctx, by, "rollback", job, fmt.Sprintf("to %d", to), err)
	}
	return r, err
}

func (c *Client) rollback(ctx context.Context, job string, to int64, by string) (ApplyResult, error) {
	r := ApplyResult{Job: job}
	versions, err := c.Versions(ctx, job)
	if err != nil {
		return r, err
	}
	var target *Version
	for i := range versions {
		if versions[i].Version == to || versions[i].Generation == to {
			target = &versions[i]
			break
		}
	}
	if target == nil {
		kept := make([]string, 0, len(versions))
		for _, v := range versions {
			kept = append(kept, fmt.Sprint(v.Version))
		}
		return r, opErr(ErrBadTarget, "job %q has no version %d (kept: %s; shardd history --definitions %s)", job, to, strings.Join(kept, " "), job)
	}
	if target.Def == nil {
		return r, opErr(ErrRefused, "job %q: version %d does not validate in this shardd: %s", job, target.Version, target.Err)
	}
	cur, err := c.readDefinition(ctx, job)
	if err != nil {
		return r, err
	}
	if cur == nil {
		return r, opErr(ErrRefused, "job %q has no registered definition (deleted?); apply it instead", job)
	}
	if !cur.Applied() {
		// What an operator writes is applied, run only by the hosts that
		// accept applied definitions: a rollback written as a file's
		// definition would make hosts that accept none run it.
		return r, opErr(ErrRefused, "job %q is defined in the hosts' files: roll their files back; or make it applied with that version (run only by the hosts that accept applied definitions): shardd get %s --version %d | shardd apply --take-over -f -", job, job, target.Version)
	}
	if cur.Job != nil && cur.Job.Hash() == target.Def.Hash() {
		r.Action, r.Version, r.Generation = "unchanged", cur.Registered.Version, cur.Generation
		return r, nil
	}
	if err := refuseApplied(target.Def); err != nil {
		return r, err
	}
	target.Def, _ = withoutOverwrite(target.Def)
	r.Action, r.Diff = "rollback", config.Diff(cur.Job, target.Def)
	rc := newRegistered(target.Def, &cur.Registered, true, keyspace.SourceApplied, by)
	cmp := clientv3.Compare(clientv3.ModRevision(c.keys.Config(job)), "=", cur.Generation)
	gen, err := c.writeDefinition(ctx, job, rc, cmp, "rollback", target.Version, fmt.Sprintf("to version %d %s", target.Version, summarize(r.Diff)))
	if err != nil {
		return r, err
	}
	r.Version, r.Generation = rc.Version, gen
	return r, nil
}

// DeleteApplied removes an applied job: its definition and placement in
// one Txn (the instances running it leave it; runs in progress end under
// their markers), then, once no instance is a member, runs it or
// campaigns for it (waiting up to wait), the rest of its keys as Remove
// does. It refuses a job the hosts' files define (shardd remove is for
// those), and one a live instance's files define too (it would publish
// it again as a file job).
func (c *Client) DeleteApplied(ctx context.Context, job, by string, wait time.Duration) (removed bool, err error) {
	removed, err = c.deleteApplied(ctx, job, by, wait)
	if err != nil {
		c.auditDefine(ctx, by, "delete", job, "", err)
	}
	return removed, err
}

func (c *Client) deleteApplied(ctx context.Context, job, by string, wait time.Duration) (bool, error) {
	cur, err := c.Definition(ctx, job)
	if err != nil {
		return false, err
	}
	if !cur.Applied() {
		return false, opErr(ErrRefused, "job %q is defined in the hosts' files, not applied: remove it from their files, then shardd remove %s", job, job)
	}
	ins, err := c.Instances(ctx)
	if err != nil {
		return false, err
	}
	var files []string
	for _, in := range ins {
		if slices.Contains(in.AppliedOverFiles, job) {
			files = append(files, in.ID)
		}
	}
	if len(files) > 0 {
		return false, opErr(ErrRefused, "job %q is also defined in the files of %s: they would publish it again; remove it from their files first", job, strings.Join(files, ", "))
	}
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(c.keys.Config(job)), "=", cur.Generation)).Then(
		clientv3.OpDelete(c.keys.Config(job)), clientv3.OpDelete(c.keys.Placement(job)),
		clientv3.OpDelete(c.keys.Versions(job), clientv3.WithPrefix()), // a job applied again starts a history of its own
		c.auditOp(keyspace.AuditEntry{Actor: by, Action: "delete", Job: job, Target: "job " + job,
			Detail: fmt.Sprintf("version %d, hash %s", cur.Registered.Version, cur.Registered.Hash), Outcome: keyspace.AuditOK})).Commit()
	if err != nil {
		return false, fmt.Errorf("delete job %q: %w", job, err)
	}
	if !resp.Succeeded {
		return false, opErr(ErrRefused, "job %q changed while it was being deleted; nothing deleted: look at it again", job)
	}
	deadline := time.Now().Add(wait)
	for {
		if _, err := c.Remove(ctx, job); err == nil || errors.Is(err, ErrUnknownJob) {
			return true, nil
		} else if !errors.Is(err, ErrRefused) || time.Now().After(deadline) {
			return false, nil // deleted; its other keys stay until shardd remove
		}
		select {
		case <-ctx.Done():
			return false, nil
		case <-time.After(200 * time.Millisecond):
		}
	}
}
