package coord

import (
	"encoding/json"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The audit log is every write action of operators on the cluster —
// trigger, kill, disable, enable, remove — and every change of a registered
// job definition, with who, what, when and how it went, refusals included.
// It lives in etcd under <prefix>/audit/<id>, one key per entry, ids
// ordered by time; AppendAudit trims it to the newest AuditKeep entries
// (it may briefly hold up to AuditKeep+auditSlack). Every field is one
// printable line of bounded length. Writes refused for a read-role token
// are not recorded here (that would let any reader flush the log): the
// instance that refused them logs them.
//
// Who is an Actor: "token:<name>" for the API and the console (the named
// token the request was made with), "cli:<user>@<host>" for the CLI, and
// "instance:<id>" for a definition an instance published from its files.

// auditOp returns the put of e (stamped: keyspace.AuditEntry.Stamp) for a
// Txn.
func auditOp(keys keyspace.Keys, e *keyspace.AuditEntry) clientv3.Op {
	e.Stamp(time.Now())
	val, _ := json.Marshal(e)
	return clientv3.OpPut(keys.Audit()+e.ID, string(val))
}
