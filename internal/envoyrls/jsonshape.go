package envoyrls

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/rlsproject/rls/internal/service"
)

// The size of a /json body. A RateLimitRequest within the service's bounds
// (service.MaxRequestBytes of domain, keys and values, MaxDescriptors
// descriptors of MaxEntries entries) takes at most maxJSONBody bytes of
// proto3 JSON, pretty-printed and with every byte of its strings escaped
// as \u00XX (6 bytes, JSON's longest escape for one byte):
const (
	jsonEscape = 6 // bytes of JSON text per byte of a string, at most
	// jsonEntry is an entry without its strings, pretty-printed four spaces
	// deep: `{`, `"key": "",`, `"value": ""`, `},` and their indentation.
	jsonEntry = 128
	// jsonDescriptor is a descriptor without its entries: "entries", an
	// override with every field at its longest, "hits_addend" as a string
	// of 20 digits, "is_negative_hits", indentation.
	jsonDescriptor = 512
	// jsonRequest is the rest: "domain", "descriptors", "hits_addend".
	jsonRequest = 256

	maxJSONBody = jsonEscape*service.MaxRequestBytes +
		service.MaxDescriptors*(jsonDescriptor+service.MaxEntries*jsonEntry) + jsonRequest // 557,312 bytes
)

// jsonReadChunk is the first read of a body; reads double up to
// jsonMaxChunk: a bound crossed early in a long body stops the reading
// within a few KiB of it, and the reading never runs more than
// jsonMaxChunk past a bound.
const (
	jsonReadChunk = 4 << 10
	jsonMaxChunk  = 64 << 10
)

// errBodyTooLarge is the error of a body longer than its cap.
type errBodyTooLarge struct{ max int }

func (e *errBodyTooLarge) Error() string {
	return fmt.Sprintf("body: more than %d bytes (the longest RateLimitRequest within rls's bounds, in JSON): request body too large", e.max)
}

// errReadBody is the error of a body that could not be read.
type errReadBody struct{ err error }

func (e *errReadBody) Error() string { return "reading body: " + e.err.Error() }
func (e *errReadBody) Unwrap() error { return e.err }

// readJSONRequest reads a RateLimitRequest in proto3 JSON from r, a body
// of at most limit bytes (hint, when above 0, is its announced length), and
// checks its shape while it reads: as soon as the text read so far breaks
// one of the service's bounds (more descriptors or entries than allowed,
// a domain, key or value longer than allowed, too many bytes of them in
// all, an empty domain, key or entries), it stops reading and returns the
// error that the service would give for that field (an
// *service.InvalidError; a count it stopped at says "or more"), having
// built nothing. A body longer than limit is refused once limit+1 bytes are
// in (*errBodyTooLarge); a read error is an *errReadBody.
//
// Text that is not shaped like a RateLimitRequest (bad JSON, wrong types,
// escapes protojson refuses) stops the check, not the reading: the body is
// read to its end and returned, for protojson to refuse with its own
// message. Whatever the check refuses, protojson or the service refuses
// too (FuzzJSONStream).
func readJSONRequest(r io.Reader, limit, hint int) ([]byte, error) {
	s := jsonStream{r: r, max: limit, chunk: jsonReadChunk, size: limit + 1}
	if hint > 0 && hint <= limit {
		s.size = hint + 1 // see more
	}
	s.request()
	for s.err == nil && s.more() { // the rest: protojson's to judge
		s.i = len(s.buf)
	}
	if s.err != nil {
		return nil, s.err
	}
	return s.buf, nil
}

// jsonStream reads a body and walks its JSON text without building values,
// counting what the service bounds. Its walking methods report false when
// the text is not what they expect, nested deeper than maxJSONDepth (a
// RateLimitRequest is 5 deep), or a bound was crossed (err set); after
// false nothing more is walked. Not safe for concurrent use.
type jsonStream struct {
	r     io.Reader
	buf   []byte // the body read so far
	i     int    // the next byte to walk
	max   int
	size  int  // the most buf grows to: max+1, or the announced length + 1
	chunk int  // the size of the next read
	eof   bool // r is at its end
	err   error
	depth int

	name    [16]byte // a member name, unescaped (the longest rls looks for is 11 bytes)
	nameLen int      // its length, which may exceed len(name)
	domain  int      // the domain's length
	n       int      // descriptors so far
	total   int      // bytes of domain, keys and values so far
}

const maxJSONDepth = 16

// more reads the next part of the body; false at its end, at a read error
// or once it is longer than max (s.err set for those two).
func (s *jsonStream) more() bool {
	for empty := 0; s.err == nil && !s.eof; {
		if len(s.buf) > s.max {
			s.err = &errBodyTooLarge{s.max}
			return false
		}
		if len(s.buf) >= s.size {
			s.size = s.max + 1 // more than announced: up to the cap
		}
		want := min(s.chunk, s.size-len(s.buf))
		if free := cap(s.buf) - len(s.buf); free > 0 {
			want = min(want, free)
		} else {
			// Memory in proportion to what came: a first chunk, four
			// times as much while under jsonMaxChunk, then the whole
			// size (the announced length and a byte more, to see the end;
			// else the cap).
			size := min(jsonReadChunk, s.size)
			switch {
			case cap(s.buf) >= jsonMaxChunk:
				size = s.size
			case cap(s.buf) > 0:
				size = min(4*cap(s.buf), s.size)
			}
			grown := make([]byte, len(s.buf), max(size, len(s.buf)+want))
			copy(grown, s.buf)
			s.buf = grown
		}
		n, err := s.r.Read(s.buf[len(s.buf) : len(s.buf)+want])
		s.buf = s.buf[:len(s.buf)+n]
		s.chunk = min(2*s.chunk, jsonMaxChunk)
		switch {
		case errors.Is(err, io.EOF):
			s.eof = true
		case err != nil:
			s.err = &errReadBody{err}
			return false
		}
		if len(s.buf) > s.max {
			s.err = &errBodyTooLarge{s.max}
			return false
		}
		if n > 0 {
			return true
		}
		if empty++; empty == 100 {
			s.err = &errReadBody{io.ErrNoProgress}
			return false
		}
	}
	return false
}

// peek returns the next byte without consuming it; false at the end of
// the body (or an error).
func (s *jsonStream) peek() (byte, bool) {
	if s.i < len(s.buf) {
		return s.buf[s.i], true
	}
	if !s.more() {
		return 0, false
	}
	return s.buf[s.i], true
}

// refuse records err, a bound crossed, and stops the walk.
func (s *jsonStream) refuse(err error) bool {
	s.err = err
	return false
}

// request walks the top-level object and checks, at its end, what only
// the whole request tells (an empty domain, no descriptors).
func (s *jsonStream) request() {
	ok := s.object(func() bool {
		switch s.member() {
		case "domain":
			n, ok := s.str(service.MaxDomainLen)
			switch {
			case !ok:
				return false
			case n > service.MaxDomainLen:
				return s.refuse(service.CheckDomainLen(n))
			}
			s.domain = n
			return s.add(n)
		case "descriptors":
			return s.array(func() bool {
				i := s.n
				if s.n++; s.n > service.MaxDescriptors {
					return s.refuse(service.CheckDescriptorCount(s.n, true))
				}
				return s.descriptor(i)
			})
		}
		return s.skip()
	})
	if ok {
		if s.domain == 0 {
			s.refuse(service.CheckShape("", s.n))
		} else if err := service.CheckDescriptorCount(s.n, false); err != nil {
			s.refuse(err)
		}
	}
}

// descriptor walks descriptor i.
func (s *jsonStream) descriptor(i int) bool {
	entries := 0
	ok := s.object(func() bool {
		if s.member() != "entries" {
			return s.skip()
		}
		return s.array(func() bool {
			j := entries
			if entries++; entries > service.MaxEntries {
				return s.refuse(service.CheckEntries(i, entries, true))
			}
			return s.entry(i, j)
		})
	})
	if ok && entries == 0 {
		return s.refuse(service.CheckEntries(i, 0, false))
	}
	return ok
}

// entry walks entry j of descriptor i.
func (s *jsonStream) entry(i, j int) bool {
	key := 0
	ok := s.object(func() bool {
		switch s.member() {
		case "key":
			n, ok := s.str(service.MaxKeyLen)
			switch {
			case !ok:
				return false
			case n > service.MaxKeyLen:
				return s.refuse(service.CheckKey(i, j, n))
			}
			key = n
			return s.add(n)
		case "value":
			n, ok := s.str(service.MaxValueLen)
			switch {
			case !ok:
				return false
			case n > service.MaxValueLen:
				return s.refuse(service.CheckValue(i, j, n))
			}
			return s.add(n)
		}
		return s.skip()
	})
	if ok && key == 0 {
		return s.refuse(service.CheckKey(i, j, 0))
	}
	return ok
}

// add counts n more bytes of domain, keys and values.
func (s *jsonStream) add(n int) bool {
	if s.total += n; s.total > service.MaxRequestBytes {
		return s.refuse(service.CheckTotal(s.total, true))
	}
	return true
}

// member returns the name that object has just read, as a string the
// switches above compare without allocating ("" for a name longer than
// any rls looks for).
func (s *jsonStream) member() string {
	if s.nameLen > len(s.name) {
		return ""
	}
	return string(s.name[:s.nameLen])
}

// space consumes blanks.
func (s *jsonStream) space() {
	for {
		for s.i < len(s.buf) {
			if c := s.buf[s.i]; c != ' ' && c != '\t' && c != '\n' && c != '\r' {
				return
			}
			s.i++
		}
		if !s.more() {
			return
		}
	}
}

// next consumes c after blanks.
func (s *jsonStream) next(c byte) bool {
	s.space()
	if b, ok := s.peek(); ok && b == c {
		s.i++
		return true
	}
	return false
}

// null consumes a null after blanks.
func (s *jsonStream) null() bool {
	s.space()
	for k := range 4 {
		for s.i+k >= len(s.buf) {
			if !s.more() {
				return false
			}
		}
		if s.buf[s.i+k] != "null"[k] {
			return false
		}
	}
	s.i += 4
	return true
}

// object walks an object (or null): for each member, it reads the name
// into s.name and calls member, which consumes the value.
func (s *jsonStream) object(member func() bool) bool {
	return s.nested('{', '}', func() bool {
		return s.memberName() && s.next(':') && member()
	})
}

// array calls elem for each element of an array (none for null); elem
// consumes it.
func (s *jsonStream) array(elem func() bool) bool {
	return s.nested('[', ']', elem)
}

// nested consumes open, items separated by commas (each consumed by item),
// and close; or null.
func (s *jsonStream) nested(open, close byte, item func() bool) bool {
	if s.null() {
		return true
	}
	if s.depth == maxJSONDepth || !s.next(open) {
		return false
	}
	s.depth++
	if s.next(close) {
		s.depth--
		return true
	}
	for {
		if !item() {
			return false // the walk is over: depth no longer matters
		}
		if s.next(close) {
			s.depth--
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

// memberName consumes a member name into s.name.
func (s *jsonStream) memberName() bool {
	n, ok := s.string(-1, true)
	s.nameLen = n
	return ok
}

// str consumes a string, or null (""), and returns the length of its
// value in bytes as protojson decodes it; it stops once the length passes
// limit, returning limit+1 (the rest unread).
func (s *jsonStream) str(limit int) (int, bool) {
	if s.null() {
		return 0, true
	}
	return s.string(limit, false)
}

// string consumes a string and returns the length of its value in bytes,
// as protojson decodes it: a byte of the text as one byte (the bytes of a
// multi-byte character one by one), an escape as its character's UTF-8
// length. With limit ≥ 0 it stops once the length passes limit (the rest
// unread). With keep, the value's first len(s.name) bytes go to s.name.
// It reports false for what protojson refuses in a string: a control
// character, a bad escape, a lone surrogate, no end.
func (s *jsonStream) string(limit int, keep bool) (int, bool) {
	if !s.next('"') {
		return 0, false
	}
	n := 0
	for limit < 0 || n <= limit {
		// The bytes already read, up to a quote, an escape or a control
		// character (or just past limit).
		run := s.buf[s.i:]
		if limit >= 0 && len(run) > limit-n+1 {
			run = run[:limit-n+1]
		}
		k := plainRun(run)
		if keep && n < len(s.name) {
			copy(s.name[n:], run[:k])
		}
		n += k
		s.i += k
		c, ok := s.peek()
		switch {
		case limit >= 0 && n > limit:
			return n, true
		case !ok || c < 0x20:
			return n, false
		case c == '"':
			s.i++
			return n, true
		case c != '\\':
			continue // more bytes were read
		}
		r, ok := s.escape()
		if !ok {
			return n, false
		}
		if keep && n+utf8.RuneLen(r) <= len(s.name) {
			utf8.AppendRune(s.name[:n], r)
		}
		n += utf8.RuneLen(r)
	}
	return n, true // past limit: the caller stops
}

// stringStop marks the bytes that end a run of plain text in a string: a
// quote, a backslash, a control character.
var stringStop = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// plainRun returns the length of the longest prefix of b that holds no
// quote, backslash or control character: eight bytes at a time while none
// of them is one (a long string costs a fraction of a nanosecond a byte),
// then byte by byte.
func plainRun(b []byte) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	k := 0
	for ; k+8 <= len(b); k += 8 {
		x := binary.LittleEndian.Uint64(b[k:])
		quote, backslash := x^(ones*'"'), x^(ones*'\\')
		// A byte that is zero in quote or backslash, or below 0x20 in x,
		// sets its high bit here (exactly when there is one: the words
		// are only tested for being 0).
		if ((quote-ones)&^quote|(backslash-ones)&^backslash|(x-ones*0x20)&^x)&highs != 0 {
			break
		}
	}
	for k < len(b) && !stringStop[b[k]] {
		k++
	}
	return k
}

// escape consumes an escape sequence (the backslash first) and returns
// the character it stands for.
func (s *jsonStream) escape() (rune, bool) {
	s.i++ // the backslash
	c, ok := s.peek()
	if !ok {
		return 0, false
	}
	s.i++
	switch c {
	case '"', '\\', '/':
		return rune(c), true
	case 'b':
		return '\b', true
	case 'f':
		return '\f', true
	case 'n':
		return '\n', true
	case 'r':
		return '\r', true
	case 't':
		return '\t', true
	case 'u':
	default:
		return 0, false
	}
	r, ok := s.hex4()
	if !ok {
		return 0, false
	}
	if !utf16.IsSurrogate(r) {
		return r, true
	}
	// A surrogate pair, as one character; a lone half protojson refuses.
	for _, want := range [2]byte{'\\', 'u'} {
		if c, ok := s.peek(); !ok || c != want {
			return 0, false
		}
		s.i++
	}
	lo, ok := s.hex4()
	if r = utf16.DecodeRune(r, lo); !ok || r == utf8.RuneError {
		return 0, false
	}
	return r, true
}

// hex4 consumes four hexadecimal digits.
func (s *jsonStream) hex4() (rune, bool) {
	var r rune
	for range 4 {
		c, ok := s.peek()
		if !ok {
			return 0, false
		}
		s.i++
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// skip consumes any value.
func (s *jsonStream) skip() bool {
	s.space()
	c, ok := s.peek()
	if !ok {
		return false
	}
	switch c {
	case '{':
		return s.object(s.skip)
	case '[':
		return s.array(s.skip)
	case '"':
		_, ok := s.string(-1, false)
		return ok
	}
	// A number, true, false or null: up to the next delimiter.
	start := s.i
	for {
		c, ok := s.peek()
		if !ok || c == ',' || c == ':' || c == ']' || c == '}' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			break
		}
		s.i++
	}
	return s.i > start
}
