package decisionlog

import (
	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/service"
)

type engineItem = engine.Item

// requestShape is what a record says of a request's descriptors, from the
// items the store judged: the node each matched (the node of its limits;
// nil for none, or for a request override) and whether it has limits.
type requestShape struct {
	nodes  [service.MaxDescriptors]*config.Descriptor
	limits [service.MaxDescriptors]bool
}

// fill sets s from the items the store judged.
func (s *requestShape) fill(items []engine.Item, limits []*config.Limit, owners []int) {
	for j := range items {
		i := owners[j]
		if !s.limits[i] {
			s.limits[i] = true
			s.nodes[i] = limits[j].Descriptor
		}
	}
}

// appendDecision appends d's record (keep[i]: descriptor i's key is kept).
func (l *Log) appendDecision(b []byte, lc *logConfig, d *service.Decision, keep []bool) []byte {
	var shape requestShape
	shape.fill(d.Items, d.Limits, d.Owners)
	b = l.appendHead(b, lc, d.Request.Domain)
	b = append(b, `,"code":`...)
	switch {
	case d.Response == nil:
		b = appendString(b, "UNAVAILABLE")
	default:
		b = appendString(b, d.Response.Code.String())
	}
	if d.StoreErr != nil {
		b = append(b, ',')
		b = appendField(b, "error", d.StoreErr.Error())
	}
	b = l.appendDescriptors(b, d.Request, &shape, keep, true)
	b = append(b, `,"limits":[`...)
	for j := range d.Items {
		if j > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"descriptor":`...)
		b = appendUint(b, uint64(d.Owners[j]))
		b = append(b, ',')
		b = appendField(b, "name", d.Limits[j].Label)
		b = append(b, `,"admitted":`...)
		b = appendBool(b, d.Results[j].Admitted)
		if d.Items[j].Shadow {
			b = append(b, `,"shadow":true`...)
		}
		b = append(b, '}')
	}
	return append(b, "]}\n"...)
}

// appendReset appends the record of the reset c.
func (l *Log) appendReset(b []byte, lc *logConfig, c *service.Cleared, keep []bool) []byte {
	var shape requestShape
	shape.fill(c.Items, c.Limits, c.Owners)
	b = l.appendHead(b, lc, c.Request.Domain)
	b = append(b, `,"reset":true`...)
	b = l.appendDescriptors(b, c.Request, &shape, keep, false)
	return append(b, "}\n"...)
}

// appendHead appends the opening of a record: its time, domain and config.
func (l *Log) appendHead(b []byte, lc *logConfig, domain string) []byte {
	b = append(b, `{"time":`...)
	b = appendTime(b, l.now())
	b = append(b, ',')
	b = appendField(b, "domain", domain)
	if lc != nil {
		b = append(b, `,"config":`...)
		b = appendString(b, lc.version)
	}
	return b
}

// appendDescriptors appends "descriptors": the request's, with their hits
// (withHits), values hashed where the log hashes them, each descriptor
// with limits whose key is not kept marked sampled.
func (l *Log) appendDescriptors(b []byte, req *service.Request, shape *requestShape, keep []bool, withHits bool) []byte {
	b = append(b, `,"descriptors":[`...)
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"entries":[`...)
		b = l.appendEntries(b, d.Entries, shape.nodes[i])
		b = append(b, ']')
		if withHits {
			hits := uint64(max(req.HitsAddend, 1))
			if d.HasHits {
				hits = d.Hits
			}
			b = append(b, `,"hits":`...)
			b = appendUint(b, hits)
			if d.Refund {
				b = append(b, `,"refund":true`...)
			}
		}
		if o := d.Override; o != nil {
			b = append(b, `,"override":{"requests_per_unit":`...)
			b = appendUint(b, uint64(o.RequestsPerUnit))
			b = append(b, `,"unit":`...)
			b = appendString(b, o.Unit.String())
			b = append(b, `,"unit_multiplier":`...)
			b = appendUint(b, uint64(max(o.UnitMultiplier, 1)))
			b = append(b, '}')
		}
		if shape.limits[i] && !keep[i] {
			b = append(b, `,"sampled":true`...)
		}
		b = append(b, '}')
	}
	return append(b, ']')
}

// appendEntries appends the entries of a descriptor that matched the node
// last (nil: none), as the log keeps them.
func (l *Log) appendEntries(b []byte, entries []config.Entry, last *config.Descriptor) []byte {
	var levels [config.MaxDepth]*config.Descriptor // the node of each entry
	if l.hash != nil && last != nil && last.Depth == len(entries)-1 {
		for n := last; n != nil; n = n.Parent {
			levels[n.Depth] = n
		}
	}
	for j, e := range entries {
		if j > 0 {
			b = append(b, ',')
		}
		b = append(b, '{')
		b = appendField(b, "key", e.Key)
		b = append(b, ',')
		if l.hash == nil {
			b = appendField(b, "value", e.Value)
		} else {
			var tmp [128]byte
			var n *config.Descriptor
			if j < len(levels) {
				n = levels[j]
			}
			b = appendField(b, "value", l.hash.appendHashed(tmp[:0], e, n))
		}
		b = append(b, '}')
	}
	return b
}
