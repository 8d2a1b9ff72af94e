package keyspace

import (
	"strings"
	"time"
	"unicode"
)

// AuditKeep is how many audit entries etcd keeps.
const AuditKeep = 1000

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
	// parameter and fire, a definition's hash, the fence a kill named).
	Detail  string `json:"detail,omitempty"`
	Outcome string `json:"outcome"`
	Message string `json:"message,omitempty"`
}

// MaxAuditText bounds the free-text fields of an entry.
const MaxAuditText = 2 << 10

// MaxAuditName bounds the short fields of an entry (actor, action, job,
// target): an entry is at most a few KiB, whatever a caller sends.
const MaxAuditName = 300

// oneLineCut makes s one line of at most n bytes of valid UTF-8: control
// characters (newlines, escapes) become spaces, so that no entry can pass
// for another in a table.
func oneLineCut(s string, n int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "?"))
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n-3], "") + "..."
	}
	return s
}

// Bound makes every field of e one printable line of bounded length, as it
// is stored.
func (e *AuditEntry) Bound() {
	for _, f := range []*string{&e.Actor, &e.Action, &e.Job, &e.Target, &e.Outcome} {
		*f = oneLineCut(*f, MaxAuditName)
	}
	e.Detail = oneLineCut(e.Detail, MaxAuditText)
	e.Message = oneLineCut(e.Message, MaxAuditText)
}

// Stamp gives e its id and, when it has none, the time now; and bounds it
// (Bound): e is then as it is stored under Keys.Audit()+e.ID.
func (e *AuditEntry) Stamp(now time.Time) {
	if e.Time.IsZero() {
		e.Time = now.UTC().Truncate(time.Millisecond)
	}
	e.ID = NewRequestID(e.Time)
	e.Bound()
}
