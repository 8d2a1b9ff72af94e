package console

import (
	"net/http"
	"strings"

	"github.com/shardd/shardd/pkg/coord/admin"
	"github.com/shardd/shardd/pkg/coord/keyspace"
)

type auditData struct {
	Job, Actor string
	Entries    []keyspace.AuditEntry
}

func (c *console) audit(r *http.Request, v *view) (string, error) {
	ctx, cancel := c.ctx(r)
	defer cancel()
	q := r.URL.Query()
	d := auditData{Job: strings.TrimSpace(q.Get("job")), Actor: strings.TrimSpace(q.Get("actor"))}
	entries, err := c.o.Admin.Audit(ctx, admin.AuditFilter{Job: d.Job, Actor: d.Actor, Limit: 200})
	if err != nil {
		return "", err
	}
	d.Entries = entries
	v.Title, v.Nav, v.Data = "Audit", "audit", d
	return "audit", nil
}

// ---- templates
