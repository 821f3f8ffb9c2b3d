package decisionlog

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"strings"
	"sync"

	"github.com/rlsproject/rls/internal/config"
)

// Sampling by key: a key is kept when a hash of its counters' identity
// (engine.Item.Desc, the same in every process) falls below the share.

const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

// mix spreads h's bits (SplitMix64's finalizer), so that the share kept
// is the share of keys whatever their form.
func mix(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// sampleHash is the hash by which a key is sampled.
func sampleHash(desc string) uint64 { return mix(fnvString(fnvOffset, desc)) }

// Keyed hashes of the values the config does not name exactly.

// hasher makes the keyed hashes of values. Safe for concurrent use.
type hasher struct {
	macs sync.Pool // hash.Hash: HMAC-SHA256 with the key
}

func newHasher(key []byte) *hasher {
	k := append([]byte(nil), key...)
	h := &hasher{}
	h.macs.New = func() any { return hmac.New(sha256.New, k) }
	return h
}

// tokenLen is the length of a value's hash token: "~" and 16 characters
// (96 bits).
const tokenLen = 17

// appendToken appends the token of the value v of key k.
func (h *hasher) appendToken(b []byte, k, v string) []byte {
	mac := h.macs.Get().(hash.Hash)
	mac.Reset()
	mac.Write([]byte(k))
	mac.Write([]byte{0})
	mac.Write([]byte(v))
	var sum [sha256.Size]byte
	out := mac.Sum(sum[:0])
	h.macs.Put(mac)
	b = append(b, '~')
	return base64.RawURLEncoding.AppendEncode(b, out[:12])
}

// appendHashed appends the value of entry e, which matched node n (nil:
// none) as the log keeps it: as it is when n names it exactly, else the
// token, put in place of the first '*' of n's wildcard when a wildcard
// matched it (its other '*' dropped), so that it matches n again.
func (h *hasher) appendHashed(b []byte, e config.Entry, n *config.Descriptor) []byte {
	switch {
	case n != nil && !n.Wildcard && n.Value != "" && n.Value == e.Value:
		return append(b, e.Value...)
	case n != nil && n.Wildcard:
		first, rest, _ := strings.Cut(n.Value, "*")
		b = append(b, first...)
		b = h.appendToken(b, e.Key, e.Value)
		return append(b, strings.ReplaceAll(rest, "*", "")...)
	}
	return h.appendToken(b, e.Key, e.Value)
}
