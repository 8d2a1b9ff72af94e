package config

import (
	"fmt"
	"net"
	"net/url"
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
//     refused (it can run anything), and so are environment variables that
//     make a program load other code (LD_PRELOAD, BASH_ENV, PATH, ...).
//   - HookHosts: every URL of the definition (http.url, onFailure.webhook)
//     names one of these hosts (a name, or host:port for that port only).
//
// Files are not checked: the host's own files are its administrator's.
type AcceptPolicy struct {
	Applied     bool     `json:"applied"`
	CommandDirs []string `json:"commandDirs,omitempty"`
	HookHosts   []string `json:"hookHosts,omitempty"`
}

// codeEnv are environment variables through which a program allowed by
// CommandDirs would load code from elsewhere: the dynamic loader's, the
// shells' start-up files and search path, and the interpreters' module
// paths and options.
var codeEnv = []string{"PATH", "ENV", "BASH_ENV", "IFS", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "CDPATH", "ZDOTDIR",
	"GCONV_PATH", "NODE_OPTIONS", "NODE_PATH", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH", "RUBYOPT", "RUBYLIB",
	"PERL5OPT", "PERL5LIB", "PERLLIB", "HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "XDG_DATA_DIRS", "TMPDIR", "EDITOR", "VISUAL", "PAGER",
	"SSL_CERT_FILE", "SSL_CERT_DIR", "CURL_HOME", "WGETRC", "INPUTRC", "TERMINFO", "LOCPATH", "NLSPATH", "MALLOC_CONF"}

// codeEnvPrefixes are prefixes of such variables (the dynamic loader's,
// the interpreters': Python, Lua, PHP, Ruby, Tcl, R, OpenSSL's config).
var codeEnvPrefixes = []string{"LD_", "DYLD_", "PYTHON", "GIT_", "BASH_FUNC_", "LUA_", "PHP", "OPENSSL_", "RUBY", "TCL", "R_", "GEM_", "BUNDLE_", "GLIBC_", "GCONV_", "NPM_", "YARN_", "DENO_", "JULIA_", "GUILE_", "EMACS"}

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
				if isCodeEnv(k) {
					return fmt.Errorf("script.env sets %s, through which the program could load code from outside --accept-command-dir", k)
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
			if strings.Contains(j.HTTP.Headers[k], "${") {
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

func isCodeEnv(k string) bool {
	u := strings.ToUpper(k)
	if slices.Contains(codeEnv, u) {
		return true
	}
	for _, p := range codeEnvPrefixes {
		if strings.HasPrefix(u, p) {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
