package keyspace

import (
	"encoding/json"
	"testing"

	"github.com/shardd/shardd/pkg/config"
)

// A registered definition that is this host's, byte for byte, is this
// host's parsed one (a copy without its position in the files); any other
// is parsed.
func TestDecodeRegisteredReusesTheLocalDefinition(t *testing.T) {
	c, err := config.Parse("jobs.yaml", []byte("jobs:\n  - name: j\n    cron: '0 * * * * ?'\n    script: 'echo hi'\n"))
	if err != nil {
		t.Fatal(err)
	}
	local := c.Jobs[0]
	value := func(j *config.Job) []byte {
		b, _ := json.Marshal(RegisteredConfig{Hash: j.Hash(), Job: j.JSON(), Writer: "a"})
		return b
	}
	var rc RegisteredConfig
	got, err := DecodeRegistered("k", "j", value(local), &rc, local)
	switch {
	case err != nil:
		t.Fatal(err)
	case got == local:
		t.Fatal("returned this host's Job itself, with its position in the files")
	case got.Script != local.Script || got.Schedule != local.Schedule:
		t.Error("a copy that does not share the parsed definition")
	case got.Pos != (config.Pos{}) || got.Hash() != local.Hash() || rc.Hash != local.Hash():
		t.Errorf("pos %v, hash %s / %s, want no position and hash %s", got.Pos, got.Hash(), rc.Hash, local.Hash())
	}

	other, err := config.Parse("jobs.yaml", []byte("jobs:\n  - name: j\n    cron: '0 * * * * ?'\n    script: 'echo other'\n"))
	if err != nil {
		t.Fatal(err)
	}
	got, err = DecodeRegistered("k", "j", value(other.Jobs[0]), &rc, local)
	switch {
	case err != nil:
		t.Fatal(err)
	case got.Script == local.Script || got.Hash() != other.Jobs[0].Hash():
		t.Errorf("another definition: got hash %s, want %s, parsed anew", got.Hash(), other.Jobs[0].Hash())
	}
}
