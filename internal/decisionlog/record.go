package decisionlog

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
)

// The log's format, one JSON object per line (a field's name and form are
// part of it; readers skip fields they do not know):
//
//	{"log":"rls decisions","v":1,"time":T,"config":V,"files":[...],"sample":F,"hashed":B,
//	 "count_denied_hits":B,"shadow":B,"quota_all":B}
//	    a header: the config of version V (its files), how the log samples
//	    and hashes, the server's switches that shape decisions. It starts
//	    every file and comes again before the first record of another
//	    config.
//	{"time":T,"domain":D,"config":V,"code":"OK"|"OVER_LIMIT"|"UNAVAILABLE","error":E,
//	 "descriptors":[{"entries":[{"key":K,"value":V}...],"hits":N,"refund":true,
//	   "override":{"requests_per_unit":N,"unit":U,"unit_multiplier":M},"sampled":true}...],
//	 "limits":[{"descriptor":I,"name":L,"admitted":B,"shadow":true}...]}
//	    a decision: its descriptors (hits as counted: a request's
//	    hits_addend where the descriptor has none, 0 counting as 1), the
//	    verdict of each limit judged (its own: a limit may admit in a
//	    request that another denies). "sampled" marks a descriptor whose
//	    key the log does not keep whole: its verdicts are as recorded, its
//	    limits saw a sample of their traffic. "error" is the store's error
//	    when it failed (code: what the request got).
//	{"time":T,"domain":D,"config":V,"reset":true,"descriptors":[...]}
//	    a reset (POST /admin/reset) that reached the store.
//
// T is RFC 3339 with nanoseconds, UTC. A key or value that is not UTF-8
// is written "key_base64" or "value_base64" instead. With a hash key, a
// value the config does not name exactly is a keyed hash ("~" and 16
// characters) or, where a wildcard matched it, the wildcard with its
// first '*' replaced by one (so that it matches the same nodes).

// HeaderTag is the value of a header's "log" field.
const HeaderTag = "rls decisions"

// FormatVersion is the header's "v".
const FormatVersion = 1

// Kind says what a record is.
type Kind uint8

// The kinds of record.
const (
	Decision Kind = iota
	Header
	Reset
)

// Record is one line of a log, read back.
type Record struct {
	Kind   Kind
	Time   time.Time
	Domain string
	// Config is the version of the config the record was made on
	// (ConfigVersion).
	Config string
	// A header's: the config's files, the share of keys kept, whether
	// values are hashed, the server's switches.
	Files    []string
	Sample   float64
	Hashed   bool
	Switches Switches
	// A decision's: the code the request got and the store's error.
	Code        string
	Error       string
	Descriptors []Descriptor
	Limits      []Verdict
	// Line is the record's line in its file.
	Line int
}

// Switches are the server's switches that shape every decision
// (--count-denied-hits, --shadow, the reference's QUOTA_MODE).
type Switches struct {
	CountDeniedHits bool `json:"count_denied_hits,omitempty"`
	Shadow          bool `json:"shadow,omitempty"`
	QuotaAll        bool `json:"quota_all,omitempty"`
}

// Descriptor is one descriptor of a decision or a reset.
type Descriptor struct {
	Entries  []config.Entry
	Hits     uint64
	Refund   bool
	Override *Override
	// Sampled: the log does not keep this descriptor's key whole (see the
	// format).
	Sampled bool
}

// Override is a request's own limit.
type Override struct {
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Unit            string `json:"unit"`
	UnitMultiplier  uint32 `json:"unit_multiplier,omitempty"`
}

// Verdict is one limit's verdict in a decision.
type Verdict struct {
	Descriptor int    `json:"descriptor"`
	Name       string `json:"name"`
	Admitted   bool   `json:"admitted"`
	Shadow     bool   `json:"shadow,omitempty"`
}

// The line as JSON reads it.
type jsonRecord struct {
	Log      string           `json:"log"`
	V        int              `json:"v"`
	Time     time.Time        `json:"time"`
	Domain   string           `json:"domain"`
	DomainB  []byte           `json:"domain_base64"`
	Config   string           `json:"config"`
	Files    []string         `json:"files"`
	Sample   float64          `json:"sample"`
	Hashed   bool             `json:"hashed"`
	Code     string           `json:"code"`
	Error    string           `json:"error"`
	Reset    bool             `json:"reset"`
	Descs    []jsonDescriptor `json:"descriptors"`
	Limits   []Verdict        `json:"limits"`
	Switches                  // inline
}

type jsonDescriptor struct {
	Entries  []jsonEntry `json:"entries"`
	Hits     uint64      `json:"hits"`
	Refund   bool        `json:"refund"`
	Override *Override   `json:"override"`
	Sampled  bool        `json:"sampled"`
}

type jsonEntry struct {
	Key         string `json:"key"`
	KeyBase64   []byte `json:"key_base64"`
	Value       string `json:"value"`
	ValueBase64 []byte `json:"value_base64"`
}

// MaxLine bounds a line that Read reads: a record of the largest request
// rls accepts, escaped, fits well within it.
const MaxLine = 8 << 20

// Read reads a log: each record, in the order of the file, to f, which may
// stop the reading with an error (returned as it is). name names the log
// in errors (name:line: ...). A line that is not a record is an error.
func Read(r io.Reader, name string, f func(*Record) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxLine)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		rec, err := parseLine(b)
		if err != nil {
			return fmt.Errorf("%s:%d: %w", name, line, err)
		}
		rec.Line = line
		if err := f(rec); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s:%d: %w", name, line+1, err)
	}
	return nil
}

// parseLine reads one line.
func parseLine(b []byte) (*Record, error) {
	var j jsonRecord
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("not a decision log record: %w", err)
	}
	if j.Time.IsZero() {
		return nil, fmt.Errorf("a record without its time")
	}
	rec := &Record{Time: j.Time, Domain: j.Domain, Config: j.Config}
	if j.DomainB != nil {
		rec.Domain = string(j.DomainB)
	}
	switch {
	case j.Log != "":
		if j.Log != HeaderTag || j.V != FormatVersion {
			return nil, fmt.Errorf("a header of %q version %d, want %q version %d", j.Log, j.V, HeaderTag, FormatVersion)
		}
		rec.Kind, rec.Files, rec.Sample, rec.Hashed, rec.Switches = Header, j.Files, j.Sample, j.Hashed, j.Switches
		return rec, nil
	case j.Reset:
		rec.Kind = Reset
	default:
		rec.Kind, rec.Code, rec.Error, rec.Limits = Decision, j.Code, j.Error, j.Limits
		switch j.Code {
		case "OK", "OVER_LIMIT", "UNAVAILABLE":
		default:
			return nil, fmt.Errorf("code %q is not OK, OVER_LIMIT or UNAVAILABLE", j.Code)
		}
	}
	if rec.Domain == "" {
		return nil, fmt.Errorf("a record without its domain")
	}
	for i, d := range j.Descs {
		out := Descriptor{Hits: d.Hits, Refund: d.Refund, Override: d.Override, Sampled: d.Sampled}
		for _, e := range d.Entries {
			k, v := e.Key, e.Value
			if e.KeyBase64 != nil {
				k = string(e.KeyBase64)
			}
			if e.ValueBase64 != nil {
				v = string(e.ValueBase64)
			}
			out.Entries = append(out.Entries, config.Entry{Key: k, Value: v})
		}
		if o := d.Override; o != nil {
			if _, ok := engine.ParseUnit(o.Unit); !ok {
				return nil, fmt.Errorf("descriptors[%d].override.unit %q is not a unit", i, o.Unit)
			}
		}
		rec.Descriptors = append(rec.Descriptors, out)
	}
	for i, v := range rec.Limits {
		if v.Descriptor < 0 || v.Descriptor >= len(rec.Descriptors) {
			return nil, fmt.Errorf("limits[%d].descriptor %d: the record has %d descriptors", i, v.Descriptor, len(rec.Descriptors))
		}
	}
	return rec, nil
}

// The writing side: appenders that build a line without reflection.

// appendString appends s as a JSON string; s must be UTF-8.
func appendString[S ~string | ~[]byte](b []byte, s S) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\t':
			b = append(b, '\\', 't')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		}
		start = i + 1
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// appendField appends "name": and s as a string, or "name_base64": and
// its base64 when s is not UTF-8.
func appendField[S ~string | ~[]byte](b []byte, name string, s S) []byte {
	if valid(s) {
		b = appendString(b, name)
		b = append(b, ':')
		return appendString(b, s)
	}
	b = append(b, '"')
	b = append(b, name...)
	b = append(b, `_base64":"`...)
	b = base64.StdEncoding.AppendEncode(b, []byte(string(s)))
	return append(b, '"')
}

func valid[S ~string | ~[]byte](s S) bool {
	for i := 0; i < len(s); {
		if s[i] < utf8.RuneSelf {
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
		if r == utf8.RuneError && n <= 1 {
			return false
		}
		i += n
	}
	return true
}

func appendBool(b []byte, v bool) []byte { return strconv.AppendBool(b, v) }

func appendFloat(b []byte, f float64) []byte { return strconv.AppendFloat(b, f, 'g', -1, 64) }

func appendUint(b []byte, n uint64) []byte { return strconv.AppendUint(b, n, 10) }

func appendTime(b []byte, t time.Time) []byte {
	b = append(b, '"')
	b = t.UTC().AppendFormat(b, time.RFC3339Nano)
	return append(b, '"')
}
