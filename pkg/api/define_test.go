package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

const (
	defineSecret = "define-secret-0123456789"
	writeSecret  = "write-secret-01234567890"
	readSecret   = "read-secret-012345678901"
)

// defineAPI is the API over a real etcd, with a token of each role.
func defineAPI(t *testing.T) (http.Handler, *fakeCluster) {
	t.Helper()
	srv := etcdtest.Start(t)
	cli := srv.Client()
	t.Cleanup(func() { cli.Close() })
	fc := &fakeCluster{up: true, defs: admin.New(cli, keyspace.NewKeys(""))}
	h := Handler(Options{Instance: fc, Admin: fc, Tokens: []auth.Token{
		{Name: "definer", Role: auth.RoleDefine, Secret: defineSecret},
		{Name: "writer", Role: auth.RoleWrite, Secret: writeSecret},
		{Name: "reader", Role: auth.RoleRead, Secret: readSecret},
	}})
	return h, fc
}

func send(t *testing.T, h http.Handler, method, path, token, body string, header ...string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

const etlYAML = "jobs:\n  - name: etl\n    cron: \"0 * * * * ?\"\n    script: [/opt/jobs/etl]\n"

// Only a define token defines: a write or read token is refused (the write
// one in the audit log, the read one in the instance's log only), a page of
// another origin is refused whatever its token; the define token applies,
// sees the diff first, rolls back and deletes, each audited under its name.
func TestDefinitionEndpointsNeedTheDefineRole(t *testing.T) {
	t.Parallel()
	h, fc := defineAPI(t)
	for _, tc := range []struct {
		name, token string
		header      []string
		code        int
		want        string
	}{
		{"no token", "", nil, http.StatusUnauthorized, "bearer token is required"},
		{"a read token", readSecret, nil, http.StatusForbidden, "read role"},
		{"a write token", writeSecret, nil, http.StatusForbidden, "needs the define role"},
		{"another origin", defineSecret, []string{"Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"}, http.StatusForbidden, "cross-origin"},
	} {
		code, body := send(t, h, "PUT", "/api/v1/definitions/etl", tc.token, etlYAML, tc.header...)
		if code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%s: PUT: %d %s, want %d with %q", tc.name, code, body, tc.code, tc.want)
		}
	}
	if len(fc.audit) != 1 || fc.audit[0].Actor != "token:writer" || fc.audit[0].Action != "apply" || fc.audit[0].Outcome != keyspace.AuditRefused {
		t.Errorf("audit of the refusals: %+v, want the write token's only", fc.audit)
	}
	if code, body := send(t, h, "POST", "/api/v1/jobs/etl/trigger", defineSecret, ""); code != http.StatusForbidden || !strings.Contains(body, "need the write role") {
		t.Errorf("a define token triggering: %d %s", code, body)
	}

	code, body := send(t, h, "PUT", "/api/v1/definitions/etl?dryRun=1", defineSecret, etlYAML)
	if code != http.StatusOK || !strings.Contains(body, `"action": "create"`) {
		t.Fatalf("dry run: %d %s", code, body)
	}
	if code, _ := send(t, h, "GET", "/api/v1/definitions/etl", readSecret, ""); code != http.StatusNotFound {
		t.Fatalf("a dry run wrote the definition: GET %d", code)
	}
	if code, body := send(t, h, "PUT", "/api/v1/definitions/etl", defineSecret, etlYAML); code != http.StatusOK || !strings.Contains(body, `"version": 1`) {
		t.Fatalf("apply: %d %s", code, body)
	}
	changed := strings.Replace(etlYAML, "0 * * * * ?", "0 */5 * * * ?", 1)
	code, body = send(t, h, "PUT", "/api/v1/definitions/etl?dryRun=1", defineSecret, changed)
	if code != http.StatusOK || !strings.Contains(body, `"field": "cron"`) || !strings.Contains(body, `"new": "0 */5 * * * ?"`) {
		t.Fatalf("the diff before saving: %d %s", code, body)
	}
	send(t, h, "PUT", "/api/v1/definitions/etl", defineSecret, changed)
	code, body = send(t, h, "GET", "/api/v1/definitions/etl", readSecret, "")
	var d DefinitionOut
	json.Unmarshal([]byte(body), &d)
	if code != http.StatusOK || d.Version != 2 || d.Source != "applied" || d.By != "token:definer" || !strings.Contains(d.YAML, "0 */5 * * * ?") {
		t.Fatalf("GET: %d %+v", code, d)
	}
	code, body = send(t, h, "GET", "/api/v1/definitions/etl/versions", readSecret, "")
	if code != http.StatusOK || strings.Count(body, `"version":`) != 2 || !strings.Contains(body, `"current": true`) {
		t.Fatalf("versions: %d %s", code, body)
	}
	if code, body := send(t, h, "POST", "/api/v1/definitions/etl/rollback?to=1", writeSecret, ""); code != http.StatusForbidden {
		t.Errorf("a write token rolling back: %d %s", code, body)
	}
	if code, body := send(t, h, "POST", "/api/v1/definitions/etl/rollback?to=1", defineSecret, ""); code != http.StatusOK || !strings.Contains(body, `"version": 3`) {
		t.Fatalf("rollback: %d %s", code, body)
	}
	if code, body := send(t, h, "DELETE", "/api/v1/definitions/etl", defineSecret, ""); code != http.StatusOK {
		t.Fatalf("delete: %d %s", code, body)
	}
	entries, err := fc.defs.Audit(context.Background(), admin.AuditFilter{Job: "etl"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Actor+" "+e.Action+" "+e.Outcome)
	}
	want := "token:definer delete ok|token:definer rollback ok|token:definer apply ok|token:definer apply ok"
	if strings.Join(got, "|") != want {
		t.Errorf("audit in etcd: %q, want %q", strings.Join(got, "|"), want)
	}
}

// A definition that does not validate is refused with each problem at its
// line, as a file's would be; one that names another job is refused too.
func TestDefinitionProblemsHaveTheirLines(t *testing.T) {
	t.Parallel()
	h, _ := defineAPI(t)
	bad := "jobs:\n  - name: etl\n    cron: \"0 0 25 * * ?\"\n    shardingTotalCont: 2\n    script: [/bin/true]\n"
	code, body := send(t, h, "PUT", "/api/v1/definitions/etl", defineSecret, bad)
	var out problemsOut
	json.Unmarshal([]byte(body), &out)
	if code != http.StatusUnprocessableEntity || len(out.Problems) != 2 {
		t.Fatalf("%d %s", code, body)
	}
	if p := out.Problems[0]; p.Line != 3 || !strings.Contains(p.Message, "definition:3: job \"etl\": cron") {
		t.Errorf("first problem %+v", p)
	}
	if p := out.Problems[1]; p.Line != 4 || !strings.Contains(p.Message, "did you mean shardingTotalCount?") {
		t.Errorf("second problem %+v", p)
	}
	code, body = send(t, h, "PUT", "/api/v1/definitions/other", defineSecret, etlYAML)
	if code != http.StatusUnprocessableEntity || !strings.Contains(body, `exactly the job \"other\"`) {
		t.Errorf("a body for another job: %d %s", code, body)
	}
}
