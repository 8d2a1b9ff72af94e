// Command shardd is a sharded, distributed cron daemon.
//
// Usage:
//
//	shardd <command> [flags]
//
// Run `shardd help` for the commands and `shardd <command> --help` for their flags.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
	_ "time/tzdata" // time zones for timeZone on hosts without tzdata

	_ "github.com/shardd/shardd/internal/sighup" // first: shardd run ignores SIGHUP until its handler runs
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/runner"
)

// command is one subcommand.
type command struct {
	name    string
	summary string
	usage   string // flags synopsis
	run     func(env *env, args []string) error
}

// env is what a command talks to, so that tests can capture it.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
	now            func() time.Time // nil: time.Now
	stdin          io.Reader        // nil: os.Stdin
}

// input is the command's standard input.
func (e *env) input() io.Reader {
	if e.stdin != nil {
		return e.stdin
	}
	return os.Stdin
}

// clock returns the time now, as the command should see it.
func (e *env) clock() time.Time {
	if e.now != nil {
		return e.now()
	}
	return time.Now()
}

// exitError carries a specific exit code.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the command ran and found a problem (invalid config, ...)
	exitUsage   = 2 // bad command line
)

func commands() []command {
	return []command{
		{"run", "run the daemon: join the cluster and run the jobs", "--config PATH [--etcd URL,...] [--name ID] [--data-dir DIR] [--listen ADDR] [--ttl 10s] [--prefix /shardd]", cmdRun},
		{"status", "show jobs, their health (failing, late, running), leaders, shard maps and instances from etcd", "[--failing] [--running] [--etcd URL,...] [-o json]", cmdStatus},
		{"trigger", "run a job's items once now, on their owners (with a one-off parameter, or again for a past fire)", "JOB [--item N] [--param TEXT] [--fire TIME] [--etcd URL,...]", cmdTrigger},
		{"kill", "stop a job's runs in progress (recorded KILLED/operator, not failed over)", "JOB [--item N [--fence F]] [--wait 10s] [--etcd URL,...]", cmdKill},
		{"disable", "disable a job, one item, or one instance for a job", "JOB [--item N | --instance ID [--force]] [--etcd URL,...]", cmdDisable},
		{"enable", "undo disable", "JOB [--item N | --instance ID] [--etcd URL,...]", cmdEnable},
		{"history", "show a job's executions, newest first, from etcd and the instances' run logs", "JOB [--item N] [--since 7d] [--result FAILED] [--limit N] [--before CURSOR] [-o json] [--etcd URL,...] | --definitions JOB", cmdHistory},
		{"audit", "show who triggered, killed, disabled, enabled or removed what, and definition changes", "[--job JOB] [--actor WHO] [-n 50] [-o json] [--etcd URL,...]", cmdAudit},
		{"logs", "print a run's output from its run log, through the API of the instance that ran it", "JOB [--item N] [--run FENCE[-ITEM]] [-f] [--raw] [--api-token-file FILE] [--etcd URL,...]", cmdLogs},
		{"remove", "delete what etcd keeps of a job no instance defines any more", "JOB [--etcd URL,...]", cmdRemove},
		{"apply", "register job definitions in etcd, run by the instances that accept applied definitions and match their selector", "-f FILE|DIR|- [--take-over] [--dry-run] [-o json] [--etcd URL,...]", cmdApply},
		{"diff", "show what shardd apply would change, field by field (exit 1 when something would)", "-f FILE|DIR|- [--take-over] [-o json] [--etcd URL,...]", cmdDiff},
		{"get", "print a job's registered definition as YAML that shardd apply takes back", "JOB [--version N] [-o yaml|json] [--etcd URL,...]", cmdGet},
		{"delete", "delete an applied job: its instances leave it, then its keys go", "JOB [--wait 30s] [--etcd URL,...]", cmdDelete},
		{"rollback", "register a kept version of a job's definition again", "JOB --to VERSION [--etcd URL,...]", cmdRollback},
		{"import", "convert ElasticJob job configs (a Spring Boot YAML, a registry config, or a live ZooKeeper or etcd registry) to shardd definitions", "FILE | --registry zk://HOST:PORT --namespace NS [--job NAME] [--apply [--take-over] [--etcd URL,...]]", cmdImport},
		{"validate", "check job definitions and report every problem", "[--config] PATH", cmdValidate},
		{"plan", "preview how a strategy spreads a job's items over instances", "--strategy S --job NAME --total N --instances a,b,c [-o json] | --config PATH --instances a,b,c", cmdPlan},
		{"ca", "create the CA an embedded etcd cluster's members share (--embed-cluster), in --data-dir", "[--data-dir DIR]", cmdCA},
		{"version", "print the version", "", cmdVersion},
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == runner.WatchdogCommand { // internal: see runner.WatchdogMain
		os.Exit(runner.WatchdogMain())
	}
	// A password in the environment: hide /proc/<pid>/environ from this
	// user's other processes first thing (see cmdRun).
	if os.Getenv(envName("etcd-password")) != "" {
		notDumpable()
	}
	os.Exit(run(os.Args[1:], &env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}))
}

// run executes the command line args and returns the exit code.
func run(args []string, e *env) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		if len(args) > 1 {
			return run([]string{args[1], "--help"}, e)
		}
		usage(e.stdout)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	if args[0] == "--version" {
		args[0] = "version"
	}
	for _, c := range commands() {
		if c.name != args[0] {
			continue
		}
		err := c.run(e, args[1:])
		var ee *exitError
		switch {
		case err == nil:
			return exitOK
		case errors.Is(err, flag.ErrHelp):
			return exitOK
		case errors.As(err, &ee):
			if ee.err.Error() != "" {
				fmt.Fprintf(e.stderr, "shardd %s: %s\n", c.name, ee.err)
			}
			return ee.code
		default:
			fmt.Fprintf(e.stderr, "shardd %s: %s\n", c.name, err)
			return exitFailure
		}
	}
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	if near, ok := config.Nearest(args[0], names); ok {
		fmt.Fprintf(e.stderr, "shardd: unknown command %q (did you mean %s?)\nRun 'shardd help' for usage.\n", args[0], near)
		return exitUsage
	}
	fmt.Fprintf(e.stderr, "shardd: unknown command %q\nRun 'shardd help' for usage.\n", args[0])
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprint(w, "shardd is a sharded, distributed cron daemon coordinated through etcd.\n\nUsage:\n\n\tshardd <command> [flags]\n\nCommands:\n\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "\t%-10s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun 'shardd <command> --help' for a command's flags.\n")
}

// newFlagSet returns a flag set for c whose usage text lists c's flags, and
// whose errors are returned (as usage errors), not printed and exited on.
func newFlagSet(e *env, name string) *flag.FlagSet {
	var c command
	for _, cc := range commands() {
		if cc.name == name {
			c = cc
		}
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "%s.\n\nUsage:\n\n\tshardd %s %s\n\nFlags:\n", strings.ToUpper(c.summary[:1])+c.summary[1:], c.name, c.usage)
		fs.PrintDefaults()
	}
	return fs
}

// parseFlags parses args into fs, refusing positional arguments.
func parseFlags(fs *flag.FlagSet, args []string) error {
	pos, err := parseArgs(fs, args)
	if err == nil && len(pos) > 0 {
		return usageError("unexpected argument %q", pos[0])
	}
	return err
}

// parseArgs parses args into fs with flags anywhere on the line (`shardd
// history --etcd URL JOB` and `shardd history JOB --etcd URL` alike) and
// returns the positional arguments in order; "--" ends the flags. A parse
// error becomes a usage exit.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	out := fs.Output()
	fs.SetOutput(io.Discard) // the problem is said once, below, as every other command error is
	defer fs.SetOutput(out)
	for {
		if err := fs.Parse(args); err != nil {
			fs.SetOutput(out)
			if errors.Is(err, flag.ErrHelp) {
				fs.Usage()
				return nil, err
			}
			// flag names flags with one dash; shardd's docs use two.
			msg := strings.NewReplacer("flag -", "flag --", "defined: -", "defined: --").Replace(err.Error())
			return nil, usageError("%s (shardd %s --help lists the flags)", msg, fs.Name())
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func usageError(format string, args ...any) error {
	return &exitError{exitUsage, fmt.Errorf(format, args...)}
}
