package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/shardd/shardd/pkg/auth"
	"github.com/shardd/shardd/pkg/config"
	"github.com/shardd/shardd/pkg/coord/admin"
)

// The definition endpoints (docs/applied.md): a job's registered
// definition read, applied, deleted and rolled back, as shardd get,
// apply, delete and rollback do through etcd. Reads take the read role;
// the rest the define role (define). A body is the YAML of a job file
// with the one job of the path, validated exactly as a file is; its
// problems come back one by one, each with its line.

// maxDefinition bounds a PUT body.
const maxDefinition = 1 << 20

// DefinitionOut is a job's registered definition.
type DefinitionOut struct {
	Job        string `json:"job"`
	YAML       string `json:"yaml"` // what shardd get prints, and PUT takes back
	Source     string `json:"source"`
	By         string `json:"by"`
	Written    string `json:"written"`
	Version    int64  `json:"version"`
	Generation int64  `json:"generation"`
	Selector   string `json:"selector,omitempty"`
	// Error is set when this version cannot read the definition.
	Error string `json:"error,omitempty"`
}

func (a *api) definition(w http.ResponseWriter, r *http.Request) {
	name, ok := jobName(w, r)
	if !ok {
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	d, err := a.o.Admin.Definition(ctx, name)
	if err != nil {
		writeError(w, opStatus(err), "%v", err)
		return
	}
	out := DefinitionOut{Job: name, Source: d.Registered.Source, By: d.Registered.By, Written: d.Registered.Written.UTC().Format(time.RFC3339),
		Version: d.Registered.Version, Generation: d.Generation, Selector: d.Selector}
	if out.Source == "" {
		out.Source = "file"
	}
	if out.By == "" {
		out.By = d.Registered.Writer
	}
	if d.Job != nil {
		out.YAML = string(config.YAML(d.Job))
	} else {
		out.Error = fmt.Sprint(d.Err)
	}
	writeJSON(w, http.StatusOK, out)
}

// Problem is one problem of a definition, at its line.
type Problem struct {
	Line    int    `json:"line,omitempty"`
	Message string `json:"message"`
}

// problemsOut is the answer to a definition that does not validate.
type problemsOut struct {
	Error    string    `json:"error"`
	Problems []Problem `json:"problems"`
}

func (a *api) putDefinition(w http.ResponseWriter, r *http.Request) {
	name, ok := jobName(w, r)
	if !ok {
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxDefinition))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "the definition must be at most %d bytes: %v", maxDefinition, err)
		return
	}
	c, err := config.ParseWithoutEnv("definition", body)
	if err != nil {
		out := problemsOut{Error: "the definition does not validate; nothing written"}
		for _, p := range config.Errors(err) {
			pr := Problem{Message: p.Error()}
			var ce *config.Error
			if errors.As(p, &ce) {
				pr.Line = ce.Line
			}
			out.Problems = append(out.Problems, pr)
		}
		writeJSON(w, http.StatusUnprocessableEntity, out)
		return
	}
	if len(c.Jobs) != 1 || c.Jobs[0].Name != name {
		names := make([]string, 0, len(c.Jobs))
		for _, j := range c.Jobs {
			names = append(names, j.Name)
		}
		writeJSON(w, http.StatusUnprocessableEntity, problemsOut{Error: "nothing written", Problems: []Problem{{
			Message: fmt.Sprintf("the body must define exactly the job %q of the path; it defines %d job(s) %q", name, len(c.Jobs), names)}}})
		return
	}
	q := r.URL.Query()
	dry := q.Get("dryRun") == "1" || q.Get("dryRun") == "true"
	o := admin.ApplyOptions{By: auth.CallerOf(r.Context()).Actor(), DryRun: dry, TakeOver: q.Get("takeOver") == "1" || q.Get("takeOver") == "true"}
	ctx, cancel := a.ctx(r)
	defer cancel()
	res, err := a.o.Admin.Apply(ctx, c.Jobs, o)
	switch {
	case err != nil && len(res) == 1 && res[0].Err != "":
		writeJSON(w, opStatus(err), map[string]any{"error": res[0].Err, "result": res[0]})
		return
	case err != nil:
		writeError(w, opStatus(err), "%v", err)
		return
	}
	if !dry && res[0].Action != "unchanged" && a.o.OnWrite != nil {
		a.o.OnWrite()
	}
	a.o.Logger.Info("definition", "actor", o.By, "job", name, "action", res[0].Action, "dry_run", dry, "version", res[0].Version)
	writeJSON(w, http.StatusOK, res[0])
}

func (a *api) deleteDefinition(w http.ResponseWriter, r *http.Request) {
	name, ok := jobName(w, r)
	if !ok {
		return
	}
	wait := 0 * time.Second
	if v := r.URL.Query().Get("wait"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > time.Minute {
			writeError(w, http.StatusBadRequest, "wait must be a duration from 0 to 1m, got %q", v)
			return
		}
		wait = d
	}
	ctx, cancel := context.WithTimeout(r.Context(), wait+a.o.Timeout)
	defer cancel()
	removed, err := a.o.Admin.DeleteApplied(ctx, name, auth.CallerOf(r.Context()).Actor(), wait)
	if err != nil {
		writeError(w, opStatus(err), "%v", err)
		return
	}
	if a.o.OnWrite != nil {
		a.o.OnWrite()
	}
	writeJSON(w, http.StatusOK, map[string]any{"job": name, "deleted": true, "keysRemoved": removed})
}

// VersionOut is one kept definition of a job.
type VersionOut struct {
	admin.Version
	YAML string `json:"yaml,omitempty"`
}

func (a *api) versions(w http.ResponseWriter, r *http.Request) {
	name, ok := jobName(w, r)
	if !ok {
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	vs, err := a.o.Admin.Versions(ctx, name)
	if err != nil {
		writeError(w, opStatus(err), "%v", err)
		return
	}
	out := make([]VersionOut, len(vs))
	for i, v := range vs {
		out[i].Version = v
		out[i].Job = nil // the YAML says it
		if v.Def != nil {
			out[i].YAML = string(config.YAML(v.Def))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) rollback(w http.ResponseWriter, r *http.Request) {
	name, ok := jobName(w, r)
	if !ok {
		return
	}
	to, err := strconv.ParseInt(r.URL.Query().Get("to"), 10, 64)
	if err != nil || to <= 0 {
		writeError(w, http.StatusBadRequest, "to must be a version number (GET /api/v1/definitions/%s/versions lists them), got %q", name, r.URL.Query().Get("to"))
		return
	}
	ctx, cancel := a.ctx(r)
	defer cancel()
	res, err := a.o.Admin.Rollback(ctx, name, to, auth.CallerOf(r.Context()).Actor())
	if err != nil {
		writeError(w, opStatus(err), "%v", err)
		return
	}
	if a.o.OnWrite != nil {
		a.o.OnWrite()
	}
	writeJSON(w, http.StatusOK, res)
}
