package strictyaml

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"iter"

	"gopkg.in/yaml.v3"
)

// Bounds on what aliases may bring into one file. Aliases let a small file
// stand for a huge one (an alias cycle, a "billion laughs", one long text
// used a thousand times): the reader counts what they bring in and gives
// up past these bounds, so that reading a file stays in proportion to its
// size.
const (
	// MaxAliasNodes bounds the YAML nodes brought in through aliases (each
	// use of an alias costs the size of the aliased node). Far above what a
	// hand-written file needs.
	MaxAliasNodes = 100000
	// Aliases may bring in as many bytes of text as the file holds, plus
	// AliasSlack.
	AliasSlack = 1 << 20
)

// Options say how a file format reads what YAML leaves open. The zero
// value refuses nulls where a value is wanted and allows aliases within
// the bounds.
type Options struct {
	// NullIsZero reads a null (key:, ~, null) where a scalar is wanted as
	// its type's zero value ("", false, 0) and where a mapping or a list is
	// wanted as none, as yaml.v2 decodes it into a Go value (config files:
	// envoyproxy/ratelimit's files rely on it). When false a null there is
	// reported ("name must be a string, got null").
	NullIsZero bool
	// RefuseAliases, when not empty, is the message that reports each
	// alias (*name) of the file: the format has none. Empty allows aliases
	// within MaxAliasNodes and AliasSlack.
	RefuseAliases string
}

// Context names what the messages of a reader are about: each message is
// prefixed with `What "Name": ` (`descriptor "api_key/tier=gold": `). The
// zero value adds nothing.
type Context struct {
	What, Name string
}

// Reader reads the YAML documents of one file and collects every problem
// with its position: it never stops at the first. A reader of a file
// format walks the nodes that Documents yields with the methods of Reader,
// then returns Errors. It is used by one goroutine, for one file.
type Reader struct {
	file     string
	opts     Options
	errs     []*Error
	warnings []*Error
	context  Context

	aliasNodes, aliasBytes int                 // brought in through aliases
	maxAliasBytes          int                 // AliasSlack + the file's size
	aliasOver              bool                // past a bound: aliases resolve to null
	sizes                  map[*yaml.Node]size // memo of nodeSize
	merging                map[*yaml.Node]bool // mappings whose merge keys are being expanded
	// voids are the nulls that stand for aliases refused or past a bound:
	// already reported, they are never reported again as a null.
	voids map[*yaml.Node]bool
}

// NewReader returns a Reader for the file called name (as messages give
// it), reading with opts.
func NewReader(name string, opts Options) *Reader {
	return &Reader{file: name, opts: opts, maxAliasBytes: AliasSlack}
}

// File returns the file's name, as given to NewReader.
func (r *Reader) File() string { return r.file }

// Errors returns the problems found so far, in the order found (see
// SortErrors). The slice is the reader's.
func (r *Reader) Errors() []*Error { return r.errs }

// Warnings returns what Warnf recorded, in the order found.
func (r *Reader) Warnings() []*Error { return r.warnings }

// Context returns what messages are about now.
func (r *Reader) Context() Context { return r.context }

// SetContext sets what later messages are about (see Context); a caller
// that narrows it puts the previous one back when done.
func (r *Reader) SetContext(c Context) { r.context = c }

// Documents yields the root node of each document of data, the file's
// contents, in order, resolved (an alias root is followed): an empty
// document (as after a trailing ---) is skipped. A syntax error ends the
// documents; it is reported at the line yaml.v3 gives. Documents sets the
// bound on the text aliases bring in from len(data).
func (r *Reader) Documents(data []byte) iter.Seq[*yaml.Node] {
	r.maxAliasBytes = AliasSlack + len(data)
	return func(yield func(*yaml.Node) bool) {
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var doc yaml.Node
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				return
			}
			if err != nil {
				r.syntaxError(err, data)
				return
			}
			if len(doc.Content) == 0 {
				continue
			}
			root := r.Resolve(doc.Content[0])
			if IsNull(root) {
				continue
			}
			if !yield(root) {
				return
			}
		}
	}
}

// Errorf records a problem at n, prefixed with the context.
func (r *Reader) Errorf(n *yaml.Node, format string, args ...any) {
	r.ErrorAt(n, r.inContext(fmt.Sprintf(format, args...)))
}

// ErrorAt records msg at n without the context's prefix: for problems of
// the file as a whole (a bound of the file reached).
func (r *Reader) ErrorAt(n *yaml.Node, msg string) {
	line, col := Pos(n)
	r.errs = append(r.errs, &Error{File: r.file, Line: line, Column: col, Msg: msg})
}

// Warnf records a warning at n, prefixed with the context: something the
// format tolerates but that the file's author should know.
func (r *Reader) Warnf(n *yaml.Node, format string, args ...any) {
	line, col := Pos(n)
	r.warnings = append(r.warnings, &Error{File: r.file, Line: line, Column: col, Msg: r.inContext(fmt.Sprintf(format, args...))})
}

func (r *Reader) inContext(msg string) string {
	if r.context.What == "" {
		return msg
	}
	return fmt.Sprintf("%s %q: %s", r.context.What, r.context.Name, msg)
}

// Resolve follows aliases. An alias the options refuse, or past a bound on
// what aliases bring in, is reported (a bound once) and resolves to a null
// that is never reported again, so that cyclic documents end.
func (r *Reader) Resolve(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode {
		if r.opts.RefuseAliases != "" {
			r.ErrorAt(n, r.opts.RefuseAliases)
			return r.void(n)
		}
		if n.Alias == nil || r.aliasOver {
			return r.void(n)
		}
		size := r.nodeSize(n.Alias)
		r.aliasNodes += size.nodes
		r.aliasBytes += size.bytes
		switch {
		case r.aliasNodes > MaxAliasNodes:
			r.aliasOver = true
			r.ErrorAt(n, fmt.Sprintf("aliases expand to more than %d nodes (an alias cycle, or an exponential expansion)", MaxAliasNodes))
		case r.aliasBytes > r.maxAliasBytes:
			r.aliasOver = true
			r.ErrorAt(n, fmt.Sprintf("aliases expand to more than %d bytes of text (the file's size plus 1 MiB): each use of an alias repeats its text", r.maxAliasBytes))
		}
		if r.aliasOver {
			return r.void(n)
		}
		n = n.Alias
	}
	return n
}

// void returns a null at n's place that stands for n, an alias already
// dealt with.
func (r *Reader) void(n *yaml.Node) *yaml.Node {
	v := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line, Column: n.Column}
	if r.voids == nil {
		r.voids = make(map[*yaml.Node]bool)
	}
	r.voids[v] = true
	return v
}

// size is what a YAML tree holds: its nodes and the bytes of its scalars.
type size struct{ nodes, bytes int }

// nodeSize measures n's tree, an alias in it counting as one node.
func (r *Reader) nodeSize(n *yaml.Node) size {
	if s, ok := r.sizes[n]; ok {
		return s
	}
	if r.sizes == nil {
		r.sizes = make(map[*yaml.Node]size)
	}
	r.sizes[n] = size{nodes: 1} // a node that contains itself counts once
	s := size{nodes: 1, bytes: len(n.Value)}
	if n.Kind != yaml.AliasNode {
		for _, c := range n.Content {
			cs := r.nodeSize(c)
			s.nodes += cs.nodes
			s.bytes += cs.bytes
		}
	}
	r.sizes[n] = s
	return s
}

// Pos returns the position of n: for a mapping, that of its first key (a
// flow mapping's opening brace says less than its first key does); 1:1
// for a node that has none.
func Pos(n *yaml.Node) (line, col int) {
	if n.Kind == yaml.MappingNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	if n.Line < 1 {
		return 1, 1
	}
	return n.Line, n.Column
}

// IsNull reports whether n is a null scalar.
func IsNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// Describe names the YAML type and value of n for messages: "a mapping",
// "a list", "null", "boolean true", "number 5", `string "x"`.
func Describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!bool":
			return "boolean " + n.Value
		case "!!int", "!!float":
			return "number " + n.Value
		default:
			return fmt.Sprintf("string %q", n.Value)
		}
	}
	return "an alias"
}
