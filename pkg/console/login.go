package console

import (
	"errors"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/auth"
)

type loginData struct {
	Next     string
	Problem  string
	Note     string
	Writable bool
}

func (c *console) loginPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := loginData{Next: safeNext(q.Get("next")), Writable: c.o.Auth.Writable()}
	switch {
	case q.Get("expired") != "":
		d.Note = "Your session has expired, or this instance has restarted since you logged in (sessions live in the instance's memory): log in again."
	case q.Get("bye") != "":
		d.Note = "You are logged out."
	}
	v := &view{Title: "Log in", Instance: c.o.Instance, Version: c.o.Version, Now: c.o.Now(), Status: http.StatusOK, Data: d}
	v.Caller, _ = c.o.Auth.Identify(r)
	c.render(w, "login", v)
}

// welcomeData is the page that answers a login: it gives the session's
// key to the page's script (view.Key), which goes on to Next.
type welcomeData struct {
	Name, Role, Next string
}

func (c *console) login(w http.ResponseWriter, r *http.Request) {
	if auth.CrossOrigin(r) {
		http.Error(w, "cross-origin login refused", http.StatusForbidden)
		return
	}
	next := safeNext(r.PostFormValue("next"))
	refused := func(status int, problem string) {
		v := &view{Title: "Log in", Instance: c.o.Instance, Version: c.o.Version, Now: c.o.Now(), Status: status,
			Data: loginData{Next: next, Problem: problem, Writable: c.o.Auth.Writable()}}
		c.render(w, "login", v)
	}
	caller, key, err := c.o.Auth.Login(w, r, r.PostFormValue("token"))
	var limited *auth.LimitError
	switch {
	case errors.As(err, &limited):
		// Not a warning each: a flood of attempts would flood the log.
		c.o.Logger.Debug("console login refused: rate limit", "remote", r.RemoteAddr, "err", err)
		w.Header().Set("Retry-After", strconv.Itoa(int((limited.Retry+time.Second-1)/time.Second)))
		refused(http.StatusTooManyRequests, "Not tried: "+err.Error()+".")
		return
	case err != nil:
		c.o.Logger.Warn("console login refused: no token has that secret", "remote", r.RemoteAddr)
		refused(http.StatusUnauthorized, "That is not the secret of any of this instance's tokens (--api-token-file): paste the secret (the third field of a NAME ROLE SECRET line), not the token's name.")
		return
	}
	c.o.Logger.Info("console login", "token", caller.Token.Name, "role", caller.Token.Role, "remote", r.RemoteAddr)
	c.render(w, "welcome", &view{Title: "Logged in", Caller: caller, Key: key, Instance: c.o.Instance, Version: c.o.Version, Now: c.o.Now(),
		Status: http.StatusOK, Data: welcomeData{Name: caller.Token.Name, Role: caller.Token.Role, Next: next}})
}

// logout clears the caller's cookie, and ends its session when the form
// carries the session's key (the page's script puts it there): whoever
// received the cookie alone cannot log its owner out.
func (c *console) logout(w http.ResponseWriter, r *http.Request) {
	if auth.CrossOrigin(r) {
		http.Error(w, "logout refused: not from this console's page", http.StatusForbidden)
		return
	}
	c.o.Auth.Logout(w, r, r.PostFormValue("key"))
	http.Redirect(w, r, "/login?bye=1", http.StatusSeeOther)
}

// safeNext keeps a post-login redirect on this site: a path of this site
// with printable characters and no backslash (browsers read "\\" as "/",
// and drop tabs and newlines, so "/\\host" and "/<TAB>/host" are "//host"),
// that is still such a path once cleaned as http.Redirect cleans it.
func safeNext(next string) string {
	bad := func(p string) bool {
		return !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.ContainsFunc(p, func(r rune) bool {
			return r == '\\' || r < 0x20 || r == 0x7f
		})
	}
	if bad(next) || bad(path.Clean(strings.SplitN(next, "?", 2)[0])) {
		return "/"
	}
	return next
}
