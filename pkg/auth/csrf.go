package auth

import (
	"net/http"
	"net/url"
	"strings"
)

// CrossOrigin reports whether r comes from a web page of another origin
// than the API's own: browsers send Origin on such requests.
func CrossOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	return err != nil || !strings.EqualFold(u.Host, r.Host)
}
