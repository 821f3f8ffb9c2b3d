package httpapi

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

const explainConfig = `
domain: api
http_descriptors:
  - actions: [{remote_address: {}}]
  - actions:
      - request_headers: {header_name: x-api-key, descriptor_key: api_key}
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: api_key
    value: internal
    rate_limit: {unlimited: true}
  - key: tenant
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: hour, requests_per_unit: 10}
`

// postExplain serves POST /debug/explain with body from remote.
func postExplain(t *testing.T, svc *service.Service, access DebugAccess, remote, body string) (int, string) {
	t.Helper()
	h := New(Options{Service: svc, Debug: access, Gatherer: prometheus.NewRegistry()})
	r := httptest.NewRequest("POST", "/debug/explain", strings.NewReader(body))
	r.RemoteAddr = remote
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w.Code, w.Body.String()
}

// TestExplainWhyMatchingStopped: one request per way a descriptor's match
// ends, each answered 200 with the reason, where it stopped and a sentence.
func TestExplainWhyMatchingStopped(t *testing.T) {
	svc := servetest.Service(t, explainConfig, service.Options{})
	for _, tc := range []struct {
		name    string
		body    string
		result  string
		stopped int // -1: did not stop
		message string
	}{
		{"matched", `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`,
			"matched", -1, `matched "remote_address" (test.yaml:8:5)`},
		{"a node without limits", `{"domain":"api","descriptors":[{"entries":[{"key":"tenant","value":"t1"}]}]}`,
			"no_limits", -1, `matched "tenant" (test.yaml:13:5), which has no limits: its nested descriptors do`},
		{"unknown domain", `{"domain":"apx","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`,
			"unknown_domain", -1, `domain "apx" is not in the config (domains: api)`},
		{"no node for the key", `{"domain":"api","descriptors":[{"entries":[{"key":"remote_addr","value":"10.0.0.1"}]}]}`,
			"no_node_for_key", 0, `entries[0] (remote_addr=10.0.0.1): no descriptor has key "remote_addr" at the top level (keys there: remote_address, api_key, tenant)`},
		{"value not matched", `{"domain":"api","descriptors":[{"entries":[{"key":"tenant","value":"t1"},{"key":"plan","value":"free"}]}]}`,
			"value_not_matched", 1, `entries[1] (plan=free): no value of key "plan" under "tenant" is "free"`},
		{"deeper than the config", `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"},{"key":"path","value":"/"}]}]}`,
			"deeper_than_config", 1, `entries[1] (path=/): "remote_address" has no nested descriptors`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := postExplain(t, svc, DebugLoopback, "127.0.0.1:1", tc.body)
			if code != 200 {
				t.Fatalf("POST /debug/explain %s = %d %s, want 200", tc.body, code, body)
			}
			var ex Explanation
			if err := json.Unmarshal([]byte(body), &ex); err != nil {
				t.Fatalf("answer is not an explanation: %v\n%s", err, body)
			}
			m := ex.Descriptors[0].Match
			if m.Result != tc.result || !strings.Contains(m.Message, tc.message) {
				t.Errorf("match %+v, want result %s and a message with %q", m, tc.result, tc.message)
			}
			if got := -1; m.StoppedAt != nil {
				if got = *m.StoppedAt; got != tc.stopped {
					t.Errorf("stopped at entry %d, want %d", got, tc.stopped)
				}
			} else if tc.stopped != -1 {
				t.Errorf("no stopped_at_entry, want %d", tc.stopped)
			}
		})
	}
}

func TestExplainHTTPForm(t *testing.T) {
	svc := servetest.Service(t, explainConfig, service.Options{})
	code, body := postExplain(t, svc, DebugLoopback, "127.0.0.1:1",
		`{"domain":"api","http":{"method":"GET","path":"/","headers":{"X-Api-Key":"internal"},"client_address":"203.0.113.7:5555"}}`)
	if code != 200 {
		t.Fatalf("POST /debug/explain (HTTP form) = %d %s", code, body)
	}
	var ex Explanation
	if err := json.Unmarshal([]byte(body), &ex); err != nil {
		t.Fatal(err)
	}
	if len(ex.Descriptors) != 2 || ex.Descriptors[0].Entries[0].Value != "203.0.113.7" || ex.Descriptors[1].Limits[0].Applies != "unlimited" {
		t.Errorf("explanation %s, want the address (port dropped) and the unlimited api key", body)
	}
	if len(ex.HTTPDescriptors) != 2 || ex.HTTPDescriptors[1].Descriptor == nil || *ex.HTTPDescriptors[1].Descriptor != 1 {
		t.Errorf("http_descriptors %+v, want both items with their descriptor", ex.HTTPDescriptors)
	}
}

func TestExplainRefusals(t *testing.T) {
	svc := servetest.Service(t, explainConfig, service.Options{})
	good := `{"domain":"api","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`
	for _, tc := range []struct {
		name   string
		access DebugAccess
		remote string
		body   string
		want   int
		msg    string
	}{
		{"from afar", DebugLoopback, "192.0.2.1:1", good, 403, "loopback"},
		{"debug off", DebugOff, "127.0.0.1:1", good, 404, ""},
		{"debug on, from afar", DebugOn, "192.0.2.1:1", good, 200, `"known_domain": true`},
		{"not JSON", DebugLoopback, "127.0.0.1:1", `{"domain":`, 400, "bad RateLimitRequest"},
		{"unknown field", DebugLoopback, "127.0.0.1:1", `{"domain":"api","descriptors":[{"entries":[{"key":"a","value":"b"}]}],"x":1}`, 400, "bad RateLimitRequest"},
		{"no descriptors", DebugLoopback, "127.0.0.1:1", `{"domain":"api"}`, 400, "descriptors: must not be empty"},
		{"HTTP form, unknown field", DebugLoopback, "127.0.0.1:1", `{"domain":"api","http":{"verb":"GET"}}`, 400, `unknown field "verb"`},
		{"HTTP form, no domain", DebugLoopback, "127.0.0.1:1", `{"http":{}}`, 400, `"domain" must be set`},
		{"HTTP form, bad address", DebugLoopback, "127.0.0.1:1", `{"domain":"api","http":{"client_address":"nope"}}`, 400, "not an IP address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := postExplain(t, svc, tc.access, tc.remote, tc.body)
			if code != tc.want || !strings.Contains(body, tc.msg) {
				t.Errorf("POST /debug/explain %s from %s = %d %q, want %d with %q", tc.body, tc.remote, code, body, tc.want, tc.msg)
			}
		})
	}
}
