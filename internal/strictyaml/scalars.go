package strictyaml

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// The typed readers below take a value's node as written (they resolve
// it) and name, what messages call it (a key, or a path such as
// "descriptors[0].hits"). They report a problem at the value, prefixed
// with the context, and never stop the reading: a bad value reads as its
// type's zero value.

// null handles v, a null where want is wanted: with NullIsZero it is the
// zero value (true); otherwise it is reported, unless it stands for an
// alias already reported, and false.
func (r *Reader) null(v *yaml.Node, name, want string) bool {
	if r.opts.NullIsZero {
		return true
	}
	if !r.voids[v] {
		r.Errorf(v, "%s must be %s, got null", name, want)
	}
	return false
}

// Mapping returns n resolved when it is a mapping; otherwise it reports it
// and returns nil. A null is none (NullIsZero) or reported.
func (r *Reader) Mapping(n *yaml.Node, name string) *yaml.Node {
	return r.collection(n, name, yaml.MappingNode, "a mapping")
}

// List returns the items of n, resolved, when it is a list; otherwise it
// reports it and returns nil. A null is an empty list (NullIsZero) or
// reported.
func (r *Reader) List(n *yaml.Node, name string) []*yaml.Node {
	v := r.collection(n, name, yaml.SequenceNode, "a list")
	if v == nil {
		return nil
	}
	items := make([]*yaml.Node, len(v.Content))
	for i, item := range v.Content {
		items[i] = r.Resolve(item)
	}
	return items
}

// collection returns n resolved when it is of kind (want in messages);
// otherwise it reports it and returns nil.
func (r *Reader) collection(n *yaml.Node, name string, kind yaml.Kind, want string) *yaml.Node {
	v := r.Resolve(n)
	if IsNull(v) {
		r.null(v, name, want)
		return nil
	}
	if v.Kind != kind {
		r.Errorf(v, "%s must be %s, got %s", name, want, Describe(v))
		return nil
	}
	return v
}

// String returns n's text. Any scalar is accepted as written (as yaml.v2
// does for envoyproxy/ratelimit: value: 200 is "200").
func (r *Reader) String(n *yaml.Node, name string) (string, bool) {
	v := r.Resolve(n)
	if v.Kind != yaml.ScalarNode {
		r.Errorf(v, "%s must be a string, got %s", name, Describe(v))
		return "", false
	}
	if IsNull(v) {
		return "", r.null(v, name, "a string")
	}
	return v.Value, true
}

const quotedStyles = yaml.DoubleQuotedStyle | yaml.SingleQuotedStyle | yaml.LiteralStyle | yaml.FoldedStyle

// Bool returns n as a bool: true/false in any of YAML's spellings, and the
// YAML 1.1 forms (yes, no, on, off, ...) that yaml.v2 accepts; a quoted
// "true" is text, not a boolean.
func (r *Reader) Bool(n *yaml.Node, name string) bool {
	v := r.Resolve(n)
	if v.Kind == yaml.ScalarNode {
		if IsNull(v) {
			r.null(v, name, "true or false")
			return false
		}
		tag := v.ShortTag()
		if tag == "!!bool" || (tag == "!!str" && v.Style&quotedStyles == 0) {
			if b, ok := boolWords[v.Value]; ok {
				return b
			}
		}
	}
	r.Errorf(v, "%s must be true or false, got %s", name, Describe(v))
	return false
}

// boolWords are the spellings of booleans that yaml.v3 reads into a bool
// (yaml.v3's resolve and decode tables, YAML 1.2 and 1.1).
var boolWords = map[string]bool{
	"true": true, "True": true, "TRUE": true, "false": false, "False": false, "FALSE": false,
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}

// Number returns n as a whole number in [0, max]: as yaml.v3 reads an
// !!int, underscores dropped, then Go's syntax (1_000, 0x10, 0o17, 0b101,
// a leading 0 for octal).
func (r *Reader) Number(n *yaml.Node, name string, max uint64) (uint64, bool) {
	v := r.Resolve(n)
	if IsNull(v) {
		return 0, r.null(v, name, "a whole number")
	}
	x, problem := wholeNumber(v, max)
	if problem != "" {
		r.Errorf(v, "%s %s", name, problem)
		return 0, false
	}
	return x, true
}

var integerText = regexp.MustCompile(`^[-+]?[0-9][0-9_]*$`)

// wholeNumber reads the scalar n as a whole number in [0, max], or says
// why it is not one, to follow the value's name ("must not be negative,
// got -1").
func wholeNumber(n *yaml.Node, max uint64) (v uint64, problem string) {
	if n.Kind == yaml.ScalarNode {
		switch n.ShortTag() {
		case "!!int":
			plain := strings.ReplaceAll(n.Value, "_", "")
			if x, err := strconv.ParseInt(plain, 0, 64); err == nil {
				if x < 0 {
					return 0, fmt.Sprintf("must not be negative, got %d", x)
				}
				if uint64(x) > max {
					return 0, fmt.Sprintf("%d is out of range (at most %d)", x, max)
				}
				return uint64(x), ""
			}
			if x, err := strconv.ParseUint(plain, 0, 64); err == nil {
				return 0, fmt.Sprintf("%d is out of range (at most %d)", x, max)
			}
		case "!!float":
			// yaml.v3 reads an integer too large for 64 bits as a float.
			if integerText.MatchString(n.Value) {
				if strings.HasPrefix(n.Value, "-") {
					return 0, "must not be negative, got " + n.Value
				}
				return 0, fmt.Sprintf("%s is out of range (at most %d)", n.Value, max)
			}
		}
	}
	return 0, "must be a whole number, got " + Describe(n)
}

// Duration returns n as a Go duration (time.ParseDuration: "1.5s", "2m",
// "1h30m", "-1s", "0").
func (r *Reader) Duration(n *yaml.Node, name string) (time.Duration, bool) {
	v := r.Resolve(n)
	if IsNull(v) {
		return 0, r.null(v, name, "a duration")
	}
	if v.Kind == yaml.ScalarNode {
		if d, err := time.ParseDuration(v.Value); err == nil {
			return d, true
		}
	}
	r.Errorf(v, "%s must be a duration (e.g. 1.5s, 2m, 1h30m), got %s", name, Describe(v))
	return 0, false
}
