package httpdesc

import (
	"net/netip"
	"net/url"
	"strings"

	"github.com/rlsproject/rls/internal/engine"
)

// Entry is one (key, value) pair of a descriptor.
type Entry = engine.Entry

// Request is what http_descriptors read from an HTTP request. The
// transport adapters implement it.
type Request interface {
	// Header returns the first value of the header with the lower-case name,
	// and whether it is present. The pseudo-headers ":method", ":path" (with
	// the query string; a "#fragment" after it is ignored) and ":authority"
	// are answered too.
	Header(name string) (string, bool)
	// ClientAddr returns the client's address; the zero Addr when unknown.
	ClientAddr() netip.Addr
}

// Build appends to dst the descriptors that l makes of r, with Envoy's
// rules: one descriptor per item, entries in action order; an action that
// cannot produce its entry drops the whole descriptor, unless it has
// skip_if_absent (then only the entry is left out); a descriptor left with
// no entries is dropped.
func (l List) Build(r Request, dst [][]Entry) [][]Entry {
	for _, h := range l {
		if entries, failed := h.apply(r); failed < 0 && len(entries) > 0 {
			dst = append(dst, entries)
		}
	}
	return dst
}

// apply runs h's actions on r: the entries they produce, in action order,
// and failed, the index of the action that could not produce its entry and
// so drops the descriptor (-1 when none did; an action with skip_if_absent
// never fails). The one rule of Build and Explain.
func (h *Item) apply(r Request) (entries []Entry, failed int) {
	for i, a := range h.actions {
		e, ok := a.entry(r)
		if !ok {
			if a.SkipIfAbsent {
				continue
			}
			return nil, i
		}
		if entries == nil {
			entries = make([]Entry, 0, len(h.actions))
		}
		entries = append(entries, e)
	}
	return entries, -1
}

// entry produces a's entry for r, or false when it cannot.
func (a *action) entry(r Request) (Entry, bool) {
	switch a.Kind {
	case actionRemoteAddress, actionMaskedRemoteAddress:
		addr := r.ClientAddr()
		if !addr.IsValid() {
			return Entry{}, false
		}
		addr = addr.Unmap().WithZone("")
		if a.Kind == actionRemoteAddress {
			return Entry{Key: a.DescriptorKey, Value: addr.String()}, true
		}
		bits := a.V6PrefixLen
		if addr.Is4() {
			bits = a.V4PrefixLen
		}
		prefix, err := addr.Prefix(bits)
		if err != nil {
			return Entry{}, false
		}
		return Entry{Key: a.DescriptorKey, Value: prefix.String()}, true
	case actionRequestHeaders:
		v, ok := header(r, a.HeaderName)
		return Entry{Key: a.DescriptorKey, Value: v}, ok
	case actionQueryParameters:
		path, _ := header(r, ":path")
		v, ok := queryParameter(path, a.QueryParameterName)
		return Entry{Key: a.DescriptorKey, Value: v}, ok
	case actionGenericKey:
		return Entry{Key: a.DescriptorKey, Value: a.DescriptorValue}, true
	case actionHeaderValueMatch:
		all := true
		for _, m := range a.Headers {
			if !m.matches(r) {
				all = false
				break
			}
		}
		return Entry{Key: a.DescriptorKey, Value: a.DescriptorValue}, all == a.ExpectMatch
	}
	return Entry{}, false
}

// header returns the first value of r's header called name. The ":path"
// pseudo-header comes without its fragment ("#..."): Envoy never sees one
// (clients do not send it), but a forward-auth X-Original-URI may carry
// one, and it is neither path nor query.
func header(r Request, name string) (string, bool) {
	v, ok := r.Header(name)
	if name == ":path" {
		v, _, _ = strings.Cut(v, "#")
	}
	return v, ok
}

// queryParameter returns the URL-decoded value of the first parameter
// called name in the query of path ("/p?a=1&b=2"), a path without
// fragment.
func queryParameter(path, name string) (string, bool) {
	_, query, ok := strings.Cut(path, "?")
	if !ok {
		return "", false
	}
	for query != "" {
		var part string
		part, query, _ = strings.Cut(query, "&")
		k, v, _ := strings.Cut(part, "=")
		if k == "" || unescapeQuery(k) != name {
			continue
		}
		return unescapeQuery(v), true
	}
	return "", false
}

// unescapeQuery decodes %XX and '+'; badly escaped text stays as it is.
func unescapeQuery(s string) string {
	if !strings.ContainsAny(s, "%+") {
		return s
	}
	if u, err := url.QueryUnescape(s); err == nil {
		return u
	}
	return s
}

// matches applies m to r with Envoy's rules: an absent header matches only
// present_match: false (or present_match: true inverted); invert_match
// inverts the result for a present header.
func (m *headerMatcher) matches(r Request) bool {
	v, ok := header(r, m.Name)
	if m.Kind == matchPresent {
		return (ok == m.Present) != m.Invert
	}
	if !ok {
		return false
	}
	var match bool
	switch m.Kind {
	case matchExact:
		match = len(v) == len(m.Pattern) && hasPrefix(v, m.Pattern, m.IgnoreCase)
	case matchPrefix:
		match = hasPrefix(v, m.Pattern, m.IgnoreCase)
	case matchSuffix:
		match = len(v) >= len(m.Pattern) && hasPrefix(v[len(v)-len(m.Pattern):], m.Pattern, m.IgnoreCase)
	case matchContains:
		match = contains(v, m.Pattern, m.IgnoreCase)
	case matchRegex:
		match = m.Regex != nil && m.Regex.MatchString(v)
	}
	return match != m.Invert
}

// hasPrefix is strings.HasPrefix, ASCII case-insensitive when fold is set
// (Envoy's ignore_case folds ASCII only).
func hasPrefix(s, prefix string, fold bool) bool {
	if len(s) < len(prefix) {
		return false
	}
	if !fold {
		return s[:len(prefix)] == prefix
	}
	for i := 0; i < len(prefix); i++ {
		if lowerASCII(s[i]) != lowerASCII(prefix[i]) {
			return false
		}
	}
	return true
}

// contains is strings.Contains, ASCII case-insensitive when fold is set.
func contains(s, sub string, fold bool) bool {
	if !fold {
		return strings.Contains(s, sub)
	}
	for i := 0; i+len(sub) <= len(s); i++ {
		if hasPrefix(s[i:], sub, true) {
			return true
		}
	}
	return false
}

func lowerASCII(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
