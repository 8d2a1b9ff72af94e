package console

import (
	"bytes"
	"html/template"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/shardd/shardd/pkg/coord/keyspace"
	"github.com/shardd/shardd/pkg/history"
)

// parsePages parses each page with the layout; a bad template is a bug
// the tests catch, so it panics.
func parsePages() map[string]*template.Template {
	funcs := template.FuncMap{
		"when": func(t time.Time) string {
			if t.IsZero() {
				return "-"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
		"whenIn": func(t time.Time) string { return t.Format("2006-01-02 15:04:05 MST") },
		"took": func(a, b time.Time) string {
			if a.IsZero() || b.IsZero() {
				return "-"
			}
			return b.Sub(a).Round(time.Millisecond).String()
		},
		"age":    func(d time.Duration) string { return d.Round(100 * time.Millisecond).String() },
		"join":   strings.Join,
		"jobURL": func(job string) string { return "/jobs/" + url.PathEscape(job) },
		"apiURL": func(job, action string) string { return "/api/v1/jobs/" + url.PathEscape(job) + "/" + action },
		"defURL": func(job string) string { return "/api/v1/definitions/" + url.PathEscape(job) },
		"logURL": func(job, run string) string {
			return "/jobs/" + url.PathEscape(job) + "?run=" + url.QueryEscape(run) + "#log"
		},
		"runID":  func(r keyspace.ItemRecord) string { return strconv.FormatInt(r.Fence, 10) + "-" + strconv.Itoa(r.Item) },
		"result": result,
		"failed": failed,
		"lower":  strings.ToLower,
		"code":   code,
		"tail":   tail,
		"bytes": func(n int64) string {
			switch {
			case n >= 1<<30:
				return strconv.FormatFloat(float64(n)/(1<<30), 'f', 1, 64) + " GiB"
			case n >= 1<<20:
				return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
			}
			return strconv.FormatInt(n>>10, 10) + " KiB"
		},
		"runTail": runTail,
		"deref":   func(r *keyspace.ItemRecord) keyspace.ItemRecord { return *r },
	}
	layout := template.Must(template.New("layout").Funcs(funcs).ParseFS(templateFS, "templates/layout.html"))
	pages := map[string]*template.Template{}
	for _, name := range []string{"overview", "jobs", "job", "instances", "audit", "definition", "login", "welcome", "error"} {
		pages[name] = template.Must(template.Must(layout.Clone()).ParseFS(templateFS, "templates/"+name+".html"))
	}
	return pages
}

// bootPage is the page a navigation with a session's cookie and without
// its key gets (see console.boot): always the same, with no data.
var bootPage = func() []byte {
	var b bytes.Buffer
	template.Must(template.ParseFS(templateFS, "templates/boot.html")).ExecuteTemplate(&b, "boot", nil)
	return b.Bytes()
}()

// code is a record's exit code or HTTP status ("exit 1", "http 503").
func code(r keyspace.ItemRecord) string {
	switch {
	case r.HTTPStatus > 0:
		return "http " + strconv.Itoa(r.HTTPStatus)
	case r.ExitCode >= 0:
		return "exit " + strconv.Itoa(r.ExitCode)
	}
	return "-"
}

// tail is what says most about how a run ended: a failed run's last line
// of output (its own words, "upstream timeout"), else its error (a kill's
// "killed by ..."), else its output's last line; cut.
func tail(r keyspace.ItemRecord) string { return tailOf(r, r.LastLine) }

// runTail is tail of a history row: its log's last line (stderr's, else
// stdout's) stands for its output's.
func runTail(r history.Run) string { return tailOf(r.ItemRecord, r.LastLine) }

func tailOf(r keyspace.ItemRecord, last string) string {
	out := strings.TrimSpace(r.Output)
	if i := strings.LastIndexByte(out, '\n'); i >= 0 {
		out = out[i+1:]
	}
	if last != "" {
		out = strings.TrimSpace(last)
	}
	if r.Error != "" && (out == "" || r.State != keyspace.StateFailed || r.HTTPStatus > 0) {
		out = r.Error
		if r.HTTPStatus > 0 { // "POST https://...: status 503: queue full": the status and the answer's start
			if i := strings.Index(out, "status "+strconv.Itoa(r.HTTPStatus)); i >= 0 {
				out = out[i:]
			}
		}
	}
	if len(out) > 120 {
		out = strings.ToValidUTF8(out[:117], "") + "..."
	}
	return out
}
