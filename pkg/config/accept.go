package config

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// AcceptPolicy is what an instance accepts of applied definitions (shardd
// apply, the API, the console's editor): definitions written into etcd by
// an operator rather than read from the host's own files. Running one is
// running code an operator sent to the host, so an instance runs none
// unless Applied is set (shardd run --accept-applied), and then only those
// whose work passes the restrictions given:
//
//   - CommandDirs: every command of the definition (script.command,
//     onFailure.command, listeners) is an argv list whose program is an
//     absolute path under one of these directories. A shell string is
//     refused (it can run anything), and so is a script.env variable that
//     Env does not name (a variable can make a program load other code).
//   - HookHosts: every URL of the definition (http.url, onFailure.webhook)
//     names one of these hosts (a name, or host:port for that port only).
//
// Files are not checked: the host's own files are its administrator's.
type AcceptPolicy struct {
	Applied     bool     `json:"applied"`
	CommandDirs []string `json:"commandDirs,omitempty"`
	HookHosts   []string `json:"hookHosts,omitempty"`
	// Env are the script.env variables accepted with CommandDirs (any
	// other could make an accepted program load code from elsewhere:
	// LD_PRELOAD, BASH_ENV, PATH, JAVA_OPTS, OPENSSL_CONF, ... no list of
	// those is complete, so the accepted ones are named instead).
	Env []string `json:"env,omitempty"`
}

// Check says why p refuses the applied definition j; nil: it accepts it.
// The error names the field at fault.
func (p AcceptPolicy) Check(j *Job) error {
	if !p.Applied {
		return fmt.Errorf("this instance does not run applied definitions (start it with --accept-applied)")
	}
	if len(p.CommandDirs) > 0 {
		if j.Script != nil {
			if err := p.checkCommand("script.command", j.Script.Command); err != nil {
				return err
			}
			for _, k := range sortedKeys(j.Script.Env) {
				if !slices.Contains(p.Env, k) {
					return fmt.Errorf("script.env sets %s, which --accept-env does not name: a variable can make the program load code from outside --accept-command-dir (LD_PRELOAD, BASH_ENV, JAVA_OPTS, ...), so this instance accepts only the ones it names", k)
				}
			}
		}
		if j.OnFailure != nil && j.OnFailure.Command != nil {
			if err := p.checkCommand("onFailure.command", *j.OnFailure.Command); err != nil {
				return err
			}
		}
		if l := j.Listeners; l != nil {
			for _, c := range []struct {
				field string
				cmd   *Command
			}{{"listeners.before", l.Before}, {"listeners.after", l.After}} {
				if c.cmd != nil {
					if err := p.checkCommand(c.field, *c.cmd); err != nil {
						return err
					}
				}
			}
		}
	}
	if j.HTTP != nil && len(p.HookHosts) == 0 && len(p.CommandDirs) > 0 {
		// Headers expand ${VAR} from shardd's environment on this host: to
		// a URL of any host, the host's secrets would go wherever the
		// definition says. Restricted commands mean a restricted host.
		for _, k := range sortedKeys(j.HTTP.Headers) {
			if expands(j.HTTP.Headers[k]) {
				return fmt.Errorf("http.headers %s sends a variable of this host's environment to a URL of any host: this instance accepts it only with --accept-hook-host", k)
			}
		}
	}
	if len(p.HookHosts) > 0 {
		if j.HTTP != nil {
			if err := p.checkURL("http.url", j.HTTP.URL); err != nil {
				return err
			}
		}
		if j.OnFailure != nil && j.OnFailure.Webhook != "" {
			if err := p.checkURL("onFailure.webhook", j.OnFailure.Webhook); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p AcceptPolicy) checkCommand(field string, c Command) error {
	dirs := strings.Join(p.CommandDirs, ", ")
	if c.Shell != "" {
		return fmt.Errorf("%s is a shell string, which can run anything; this instance accepts only argv commands under --accept-command-dir %s", field, dirs)
	}
	if len(c.Argv) == 0 {
		return nil
	}
	prog := c.Argv[0]
	if !filepath.IsAbs(prog) {
		return fmt.Errorf("%s runs %q, not an absolute path; this instance accepts only programs under --accept-command-dir %s", field, prog, dirs)
	}
	clean := filepath.Clean(prog)
	for _, d := range p.CommandDirs {
		if rel, err := filepath.Rel(filepath.Clean(d), clean); err == nil && rel != "." && !strings.HasPrefix(rel, "..") {
			return nil
		}
	}
	return fmt.Errorf("%s runs %s, which is not under --accept-command-dir %s", field, clean, dirs)
}

func (p AcceptPolicy) checkURL(field, raw string) error {
	hosts := strings.Join(p.HookHosts, ", ")
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return fmt.Errorf("%s %q has no host this instance can check against --accept-hook-host %s", field, raw, hosts)
	}
	host := strings.ToLower(u.Hostname())
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	for _, h := range p.HookHosts {
		h = strings.ToLower(h)
		if hh, hp, err := net.SplitHostPort(h); err == nil {
			if hh == host && hp == port {
				return nil
			}
		} else if strings.Trim(h, "[]") == host {
			return nil
		}
	}
	return fmt.Errorf("%s calls %s, which is not an --accept-hook-host (%s)", field, net.JoinHostPort(host, port), hosts)
}

// expands reports whether s names a variable that the runner expands
// from shardd's environment ($VAR or ${VAR}: os.Expand's rule).
func expands(s string) bool {
	used := false
	os.Expand(s, func(string) string { used = true; return "" })
	return used
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
