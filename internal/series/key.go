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

// appendKey appends the key of labels to dst.
func appendKey(dst []byte, labels []string) []byte {
	for _, v := range labels {
		dst = AppendLabel(dst, v)
	}
	return dst
}

// decode returns the label values of key (substrings of it), in dst when
// it has the room, or an error when key is not a key.
func decode(dst []string, key string) ([]string, error) {
	n := 0
	for end := len(key); end > 0; n++ {
		if end < lenSize {
			return nil, fmt.Errorf("%d bytes left before a value's length", end)
		}
		size := lenBefore(key, end)
		if end -= lenSize; size > end {
			return nil, fmt.Errorf("a value of %d bytes with %d bytes left", size, end)
		}
		end -= size
	}
	labels := dst[:0]
	if cap(labels) < n {
		labels = make([]string, 0, n)
	}
	labels = labels[:n]
	for end := len(key); end > 0; {
		size := lenBefore(key, end)
		end -= lenSize
		n--
		labels[n] = key[end-size : end]
		end -= size
	}
	return labels, nil
}

// lenBefore returns the value length that ends key[:end].
func lenBefore(key string, end int) int {
	b := key[end-lenSize : end]
	return int(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24)
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
