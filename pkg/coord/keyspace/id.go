package keyspace

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"time"
)

// NewRequestID names an operator request's key (a trigger, a kill, an
// audit entry): time-ordered, with a random part so that two requests in
// one millisecond do not share a key.
func NewRequestID(now time.Time) string {
	var nonce [4]byte
	rand.Read(nonce[:])
	return strconv.FormatInt(now.UnixNano(), 36) + "-" + hex.EncodeToString(nonce[:])
}
