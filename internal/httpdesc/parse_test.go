package httpdesc

import (
	"fmt"
	"strings"
	"testing"
)

// TestParse: what each item reads into, defaults included.
func TestParse(t *testing.T) {
	l := parse(t, `
  - actions: [{remote_address: {}}, {masked_remote_address: }]
  - actions:
      - generic_key: {descriptor_value: writes}
      - header_value_match:
          descriptor_value: post
          headers: [{name: ":METHOD", string_match: {exact: POST}}, {name: X-R, string_match: {safe_regex: {regex: "v[0-9]+"}}}]
  - actions:
      - request_headers: {header_name: X-Api-Key, descriptor_key: api_key}
`)
	if len(l) != 3 || l[0].Line != 2 || l[0].Column != 5 || l[2].Line != 8 {
		t.Fatalf("items %+v, want 3 at lines 2, 3 and 8", l)
	}
	if a := l[0].actions[1]; a.Kind != actionMaskedRemoteAddress || a.DescriptorKey != "masked_remote_address" || a.V4PrefixLen != 32 || a.V6PrefixLen != 128 {
		t.Errorf("masked_remote_address with no fields = %+v, want the defaults /32, /128", a)
	}
	hv := l[1].actions[1]
	if hv.DescriptorKey != "header_match" || !hv.ExpectMatch || len(hv.Headers) != 2 {
		t.Fatalf("header_value_match = %+v, want key header_match, expect_match true, 2 headers", hv)
	}
	if m := hv.Headers[0]; m.Name != ":method" || m.Kind != matchExact || m.Pattern != "POST" {
		t.Errorf("header matcher = %+v, want :method exact POST (name lower-cased)", m)
	}
	if re := hv.Headers[1].Regex; re == nil || !re.MatchString("v12") || re.MatchString("xv12") || re.MatchString("v12x") {
		t.Errorf("safe_regex v[0-9]+ must match the whole value: %v", re)
	}
	if a := l[2].actions[0]; a.HeaderName != "x-api-key" || a.DescriptorKey != "api_key" || a.SkipIfAbsent {
		t.Errorf("request_headers = %+v", a)
	}
}

// TestParseProblems: problems come with their place, and an item left
// with no valid action is left out. (The config's corpus of bad files,
// internal/config/testdata/bad/http_*.yaml, pins the rest through
// config.Parse.)
func TestParseProblems(t *testing.T) {
	l, errs := read(`
  - actions: [{remote_address: {}}]
  - actions: [{destination_cluster: {}}]
  - actions: [{generic_key: {descriptor_value: g, skip_if_absent: true}}]
  - {actions: []}
`)
	var got []string
	for _, e := range errs {
		got = append(got, fmt.Sprintf("%d:%d: %s", e.Line, e.Column, e.Msg))
	}
	want := []string{
		`3:16: unsupported action "destination_cluster" (supported: remote_address|masked_remote_address|request_headers|query_parameters|generic_key|header_value_match)`,
		`4:51: unknown key "skip_if_absent" in generic_key (allowed: descriptor_value, descriptor_key)`,
		`5:6: http_descriptors item has no actions`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(l) != 2 {
		t.Errorf("%d items, want 2: the one with an unsupported action left out", len(l))
	}
}

// TestMarshalJSON: an item's part of the config dump, HTML characters
// left as they are (as the rest of the dump writes them).
func TestMarshalJSON(t *testing.T) {
	l := parse(t, `
  - actions:
      - masked_remote_address: {v4_prefix_mask_len: 24}
      - header_value_match: {descriptor_value: "a<b>&c", expect_match: false, headers: [{name: x-h, string_match: {prefix: "<&>", ignore_case: true}}, {name: x-p, present_match: true, invert_match: true}, {name: x-r, string_match: {safe_regex: {regex: "a&b"}}}]}
`)
	b, err := l[0].MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"actions":[{"kind":"masked_remote_address","descriptor_key":"masked_remote_address","v4_prefix_mask_len":24,"v6_prefix_mask_len":128,"line":3,"column":9},` +
		`{"kind":"header_value_match","descriptor_key":"header_match","descriptor_value":"a<b>&c","expect_match":false,"headers":[` +
		`{"name":"x-h","match":"prefix","pattern":"<&>","ignore_case":true},{"name":"x-p","match":"present_match","present":true,"invert_match":true},` +
		`{"name":"x-r","match":"safe_regex","regex":"a&b"}],"line":4,"column":9}],"line":2,"column":5}`
	if string(b) != want {
		t.Errorf("MarshalJSON =\n%s\nwant\n%s", b, want)
	}
}

func TestKindStrings(t *testing.T) {
	if got := actionHeaderValueMatch.String(); got != "header_value_match" {
		t.Errorf("actionHeaderValueMatch.String() = %q", got)
	}
	if got := actionKind(99).String(); got != "unknown" {
		t.Errorf("actionKind(99).String() = %q", got)
	}
	if got := matchRegex.String(); got != "safe_regex" {
		t.Errorf("matchRegex.String() = %q", got)
	}
	if got := matchKind(99).String(); got != "unknown" {
		t.Errorf("matchKind(99).String() = %q", got)
	}
}
