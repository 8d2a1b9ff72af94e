package auth

import (
	"net/http"
	"net/url"
	"strings"
)

// Cross-site request forgery: a page of another origin that has the
// operator's browser send a request to shardd, with the browser's
// cookies. No token in the pages stops it (docs/security.md, "Console
// sessions"), three things do:
//
//   - a console session is a caller only with its key, in KeyHeader: a
//     page of another origin can neither read the key (web storage is
//     kept per origin) nor send a custom header without a CORS preflight,
//     which shardd never grants;
//   - the session's cookie is SameSite=Strict (see Authority.Login);
//   - what changes something (the API's writes, the console's login and
//     logout) is refused when it comes from a page of another origin
//     (CrossOrigin), whatever credentials it carries.

// CrossOrigin reports whether r comes from a web page of another origin
// than the server's own: browsers send Origin on such requests. An Origin
// that does not parse counts as another.
func CrossOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	return err != nil || !strings.EqualFold(u.Host, r.Host)
}
