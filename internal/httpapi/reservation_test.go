package httpapi

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/servetest"
	"github.com/rlsproject/rls/internal/service"
)

// TestExplainReservation: POST /debug/explain of a descriptor whose
// limits reserve writes, on the limit, its reserve with what its counter
// holds (hits, holds, the oldest's age) and what this call would do, and
// on the descriptor its reservation: the request's id, how many holds and
// the oldest. A descriptor without an id would neither reserve nor settle.
func TestExplainReservation(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	svc := servetest.Service(t, `
domain: llm
reservation_key: request_id
descriptors:
  - key: tenant
    reserve: {estimate: 400, ttl: 5m}
    rate_limit: {unit: hour, requests_per_unit: 1000, name: tokens}
`, service.Options{Store: servetest.MemoryStore(t, clock.Now)})
	for i, id := range []string{"a", "b"} {
		clock.Set(storetest.T0.Add(time.Duration(i) * 10 * time.Second))
		req := &service.Request{Domain: "llm", Descriptors: []service.Descriptor{{Entries: []config.Entry{{Key: "tenant", Value: "acme"}, {Key: "request_id", Value: id}}}}}
		if resp, err := svc.ShouldRateLimit(context.Background(), req); err != nil || resp.Code != service.OK {
			t.Fatalf("reserve %s: %v %v", id, resp, err)
		}
	}
	clock.Set(storetest.T0.Add(30 * time.Second))
	for _, tc := range []struct {
		entries string
		id      string
		call    string
	}{
		{`{"key":"tenant","value":"acme"},{"key":"request_id","value":"a"}`, "a", "settle"},
		{`{"key":"request_id","value":"c"},{"key":"tenant","value":"acme"}`, "c", "reserve"},
		{`{"key":"tenant","value":"acme"}`, "", "none"},
	} {
		body := `{"domain":"llm","descriptors":[{"entries":[` + tc.entries + `]}]}`
		code, answer := postExplain(t, svc, DebugLoopback, "127.0.0.1:1", body)
		if code != 200 {
			t.Fatalf("POST /debug/explain %s = %d %s", body, code, answer)
		}
		var ex Explanation
		if err := json.Unmarshal([]byte(answer), &ex); err != nil {
			t.Fatal(err)
		}
		d := ex.Descriptors[0]
		if d.Match.Result != "matched" || len(d.Limits) != 1 || d.Limits[0].State == nil {
			t.Fatalf("explain %s: %s; want the tenant's limit matched, with its state", body, answer)
		}
		wantRes := DescriptorReservation{Key: "request_id", ID: tc.id, Count: 2, Oldest: "30s"}
		if d.Reservation == nil || *d.Reservation != wantRes {
			t.Errorf("explain %s: reservation %+v, want %+v", body, d.Reservation, wantRes)
		}
		wantLimit := ReserveExplanation{Estimate: 400, TTL: "5m0s", Call: tc.call, Held: 800, Holds: 2, OldestHold: "30s"}
		if r := d.Limits[0].Reserve; r == nil || *r != wantLimit || d.Limits[0].State.Remaining != 200 {
			t.Errorf("explain %s: limit's reserve %+v, remaining %d; want %+v and 200 remaining (1000 - 800 held)", body, r, d.Limits[0].State.Remaining, wantLimit)
		}
	}
}

// TestExplainOnlyTheReservationEntry: a descriptor whose one entry is the
// domain's reservation_key has nothing left to match once it is taken
// out. Explain answered it with a panic (an index past the entries, in
// the message of where matching stopped) and the connection cut; it
// says so now, as the decision answers it (OK, nothing counted).
func TestExplainOnlyTheReservationEntry(t *testing.T) {
	svc := servetest.Service(t, `
domain: llm
reservation_key: request_id
descriptors:
  - key: tenant
    reserve: {estimate: 400, ttl: 5m}
    rate_limit: {unit: hour, requests_per_unit: 1000}
`, service.Options{})
	body := `{"domain":"llm","descriptors":[{"entries":[{"key":"request_id","value":"r1"}]}]}`
	code, answer := postExplain(t, svc, DebugLoopback, "127.0.0.1:1", body)
	if code != 200 {
		t.Fatalf("POST /debug/explain %s = %d %s, want 200", body, code, answer)
	}
	var ex Explanation
	if err := json.Unmarshal([]byte(answer), &ex); err != nil {
		t.Fatal(err)
	}
	m := ex.Descriptors[0].Match
	if ex.Code != "OK" || m.Result != "no_entries" || m.StoppedAt != nil || !strings.Contains(m.Message, `"request_id"`) || len(ex.Descriptors[0].Limits) != 0 {
		t.Errorf("explain %s: code %s, match %+v; want OK, no_entries, a message naming the reservation_key, no limits", body, ex.Code, m)
	}
}
