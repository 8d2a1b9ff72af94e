package console

import (
	"errors"
	"net/http"

	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/admin"
)

// The definition editor (docs/applied.md): a job's registered definition
// as YAML, its kept versions with what each changed, and, for a define
// session, an editor whose text the page's script checks through the
// API's dry run (problems at their lines, then the diff) before it saves
// it, and a rollback per version. Every write goes through the API's
// definition endpoints with the session's key, as every console action.

type definitionData struct {
	Job string
	New bool // no job yet: the editor starts from a skeleton
	// YAML is the registered definition as shardd get prints it.
	YAML     string
	Def      *admin.Definition
	Versions []admin.Version
	Err      string
}

// newJobSkeleton is the editor's text for a new job.
const newJobSkeleton = `jobs:
  - name: my-job
    cron: "0 */5 * * * ?"
    shardingTotalCount: 1
    instances:
      selector: "role=worker"
    script: [/opt/jobs/my-job]
`

func (c *console) definition(r *http.Request, v *view) (string, error) {
	name := r.PathValue("job")
	ctx, cancel := c.ctx(r)
	defer cancel()
	d := definitionData{Job: name}
	def, err := c.o.Admin.Definition(ctx, name)
	switch {
	case errors.Is(err, admin.ErrUnknownJob):
		return c.unknownJob(name, v), nil
	case err != nil:
		return "", err
	}
	d.Def = def
	if def.Job != nil {
		d.YAML = string(config.YAML(def.Job))
	} else {
		d.Err = "this shardd cannot read the registered definition: " + def.Err.Error()
	}
	if d.Versions, err = c.o.Admin.Versions(ctx, name); err != nil && !errors.Is(err, admin.ErrUnknownJob) {
		return "", err
	}
	v.Title, v.Nav, v.Data = "Definition of "+name, "jobs", d
	return "definition", nil
}

func (c *console) newDefinition(r *http.Request, v *view) (string, error) {
	v.Title, v.Nav, v.Data = "New job", "jobs", definitionData{New: true, YAML: newJobSkeleton}
	return "definition", nil
}

// canDefine says whether the caller may define jobs from this page: a
// console session of a define token.
func canDefine(c *auth.Caller) bool {
	return c != nil && c.Session && c.Token.Role == auth.RoleDefine
}
