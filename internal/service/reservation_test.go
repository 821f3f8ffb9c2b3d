package service

import (
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
)

const reservationConfig = `
domain: llm
reservation_key: request_id
descriptors:
  - key: tenant
    reserve: {estimate: 400, ttl: 1m}
    rate_limits:
      - {unit: hour, requests_per_unit: 1000, name: tokens}
    descriptors:
      - key: model
        rate_limit: {unit: hour, requests_per_unit: 5000, name: model_tokens, reserve: {estimate: 100, ttl: 1m}}
`

// newReservationFixture is a service on a memory store with
// reservationConfig, observed by obs too (when not nil).
func newReservationFixture(t *testing.T, obs Observer) *fixture {
	t.Helper()
	cfg, err := config.Parse("llm.yaml", []byte(reservationConfig))
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{clock: storetest.NewClock(storetest.T0), seen: newTally()}
	ms := memstore.New(memstore.Options{Now: f.clock.Now})
	t.Cleanup(func() { ms.Close() })
	observers := []Observer{f.seen}
	if obs != nil {
		observers = append(observers, obs)
	}
	f.svc = New(Options{Store: ms, Observers: observers})
	if err := f.svc.Reload(func() (*config.Config, error) { return cfg, nil }); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestReservationKey: the entry of the domain's reservation_key, wherever
// it sits in a descriptor, is matched by nothing and part of no counter:
// descriptors that differ only by it count on one counter, reserving and
// settling by their ids; a descriptor without it is an ordinary call.
func TestReservationKey(t *testing.T) {
	var seen []string // each decision's entries that count, and its first item's id
	f := newReservationFixture(t, observerFunc(func(d *Decision) {
		if len(d.Entries) > 0 && len(d.Items) > 0 {
			var keys string
			for _, e := range d.Entries[0] {
				keys += e.Key + "=" + e.Value + "/"
			}
			seen = append(seen, keys+"#"+d.Items[0].Reservation)
		}
	}))
	type step struct {
		entries   []string
		hits      uint64 // 0: the request's one hit
		code      Code
		remaining uint32
		limit     string
	}
	for i, st := range []step{
		{[]string{"tenant", "acme", "request_id", "a"}, 0, OK, 600, "tokens"},          // a holds 400
		{[]string{"request_id", "b", "tenant", "acme"}, 0, OK, 200, "tokens"},          // first or last: b holds 400
		{[]string{"tenant", "acme", "request_id", "a"}, 150, OK, 450, "tokens"},        // a settles: 400 back, 150 charged
		{[]string{"tenant", "acme", "request_id", "c"}, 500, OverLimit, 450, "tokens"}, // c would hold 500
		{[]string{"tenant", "acme"}, 10, OK, 440, "tokens"},                            // no id: 10 hits
		{[]string{"tenant", "acme", "model", "m1", "request_id", "d"}, 0, OK, 4900, "model_tokens"},
	} {
		d := desc(st.entries...)
		if st.hits > 0 {
			d.HasHits, d.Hits = true, st.hits
		}
		resp := f.check(t, &Request{Domain: "llm", Descriptors: []Descriptor{d}})
		s := resp.Statuses[0]
		label := ""
		if s.Limit != nil {
			label = s.Limit.Label
		}
		if resp.Code != st.code || s.Remaining != st.remaining || label != st.limit {
			t.Fatalf("step %d: %v hits %d = %s remaining %d on %q, want %s %d on %q", i, st.entries, st.hits, resp.Code, s.Remaining, label, st.code, st.remaining, st.limit)
		}
	}
	// The observers see the entries that count, the id on the items.
	if got := seen[1]; got != "tenant=acme/#b" {
		t.Errorf("the observers saw %q of the second decision, want the entries without the id, the id on the item", got)
	}
}

// TestExplainReservations: explain says what a call would do with its id
// (reserve, settle), and what the limits hold: hits held, holds, the
// oldest; and consumes nothing.
func TestExplainReservations(t *testing.T) {
	f := newReservationFixture(t, nil)
	f.check(t, &Request{Domain: "llm", Descriptors: []Descriptor{desc("tenant", "acme", "request_id", "a")}})
	f.clock.Set(storetest.T0.Add(10 * time.Second))
	f.check(t, &Request{Domain: "llm", Descriptors: []Descriptor{desc("tenant", "acme", "request_id", "b")}})
	for _, tc := range []struct {
		id    string
		phase engine.Phase
	}{{"a", engine.Settling}, {"z", engine.Reserving}, {"", engine.NotReserving}} {
		entries := []string{"tenant", "acme"}
		if tc.id != "" {
			entries = append(entries, "request_id", tc.id)
		}
		ex := f.explain(t, &Request{Domain: "llm", Descriptors: []Descriptor{desc(entries...)}})
		de := ex.Descriptors[0]
		st := de.Limits[0].State
		if de.Reservation != tc.id || len(de.Matched) != 1 || de.Match.Node == nil || de.Match.Node.Path != "tenant" {
			t.Fatalf("id %q: reservation %q, matched %v at %v", tc.id, de.Reservation, de.Matched, de.Match.Node)
		}
		if st == nil || st.Phase != tc.phase || st.Held != 800 || st.Holds != 2 || st.OldestHold != 10*time.Second || st.Remaining != 200 {
			t.Errorf("id %q: state %+v, want phase %s, 800 held in 2 holds, the oldest 10s old, 200 remaining", tc.id, st, tc.phase)
		}
	}
	// Nothing consumed: a's hold is still there to settle.
	resp := f.check(t, &Request{Domain: "llm", Descriptors: []Descriptor{{Entries: desc("tenant", "acme", "request_id", "a").Entries, HasHits: true, Hits: 100}}})
	if resp.Statuses[0].Remaining != 500 {
		t.Errorf("settle after explains: remaining %d, want 500 (1000 - 400 held by b - 100 charged)", resp.Statuses[0].Remaining)
	}
}

// observerFunc is an Observer that sees decisions only.
type observerFunc func(*Decision)

func (observerFunc) ForConfig(*config.Config) any { return nil }
func (observerFunc) Reloaded(error)               {}
func (o observerFunc) Decided(_ any, d *Decision) { o(d) }
func (observerFunc) Cleared(any, *Cleared)        {}
