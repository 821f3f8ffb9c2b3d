package envoyrls

import (
	"bytes"
	"encoding/json"

	"github.com/rlsproject/rls/internal/service"
)

// checkJSONShape scans the proto3 JSON of a RateLimitRequest for what
// service.CheckShape and service.CheckEntryCount check, building nothing,
// so that a 1 MiB body of 60,000 descriptors is refused after a scan and
// not after protojson built them all (200 ms and 27 MB). Text that is not
// shaped like a RateLimitRequest is left to protojson to refuse (nil here),
// unless the descriptors or entries seen before it already break a bound.
func checkJSONShape(b []byte) error {
	s := jsonScanner{b: b}
	var (
		domain  string
		n       int
		entries [service.MaxDescriptors]int
	)
	ok := s.object(func(key []byte) bool {
		switch string(key) {
		case "domain":
			v, ok := s.str()
			domain = string(v)
			return ok
		case "descriptors":
			return s.array(func() bool {
				i := n
				n++
				if i >= len(entries) {
					return s.skip()
				}
				return s.object(func(key []byte) bool {
					if string(key) != "entries" {
						return s.skip()
					}
					return s.array(func() bool {
						entries[i]++
						return s.skip()
					})
				})
			})
		}
		return s.skip()
	})
	if ok {
		if err := service.CheckShape(domain, n); err != nil {
			return err
		}
	} else if n > service.MaxDescriptors {
		return service.CheckShape("-", n) // the domain is protojson's to judge
	}
	for i := range min(n, len(entries)) {
		if !ok && entries[i] <= service.MaxEntries {
			continue
		}
		if err := service.CheckEntryCount(i, entries[i]); err != nil {
			return err
		}
	}
	return nil
}

// jsonScanner walks JSON text without building values. Its methods report
// false for text that is not what they expect, or nested deeper than
// maxJSONDepth (a RateLimitRequest is 4 deep).
type jsonScanner struct {
	b     []byte
	i     int
	depth int
}

const maxJSONDepth = 16

func (s *jsonScanner) space() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

// next consumes c after blanks.
func (s *jsonScanner) next(c byte) bool {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// null consumes a null.
func (s *jsonScanner) null() bool {
	s.space()
	if bytes.HasPrefix(s.b[s.i:], []byte("null")) {
		s.i += 4
		return true
	}
	return false
}

// object calls member for each member of an object (none for null), after
// its key (unescaped) and colon; member consumes the value.
func (s *jsonScanner) object(member func(key []byte) bool) bool {
	return s.nested('{', '}', func() bool {
		key, ok := s.str()
		return ok && s.next(':') && member(key)
	})
}

// array calls elem for each element of an array (none for null); elem
// consumes it.
func (s *jsonScanner) array(elem func() bool) bool {
	return s.nested('[', ']', elem)
}

// nested consumes open, items separated by commas (each consumed by item),
// and close; or null.
func (s *jsonScanner) nested(open, close byte, item func() bool) bool {
	if s.null() {
		return true
	}
	if s.depth == maxJSONDepth || !s.next(open) {
		return false
	}
	s.depth++
	defer func() { s.depth-- }()
	if s.next(close) {
		return true
	}
	for {
		if !item() {
			return false
		}
		if s.next(close) {
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

// str consumes a string (or null, as "") and returns its value, unescaped.
func (s *jsonScanner) str() ([]byte, bool) {
	if s.null() {
		return nil, true
	}
	raw, ok := s.rawString()
	if !ok {
		return nil, false
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw[1 : len(raw)-1], true
	}
	var v string
	if json.Unmarshal(raw, &v) != nil {
		return nil, false
	}
	return []byte(v), true
}

// rawString consumes a string and returns it with its quotes.
func (s *jsonScanner) rawString() ([]byte, bool) {
	if !s.next('"') {
		return nil, false
	}
	start := s.i - 1
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '\\':
			s.i += 2
			continue
		case '"':
			s.i++
			return s.b[start:s.i], true
		}
		s.i++
	}
	return nil, false
}

// skip consumes any value.
func (s *jsonScanner) skip() bool {
	s.space()
	if s.i >= len(s.b) {
		return false
	}
	switch s.b[s.i] {
	case '{':
		return s.object(func([]byte) bool { return s.skip() })
	case '[':
		return s.array(s.skip)
	case '"':
		_, ok := s.rawString()
		return ok
	}
	// A number, true, false or null: up to the next delimiter.
	start := s.i
	for s.i < len(s.b) && bytes.IndexByte([]byte(",:]} \t\n\r"), s.b[s.i]) < 0 {
		s.i++
	}
	return s.i > start
}
