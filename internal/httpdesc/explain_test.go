package httpdesc

import (
	"net/netip"
	"reflect"
	"testing"
)

func TestExplain(t *testing.T) {
	l := parse(t, `
  - actions: [{remote_address: {}}]
  - actions:
      - request_headers: {header_name: x-api-key, descriptor_key: api_key}
  - actions:
      - generic_key: {descriptor_value: writes}
      - header_value_match: {descriptor_value: post, headers: [{name: ":method", string_match: {exact: POST}}]}
  - actions:
      - query_parameters: {query_parameter_name: page, descriptor_key: page, skip_if_absent: true}
  - actions:
      - request_headers: {header_name: ":path", descriptor_key: path}
`)
	r := &StaticRequest{Method: "GET", Path: "/a?b=1", Headers: map[string]string{"X-Api-Key": "k1"}}
	trs := l.Explain(r)
	want := []struct {
		entries []Entry
		action  int
		name    string
		reason  string
	}{
		{nil, 0, "remote_address", "no client address"},
		{entries("api_key", "k1"), -1, "", ""},
		{nil, 1, "header_value_match", "the headers did not match"},
		{nil, -1, "", "every action was skipped (skip_if_absent): no entries"},
		{entries("path", "/a?b=1"), -1, "", ""},
	}
	if len(trs) != len(want) {
		t.Fatalf("%d traces, want %d", len(trs), len(want))
	}
	var made [][]Entry
	for i, w := range want {
		tr := trs[i]
		if !reflect.DeepEqual(tr.Entries, w.entries) || tr.Action != w.action || tr.ActionName != w.name || tr.Reason != w.reason || tr.Index != i || tr.Line == 0 {
			t.Errorf("item %d: %+v, want entries %v, action %d %q, reason %q, and its line", i, tr, w.entries, w.action, w.name, w.reason)
		}
		if tr.Entries != nil {
			made = append(made, tr.Entries)
		}
	}
	if got := l.Build(r, nil); !reflect.DeepEqual(got, made) {
		t.Errorf("Build = %v, the explanation made %v", got, made)
	}

	r.Client = netip.MustParseAddr("192.0.2.1")
	r.Method = "POST"
	if trs := l.Explain(r); trs[0].Entries == nil || trs[2].Entries == nil {
		t.Errorf("with a client address and POST: %+v, want items 0 and 2 to make descriptors", trs)
	}
}

func TestStaticRequest(t *testing.T) {
	r := &StaticRequest{Path: "/p", Headers: map[string]string{"X-Api-Key": "k"}}
	for _, tc := range []struct {
		name string
		v    string
		ok   bool
	}{
		{":path", "/p", true}, {":method", "", false}, {":authority", "", false},
		{"x-api-key", "k", true}, {"X-API-KEY", "k", true}, {"x-other", "", false},
	} {
		if v, ok := r.Header(tc.name); v != tc.v || ok != tc.ok {
			t.Errorf("Header(%q) = %q, %v; want %q, %v", tc.name, v, ok, tc.v, tc.ok)
		}
	}
}
