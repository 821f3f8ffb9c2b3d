package httpdesc

import (
	"reflect"
	"testing"
)

func TestBuild(t *testing.T) {
	tests := []struct {
		name    string
		actions string // the http_descriptors list
		r       fakeRequest
		want    [][]Entry
	}{
		{
			name:    "remote_address",
			actions: "\n- actions: [{remote_address: {}}]",
			r:       req("203.0.113.7"),
			want:    [][]Entry{entries("remote_address", "203.0.113.7")},
		},
		{
			name:    "remote_address unmaps IPv4-mapped IPv6",
			actions: "\n- actions: [{remote_address: }]",
			r:       req("::ffff:203.0.113.7"),
			want:    [][]Entry{entries("remote_address", "203.0.113.7")},
		},
		{
			name:    "remote_address IPv6 without zone",
			actions: "\n- actions: [{remote_address: {}}]",
			r:       req("fe80::1%eth0"),
			want:    [][]Entry{entries("remote_address", "fe80::1")},
		},
		{
			name:    "remote_address unknown drops the descriptor",
			actions: "\n- actions: [{remote_address: {}}]\n- actions: [{generic_key: {descriptor_value: x}}]",
			r:       req(""),
			want:    [][]Entry{entries("generic_key", "x")},
		},
		{
			name:    "masked_remote_address IPv4",
			actions: "\n- actions: [{masked_remote_address: {v4_prefix_mask_len: 24, v6_prefix_mask_len: 64}}]",
			r:       req("192.168.1.77"),
			want:    [][]Entry{entries("masked_remote_address", "192.168.1.0/24")},
		},
		{
			name:    "masked_remote_address IPv6",
			actions: "\n- actions: [{masked_remote_address: {v4_prefix_mask_len: 24, v6_prefix_mask_len: 64}}]",
			r:       req("2001:db8:1:2:3:4:5:6"),
			want:    [][]Entry{entries("masked_remote_address", "2001:db8:1:2::/64")},
		},
		{
			name:    "masked_remote_address defaults /32 and /128, mapped address unmapped",
			actions: "\n- actions: [{masked_remote_address: {}}]",
			r:       req("::ffff:10.1.2.3"),
			want:    [][]Entry{entries("masked_remote_address", "10.1.2.3/32")},
		},
		{
			name:    "masked_remote_address /0",
			actions: "\n- actions: [{masked_remote_address: {v4_prefix_mask_len: 0}}]",
			r:       req("10.1.2.3"),
			want:    [][]Entry{entries("masked_remote_address", "0.0.0.0/0")},
		},
		{
			name:    "request_headers first value, pseudo-header",
			actions: "\n- actions: [{request_headers: {header_name: X-Api-Key, descriptor_key: api_key}}, {request_headers: {header_name: ':path', descriptor_key: path}}]",
			r:       req("10.0.0.1", "x-api-key", "k1", ":path", "/a?b=c"),
			want:    [][]Entry{entries("api_key", "k1", "path", "/a?b=c")},
		},
		{
			name:    "request_headers absent drops the descriptor",
			actions: "\n- actions: [{remote_address: {}}, {request_headers: {header_name: x-api-key, descriptor_key: api_key}}]",
			r:       req("10.0.0.1"),
			want:    nil,
		},
		{
			name:    "request_headers absent with skip_if_absent leaves the entry out",
			actions: "\n- actions: [{remote_address: {}}, {request_headers: {header_name: x-api-key, descriptor_key: api_key, skip_if_absent: true}}]",
			r:       req("10.0.0.1"),
			want:    [][]Entry{entries("remote_address", "10.0.0.1")},
		},
		{
			name:    "request_headers present but empty is an entry",
			actions: "\n- actions: [{request_headers: {header_name: x-api-key, descriptor_key: api_key}}]",
			r:       req("", "x-api-key", ""),
			want:    [][]Entry{entries("api_key", "")},
		},
		{
			name:    "every entry skipped: no descriptor",
			actions: "\n- actions: [{request_headers: {header_name: x-a, descriptor_key: a, skip_if_absent: true}}, {query_parameters: {query_parameter_name: q, descriptor_key: q, skip_if_absent: true}}]",
			r:       req("", ":path", "/"),
			want:    nil,
		},
		{
			name:    "query_parameters first occurrence, decoded",
			actions: "\n- actions: [{query_parameters: {query_parameter_name: page, descriptor_key: page}}, {query_parameters: {query_parameter_name: 'a b', descriptor_key: ab}}]",
			r:       req("", ":path", "/list?x=1&page=2%2B3&page=9&a+b=c%20d#frag"),
			want:    [][]Entry{entries("page", "2+3", "ab", "c d")},
		},
		{
			name:    "query_parameters: a fragment is not the query",
			actions: "\n- actions: [{query_parameters: {query_parameter_name: page, descriptor_key: page}}]\n- actions: [{generic_key: {descriptor_value: g}}]",
			r:       req("", ":path", "/a#?page=z"),
			want:    [][]Entry{entries("generic_key", "g")},
		},
		{
			name:    "query_parameters: the query ends at the fragment",
			actions: "\n- actions: [{query_parameters: {query_parameter_name: page, descriptor_key: page}}, {query_parameters: {query_parameter_name: x, descriptor_key: x, skip_if_absent: true}}]",
			r:       req("", ":path", "/a?page=1#x=2&page=3"),
			want:    [][]Entry{entries("page", "1")},
		},
		{
			name:    ":path without its fragment",
			actions: "\n- actions: [{request_headers: {header_name: ':path', descriptor_key: path}}]",
			r:       req("", ":path", "/a/b?x=1#frag?y=2"),
			want:    [][]Entry{entries("path", "/a/b?x=1")},
		},
		{
			name: "header_value_match on :path without its fragment",
			actions: `
- actions:
    - header_value_match:
        descriptor_value: root
        headers: [{name: ":path", string_match: {exact: /}}]`,
			r:    req("", ":path", "/#top"),
			want: [][]Entry{entries("header_match", "root")},
		},
		{
			name:    "other headers keep their #",
			actions: "\n- actions: [{request_headers: {header_name: x-tag, descriptor_key: tag}}]",
			r:       req("", "x-tag", "a#b"),
			want:    [][]Entry{entries("tag", "a#b")},
		},
		{
			name:    "query_parameters without = is empty",
			actions: "\n- actions: [{query_parameters: {query_parameter_name: flag, descriptor_key: flag}}]",
			r:       req("", ":path", "/p?&flag&x=1"),
			want:    [][]Entry{entries("flag", "")},
		},
		{
			name:    "query_parameters badly escaped stays as sent",
			actions: "\n- actions: [{query_parameters: {query_parameter_name: q, descriptor_key: q}}]",
			r:       req("", ":path", "/p?q=100%"),
			want:    [][]Entry{entries("q", "100%")},
		},
		{
			name:    "query_parameters absent drops the descriptor",
			actions: "\n- actions: [{query_parameters: {query_parameter_name: q, descriptor_key: q}}]\n- actions: [{query_parameters: {query_parameter_name: q, descriptor_key: q}}]",
			r:       req("", ":path", "/p?qq=1"),
			want:    nil,
		},
		{
			name:    "query_parameters skip_if_absent",
			actions: "\n- actions: [{generic_key: {descriptor_value: g}}, {query_parameters: {query_parameter_name: q, descriptor_key: q, skip_if_absent: true}}]",
			r:       req("", ":path", "/p"),
			want:    [][]Entry{entries("generic_key", "g")},
		},
		{
			name:    "generic_key default and custom key",
			actions: "\n- actions: [{generic_key: {descriptor_value: writes}}, {generic_key: {descriptor_key: tier, descriptor_value: gold}}]",
			r:       req(""),
			want:    [][]Entry{entries("generic_key", "writes", "tier", "gold")},
		},
		{
			name: "header_value_match all match",
			actions: `
- actions:
    - header_value_match:
        descriptor_value: post
        headers: [{name: ":method", string_match: {exact: POST}}, {name: x-b, present_match: true}]`,
			r:    req("", ":method", "POST", "x-b", "1"),
			want: [][]Entry{entries("header_match", "post")},
		},
		{
			name: "header_value_match one misses: no descriptor",
			actions: `
- actions:
    - header_value_match:
        descriptor_value: post
        headers: [{name: ":method", string_match: {exact: POST}}, {name: x-b, present_match: true}]`,
			r:    req("", ":method", "POST"),
			want: nil,
		},
		{
			name: "header_value_match expect_match false: entry when not all match",
			actions: `
- actions:
    - header_value_match:
        descriptor_key: not_get
        descriptor_value: "yes"
        expect_match: false
        headers: [{name: ":method", string_match: {exact: GET}}]`,
			r:    req("", ":method", "POST"),
			want: [][]Entry{entries("not_get", "yes")},
		},
		{
			name: "header_value_match expect_match false: no entry when all match",
			actions: `
- actions:
    - header_value_match:
        descriptor_value: "yes"
        expect_match: false
        headers: [{name: ":method", string_match: {exact: GET}}]`,
			r:    req("", ":method", "GET"),
			want: nil,
		},
		{
			name: "several items, order kept, failing ones dropped",
			actions: `
- actions: [{remote_address: {}}]
- actions: [{request_headers: {header_name: x-api-key, descriptor_key: api_key}}]
- actions: [{request_headers: {header_name: ":path", descriptor_key: path}}]`,
			r:    req("10.9.8.7", ":path", "/api/v1/users"),
			want: [][]Entry{entries("remote_address", "10.9.8.7"), entries("path", "/api/v1/users")},
		},
	}
	for _, tt := range tests {
		got := parse(t, tt.actions).Build(tt.r, nil)
		if !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: Build(%+v) = %v, want %v", tt.name, tt.r, got, tt.want)
		}
	}
}

// TestBuildAppends: dst is appended to, not replaced.
func TestBuildAppends(t *testing.T) {
	l := parse(t, "[{actions: [{generic_key: {descriptor_value: g}}]}]")
	dst := [][]Entry{entries("first", "1")}
	got := l.Build(req(""), dst)
	if want := [][]Entry{entries("first", "1"), entries("generic_key", "g")}; !reflect.DeepEqual(got, want) {
		t.Errorf("Build(dst=[first]) = %v, want %v", got, want)
	}
	var none List
	if got := none.Build(req("10.0.0.1"), dst); !reflect.DeepEqual(got, dst) {
		t.Errorf("no http_descriptors: Build = %v, want dst unchanged", got)
	}
	if got := none.Build(req(""), nil); got != nil {
		t.Errorf("no http_descriptors: Build(nil) = %v, want nil", got)
	}
}

// TestHeaderMatcher pins Envoy's headerMatcher rules, one matcher per row.
func TestHeaderMatcher(t *testing.T) {
	tests := []struct {
		matcher string
		value   string // "<absent>" for no header
		want    bool
	}{
		{"{exact: abc}", "abc", true},
		{"{exact: abc}", "abcd", false},
		{"{exact: abc}", "ABC", false},
		{"{exact: abc, ignore_case: true}", "ABC", true},
		{"{exact: ''}", "", true},
		{"{prefix: ab}", "abc", true},
		{"{prefix: ab}", "xab", false},
		{"{prefix: AB, ignore_case: true}", "abc", true},
		{"{suffix: bc}", "abc", true},
		{"{suffix: bc}", "bcx", false},
		{"{suffix: BC, ignore_case: true}", "abc", true},
		{"{suffix: abcd}", "bcd", false},
		{"{contains: ot}", "robot/1.0", true},
		{"{contains: OT, ignore_case: true}", "RoBoT", true},
		{"{contains: ot}", "robOT", false},
		{"{safe_regex: {regex: 'v[0-9]+'}}", "v10", true},
		{"{safe_regex: {regex: 'v[0-9]+'}}", "v10x", false},
		{"{safe_regex: {regex: 'a|b'}}", "b", true},
		{"{safe_regex: {regex: 'a|b'}}", "ab", false},
		{"{safe_regex: {regex: '(?i)abc'}}", "ABC", true},
		{"{exact: abc}", "<absent>", false},
	}
	for _, tt := range tests {
		for _, invert := range []bool{false, true} {
			text := "\n- actions:\n  - header_value_match:\n      descriptor_value: v\n      headers: [{name: x-h, string_match: " + tt.matcher
			if invert {
				text += ", invert_match: true"
			}
			text += "}]\n"
			m := parse(t, text)[0].actions[0].Headers[0]
			r := req("")
			if tt.value != "<absent>" {
				r = req("", "x-h", tt.value)
			}
			want := tt.want != invert
			if tt.value == "<absent>" {
				want = false // an absent header matches no string matcher, inverted or not
			}
			if got := m.matches(r); got != want {
				t.Errorf("string_match %s, invert_match %v, header %q: matches = %v, want %v", tt.matcher, invert, tt.value, got, want)
			}
		}
	}

	presence := []struct {
		present, invert, headerSet, want bool
	}{
		{present: true, headerSet: true, want: true},
		{present: true, headerSet: false, want: false},
		{present: false, headerSet: false, want: true},
		{present: false, headerSet: true, want: false},
		{present: true, invert: true, headerSet: false, want: true},
		{present: true, invert: true, headerSet: true, want: false},
		{present: false, invert: true, headerSet: false, want: false},
	}
	for _, tt := range presence {
		m := &headerMatcher{Name: "x-h", Kind: matchPresent, Present: tt.present, Invert: tt.invert}
		r := req("")
		if tt.headerSet {
			r = req("", "x-h", "")
		}
		if got := m.matches(r); got != tt.want {
			t.Errorf("present_match %v, invert_match %v, header set %v: matches = %v, want %v", tt.present, tt.invert, tt.headerSet, got, tt.want)
		}
	}
}
