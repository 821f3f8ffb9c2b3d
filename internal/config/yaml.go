package config

import (
	"fmt"
	"math"
	"slices"

	"gopkg.in/yaml.v3"

	"github.com/rlsproject/rls/internal/strictyaml"
)

// A node's path repeats its ancestors' keys and values, and a limit's
// label its node's path: the parser counts both and gives up past a bound
// in proportion to the file (aliases are bounded by strictyaml), so that
// the Config and its dump stay in proportion to the file.
const (
	// Descriptor paths and limit labels may add up to nameRatio times the
	// file's size, plus nameSlack.
	nameSlack = 1 << 20
	nameRatio = 8
)

// parser walks the YAML documents of one config file with a strict reader
// and collects every problem with its position. It is used by one
// goroutine, for one file.
type parser struct {
	*strictyaml.Reader
	nameBytes, maxNameBytes int  // descriptor paths and limit labels
	nameOver                bool // past maxNameBytes: reported
	opts                    *ParseOptions
	reservationKey          string // the domain's being parsed
}

// newParser returns a parser for the file called name holding size bytes.
func newParser(name string, size int, opts *ParseOptions) *parser {
	r := strictyaml.NewReader(name, strictyaml.Options{NullIsZero: true})
	return &parser{Reader: r, maxNameBytes: nameSlack + nameRatio*size, opts: opts}
}

// spendNames counts n more bytes of descriptor paths and limit labels and
// reports whether they fit; the first time they do not, the problem is
// reported at at.
func (p *parser) spendNames(n int, at *yaml.Node) bool {
	if p.nameOver {
		return false
	}
	p.nameBytes += n
	if p.nameBytes <= p.maxNameBytes {
		return true
	}
	p.nameOver = true
	p.ErrorAt(at, fmt.Sprintf("descriptor paths and limit labels add up to more than %d bytes (8 times the file's size plus 1 MiB): "+
		"a long key or value is repeated in the path of every descriptor below it", p.maxNameBytes))
	return false
}

// uint32Field reads f's value as a whole number for the uint32 fields of
// a limit.
func (p *parser) uint32Field(f strictyaml.Field) (uint32, bool) {
	x, ok := p.Number(f.Value, f.Key, math.MaxUint32)
	return uint32(x), ok
}

// level is where a key sits in a domain document.
type level int

const (
	levelDomain level = iota
	levelDescriptor
	levelLimit
)

// levelKeys are the keys of each level; levelWhere says where that is.
var (
	levelKeys = [...][]string{
		levelDomain: {"domain", "descriptors", "http_descriptors", "reservation_key"},
		levelDescriptor: {"key", "value", "descriptors", "rate_limit", "rate_limits", "shadow_mode", "quota_mode",
			"detailed_metric", "value_to_metric", "share_threshold", "metadata", "count_denied_hits", "lease", "reserve"},
		levelLimit: {"unit", "requests_per_unit", "unlimited", "name", "replaces", "algorithm", "burst",
			"unit_multiplier", "shadow_mode", "count_denied_hits", "calendar", "time_zone", "lease", "penalty", "penalty_reset", "lease_ttl", "reserve"},
	}
	levelWhere = [...]string{
		levelDomain:     "at the top of a document",
		levelDescriptor: "in a descriptor",
		levelLimit:      "in a rate_limit",
	}
)

// misplaced reports f, an unknown key of a domain, descriptor or limit: a
// key of another level says where it belongs. A key that the ParseOptions
// tolerate is ignored with a warning instead.
func (p *parser) misplaced(f strictyaml.Field, lv level) {
	if slices.Contains(p.opts.TolerateKeys, f.Key) {
		if p.opts.TolerateReason != "" {
			p.Warnf(f.KeyNode, "key %q is ignored %s (%s)", f.Key, levelWhere[lv], p.opts.TolerateReason)
		} else {
			p.Warnf(f.KeyNode, "key %q is ignored %s", f.Key, levelWhere[lv])
		}
		return
	}
	for other, keys := range levelKeys {
		if level(other) != lv && slices.Contains(keys, f.Key) {
			p.Errorf(f.KeyNode, "key %q is not allowed %s (it belongs %s)", f.Key, levelWhere[lv], levelWhere[other])
			return
		}
	}
	what := [...]string{levelDomain: "domain", levelDescriptor: "descriptor", levelLimit: "rate_limit"}[lv]
	p.Unknown(f, what, levelKeys[lv])
}
