package keyspace

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
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
	// Source says how the definition came: SourceFile (also "", from
	// versions before applied definitions) or SourceApplied.
	Source string `json:"source,omitempty"`
	// By is who wrote it: the publishing instance's id, or the operator
	// (cli:USER@HOST, token:NAME, console:NAME).
	By string `json:"by,omitempty"`
	// Version counts the changes of the job's registered definition, from
	// 1; its record is versions/<Version>. 0: written before versions
	// were kept.
	Version int64 `json:"version,omitempty"`
}

// The sources of a registered definition.
const (
	// SourceFile: a host published its file's definition.
	SourceFile = "file"
	// SourceApplied: shardd apply, the API or the console's editor wrote
	// it; the instances that accept applied definitions and match its
	// selector run it, and no host's file publishes over it.
	SourceApplied = "applied"
)

// Applied reports whether the definition was applied (not published from
// a host's file).
func (rc *RegisteredConfig) Applied() bool { return rc.Source == SourceApplied }

// VersionRecord is the value of jobs/<job>/versions/<n>: one registered
// definition of the job, kept after it is replaced, for history and
// rollback. The last VersionsKept are kept; each is written in the Txn
// that registers it, so its ModRevision is the definition's generation.
type VersionRecord struct {
	Version int64           `json:"version"`
	Hash    string          `json:"hash"`
	Job     json.RawMessage `json:"job"`
	Source  string          `json:"source"`
	By      string          `json:"by"`
	Written time.Time       `json:"written"`
	// Change says what wrote it: "publish" (a host's file), "apply",
	// "rollback" (to Of), "take-over" (apply over a file job), "import".
	Change string `json:"change"`
	// Of is, for a rollback, the version whose definition it restored.
	Of int64 `json:"of,omitempty"`
}

// VersionsKept bounds the versions kept per job.
const VersionsKept = 30

// Placement is the value of placement/<job>: the job is applied.
type Placement struct {
	Selector string `json:"selector,omitempty"`
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

// VersionWrite is what a Txn that registers rc (as change; of is the
// version a rollback restores) writes besides the config key: the version
// record val at key, and the deletion of [pruneFrom, pruneEnd), the
// versions older than the last VersionsKept (pruneEnd "" when there are
// none). Every writer of a registered definition (a publishing instance,
// apply, rollback) adds them to its Txn, so that versions/ holds each
// change at its generation.
func (k Keys) VersionWrite(job string, rc RegisteredConfig, change string, of int64) (key, val, pruneFrom, pruneEnd string) {
	b, _ := json.Marshal(VersionRecord{Version: rc.Version, Hash: rc.Hash, Job: rc.Job, Source: rc.Source, By: rc.By, Written: rc.Written, Change: change, Of: of})
	if oldest := rc.Version - VersionsKept + 1; oldest > 1 {
		pruneFrom, pruneEnd = k.Versions(job), k.Version(job, oldest)
	}
	return k.Version(job, rc.Version), string(b), pruneFrom, pruneEnd
}

// Follow makes rc the definition that replaces prev in the config key:
// the next version, and prev's hash added to the superseded ones (rc's own
// taken out, the last MaxSuperseded kept). Every writer of the key (a
// publishing instance, apply, rollback) builds its value with it.
func (rc *RegisteredConfig) Follow(prev *RegisteredConfig) {
	rc.Version = prev.Version + 1
	rc.Superseded = slices.DeleteFunc(slices.Clone(prev.Superseded), func(h string) bool { return h == rc.Hash || h == prev.Hash })
	if prev.Hash != "" && prev.Hash != rc.Hash {
		rc.Superseded = append(rc.Superseded, prev.Hash)
	}
	if len(rc.Superseded) > MaxSuperseded {
		rc.Superseded = rc.Superseded[len(rc.Superseded)-MaxSuperseded:]
	}
}
