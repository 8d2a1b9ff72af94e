package coord

import (
	"encoding/json"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// auditOp returns the put of e (stamped: keyspace.AuditEntry.Stamp) for a
// Txn: the audit entry of a definition this instance publishes (job.go).
// Package admin describes the audit log, and appends the operators'
// entries.
func auditOp(keys keyspace.Keys, e *keyspace.AuditEntry) clientv3.Op {
	e.Stamp(time.Now())
	val, _ := json.Marshal(e)
	return clientv3.OpPut(keys.Audit()+e.ID, string(val))
}
