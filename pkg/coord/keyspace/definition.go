package keyspace

import (
	"encoding/json"
	"time"
)

// RegisteredConfig is the value of a job's config key: the one definition
// of the job the cluster runs (see docs/design.md, "Job definitions").
type RegisteredConfig struct {
	Hash    string          `json:"hash"`
	Job     json.RawMessage `json:"job"`
	Writer  string          `json:"writer"`
	Written time.Time       `json:"written"`
	// Superseded are the hashes of the definitions this one replaced, the
	// latest last, at most MaxSuperseded: a host that comes back with one of
	// them (and no loaded record) is behind, not editing.
	Superseded []string `json:"superseded,omitempty"`
}

// MaxSuperseded bounds RegisteredConfig.Superseded.
const MaxSuperseded = 20

// LoadedRecord is the value of a job's loaded/<id> key: the definition
// instance <id> last loaded from its own files. It has no lease: it
// outlives the process, so that a restarted host can tell an edit of its
// file from a file that is behind the cluster.
type LoadedRecord struct {
	Hash string    `json:"hash"`
	At   time.Time `json:"at"`
	// Seen is the generation of the registered definition when the record
	// was written; 0 when the record was written with a publication of
	// Hash, whose generation is then the record's own ModRevision.
	Seen int64 `json:"seen,omitempty"`
}
