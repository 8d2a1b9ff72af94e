package selector

import (
	"strings"
	"testing"
)

func TestParseAndMatch(t *testing.T) {
	db := map[string]string{"role": "db", "zone": "a"}
	web := map[string]string{"role": "web", "zone": "c", "spot": ""}
	none := map[string]string{}
	cases := []struct {
		sel           string
		canon         string
		db, web, none bool
	}{
		{"", "", true, true, true},
		{"role=db", "role=db", true, false, false},
		{"role == db", "role=db", true, false, false},
		{"role!=db", "role!=db", false, true, true},
		{"zone in (a, b)", "zone in (a,b)", true, false, false},
		{"zone notin (a,b)", "zone notin (a,b)", false, true, true},
		{"spot", "spot", false, true, false},
		{"!spot", "!spot", true, false, true},
		{"role=db,zone in (a,b)", "role=db,zone in (a,b)", true, false, false},
		{" zone in (b,a,a) , role = db ", "role=db,zone in (a,b)", true, false, false},
		{"example.com/tier=gold", "example.com/tier=gold", false, false, false},
		{"role=", "role=", false, false, false},
	}
	for _, tc := range cases {
		s, err := Parse(tc.sel)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.sel, err)
			continue
		}
		if got := s.String(); got != tc.canon {
			t.Errorf("Parse(%q).String() = %q, want %q", tc.sel, got, tc.canon)
		}
		for _, m := range []struct {
			name   string
			labels map[string]string
			want   bool
		}{{"db", db, tc.db}, {"web", web, tc.web}, {"none", none, tc.none}} {
			if got := s.Matches(m.labels); got != m.want {
				t.Errorf("%q matches %s (%v): %v, want %v", tc.sel, m.name, m.labels, got, m.want)
			}
		}
	}
}

func TestParseErrorsSayWhere(t *testing.T) {
	for _, tc := range []struct{ sel, want string }{
		{"role=db zone=a", "at 9: want a comma"},
		{"role>db", "want =, ==, !=, in or notin"},
		{"zone in a,b", "want ( and the values"},
		{"zone in (a b)", "want , or ) in the values"},
		{"zone in ()", "want a label value"},
		{",role=db", "want a label key"},
		{"-role=db", "must start and end with a letter or digit"},
		{"role=db!", "want a comma"},
		{strings.Repeat("k", 64) + "=v", "longer than 63 bytes"},
		{"a/b/c=d", "want prefix/name"},
		{"under_score.io/x=1", "is not a DNS name"},
	} {
		if _, err := Parse(tc.sel); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q): %v, want an error containing %q", tc.sel, err, tc.want)
		}
	}
}

func TestParseLabel(t *testing.T) {
	if k, v, err := ParseLabel("zone=eu-1"); err != nil || k != "zone" || v != "eu-1" {
		t.Errorf("ParseLabel(zone=eu-1) = %q %q %v", k, v, err)
	}
	for _, bad := range []string{"zone", "=a", "zone=a b", "zone=-a"} {
		if _, _, err := ParseLabel(bad); err == nil {
			t.Errorf("ParseLabel(%q): no error", bad)
		}
	}
}

// What parses prints to its canonical form, which parses to the same
// selector, matching the same labels.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"role=db,zone in (a,b)", "!spot", "x notin (1,2,3)", "a.b/c==d", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, text string) {
		s, err := Parse(text)
		if err != nil {
			return
		}
		again, err := Parse(s.String())
		if err != nil || again.String() != s.String() {
			t.Fatalf("%q: canonical %q parsed again: %v, %v", text, s.String(), again, err)
		}
		labels := map[string]string{}
		for _, r := range s {
			if len(r.Values) > 0 {
				labels[r.Key] = r.Values[0]
			}
		}
		if s.Matches(labels) != again.Matches(labels) {
			t.Fatalf("%q and its canonical form match %v differently", text, labels)
		}
	})
}
