// Package admin is the operator client of a shardd cluster: the status of
// every job, instance and item; the history of runs; and the commands an
// operator sends (trigger, kill, disable, enable, remove), each checked
// against what etcd holds before it changes anything, and audited. The
// CLI, the API and the console use it; the runtime (package coord) never
// does. It reads and writes the values of package keyspace.
//
// Every command refuses a target it cannot act on with an error that
// errors.Is one of ErrUnknownJob, ErrBadTarget or ErrRefused, and whose
// message says exactly what is wrong.
package admin
