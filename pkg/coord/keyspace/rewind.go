package keyspace

import "time"

// RewindRecord is the value of rewinds/<id>: what instance <id> saw of
// etcd going back, and how far its recovery is.
type RewindRecord struct {
	Instance string    `json:"instance"`
	Detected time.Time `json:"detected"`
	Reason   string    `json:"reason"`
	// Seen is the revision of the history that went that showed it (the
	// highest one seen before an answer below it, or the revision a key
	// that went back had); Revision etcd's when recovery began.
	Seen     int64 `json:"seen"`
	Revision int64 `json:"revision"`
	// By, when set, is the instance whose report this one took as its own
	// rewind (Reason and Seen are then that instance's).
	By string `json:"by,omitempty"`
	// Recovered is when the instance resumed; zero while it waits.
	Recovered time.Time `json:"recovered,omitzero"`
	// Waiting says why it has not, when it cannot by itself.
	Waiting  string `json:"waiting,omitempty"`
	Repaired int    `json:"repaired,omitempty"`
}
