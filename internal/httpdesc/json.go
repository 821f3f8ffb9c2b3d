package httpdesc

import (
	"bytes"
	"encoding/json"
)

// The shapes of an item in the config dump. Flags that are false and
// optional fields that are empty are left out.
type (
	jsonItem struct {
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

// MarshalJSON writes the item as the config dump shows it (GET
// /debug/config): its actions with their fields, and its position. HTML
// characters are left as they are, as in the rest of the dump.
func (h *Item) MarshalJSON() ([]byte, error) {
	out := jsonItem{Line: h.Line, Column: h.Column}
	for _, a := range h.actions {
		out.Actions = append(out.Actions, dumpAction(a))
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(out); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
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
