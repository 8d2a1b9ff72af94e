package keyspace

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/shardd/shardd/pkg/config"
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

// DefinitionState is what an instance found at a job's config key.
type DefinitionState int

const (
	DefinitionMissing    DefinitionState = iota // no key
	DefinitionGood                              // a definition this version reads
	DefinitionGarbage                           // not a definition of this job at all: replaced
	DefinitionUnreadable                        // a definition of this job this version cannot read (a newer shardd wrote it?): kept
)

// ErrUnreadable marks a registered definition of the right job that this
// version cannot read: most likely a newer shardd wrote it, with a field
// this one does not know. Unlike garbage, it is not replaced.
var ErrUnreadable = errors.New("a definition this shardd version cannot read (written by a newer version?)")

// DefinitionStateOf classifies the error of DecodeRegistered.
func DefinitionStateOf(err error) DefinitionState {
	switch {
	case err == nil:
		return DefinitionGood
	case errors.Is(err, ErrUnreadable):
		return DefinitionUnreadable
	}
	return DefinitionGarbage
}

// DecodeRegistered decodes a config key's value into rc and returns its
// job definition. The error wraps ErrUnreadable when the value is a
// definition of job that this version's strict parser refuses. local, if
// set, is this host's definition of job: when the registered one is its
// JSON byte for byte (every host with the same file registers the same
// bytes), it is returned rather than parsed again, a copy without its
// position in this host's files that shares the rest (a Job is never
// changed once parsed): parsing every definition every instance sees was
// a tenth of a cold start's CPU with 10,000 jobs, and a second parsed
// copy of each definition was memory for nothing.
func DecodeRegistered(key, job string, data []byte, rc *RegisteredConfig, local *config.Job) (*config.Job, error) {
	if err := json.Unmarshal(data, rc); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	var named struct {
		Name string `json:"name"`
	}
	if err := json.Unmarshal(rc.Job, &named); err != nil || named.Name == "" {
		return nil, fmt.Errorf("no job definition in the value")
	}
	if named.Name != job {
		return nil, fmt.Errorf("defines job %q, not %q", named.Name, job)
	}
	if local != nil && local.Name == job && bytes.Equal(rc.Job, local.JSON()) {
		c := *local
		c.Pos = config.Pos{}
		rc.Hash = c.Hash()
		return &c, nil
	}
	j, err := config.ParseJobJSON(key, rc.Job)
	switch {
	case errors.Is(err, config.ErrUnknownFields):
		return nil, fmt.Errorf("%w: %v", ErrUnreadable, err)
	case err != nil:
		return nil, err
	}
	if rc.Hash != j.Hash() {
		rc.Hash = j.Hash() // written by another version: the hash of what it says
	}
	return j, nil
}
