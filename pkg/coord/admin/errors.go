package admin

import (
	"errors"
	"fmt"
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

// Refusal is an ErrRefused error saying msg: a refusal decided outside
// this package (the API's roles), recorded as such in the audit log.
func Refusal(msg string) error { return &opError{kind: ErrRefused, msg: msg} }
