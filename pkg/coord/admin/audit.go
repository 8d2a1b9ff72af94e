package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// The audit log is every write action of operators on the cluster —
// trigger, kill, disable, enable, remove — and every change of a registered
// job definition, with who, what, when and how it went, refusals included.
// It lives in etcd under <prefix>/audit/<id>, one key per entry, ids
// ordered by time; RecordAudit trims it to the newest AuditKeep
// entries (it may briefly hold up to AuditKeep+auditSlack). Every field is one
// printable line of bounded length. Writes refused for a read-role token
// are not recorded here (that would let any reader flush the log): the
// instance that refused them logs them.
//
// Who is an Actor: "token:<name>" for the API and the console (the named
// token the request was made with), "cli:<user>@<host>" for the CLI, and
// "instance:<id>" for a definition an instance published from its files.

// auditSlack is how far past AuditKeep the log grows before it is trimmed:
// trimming is a range read and a delete, done once per auditSlack entries.
const auditSlack = 50

// AuditOutcome classifies a command's error for the audit log.
func AuditOutcome(err error) string {
	switch {
	case err == nil:
		return keyspace.AuditOK
	case errors.Is(err, ErrUnknownJob), errors.Is(err, ErrBadTarget), errors.Is(err, ErrRefused):
		return keyspace.AuditRefused
	}
	return keyspace.AuditError
}

// RecordAudit records e and trims the log to its newest AuditKeep entries.
func (c *Client) RecordAudit(ctx context.Context, e keyspace.AuditEntry) (keyspace.AuditEntry, error) {
	e.Stamp(time.Now())
	val, _ := json.Marshal(e)
	resp, err := c.cli.Txn(ctx).Then(clientv3.OpPut(c.keys.Audit()+e.ID, string(val)), clientv3.OpGet(c.keys.Audit(), clientv3.WithPrefix(), clientv3.WithCountOnly())).Commit()
	if err != nil {
		return e, fmt.Errorf("record the audit entry: %w", err)
	}
	if n := resp.Responses[1].GetResponseRange().Count; n > keyspace.AuditKeep+auditSlack {
		c.trimAudit(ctx)
	}
	return e, nil
}

// trimAudit deletes the entries older than the newest AuditKeep, as a
// fresh read finds them: appenders that trim at once each keep AuditKeep
// (a count read before another's trim would delete too much). A failure is
// left for a later append.
func (c *Client) trimAudit(ctx context.Context) {
	newest, err := c.cli.Get(ctx, c.keys.Audit(), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(keyspace.AuditKeep+1))
	if err != nil || len(newest.Kvs) <= keyspace.AuditKeep {
		return
	}
	oldestKept := string(newest.Kvs[keyspace.AuditKeep-1].Key)
	c.cli.Delete(ctx, c.keys.Audit(), clientv3.WithRange(oldestKept)) // [audit/, oldestKept)
}

// AuditFilter selects entries of the audit log.
type AuditFilter struct {
	Job   string // "" for every job
	Actor string // "" for everyone; see actorMatches
	// Limit bounds the entries returned (default and at most AuditKeep).
	Limit int
}

// actorMatches reports whether an entry's actor is the one asked for: the
// same, or one it names the kind or start of ("cli" or "cli:" matches
// every CLI user, "cli:root" root on every host, "token" every token).
func actorMatches(actor, want string) bool {
	switch {
	case want == "" || actor == want:
		return true
	case strings.HasSuffix(want, ":") || strings.HasSuffix(want, "@"):
		return strings.HasPrefix(actor, want)
	}
	return strings.HasPrefix(actor, want+":") || strings.HasPrefix(actor, want+"@")
}

// auditPage is how many entries Audit reads at a time.
const auditPage = 200

// Audit returns the audit entries that match f, newest first. It reads
// the log newest first, a page at a time, until it has f.Limit entries.
func (c *Client) Audit(ctx context.Context, f AuditFilter) ([]keyspace.AuditEntry, error) {
	if f.Limit <= 0 || f.Limit > keyspace.AuditKeep+auditSlack {
		f.Limit = keyspace.AuditKeep + auditSlack
	}
	out := []keyspace.AuditEntry{}
	end := clientv3.GetPrefixRangeEnd(c.keys.Audit())
	for {
		resp, err := c.cli.Get(ctx, c.keys.Audit(), clientv3.WithRange(end),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(auditPage))
		if err != nil {
			return nil, fmt.Errorf("read the audit log: %w", err)
		}
		for _, kv := range resp.Kvs {
			var e keyspace.AuditEntry
			if json.Unmarshal(kv.Value, &e) != nil {
				continue
			}
			if (f.Job != "" && e.Job != f.Job) || !actorMatches(e.Actor, f.Actor) {
				continue
			}
			if out = append(out, e); len(out) == f.Limit {
				return out, nil
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return out, nil
		}
		end = string(resp.Kvs[len(resp.Kvs)-1].Key) // the next page: older than this one's last
	}
}
