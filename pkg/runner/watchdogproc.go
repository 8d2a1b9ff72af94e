package runner

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// watched is a run the watchdog process knows (see "Runs, not pids").
type watched struct {
	pgid    int
	start   uint64
	checked bool   // start is known (protocol 2): check it before a kill
	cgroup  string // the run's cgroup directory, or ""
}

// WatchdogMain runs the watchdog on standard input; it returns when the
// input closes, after killing every run still registered.
func WatchdogMain() int {
	// A SIGHUP meant for shardd (systemctl kill -s HUP reaches the whole
	// unit) must not end the watchdog.
	signal.Ignore(syscall.SIGHUP)
	// The OOM killer should take anything else first; allowed with
	// CAP_SYS_RESOURCE only, and best effort.
	os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0)
	lines := make(chan string)
	go func() {
		s := bufio.NewScanner(os.Stdin)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	wd := watchdogState{runs: map[string]watched{}, version: 1}
	first := true
	var deadline *time.Timer
	var fire <-chan time.Time
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				wd.killAll("shardd is gone")
				return 0
			}
			if first {
				first = false
				if v, ok := strings.CutPrefix(line, versionPrefix); ok {
					if v != strconv.Itoa(protocolVersion) {
						fmt.Fprintf(os.Stderr, "shardd watchdog: protocol %q not spoken (this binary speaks 1 and %d)\n", v, protocolVersion)
						return 2
					}
					wd.version = protocolVersion
					fmt.Fprintf(os.Stdout, "%s%d\n", versionPrefix, protocolVersion)
					continue
				}
				// protocol 1: a shardd from before versions
			}
			cmd, arg, _ := strings.Cut(line, " ")
			switch cmd {
			case "deadline":
				n, err := strconv.ParseInt(arg, 10, 64)
				if err != nil {
					fmt.Fprintf(os.Stderr, "shardd watchdog: bad line %q\n", line)
					continue
				}
				if deadline != nil {
					deadline.Stop()
				}
				deadline = time.NewTimer(time.Duration(n))
				fire, wd.expired = deadline.C, false
			case "add", "del":
				if err := wd.apply(cmd, arg); err != nil {
					fmt.Fprintf(os.Stderr, "shardd watchdog: bad line %q: %v\n", line, err)
				}
			default:
				fmt.Fprintf(os.Stderr, "shardd watchdog: bad line %q\n", line)
			}
		case <-fire:
			wd.expired = true
			wd.killAll("the session's fence deadline passed")
		}
	}
}

// watchdogState is the watchdog process's registry.
type watchdogState struct {
	version int
	runs    map[string]watched // by token; in protocol 1 "pgid <n>"
	expired bool               // the last deadline passed
}

// apply applies an add or del line's argument.
func (s *watchdogState) apply(cmd, arg string) error {
	var token string
	var r watched
	var err error
	if s.version == 1 { // add <pgid> [<cgroup>], del <pgid>
		pg, cgroup, _ := strings.Cut(arg, " ")
		if r.pgid, err = strconv.Atoi(pg); err != nil {
			return err
		}
		token, r.cgroup = "pgid "+pg, cgroup
	} else { // add <token> <pgid> <start> [<cgroup>], del <token>
		f := strings.SplitN(arg, " ", 4)
		token = f[0]
		if cmd == "add" {
			if len(f) < 3 {
				return errors.New("want add <token> <pgid> <start time> [<cgroup>]")
			}
			if r.pgid, err = strconv.Atoi(f[1]); err != nil {
				return err
			}
			if r.start, err = strconv.ParseUint(f[2], 10, 64); err != nil {
				return err
			}
			r.checked = true
			if len(f) == 4 {
				r.cgroup = f[3]
			}
		}
	}
	if cmd == "del" {
		delete(s.runs, token)
		return nil
	}
	if r.pgid <= 1 {
		return fmt.Errorf("process group %d is not a run's", r.pgid)
	}
	s.runs[token] = r
	if s.expired {
		s.killAll("added after the session's fence deadline passed")
	}
	return nil
}

// killAll kills every registered run whose group is still its own (see
// ours), and every registered cgroup, and forgets them all.
func (s *watchdogState) killAll(why string) {
	// Every group and cgroup is signalled first, at once: the fence
	// deadline needs all of them dead, not one after another's wait.
	spared := map[string]string{}
	for token, r := range s.runs {
		if ok, reason := r.ours(); ok {
			syscall.Kill(-r.pgid, syscall.SIGKILL)
		} else {
			spared[token] = reason
		}
		if r.cgroup != "" {
			(&runCgroup{dir: r.cgroup}).signal()
		}
	}
	for token, r := range s.runs {
		name := "run " + token
		if s.version == 1 {
			name = "run"
		}
		if r.cgroup != "" {
			(&runCgroup{dir: r.cgroup}).kill() // what forked meanwhile; then removed
		}
		switch reason, ok := spared[token]; {
		case ok && r.cgroup != "":
			fmt.Fprintf(os.Stderr, "shardd watchdog: %s: killed cgroup %s; not process group %d: %s: %s\n", name, r.cgroup, r.pgid, reason, why)
		case ok:
			fmt.Fprintf(os.Stderr, "shardd watchdog: %s: not killed process group %d: %s: %s\n", name, r.pgid, reason, why)
		case r.cgroup != "":
			fmt.Fprintf(os.Stderr, "shardd watchdog: %s: killed process group %d and cgroup %s: %s\n", name, r.pgid, r.cgroup, why)
		default:
			fmt.Fprintf(os.Stderr, "shardd watchdog: %s: killed process group %d: %s\n", name, r.pgid, why)
		}
		delete(s.runs, token)
	}
}

// ours reports whether killing process group r.pgid reaches r's run and
// no other process; if not, why not. See "Runs, not pids".
func (r watched) ours() (bool, string) {
	if !r.checked {
		return true, "" // protocol 1: nothing to check against
	}
	start, err := procStart(r.pgid)
	switch {
	case err != nil:
		// Reaped (no such process): what is left of the group holds the
		// id. Or unreadable: err on G1's side; a process of another
		// user hidden by hidepid could not be signalled by us anyway.
		return true, ""
	case start != r.start:
		return false, fmt.Sprintf("pid %d is a process started later (start time %d, the run's leader's %d): the run's group is gone", r.pgid, start, r.start)
	}
	return true, ""
}
