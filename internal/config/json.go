package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
)

// jsonLimit is the shape of a limit in the config dump. Flags that are
// false and optional fields that are empty are left out; everything else
// is always there. (A domain's http_descriptors dump themselves:
// httpdesc.Item.MarshalJSON.)
type jsonLimit struct {
	Index           int      `json:"index"`
	ID              string   `json:"id"`
	Label           string   `json:"label"`
	Name            string   `json:"name,omitempty"`
	Unlimited       bool     `json:"unlimited,omitempty"`
	Algorithm       string   `json:"algorithm,omitempty"`
	Unit            string   `json:"unit,omitempty"`
	UnitMultiplier  uint32   `json:"unit_multiplier,omitempty"`
	Window          string   `json:"window,omitempty"`
	WindowSeconds   int64    `json:"window_seconds,omitempty"`
	RequestsPerUnit *uint32  `json:"requests_per_unit,omitempty"`
	Burst           *uint32  `json:"burst,omitempty"`
	LeaseTTL        string   `json:"lease_ttl,omitempty"`
	Shadow          bool     `json:"shadow,omitempty"`
	CountDenied     bool     `json:"count_denied_hits,omitempty"`
	Lease           bool     `json:"lease,omitempty"`
	Penalty         []string `json:"penalty,omitempty"`
	PenaltyReset    string   `json:"penalty_reset,omitempty"`
	Calendar        string   `json:"calendar_time_zone,omitempty"`
	Replaces        []string `json:"replaces,omitempty"`
	Line            int      `json:"line"`
	Column          int      `json:"column"`
}

// DefaultMaxDumpBytes bounds MarshalJSON's output. A dump stops there
// (see WriteJSON): aliases and long paths can make a config's dump much
// bigger than its files, and /debug/config must not build it whole.
const DefaultMaxDumpBytes = 32 << 20

// MarshalJSON dumps the whole config, for GET /debug/config: WriteJSON
// with DefaultMaxDumpBytes.
func (c *Config) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	if err := c.WriteJSON(&b, DefaultMaxDumpBytes); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// WriteJSON writes the config to w as JSON: the files, then the domains
// by name, each with its descriptor tree (paths, flags, metadata, limits
// with their IDs, labels and indexes) and its http_descriptors. The output
// is indented and stable: the same config gives the same bytes. Flags that
// are false and optional fields that are empty are left out.
//
// At most maxBytes are written, plus the closing brackets (maxBytes ≤ 0
// means DefaultMaxDumpBytes): the dump stops before the first item (a
// field, a limit, a metadata map) that would go past it, closes what is
// open and ends with a "truncated" field that says so, so that it stays
// valid JSON. One item at a time is held in memory.
//
// Lists in extra follow the domains, each as a field of the top object
// (GET /debug/config adds the runtime overrides so), within the same
// budget.
func (c *Config) WriteJSON(w io.Writer, maxBytes int, extra ...DumpList) error {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxDumpBytes
	}
	d := &dumper{w: w, left: maxBytes}
	d.enc = json.NewEncoder(&d.scratch)
	d.enc.SetEscapeHTML(false)
	files := []string{}
	if c != nil {
		files = append(files, c.files...)
	}
	domains := c.Domains()
	d.raw("{")
	filesOK := d.field("  ", "files", files, true)
	ok := filesOK && d.objects("  ", "domains", len(domains), false, func(i int, ind string) bool { return d.domain(domains[i], ind) })
	for _, x := range extra {
		ok = ok && d.items("  ", x.Key, x.N, x.Elem)
	}
	if d.full {
		note := fmt.Sprintf("the dump stops at its cap of %s; the rest of the config is left out", bytesText(int64(maxBytes)))
		d.raw(sep("  ", !filesOK) + `"truncated": ` + quote(note))
	}
	d.raw("\n}")
	return d.err
}

// DumpList is a list that WriteJSON writes after the domains: the field
// Key holding N elements, each Elem(i) encoded as JSON.
type DumpList struct {
	Key  string
	N    int
	Elem func(i int) any
}

// dumper writes the JSON dump item by item within a budget. Each writing
// method reports whether it wrote everything it was asked to.
type dumper struct {
	w       io.Writer
	err     error
	left    int  // bytes the budget still allows
	full    bool // something did not fit: only closing brackets follow
	scratch bytes.Buffer
	enc     *json.Encoder // encodes one item into scratch
}

// raw writes structure outside the budget: brackets, the truncation note.
func (d *dumper) raw(s string) {
	if d.err == nil {
		_, d.err = io.WriteString(d.w, s)
	}
}

// put writes s when it fits in the budget; otherwise the dump is full.
func (d *dumper) put(s ...string) bool {
	n := 0
	for _, part := range s {
		n += len(part)
	}
	if !d.spend(n) {
		return false
	}
	for _, part := range s {
		d.raw(part)
	}
	return d.err == nil
}

// spend takes n bytes from the budget, or marks the dump full.
func (d *dumper) spend(n int) bool {
	if d.full || d.err != nil {
		return false
	}
	if n > d.left {
		d.full = true
		return false
	}
	d.left -= n
	return true
}

// item writes head then v, encoded with its inner lines at indentation
// ind, when both fit in the budget.
func (d *dumper) item(head string, v any, ind string) bool {
	if d.full || d.err != nil {
		return false
	}
	d.scratch.Reset()
	d.enc.SetIndent(ind, "  ")
	if d.err = d.enc.Encode(v); d.err != nil {
		return false
	}
	body := bytes.TrimSuffix(d.scratch.Bytes(), []byte("\n"))
	if !d.spend(len(head) + len(body)) {
		return false
	}
	d.raw(head)
	if d.err == nil {
		_, d.err = d.w.Write(body)
	}
	return d.err == nil
}

// sep is what comes before the element or field at indentation ind.
func sep(ind string, first bool) string {
	if first {
		return "\n" + ind
	}
	return ",\n" + ind
}

// field writes one field of an object whose fields sit at indentation ind.
func (d *dumper) field(ind, key string, v any, first bool) bool {
	return d.item(sep(ind, first)+quote(key)+": ", v, ind)
}

// objects writes the field key holding n objects, whose fields elem writes
// at the indentation it is given; n == 0 gives [].
func (d *dumper) objects(ind, key string, n int, first bool, elem func(i int, ind string) bool) bool {
	if n == 0 {
		return d.put(sep(ind, first), quote(key), ": []")
	}
	if !d.put(sep(ind, first), quote(key), ": [") {
		return false
	}
	inner := ind + "  "
	ok := true
	for i := 0; ok && i < n; i++ {
		if ok = d.put(sep(inner, i == 0), "{"); ok {
			ok = elem(i, inner+"  ")
			d.raw("\n" + inner + "}")
		}
	}
	d.raw("\n" + ind + "]")
	return ok
}

// items writes the field key holding n elements, each written as one item.
func (d *dumper) items(ind, key string, n int, elem func(i int) any) bool {
	if !d.put(sep(ind, false), quote(key), ": [") {
		return false
	}
	inner := ind + "  "
	ok := true
	for i := 0; ok && i < n; i++ {
		ok = d.item(sep(inner, i == 0), elem(i), inner)
	}
	d.raw("\n" + ind + "]")
	return ok
}

// domain writes the fields of one domain, at indentation ind.
func (d *dumper) domain(dom *Domain, ind string) bool {
	return d.field(ind, "name", dom.Name, true) && d.field(ind, "file", dom.File, false) &&
		d.field(ind, "line", dom.Line, false) && d.field(ind, "column", dom.Column, false) &&
		d.objects(ind, "descriptors", len(dom.Descriptors), false, func(i int, ind string) bool {
			return d.descriptor(dom.Descriptors[i], ind)
		}) &&
		(len(dom.HTTPDescriptors) == 0 || d.items(ind, "http_descriptors", len(dom.HTTPDescriptors), func(i int) any {
			return dom.HTTPDescriptors[i] // its MarshalJSON
		}))
}

// descriptor writes the fields of one node and its subtree, at
// indentation ind.
func (d *dumper) descriptor(n *Descriptor, ind string) bool {
	ok := d.field(ind, "path", n.Path, true) && d.field(ind, "key", n.Key, false) &&
		(n.Value == "" || d.field(ind, "value", n.Value, false))
	for _, flag := range [...]struct {
		key string
		on  bool
	}{
		{"wildcard", n.Wildcard}, {"shadow_mode", n.ShadowMode}, {"quota_mode", n.QuotaMode}, {"count_denied_hits", n.CountDeniedHits}, {"lease", n.Lease},
		{"detailed_metric", n.DetailedMetric}, {"value_to_metric", n.ValueToMetric}, {"share_threshold", n.ShareThreshold},
	} {
		ok = ok && (!flag.on || d.field(ind, flag.key, true, false))
	}
	return ok && (len(n.Metadata) == 0 || d.field(ind, "metadata", n.Metadata, false)) &&
		d.field(ind, "line", n.Line, false) && d.field(ind, "column", n.Column, false) &&
		(len(n.Limits) == 0 || d.items(ind, "limits", len(n.Limits), func(i int) any { return dumpLimit(n.Limits[i]) })) &&
		(len(n.Children) == 0 || d.objects(ind, "descriptors", len(n.Children), false, func(i int, ind string) bool {
			return d.descriptor(n.Children[i], ind)
		}))
}

// quote is s as a JSON string.
func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func dumpLimit(l *Limit) jsonLimit {
	jl := jsonLimit{
		Index: l.Index, ID: l.ID(), Label: l.Label, Name: l.Name, Unlimited: l.Unlimited,
		Shadow: l.Shadow, CountDenied: l.CountDeniedHits, Lease: l.Rule != nil && l.Rule.Lease, Calendar: calendarZone(l), Replaces: l.Replaces, Line: l.Line, Column: l.Column,
	}
	if l.Unlimited {
		return jl
	}
	r := l.Rule
	rpu := r.Limit
	jl.Algorithm, jl.Unit, jl.UnitMultiplier, jl.RequestsPerUnit = r.Algorithm(), r.Unit.String(), r.Multiplier, &rpu
	jl.Window, jl.WindowSeconds = compactWindow(l), int64(r.Window.Seconds())
	if r.InFlight() {
		jl.Window, jl.WindowSeconds, jl.LeaseTTL = "", 0, r.Window.String() // it has no window
	}
	if r.HasBurst() {
		burst := r.Burst
		jl.Burst = &burst
	}
	for _, d := range r.Penalty {
		jl.Penalty = append(jl.Penalty, d.String())
	}
	if r.Penalized() {
		jl.PenaltyReset = r.PenaltyReset.String()
	}
	return jl
}

// calendarZone is the time zone of a calendar limit, "" for another.
func calendarZone(l *Limit) string {
	if l.Rule == nil || l.Rule.Calendar == nil {
		return ""
	}
	return l.Rule.Calendar.String()
}
