package coord

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// The audit log is every write action of operators on the cluster —
// trigger, kill, disable, enable, remove — and every change of a registered
// job definition, with who, what, when and how it went, refusals included.
// It lives in etcd under <prefix>/audit/<id>, one key per entry, ids
// ordered by time; AppendAudit trims it to the newest AuditKeep entries
// (it may briefly hold up to AuditKeep+auditSlack).
//
// Who is an Actor: "token:<name>" for the API and the console (the named
// token the request was made with), "cli:<user>@<host>" for the CLI, and
// "instance:<id>" for a definition an instance published from its files.

// AuditKeep is how many audit entries etcd keeps.
const AuditKeep = 1000

// auditSlack is how far past AuditKeep the log grows before it is trimmed:
// trimming is a range read and a delete, done once per auditSlack entries.
const auditSlack = 50

// Audit outcomes.
const (
	AuditOK      = "ok"
	AuditRefused = "refused" // the command's checks refused it
	AuditError   = "error"   // it could not be done (etcd unreachable, ...)
)

// AuditEntry is one write action.
type AuditEntry struct {
	ID     string    `json:"id"`
	Time   time.Time `json:"time"`
	Actor  string    `json:"actor"`
	Action string    `json:"action"` // trigger, kill, disable, enable, remove, definition
	Job    string    `json:"job,omitempty"`
	// Target is what the action was on, as the commands print it ("job
	// orders", "item 2 of job orders", "instance host-a for job orders").
	Target string `json:"target"`
	// Detail holds the action's arguments worth keeping (a trigger's
	// parameter and fire, a definition's hash).
	Detail  string `json:"detail,omitempty"`
	Outcome string `json:"outcome"`
	Message string `json:"message,omitempty"`
}

// maxAuditText bounds the free-text fields of an entry.
const maxAuditText = 2 << 10

// AuditOutcome classifies a command's error for the audit log.
func AuditOutcome(err error) string {
	switch {
	case err == nil:
		return AuditOK
	case errors.Is(err, ErrUnknownJob), errors.Is(err, ErrBadTarget), errors.Is(err, ErrRefused):
		return AuditRefused
	}
	return AuditError
}

// auditOp returns the put of e (with its id and time set) for a Txn.
func auditOp(keys Keys, e *AuditEntry) clientv3.Op {
	if e.Time.IsZero() {
		e.Time = time.Now().UTC().Truncate(time.Millisecond)
	}
	e.ID = newRequestID(e.Time)
	e.Detail = oneLineCut(e.Detail, maxAuditText)
	e.Message = oneLineCut(e.Message, maxAuditText)
	val, _ := json.Marshal(e)
	return clientv3.OpPut(keys.Audit()+e.ID, string(val))
}

// oneLineCut makes s one line of at most n bytes.
func oneLineCut(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n-3], "") + "..."
	}
	return s
}

// AppendAudit records e and trims the log to its newest AuditKeep entries.
func AppendAudit(ctx context.Context, cli *clientv3.Client, keys Keys, e AuditEntry) (AuditEntry, error) {
	resp, err := cli.Txn(ctx).Then(auditOp(keys, &e), clientv3.OpGet(keys.Audit(), clientv3.WithPrefix(), clientv3.WithCountOnly())).Commit()
	if err != nil {
		return e, fmt.Errorf("record the audit entry: %w", err)
	}
	if n := resp.Responses[1].GetResponseRange().Count; n > AuditKeep+auditSlack {
		trimAudit(ctx, cli, keys, n-AuditKeep)
	}
	return e, nil
}

// trimAudit deletes the oldest n entries; a failure is left for the next
// append to retry.
func trimAudit(ctx context.Context, cli *clientv3.Client, keys Keys, n int64) {
	old, err := cli.Get(ctx, keys.Audit(), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend), clientv3.WithLimit(n))
	if err != nil || len(old.Kvs) == 0 {
		return
	}
	last := string(old.Kvs[len(old.Kvs)-1].Key)
	cli.Delete(ctx, keys.Audit(), clientv3.WithRange(last+"\x00"))
}

// AuditFilter selects entries of the audit log.
type AuditFilter struct {
	Job   string // "" for every job
	Actor string // "" for everyone
	// Limit bounds the entries returned (default and at most AuditKeep).
	Limit int
}

// ReadAudit returns the audit entries that match f, newest first.
func ReadAudit(ctx context.Context, cli *clientv3.Client, keys Keys, f AuditFilter) ([]AuditEntry, error) {
	if f.Limit <= 0 || f.Limit > AuditKeep+auditSlack {
		f.Limit = AuditKeep + auditSlack
	}
	resp, err := cli.Get(ctx, keys.Audit(), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend))
	if err != nil {
		return nil, fmt.Errorf("read the audit log: %w", err)
	}
	out := []AuditEntry{}
	for _, kv := range resp.Kvs {
		var e AuditEntry
		if json.Unmarshal(kv.Value, &e) != nil {
			continue
		}
		if (f.Job != "" && e.Job != f.Job) || (f.Actor != "" && e.Actor != f.Actor) {
			continue
		}
		if out = append(out, e); len(out) == f.Limit {
			break
		}
	}
	return out, nil
}

// Audit reads the audit log (see ReadAudit).
func (n *Node) Audit(ctx context.Context, f AuditFilter) ([]AuditEntry, error) {
	return ReadAudit(ctx, n.opts.Client, n.keys, f)
}

// RecordAudit appends e to the audit log and logs it (see AppendAudit).
func (n *Node) RecordAudit(ctx context.Context, e AuditEntry) error {
	e, err := AppendAudit(ctx, n.opts.Client, n.keys, e)
	n.log.Info("audit", "actor", e.Actor, "action", e.Action, "target", e.Target, "detail", e.Detail, "outcome", e.Outcome, "message", e.Message)
	return err
}
