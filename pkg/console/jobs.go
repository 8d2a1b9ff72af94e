package console

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/coord/admin"
)

// Filters of the job list.
var jobFilters = []string{"", "ok", "running", "failed-last-hour", "failing", "disabled", "troubled"}

type jobsData struct {
	Query, Filter string
	Filters       []string
	Rows          []jobListRow
	Matched       int
	Page, Pages   int
	PrevURL       string
	NextURL       string
}

type jobListRow struct {
	jobRow
	Schedule schedule
	// Health is how the job's runs go (nil: not known).
	Health *admin.Health
}

func (c *console) jobs(r *http.Request, v *view) (string, error) {
	snap, err := c.snapshot(r, v, "Jobs", "jobs")
	if err != nil {
		return "", err
	}
	q := r.URL.Query()
	d := jobsData{Query: strings.TrimSpace(q.Get("q")), Filter: q.Get("filter"), Filters: jobFilters, Page: 1}
	if !slices.Contains(jobFilters, d.Filter) {
		d.Filter = ""
	}
	if p, err := strconv.Atoi(q.Get("page")); err == nil && p > 1 {
		d.Page = p
	}
	needle := strings.ToLower(d.Query)
	var match []jobRow
	for _, row := range snap.rows {
		if needle != "" && !strings.Contains(strings.ToLower(row.Name), needle) {
			continue
		}
		ok := true
		switch d.Filter {
		case "ok": // its map covers its instances, and its runs go well
			ok = row.Status == admin.StatusOK && (row.job.Health == nil || row.job.Health.State == admin.HealthOK)
		case "running":
			ok = row.Running > 0
		case "failed-last-hour":
			ok = row.FailedAt.After(v.Now.Add(-time.Hour))
		case "failing": // its health: an item's last run failed, or a due fire went unrecorded
			ok = row.Failing > 0 || row.job.Health != nil && row.job.Health.State != admin.HealthOK
		case "disabled": // paused ones too
			ok = row.Status == admin.StatusDisabled || row.Status == admin.StatusPaused
		case "troubled":
			ok = row.Status != admin.StatusOK && row.Status != admin.StatusDisabled && row.Status != admin.StatusPaused
		}
		if ok {
			match = append(match, row)
		}
	}
	d.Matched = len(match)
	d.Pages = max(1, (len(match)+PageSize-1)/PageSize)
	d.Page = min(d.Page, d.Pages)
	from := (d.Page - 1) * PageSize
	for _, row := range match[from:min(from+PageSize, len(match))] {
		d.Rows = append(d.Rows, jobListRow{jobRow: row, Schedule: scheduleOf(definition(row.def, row.Name), v.Now, 1), Health: row.job.Health})
	}
	link := func(page int) string {
		u := url.Values{}
		if d.Query != "" {
			u.Set("q", d.Query)
		}
		if d.Filter != "" {
			u.Set("filter", d.Filter)
		}
		u.Set("page", strconv.Itoa(page))
		return "/jobs?" + u.Encode()
	}
	if d.Page > 1 {
		d.PrevURL = link(d.Page - 1)
	}
	if d.Page < d.Pages {
		d.NextURL = link(d.Page + 1)
	}
	v.Data = d
	return "jobs", nil
}

// ---- job
