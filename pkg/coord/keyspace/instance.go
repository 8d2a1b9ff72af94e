package keyspace

import (
	"time"

	"github.com/shardd/shardd/pkg/config"
)

// InstanceInfo is the value of an instance key.
type InstanceInfo struct {
	ID      string    `json:"id"`
	Node    string    `json:"node"`
	Host    string    `json:"host"`
	PID     int       `json:"pid"`
	Version string    `json:"version"`
	Started time.Time `json:"started"`
	API     string    `json:"api,omitempty"`
	Jobs    []string  `json:"jobs"`
	// Conflicts are the jobs whose local definition differs from the
	// registered one, which this instance uses instead.
	Conflicts []string `json:"conflicts,omitempty"`
	// APITLS says the API serves TLS: its URL is https://API.
	APITLS bool `json:"apiTLS,omitempty"`
	// ReloadRejected says that the instance's last configuration reload
	// was rejected, and what it found (how many problems, in which jobs;
	// nothing quoted of its files): it runs its previous configuration.
	// Empty after a reload that was applied.
	ReloadRejected string `json:"reloadRejected,omitempty"`
	// Labels are the instance's (shardd run --label), for the selectors
	// of applied jobs (docs/applied.md).
	Labels map[string]string `json:"labels,omitempty"`
	// Accepts is what the instance accepts of applied definitions
	// (--accept-applied and its restrictions).
	Accepts config.AcceptPolicy `json:"accepts"`
	// Refused are the applied jobs whose selector matches the instance but
	// which it does not accept, each with why.
	Refused map[string]string `json:"refused,omitempty"`
	// AppliedOverFiles are the jobs the instance's files define that are
	// applied: its files are behind the applied definitions.
	AppliedOverFiles []string `json:"appliedOverFiles,omitempty"`
}
