package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// yamlBlock is a fenced YAML block of a Markdown file; wholeFile, the
// start of one that is a whole job file.
var (
	yamlBlock = regexp.MustCompile("(?ms)^```yaml\n(.*?)^```$")
	wholeFile = regexp.MustCompile(`^(jobs|calendars|defaults):`)
)

// The docs' examples of whole job files (a block that starts with jobs:,
// calendars: or defaults:) are valid configs: an example a user copies
// must load. Fragments (one field's shape, a compose file) are not checked.
func TestDocExamplesAreValid(t *testing.T) {
	files, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../../README.md", "../../jobs.example.yaml")
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		blocks := [][]byte{b}
		if strings.HasSuffix(f, ".md") {
			blocks = nil
			for _, m := range yamlBlock.FindAllSubmatch(b, -1) {
				if wholeFile.Match(m[1]) {
					blocks = append(blocks, m[1])
				}
			}
		}
		for i, block := range blocks {
			checked++
			if _, err := ParseWithoutEnv(filepath.Base(f), block); err != nil {
				t.Errorf("%s, YAML example %d: %v", f, i+1, err)
			}
		}
	}
	if checked < 6 {
		t.Errorf("%d examples checked: the docs have more whole job files than that", checked)
	}
}
