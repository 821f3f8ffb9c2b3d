package engine

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"time"
)

// The key layout of counters, in one place: a change here is a data
// migration (counters kept under the old keys are forgotten), so
// TestKeyLayout holds every part of it to a golden file.
//
// A counter is identified by its descriptor's identity (AppendDescriptorKey)
// and its rule's identity among the rules of that descriptor (Rule.ID,
// built by the functions below from what each algorithm names). A store
// that keeps counters under string keys (Redis) keys a descriptor as
//
//	<prefix>{<descriptor identity>}          (DescriptorKey)
//
// and a counter as that, ":" and its rule ID (CounterKey), where the braces
// make the descriptor identity Redis Cluster's hash tag (all counters of
// one descriptor share a slot). The Redis store keeps the counters of a
// descriptor as the fields of one hash at its DescriptorKey, named by their
// rule IDs, but for sliding logs (concurrency limits too), each a sorted
// set at its CounterKey; a CounterKey also names the counter in notices
// that its hits were given back, on the channel FreedChannel(prefix).

// maxPart is the longest escaped key part kept readable; longer parts are
// replaced by a hash so that keys stay short whatever the request sends.
const maxPart = 64

// Entry is one (key, value) pair of a request descriptor.
type Entry struct {
	Key   string
	Value string
}

// AppendDescriptorKey appends the identity of one request descriptor: the
// domain, then for each entry "/" + key + "=" + value. Where shares[i] is
// not "" (the entry's level matched a share_threshold wildcard), "~" +
// shares[i] (the pattern) stands in for "=" + value, so that all values
// matching it share counters.
//
// The encoding is unambiguous: '%', '/', '=', '~', '#', '{', '}', ':' and
// bytes outside printable ASCII are percent-escaped, and a part whose escaped
// form is longer than 64 bytes becomes "#" + 22 base64url characters of its
// SHA-256. Different descriptors never share a counter (unlike
// envoyproxy/ratelimit, where ("a_b","c") and ("a","b_c") collide), and the
// result contains no '{' or '}', so it can sit inside a Redis hash tag.
func AppendDescriptorKey(dst []byte, domain string, entries []Entry, shares []string) []byte {
	dst = appendPart(dst, domain)
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

// DescriptorKey returns the string key of the descriptor whose identity is
// desc, under prefix.
func DescriptorKey(prefix, desc string) string {
	return prefix + "{" + desc + "}"
}

// HashExpiry is the field of a descriptor's hash (Redis) that holds the
// instant at which the hash expires; no rule ID is "x".
const HashExpiry = "x"

// CounterKey returns the string key of the counter of rule r for the
// descriptor whose identity is desc, under prefix: its DescriptorKey, ":"
// and the rule's ID.
func CounterKey(prefix, desc string, r *Rule) string {
	return prefix + "{" + desc + "}:" + r.ID // CounterKeyIn(DescriptorKey(…), r.ID), in one allocation
}

// CounterKeyIn returns the string key of the counter of the rule whose ID
// is id, in the descriptor whose key (DescriptorKey) is key.
func CounterKeyIn(key, id string) string { return key + ":" + id }

// The runtime overrides of limits, on a store that shares them between
// processes (Redis), live under the counters' prefix in one cluster slot,
// that of the hash tag "overrides" (no descriptor identity is: each holds
// a '/'):
//
//	<prefix>{overrides}     a hash: each override at its OverrideField
//	<prefix>{overrides}:v   the overrides' version, which every change increments
//
// and each change is announced on OverridesChannel(prefix).

// OverridesKey returns the key of the hash of the overrides, under prefix.
func OverridesKey(prefix string) string { return prefix + "{overrides}" }

// OverridesVersionKey returns the key of the overrides' version, under
// prefix.
func OverridesVersionKey(prefix string) string { return prefix + "{overrides}:v" }

// OverridesChannel returns the channel on which changes of the overrides
// kept under prefix are announced.
func OverridesChannel(prefix string) string { return prefix + "overrides" }

// OverrideField returns the identity of the override of the limit named
// name (every limit when "") of the descriptor entries of domain, whose
// values may be prefixes (ending in '*'): the descriptor's identity as
// AppendDescriptorKey writes it, then the name part of a rule identity.
// Two overrides of the same domain, entries and name share it: the second
// replaces the first.
func OverrideField(domain string, entries []Entry, name string) string {
	return string(AppendDescriptorKey(nil, domain, entries, nil)) + nameSuffix(name)
}

// FreedChannel returns the channel on which notices that hits of a counter
// were given back are published, for counters keyed under prefix.
func FreedChannel(prefix string) string { return prefix + "freed" }

// windowID is the rule identity of a window of a length: the algorithm's
// code (its prefix: "fw", "sw", "sl", "tb") and the window in whole seconds
// ("fw60s").
func windowID(prefix string, r *Rule) string {
	return prefix + strconv.FormatInt(int64(r.Window/time.Second), 10) + "s"
}

// calendarID is the rule identity of a calendar window: its unit and time
// zone ("cal.month@Europe/Paris"), another counter than a fixed window of
// the same nominal length, and one per zone.
func calendarID(r *Rule) string {
	return "cal." + r.Unit.String() + "@" + r.Calendar.String()
}

// UnlimitedID is the identity, among the limits of a descriptor, of an
// unlimited one named name: it has no counter, but no two limits of a
// descriptor may share an identity.
func UnlimitedID(name string) string { return "unlimited" + nameSuffix(name) }

// nameSuffix is the part of a rule identity that its name adds: ":" + the
// name's length + ":" + the name ("tb1s:5:burst").
func nameSuffix(name string) string {
	if name == "" {
		return ""
	}
	return ":" + strconv.Itoa(len(name)) + ":" + name
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
