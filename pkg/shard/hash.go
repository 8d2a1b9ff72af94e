package shard

import "unicode/utf16"

// JavaHashCode returns Java's String.hashCode of s: s[0]*31^(n-1) + ... +
// s[n-1] over the UTF-16 code units of s, in int32 arithmetic that wraps.
// ElasticJob's ODEVITY and ROUND_ROBIN depend on it. Invalid UTF-8 in s is
// read as U+FFFD, as Go's range over a string does.
func JavaHashCode(s string) int32 {
	var h int32
	for _, r := range s {
		if r >= 0x10000 {
			hi, lo := utf16.EncodeRune(r)
			h = 31*h + int32(hi)
			h = 31*h + int32(lo)
			continue
		}
		h = 31*h + int32(r)
	}
	return h
}

// hash64 is FNV-1a (64 bit) with a splitmix64 finish. It is part of the
// CONSISTENT_HASH and RANDOM contracts: changing it moves items.
type hash64 uint64

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func newHash() hash64 { return fnvOffset }

func (h hash64) byte(b byte) hash64 { return (h ^ hash64(b)) * fnvPrime }

// str hashes s followed by a 0 byte, so that ("ab","c") and ("a","bc") differ.
func (h hash64) str(s string) hash64 {
	for i := 0; i < len(s); i++ {
		h = h.byte(s[i])
	}
	return h.byte(0)
}

func (h hash64) u64(v uint64) hash64 {
	for i := 0; i < 8; i++ {
		h = h.byte(byte(v >> (8 * i)))
	}
	return h
}

// sum finishes the hash with splitmix64's mixer, which spreads FNV's weak low bits.
func (h hash64) sum() uint64 {
	z := uint64(h)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
