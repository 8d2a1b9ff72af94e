package config

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.yaml")
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			for _, e := range Errors(err) {
				var ce *Error
				if !errors.As(e, &ce) || ce.File != "fuzz.yaml" || ce.Msg == "" {
					t.Fatalf("error %q is not a located *Error", e)
				}
			}
			return
		}
		for _, j := range c.Jobs {
			if CheckName(j.Name) != nil || j.ShardingTotalCount < 1 || j.Location == nil || (len(j.Cron) > 0) != (j.Schedule != nil) {
				t.Fatalf("invalid job accepted: %+v", j)
			}
			if (j.Script == nil) == (j.HTTP == nil) {
				t.Fatalf("job %q accepted with script %v and http %v", j.Name, j.Script, j.HTTP)
			}
		}
	})
}

func FuzzParseItemParameters(f *testing.F) {
	for _, s := range []string{"0=Beijing,1=Shanghai,2=Guangzhou", " 0 = a ", "0=a=b", "1=a,1=b", "", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseItemParameters(s)
		if err != nil {
			return
		}
		// What parses round-trips through the ElasticJob form.
		again, err := ParseItemParameters(p.String())
		if err != nil {
			t.Fatalf("String() of %q = %q, which does not parse: %v", s, p.String(), err)
		}
		if !reflect.DeepEqual(p, again) {
			t.Fatalf("round trip of %q: %v != %v", s, p, again)
		}
		for item, v := range p {
			if item < 0 || v == "" || strings.Contains(v, ",") {
				t.Fatalf("%q gave item %d = %q", s, item, v)
			}
		}
	})
}
