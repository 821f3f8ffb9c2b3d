package engine

import (
	"crypto/sha256"
	"encoding/base64"

	"github.com/rlsproject/rls/internal/descriptors"
)

// maxPart is the longest escaped key part kept readable; longer parts are
// replaced by a hash so that keys stay short whatever the request sends.
const maxPart = 64

// AppendDescriptorKey appends the counter identity of one request
// descriptor: the domain, then for each entry "/" + key + "=" + value. When
// the entry's level matched a share_threshold wildcard, "~" + the pattern
// stands in for "=" + value, so that all values matching it share counters.
// node is the node that the entries matched (nil for a request override).
//
// The encoding is unambiguous: '%', '/', '=', '~', '#', '{', '}', ':' and
// bytes outside printable ASCII are percent-escaped, and a part whose escaped
// form is longer than 64 bytes becomes "#" + 22 base64url characters of its
// SHA-256. Different descriptors never share a counter (unlike
// envoyproxy/ratelimit, where ("a_b","c") and ("a","b_c") collide), and the
// result contains no '{' or '}', so it can sit inside a Redis hash tag.
func AppendDescriptorKey(dst []byte, domain string, entries []descriptors.Entry, node *descriptors.Descriptor) []byte {
	dst = appendPart(dst, domain)
	var shares []string
	if node != nil && node.Depth == len(entries)-1 {
		shares = node.Shares
	}
	for i, e := range entries {
		dst = append(dst, '/')
		dst = appendPart(dst, e.Key)
		if i < len(shares) && shares[i] != "" {
			dst = append(dst, '~')
			dst = appendPart(dst, shares[i])
			continue
		}
		dst = append(dst, '=')
		dst = appendPart(dst, e.Value)
	}
	return dst
}

// mustEscape[c] is true for the bytes that appendPart percent-escapes.
var mustEscape = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c <= ' ' || c >= 0x7f
	}
	for _, c := range "%/=~#{}:" {
		t[c] = true
	}
	return t
}()

func appendPart(dst []byte, s string) []byte {
	esc := 0
	for i := 0; i < len(s); i++ {
		if mustEscape[s[i]] {
			esc++
		}
	}
	switch {
	case len(s)+2*esc > maxPart:
		sum := sha256.Sum256([]byte(s))
		dst = append(dst, '#')
		return base64.RawURLEncoding.AppendEncode(dst, sum[:16])
	case esc == 0:
		return append(dst, s...)
	}
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if mustEscape[c] {
			dst = append(dst, '%', hex[c>>4], hex[c&15])
			continue
		}
		dst = append(dst, c)
	}
	return dst
}
