package auth

import (
	"net/http/httptest"
	"testing"
)

// A request from a page of another origin (another host, another port, an
// opaque or malformed Origin) is cross-origin; one without Origin, or from
// the server's own origin, is not.
func TestCrossOrigin(t *testing.T) {
	for _, tc := range []struct {
		host, origin string
		want         bool
	}{
		{"127.0.0.1:9741", "", false},
		{"127.0.0.1:9741", "http://127.0.0.1:9741", false},
		{"localhost:9741", "HTTP://LOCALHOST:9741", false},
		{"127.0.0.1:9741", "http://127.0.0.1:8000", true},
		{"127.0.0.1:9741", "https://evil.example", true},
		{"127.0.0.1:9741", "null", true},
		{"127.0.0.1:9741", "http://%zz", true},
	} {
		r := httptest.NewRequest("POST", "/api/v1/jobs/orders/trigger", nil)
		r.Host = tc.host
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if got := CrossOrigin(r); got != tc.want {
			t.Errorf("Origin %q to Host %q: cross-origin %v, want %v", tc.origin, r.Host, got, tc.want)
		}
	}
}
