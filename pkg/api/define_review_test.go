package api

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Review: hostile PUT bodies and paths against the definition endpoints.
func TestReviewDefinitionPutHostileBodies(t *testing.T) {
	t.Parallel()
	h, _ := defineAPI(t)
	// A billion-laughs document within the 1 MiB limit.
	var b strings.Builder
	b.WriteString("a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n")
	for i := 1; i < 10; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [*a%d,*a%d,*a%d,*a%d,*a%d,*a%d,*a%d,*a%d,*a%d]\n", i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	b.WriteString("jobs:\n  - name: etl\n    jobParameter: *a9\n    script: [/opt/jobs/etl]\n")
	start := time.Now()
	code, body := send(t, h, "PUT", "/api/v1/definitions/etl?dryRun=1", defineSecret, b.String())
	if d := time.Since(start); d > 3*time.Second || code == http.StatusOK {
		t.Errorf("alias bomb: %d after %v: %.300s", code, d, body)
	}
	// Over the size limit.
	big := etlYAML + "# " + strings.Repeat("x", 2<<20) + "\n"
	if code, body := send(t, h, "PUT", "/api/v1/definitions/etl", defineSecret, big); code != http.StatusRequestEntityTooLarge {
		t.Errorf("a 2 MiB body: %d %.200s", code, body)
	}
	// Names that are paths.
	for _, p := range []string{"/api/v1/definitions/..%2Fplacement", "/api/v1/definitions/%2e%2e", "/api/v1/definitions/etl%2Fconfig"} {
		if code, body := send(t, h, "PUT", p, defineSecret, etlYAML); code == http.StatusOK {
			t.Errorf("PUT %s: %d %.200s", p, code, body)
		}
	}
	// Other origins, the null origin.
	for _, o := range []string{"https://evil.example", "null"} {
		if code, _ := send(t, h, "POST", "/api/v1/definitions/etl/rollback?to=1", defineSecret, "", "Origin", o); code != http.StatusForbidden {
			t.Errorf("rollback from Origin %s: %d", o, code)
		}
	}
}
