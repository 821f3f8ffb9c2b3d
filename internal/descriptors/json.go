package descriptors

import (
	"bytes"
	"encoding/json"
)

// The shapes of the config dump. Flags that are false and optional fields
// that are empty are left out; everything else is always there.
type (
	jsonConfig struct {
		Files   []string     `json:"files"`
		Domains []jsonDomain `json:"domains"`
	}
	jsonDomain struct {
		Name            string               `json:"name"`
		File            string               `json:"file"`
		Line            int                  `json:"line"`
		Column          int                  `json:"column"`
		Descriptors     []jsonDescriptor     `json:"descriptors"`
		HTTPDescriptors []jsonHTTPDescriptor `json:"http_descriptors,omitempty"`
	}
	jsonDescriptor struct {
		Path           string           `json:"path"`
		Key            string           `json:"key"`
		Value          string           `json:"value,omitempty"`
		Wildcard       bool             `json:"wildcard,omitempty"`
		ShadowMode     bool             `json:"shadow_mode,omitempty"`
		QuotaMode      bool             `json:"quota_mode,omitempty"`
		DetailedMetric bool             `json:"detailed_metric,omitempty"`
		ValueToMetric  bool             `json:"value_to_metric,omitempty"`
		ShareThreshold bool             `json:"share_threshold,omitempty"`
		Metadata       map[string]any   `json:"metadata,omitempty"`
		Line           int              `json:"line"`
		Column         int              `json:"column"`
		Limits         []jsonLimit      `json:"limits,omitempty"`
		Descriptors    []jsonDescriptor `json:"descriptors,omitempty"`
	}
	jsonLimit struct {
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
		Shadow          bool     `json:"shadow,omitempty"`
		Replaces        []string `json:"replaces,omitempty"`
		Line            int      `json:"line"`
		Column          int      `json:"column"`
	}
	jsonHTTPDescriptor struct {
		Actions []jsonAction `json:"actions"`
		Line    int          `json:"line"`
		Column  int          `json:"column"`
	}
	jsonAction struct {
		Kind               string              `json:"kind"`
		DescriptorKey      string              `json:"descriptor_key"`
		DescriptorValue    string              `json:"descriptor_value,omitempty"`
		HeaderName         string              `json:"header_name,omitempty"`
		QueryParameterName string              `json:"query_parameter_name,omitempty"`
		SkipIfAbsent       bool                `json:"skip_if_absent,omitempty"`
		V4PrefixLen        *int                `json:"v4_prefix_mask_len,omitempty"`
		V6PrefixLen        *int                `json:"v6_prefix_mask_len,omitempty"`
		ExpectMatch        *bool               `json:"expect_match,omitempty"`
		Headers            []jsonHeaderMatcher `json:"headers,omitempty"`
		Line               int                 `json:"line"`
		Column             int                 `json:"column"`
	}
	jsonHeaderMatcher struct {
		Name       string  `json:"name"`
		Match      string  `json:"match"`
		Pattern    *string `json:"pattern,omitempty"`
		Regex      string  `json:"regex,omitempty"`
		Present    *bool   `json:"present,omitempty"`
		IgnoreCase bool    `json:"ignore_case,omitempty"`
		Invert     bool    `json:"invert_match,omitempty"`
	}
)

// MarshalJSON dumps the whole config, for GET /debug/config: the files,
// then the domains by name, each with its descriptor tree (paths, flags,
// metadata, limits with their IDs, labels and indexes) and its
// http_descriptors. The output is indented and stable: the same config
// gives the same bytes.
func (c *Config) MarshalJSON() ([]byte, error) {
	out := jsonConfig{Files: []string{}, Domains: []jsonDomain{}}
	if c != nil {
		out.Files = append(out.Files, c.files...)
		for _, d := range c.Domains() {
			out.Domains = append(out.Domains, dumpDomain(d))
		}
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}

func dumpDomain(d *Domain) jsonDomain {
	out := jsonDomain{Name: d.Name, File: d.File, Line: d.Line, Column: d.Column, Descriptors: dumpDescriptors(d.Descriptors)}
	if out.Descriptors == nil {
		out.Descriptors = []jsonDescriptor{}
	}
	for _, h := range d.HTTPDescriptors {
		jh := jsonHTTPDescriptor{Line: h.Line, Column: h.Column}
		for _, a := range h.actions {
			jh.Actions = append(jh.Actions, dumpAction(a))
		}
		out.HTTPDescriptors = append(out.HTTPDescriptors, jh)
	}
	return out
}

func dumpDescriptors(nodes []*Descriptor) []jsonDescriptor {
	var out []jsonDescriptor
	for _, n := range nodes {
		jd := jsonDescriptor{
			Path: n.Path, Key: n.Key, Value: n.Value, Wildcard: n.Wildcard,
			ShadowMode: n.ShadowMode, QuotaMode: n.QuotaMode, DetailedMetric: n.DetailedMetric,
			ValueToMetric: n.ValueToMetric, ShareThreshold: n.ShareThreshold, Metadata: n.Metadata,
			Line: n.Line, Column: n.Column, Descriptors: dumpDescriptors(n.Children),
		}
		for _, l := range n.Limits {
			jd.Limits = append(jd.Limits, dumpLimit(l))
		}
		out = append(out, jd)
	}
	return out
}

func dumpLimit(l *Limit) jsonLimit {
	jl := jsonLimit{
		Index: l.Index, ID: l.ID, Label: l.Label, Name: l.Name, Unlimited: l.Unlimited,
		Shadow: l.Shadow, Replaces: l.Replaces, Line: l.Line, Column: l.Column,
	}
	if l.Unlimited {
		return jl
	}
	rpu := l.RequestsPerUnit
	jl.Algorithm, jl.Unit, jl.UnitMultiplier, jl.RequestsPerUnit = l.Algorithm.String(), l.Unit.String(), l.UnitMultiplier, &rpu
	jl.Window, jl.WindowSeconds = compactWindow(l), int64(l.Window.Seconds())
	if l.Algorithm == TokenBucket {
		burst := l.Burst
		jl.Burst = &burst
	}
	return jl
}

func dumpAction(a *action) jsonAction {
	ja := jsonAction{
		Kind: a.Kind.String(), DescriptorKey: a.DescriptorKey, DescriptorValue: a.DescriptorValue,
		HeaderName: a.HeaderName, QueryParameterName: a.QueryParameterName, SkipIfAbsent: a.SkipIfAbsent,
		Line: a.Line, Column: a.Column,
	}
	switch a.Kind {
	case actionMaskedRemoteAddress:
		v4, v6 := a.V4PrefixLen, a.V6PrefixLen
		ja.V4PrefixLen, ja.V6PrefixLen = &v4, &v6
	case actionHeaderValueMatch:
		expect := a.ExpectMatch
		ja.ExpectMatch = &expect
		for _, m := range a.Headers {
			jm := jsonHeaderMatcher{Name: m.Name, Match: m.Kind.String(), IgnoreCase: m.IgnoreCase, Invert: m.Invert}
			switch m.Kind {
			case matchRegex:
				jm.Regex = m.regexSrc
			case matchPresent:
				present := m.Present
				jm.Present = &present
			default:
				pattern := m.Pattern
				jm.Pattern = &pattern
			}
			ja.Headers = append(ja.Headers, jm)
		}
	}
	return ja
}
