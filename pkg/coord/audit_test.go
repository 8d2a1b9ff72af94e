package coord

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/shardd/shardd/internal/etcdtest"
	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

// A definition edited on one host is recorded in the audit log, as the
// instance that published it.
func TestDefinitionChangeIsAudited(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	cli, keys, ctx := srv.Client(), keyspace.NewKeys(""), context.Background()
	a := startNode(t, srv, "a", jobs(t, "jobs:\n"+job("orders", 3)))
	waitFor(t, 10*time.Second, "orders' map", func() bool { m := storedMap(t, cli, "orders"); return m != nil && m.Total == 3 })
	a.SetJobs(jobs(t, "jobs:\n"+job("orders", 4)))
	waitFor(t, 10*time.Second, "the edit's audit entry", func() bool {
		es, _ := admin.New(cli, keys).Audit(ctx, admin.AuditFilter{Job: "orders"})
		return len(es) == 1 && es[0].Action == "definition" && es[0].Actor == "instance:a" && strings.Contains(es[0].Message, "edited on this host")
	})
}
