package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// JSON returns j's definition as canonical JSON: the same definition always
// gives the same bytes. Derived fields (schedule, location, position) are left out.
func (j *Job) JSON() []byte {
	b, err := json.Marshal(j)
	if err != nil {
		panic(fmt.Sprintf("config: marshal job %q: %v", j.Name, err)) // every field type marshals
	}
	return b
}

// Hash identifies j's definition: two jobs with equal hashes behave the
// same. Overwrite is left out: it says how a host publishes its definition,
// not how the job behaves.
func (j *Job) Hash() string {
	if j.hash != "" {
		return j.hash
	}
	return j.computeHash()
}

func (j *Job) computeHash() string {
	c := *j
	c.Overwrite = false
	sum := sha256.Sum256(c.JSON())
	return hex.EncodeToString(sum[:8])
}

// seal computes j's Hash once, for good: a Job the parsers return is final
// (a new definition replaces it, none is changed in place), and hashing
// one for every comparison was a tenth of a cold start's CPU with 10,000
// jobs (every instance compares every definition it sees with its own).
func (j *Job) seal() *Job {
	j.hash = j.computeHash()
	return j
}

// ParseJobJSON reads a job definition written by JSON, strictly, and
// validates it as Load would. source names where the data came from in
// errors. The error wraps ErrUnknownFields when the data is a valid
// definition apart from fields this version does not know (a newer
// version wrote it).
func ParseJobJSON(source string, data []byte) (*Job, error) {
	j, err := parseJobJSON(source, data, true)
	if err != nil {
		if _, lerr := parseJobJSON(source, data, false); lerr == nil {
			return nil, fmt.Errorf("%w: %v", ErrUnknownFields, err)
		}
	}
	return j, err
}

// ErrUnknownFields: a job definition with fields this version does not know.
var ErrUnknownFields = errors.New("config: fields this version does not know")

func parseJobJSON(source string, data []byte, strict bool) (*Job, error) {
	j := DefaultJob()
	dec := json.NewDecoder(bytes.NewReader(data))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(&j); err != nil {
		return nil, &Error{File: source, Msg: "not a job definition: " + err.Error()}
	}
	if dec.More() {
		return nil, &Error{File: source, Msg: "not a job definition: data after the JSON object"}
	}
	if j.Script != nil && j.Script.Command.Shell != "" && len(j.Script.Command.Argv) > 0 {
		return nil, &Error{File: source, Job: fmt.Sprintf("%q", j.Name), Msg: "script.command has both argv and shell"}
	}
	var l loader
	if !validate(scope{l: &l, file: source, job: fmt.Sprintf("%q", j.Name)}, &j, &fields{line: map[string]int{}, failed: map[string]bool{}}) {
		return nil, errors.Join(l.errs...)
	}
	return j.seal(), nil
}
