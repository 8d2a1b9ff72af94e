// Package sighup makes `shardd run` ignore SIGHUP from its first
// instruction until its reload handler takes the signal over.
//
// SIGHUP's default action ends a process, and Go's runtime keeps that
// default for a program that has not asked for the signal. `shardd run`
// asks (signal.Notify, to reload on it) once its main function runs, after
// every package's initialization, which takes some 10 ms: a SIGHUP sent
// right after the process was started (`systemctl reload` racing a start,
// a script's `kill -HUP` after a restart) killed it. This package's init
// ignores the signal instead. It imports nothing but os/signal, so it is
// initialized among the first packages (Go initializes a package as soon
// as its imports are, in the order of their paths), about 1 ms after exec;
// before that, during the runtime's own start, no Go code runs that could
// catch anything.
//
// Only `shardd run` ignores it: the other commands keep the default, which
// ends them when their terminal goes away. An ignored signal is lost, not
// delayed, which is right before the configuration is read: the read
// after it sees the change that the SIGHUP announced. A disposition set to
// ignore is inherited by the programs a process starts; `shardd run`
// replaces it with a handler (signal.Notify) before it starts any, and the
// programs then start with the default.
package sighup

import (
	"os"
	"os/signal"
	"syscall"
)

// Command is the shardd command that ignores SIGHUP from its start.
const Command = "run"

func init() {
	if len(os.Args) > 1 && os.Args[1] == Command {
		signal.Ignore(syscall.SIGHUP)
	}
}
