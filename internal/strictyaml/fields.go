package strictyaml

import (
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Field is one key/value pair of a YAML mapping. The zero Field stands for
// a key that is absent.
type Field struct {
	Key string
	// KeyNode is the key's node (resolved); nil for the zero Field.
	KeyNode *yaml.Node
	// Value is the value's node as written (not resolved: the typed
	// readers resolve it).
	Value *yaml.Node
}

// Given reports whether f is a field of the mapping (not the zero Field).
func (f Field) Given() bool { return f.KeyNode != nil }

// Fields returns the pairs of the mapping n in file order, with merge keys
// (<<) expanded: explicit keys win over merged ones, and earlier merged
// mappings over later ones. It reports duplicate keys and keys that are
// not scalars.
func (r *Reader) Fields(n *yaml.Node) []Field {
	if r.merging[n] {
		r.Errorf(n, "a merge key (<<) brings in the mapping that contains it")
		return nil
	}
	out := fieldList{fields: make([]Field, 0, len(n.Content)/2)}
	var merged []Field
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := r.Resolve(n.Content[i]), n.Content[i+1]
		if r.voids[k] {
			continue // an alias refused or past a bound: reported
		}
		if k.Kind != yaml.ScalarNode {
			r.Errorf(k, "a mapping key must be a string, got %s", Describe(k))
			continue
		}
		if k.ShortTag() == "!!merge" {
			if r.merging == nil {
				r.merging = make(map[*yaml.Node]bool)
			}
			r.merging[n] = true
			merged = append(merged, r.mergeFields(v)...)
			delete(r.merging, n)
			continue
		}
		if first := out.find(k.Value); first != nil {
			r.Errorf(k, "duplicate key %q (first at %d:%d)", k.Value, first.Line, first.Column)
			continue
		}
		out.add(Field{Key: k.Value, KeyNode: k, Value: v})
	}
	for _, f := range merged {
		if out.find(f.Key) == nil {
			out.add(f)
		}
	}
	return out.fields
}

// smallMapping is the most fields found by a scan; past it (a metadata map
// of thousands of keys, a merge of one) they are found through a map.
const smallMapping = 16

// fieldList is the fields of a mapping being read, found by key.
type fieldList struct {
	fields []Field
	byKey  map[string]*yaml.Node // nil while there are few fields
}

// find returns the key node of the field called key, or nil.
func (l *fieldList) find(key string) *yaml.Node {
	if l.byKey != nil {
		return l.byKey[key]
	}
	for _, f := range l.fields {
		if f.Key == key {
			return f.KeyNode
		}
	}
	return nil
}

func (l *fieldList) add(f Field) {
	l.fields = append(l.fields, f)
	switch {
	case l.byKey != nil:
		l.byKey[f.Key] = f.KeyNode
	case len(l.fields) > smallMapping:
		l.byKey = make(map[string]*yaml.Node, 2*len(l.fields))
		for _, f := range l.fields {
			l.byKey[f.Key] = f.KeyNode
		}
	}
}

// mergeFields returns the pairs that a merge key's value brings in.
func (r *Reader) mergeFields(v *yaml.Node) []Field {
	v = r.Resolve(v)
	switch v.Kind {
	case yaml.MappingNode:
		return r.Fields(v)
	case yaml.SequenceNode:
		var out []Field
		for _, item := range v.Content {
			item = r.Resolve(item)
			if item.Kind != yaml.MappingNode {
				r.Errorf(item, "a merge key (<<) takes mappings, got %s", Describe(item))
				continue
			}
			out = append(out, r.Fields(item)...)
		}
		return out
	}
	if !IsNull(v) {
		r.Errorf(v, "a merge key (<<) takes a mapping or a list of mappings, got %s", Describe(v))
	}
	return nil
}

// Object reads n as a mapping of the given keys, called what in messages
// ("a step", "statuses[0]"): it returns the values by key, resolved, and
// reports every other key as unknown (Unknown) and n itself when it is
// not a mapping (Mapping). A key whose value is an alias refused (or past
// a bound) is reported once and left out, as if absent.
func (r *Reader) Object(n *yaml.Node, what string, keys ...string) map[string]*yaml.Node {
	out := make(map[string]*yaml.Node)
	m := r.Mapping(n, what)
	if m == nil {
		return out
	}
	for _, f := range r.Fields(m) {
		if !slices.Contains(keys, f.Key) {
			r.Unknown(f, what, keys)
			continue
		}
		if v := r.Resolve(f.Value); !r.voids[v] {
			out[f.Key] = v
		}
	}
	return out
}

// Unknown reports f, a key that what does not have; allowed are the keys
// it has: the nearest is proposed, or all are listed.
func (r *Reader) Unknown(f Field, what string, allowed []string) {
	r.Errorf(f.KeyNode, "unknown key %q in %s (%s)", f.Key, what, suggest(f.Key, allowed))
}

// suggest proposes the allowed key nearest to key, or lists them all.
func suggest(key string, allowed []string) string {
	if len(allowed) == 0 {
		return "it takes no keys"
	}
	best, bestDist := "", 3
	for _, a := range allowed {
		if d := editDistance(strings.ToLower(key), a); d < bestDist {
			best, bestDist = a, d
		}
	}
	if best != "" {
		return fmt.Sprintf("did you mean %q?", best)
	}
	return "allowed: " + strings.Join(allowed, ", ")
}

// editDistance is the Levenshtein distance of a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
