package series

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// A key is a list of label values encoded in one byte string, so that a
// request's labels can be looked up without allocating: each value's bytes,
// then their length as 4 bytes (little endian). It reads from the end, so
// keys concatenate (a prefix's key, then a tail's, is the key of both), and
// no value's bytes can be taken for another's, whatever they hold.
const lenSize = 4

// AppendLabel appends label value v to key and returns the extended key.
func AppendLabel[S ~string | ~[]byte](key []byte, v S) []byte {
	start := len(key)
	key = append(key, v...)
	return EndLabel(key, start)
}

// EndLabel ends the label value whose bytes the caller appended to key
// from start on (so that a value made of parts needs no buffer of its own)
// and returns the extended key. It panics when start is not within key.
func EndLabel(key []byte, start int) []byte {
	n := len(key) - start
	if start < 0 || n < 0 || n > math.MaxUint32 {
		panic(fmt.Sprintf("series.EndLabel: start %d outside a key of %d bytes", start, len(key)))
	}
	return binary.LittleEndian.AppendUint32(key, uint32(n))
}

// encode returns the key of labels.
func encode(labels []string) string {
	var n int
	for _, v := range labels {
		n += len(v) + lenSize
	}
	key := make([]byte, 0, n)
	for _, v := range labels {
		key = AppendLabel(key, v)
	}
	return string(key)
}

// decode returns the label values of key (substrings of it), or an error
// when key is not a key.
func decode(key string) ([]string, error) {
	var rev []string
	for end := len(key); end > 0; {
		if end < lenSize {
			return nil, fmt.Errorf("%d bytes left before a value's length", end)
		}
		b := key[end-lenSize : end]
		n := int(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24)
		end -= lenSize
		if n > end {
			return nil, fmt.Errorf("a value of %d bytes with %d bytes left", n, end)
		}
		rev = append(rev, key[end-n:end])
		end -= n
	}
	labels := make([]string, len(rev))
	for i, v := range rev {
		labels[len(rev)-1-i] = v
	}
	return labels, nil
}

// validLabels returns labels with every value made valid UTF-8 (each run
// of invalid bytes becomes U+FFFD), as Prometheus accepts no other label value; labels
// itself when all are valid.
func validLabels(labels []string) []string {
	var out []string
	for i, v := range labels {
		if utf8.ValidString(v) {
			continue
		}
		if out == nil {
			out = append([]string(nil), labels...)
		}
		out[i] = strings.ToValidUTF8(v, "\uFFFD")
	}
	if out == nil {
		return labels
	}
	return out
}
