package engine_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
)

// TestConcurrencyCompile: lease_ttl is required by a concurrency limit and
// refused by the others; it becomes the rule's window (its unit means
// nothing); the counter's identity has neither; what a sliding log refuses
// (burst, calendar, lease, a limit above MaxSlidingLog) it refuses too.
func TestConcurrencyCompile(t *testing.T) {
	spec := func(edit func(*engine.Spec)) engine.Spec {
		s := engine.Spec{Algorithm: engine.Concurrency, Unit: engine.Second, Multiplier: 1, Limit: 10, LeaseTTL: engine.Some(30 * time.Second)}
		if edit != nil {
			edit(&s)
		}
		return s
	}
	r, errs := engine.Compile(spec(nil))
	if len(errs) > 0 {
		t.Fatalf("Compile: %v", errs)
	}
	if r.Window != 30*time.Second || r.ID != "cc" || r.Code() != 5 || r.Algorithm() != engine.Concurrency ||
		r.Capacity() != 10 || r.QuotaWindow(time.Time{}) != 30*time.Second || r.Unit != engine.Second {
		t.Errorf("rule = window %s, ID %q, code %d, algorithm %s, capacity %d, quota window %s, unit %s; want 30s, cc, 5, concurrency, 10, 30s, second",
			r.Window, r.ID, r.Code(), r.Algorithm(), r.Capacity(), r.QuotaWindow(time.Time{}), r.Unit)
	}
	other := engine.MustCompile(spec(func(s *engine.Spec) { s.Unit, s.LeaseTTL.V, s.Name = engine.Hour, 1500*time.Millisecond, "" }))
	if other.ID != r.ID || other.Window != 1500*time.Millisecond {
		t.Errorf("another unit and lease_ttl: ID %q window %s, want %q (the same counter) and 1.5s", other.ID, other.Window, r.ID)
	}
	if named := engine.MustCompile(spec(func(s *engine.Spec) { s.Name = "uploads" })); named.ID != "cc:7:uploads" {
		t.Errorf("named: ID %q, want cc:7:uploads", named.ID)
	}

	for _, tc := range []struct {
		name  string
		spec  engine.Spec
		field string
		key   bool
		msg   string
	}{
		{"no lease_ttl", spec(func(s *engine.Spec) { s.LeaseTTL = engine.Opt[time.Duration]{} }), "lease_ttl", false, "lease_ttl is required for algorithm concurrency"},
		{"zero", spec(func(s *engine.Spec) { s.LeaseTTL.V = 0 }), "lease_ttl", false, "lease_ttl 0s is not between 1ms and 100 years"},
		{"negative", spec(func(s *engine.Spec) { s.LeaseTTL.V = -time.Second }), "lease_ttl", false, "lease_ttl -1s is not between 1ms and 100 years"},
		{"too long", spec(func(s *engine.Spec) { s.LeaseTTL.V = engine.MaxWindow + time.Millisecond }), "lease_ttl", false, "is not between 1ms and 100 years"},
		{"sub-millisecond", spec(func(s *engine.Spec) { s.LeaseTTL.V = 1500 * time.Microsecond }), "lease_ttl", false, "lease_ttl 1.5ms is not a whole number of milliseconds"},
		{"burst", spec(func(s *engine.Spec) { s.Burst = engine.Some[uint32](5) }), "burst", true, "burst is only for algorithm token_bucket, not concurrency"},
		{"limit", spec(func(s *engine.Spec) { s.Limit = engine.MaxSlidingLog + 1 }), "requests_per_unit", false, "too large for concurrency (at most 100000"},
		{"calendar", spec(func(s *engine.Spec) { s.Unit, s.Calendar = engine.Day, true }), "calendar", true, "calendar: true is for algorithm fixed_window, not concurrency"},
		{"lease", spec(func(s *engine.Spec) { s.Lease = true }), "lease", true, "not concurrency"},
		{"on a fixed window", spec(func(s *engine.Spec) { s.Algorithm = "" }), "lease_ttl", true, "lease_ttl is only for algorithm concurrency, not fixed_window"},
		{"on a sliding log", spec(func(s *engine.Spec) { s.Algorithm = engine.SlidingLog }), "lease_ttl", true, "lease_ttl is only for algorithm concurrency, not sliding_log"},
		{"on a calendar window", spec(func(s *engine.Spec) { s.Algorithm, s.Unit, s.Calendar = "", engine.Day, true }), "lease_ttl", true, "not fixed_window"},
	} {
		r, errs := engine.Compile(tc.spec)
		i := slices.IndexFunc(errs, func(e engine.SpecError) bool { return e.Field == tc.field })
		switch {
		case r != nil:
			t.Errorf("%s: Compile(%+v) = a rule, want an error", tc.name, tc.spec)
		case i < 0:
			t.Errorf("%s: errors %v, want one of field %s", tc.name, errs, tc.field)
		case errs[i].Key != tc.key || !strings.Contains(errs[i].Msg, tc.msg):
			t.Errorf("%s: %s error %q (key %v), want %q (key %v)", tc.name, tc.field, errs[i].Msg, errs[i].Key, tc.msg, tc.key)
		}
	}
}

// TestConcurrencyAgainstModel drives a concurrency limit with seeded
// random requests, each with its identity, that acquire and then release
// after a while, or never (their release is lost), on a clock that now
// and then steps back. Releases name nobody, so a model that holds one
// slot per hit, counted until released (the newest first, as the engine
// does) or lease_ttl old, gives the verdicts and remaining counts. What it
// checks apart from that order is the bound the order exists for: every
// slot counted is backed by a request still in flight whose acquisition
// is younger than lease_ttl (a lost release never holds a slot longer).
// Half the runs are Envoy's: count_denied_hits, and a release for every
// request, denied ones too; there only the bound is checked.
func TestConcurrencyAgainstModel(t *testing.T) {
	seed := storetest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))
	const ttl = 10 * time.Second
	for run := range 100 {
		envoy := run%2 == 1
		limit := uint32(1 + rng.IntN(6))
		rule := storetest.Rule(engine.Concurrency, limit, ttl, 0)
		var st engine.State
		results := make([]engine.Result, 1)
		now := storetest.T0
		// The model: the instants of the slots held (one per hit), in
		// order; and the requests in flight, by identity, with their
		// acquisition's instant and hits, and whether their release is lost
		// (such a request stays in flight for ever).
		var slots []time.Time
		type flight struct {
			at   time.Time
			hits uint64
			lost bool
		}
		var flights []flight
		for step := range 400 {
			d := time.Duration(rng.ExpFloat64() * float64(ttl/8))
			if rng.IntN(20) == 0 {
				d = -d / 2
			}
			now = now.Add(d)
			tc := now
			if n := len(st.Log); n > 0 && st.Log[n-1].At > tc.UnixMicro() {
				tc = time.UnixMicro(st.Log[n-1].At) // a counter judges no earlier than its newest entry
			}
			release := len(flights) > 0 && rng.IntN(2) == 0
			i := 0
			if release {
				// A request in flight ends: its release, unless lost.
				i = rng.IntN(len(flights))
				if flights[i].lost {
					continue // it holds its slot for ever
				}
			}
			// The slots the counter forgets at its instant.
			slots = slices.DeleteFunc(slots, func(at time.Time) bool { return !tc.Before(at.Add(ttl)) })
			call := ""
			var wantOK bool
			if release {
				f := flights[i]
				flights = slices.Delete(flights, i, i+1)
				call = "release"
				for range f.hits {
					if len(slots) > 0 {
						slots = slots[:len(slots)-1] // the newest
					}
				}
				wantOK = true
				engine.Evaluate(now, []engine.Item{{Desc: "d/k=v", Rule: rule, Hits: f.hits, Refund: true}}, []*engine.State{&st}, results)
			} else {
				hits := uint64(1 + rng.IntN(2))
				call = "acquire"
				wantOK = uint64(len(slots))+hits <= uint64(limit)
				if wantOK {
					for range hits {
						slots = append(slots, tc)
					}
				}
				if wantOK || envoy {
					flights = append(flights, flight{at: tc, hits: hits, lost: rng.IntN(5) == 0})
				}
				engine.Evaluate(now, []engine.Item{{Desc: "d/k=v", Rule: rule, Hits: hits, CountDenied: envoy}}, []*engine.State{&st}, results)
			}
			r := results[0]
			where := func() string {
				return fmt.Sprintf("seed %d run %d step %d (%s at T0%+v, limit %d, envoy %v)", seed, run, step, call, now.Sub(storetest.T0), limit, envoy)
			}
			if !envoy && r.Admitted != wantOK {
				t.Fatalf("%s: admitted %v, want %v (model holds %d slots)", where(), r.Admitted, wantOK, len(slots))
			}
			if want := uint64(limit) - min(uint64(limit), uint64(len(slots))); !envoy && r.Remaining != want {
				t.Fatalf("%s: remaining %d, want %d", where(), r.Remaining, want)
			}
			// The bound: slots counted ≤ hits held by requests in flight
			// whose acquisition is younger than lease_ttl.
			var held uint64
			for _, f := range flights {
				if tc.Before(f.at.Add(ttl)) {
					held += f.hits
				}
			}
			if counted := st.Count; counted > held {
				t.Fatalf("%s: %d slots counted, but only %d hits are held by acquisitions younger than lease_ttl", where(), counted, held)
			}
		}
	}
}
