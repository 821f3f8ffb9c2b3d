package topkeys

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine/storetest"
)

// truth is the exact model of one limit's window: per key, its denials,
// admissions and latest fullness.
type truth struct {
	denied, admitted map[string]uint64
	fullness         map[string]float64
	denials          uint64
}

func newTruth() *truth {
	return &truth{denied: map[string]uint64{}, admitted: map[string]uint64{}, fullness: map[string]float64{}}
}

func (m *truth) observe(id string, admitted bool, f float64) {
	if admitted {
		m.admitted[id]++
	} else {
		m.denied[id]++
		m.denials++
	}
	m.fullness[id] = f
}

// checkSketch holds s to the sketch's guarantees against the model m:
// every key in the denied ranking has count−err ≤ true ≤ count and err ≤
// D/K; every key denied more than D/K times is in it; every key in the
// full ranking has its latest fullness; and, with fullness that only grows
// (monotone), the full ranking holds K keys at least as full as any other.
func checkSketch(t *testing.T, seed uint64, s *sketch, m *truth, monotone bool) {
	t.Helper()
	if s.denials != m.denials {
		t.Fatalf("seed %d: the sketch counted %d denials, the model %d", seed, s.denials, m.denials)
	}
	bound := m.denials / uint64(s.k)
	for _, e := range s.denied.items {
		tr := m.denied[e.id]
		if e.count < tr || e.count-e.err > tr || e.err > bound {
			t.Fatalf("seed %d: key %s: count %d err %d, true denials %d (bound D/K = %d)", seed, e.id, e.count, e.err, tr, bound)
		}
	}
	for id, n := range m.denied {
		if e := s.byID[id]; n > bound && (e == nil || e.di < 0) {
			t.Fatalf("seed %d: key %s denied %d times, more than D/K = %d, is not in the denied ranking", seed, id, n, bound)
		}
	}
	least := 2.0
	for _, e := range s.full.items {
		if e.fullness != m.fullness[e.id] {
			t.Fatalf("seed %d: key %s: fullness %v, its latest was %v", seed, e.id, e.fullness, m.fullness[e.id])
		}
		least = min(least, e.fullness)
	}
	if monotone {
		if len(s.full.items) < s.k {
			least = -1 // room left: every key at MinFullness or more is in it
		}
		for id, f := range m.fullness {
			if e := s.byID[id]; f >= MinFullness && f > least && (e == nil || e.fi < 0) {
				t.Fatalf("seed %d: key %s at fullness %v is not in the full ranking, whose least is %v", seed, id, f, least)
			}
		}
	}
	if len(s.byID) > 2*s.k {
		t.Fatalf("seed %d: %d entries, more than 2K = %d", seed, len(s.byID), 2*s.k)
	}
	var bytes int64
	for _, e := range s.byID {
		if (e.di < 0) == (e.fi < 0) && e.di < 0 {
			t.Fatalf("seed %d: key %s is in neither ranking and still kept", seed, e.id)
		}
		bytes += e.bytes
	}
	if bytes != s.bytes {
		t.Fatalf("seed %d: entries hold %d bytes, the sketch counts %d", seed, bytes, s.bytes)
	}
}

// TestSketchAgainstModel drives a sketch with seeded random decisions on
// skewed keys and holds it to its guarantees after every step batch.
func TestSketchAgainstModel(t *testing.T) {
	seed := storetest.Seed(t)
	for round := range 20 {
		rng := rand.New(rand.NewPCG(seed, uint64(round)))
		k := 1 + rng.IntN(16)
		s, m := newSketch(k), newTruth()
		zipf := rand.NewZipf(rng, 1.1+rng.Float64(), 1, uint64(10+rng.IntN(500)))
		used := map[string]uint64{}
		capacity := uint64(1 + rng.IntN(20))
		for step := range 2000 {
			id := fmt.Sprintf("api/k=%d", zipf.Uint64())
			admitted := used[id] < capacity
			if admitted {
				used[id]++
			}
			f := float64(used[id]) / float64(capacity)
			s.observe(id, []config.Entry{{Key: "k", Value: id}}, verdict{admitted: admitted, fullness: f, used: used[id]})
			m.observe(id, admitted, f)
			if step%97 == 0 {
				checkSketch(t, seed, s, m, true)
			}
		}
		checkSketch(t, seed, s, m, true)
	}
}

// TestSketchRemove: a reset key leaves both rankings and the heaps stay
// heaps.
func TestSketchRemove(t *testing.T) {
	seed := storetest.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 1))
	s := newSketch(8)
	for range 500 {
		id := fmt.Sprintf("k%d", rng.IntN(30))
		s.observe(id, nil, verdict{admitted: rng.IntN(3) == 0, fullness: rng.Float64()})
		if rng.IntN(10) == 0 {
			gone := fmt.Sprintf("k%d", rng.IntN(30))
			s.remove(gone)
			if s.byID[gone] != nil {
				t.Fatalf("seed %d: remove(%s) left its entry", seed, gone)
			}
		}
		for i, d := 1, s.denied.items; i < len(d); i++ {
			if d[(i-1)/2].count > d[i].count || d[i].di != i {
				t.Fatalf("seed %d: denied heap broken at %d", seed, i)
			}
		}
		for i, f := 1, s.full.items; i < len(f); i++ {
			if f[(i-1)/2].fullness > f[i].fullness || f[i].fi != i {
				t.Fatalf("seed %d: full heap broken at %d", seed, i)
			}
		}
	}
}

// TestShorten: a long key or value is cut at a rune boundary, marked, and
// two long values that differ only past the cut stay apart.
func TestShorten(t *testing.T) {
	long := string(make([]byte, 200))
	a, cut := shorten("é" + long + "a")
	b, _ := shorten("é" + long + "b")
	if !cut || a == b || len(a) > maxShown+shortSuffix {
		t.Errorf("shorten: %q (cut %v) and %q: want two different values of at most %d bytes", a, cut, b, maxShown+shortSuffix)
	}
	if s, cut := shorten("203.0.113.7"); s != "203.0.113.7" || cut {
		t.Errorf("shorten(203.0.113.7) = %q, %v", s, cut)
	}
}

// TestMergeBounds: merging two processes' summaries, a key that one of
// them does not rank is counted there at that ranking's least count, in
// its Denied and in its Error, so that the truth stays within both.
func TestMergeBounds(t *testing.T) {
	p1 := []limitSummary{{Domain: "api", Name: "l", Start: 0, End: 60e6, K: 2, Denials: 20, LeastDenied: 3, Keys: []keySummary{
		{ID: "a", InDenied: true, Count: 10},
		{ID: "b", InDenied: true, Count: 3, Err: 2, Admitted: 4},
	}}}
	p2 := []limitSummary{{Domain: "api", Name: "l", Start: 0, End: 60e6, K: 2, Denials: 15, LeastDenied: 4, Keys: []keySummary{
		{ID: "b", InDenied: true, Count: 6, Admitted: 1},
		{ID: "c", InDenied: true, Count: 4, Err: 3},
		{ID: "d", InFull: true, Denied: 1, Fullness: 0.5},
	}}}
	got := merge([][]limitSummary{p1, p2}, 1, Query{N: 10})
	if len(got) != 1 || got[0].Denials != 35 || got[0].Error != 7 {
		t.Fatalf("merge: %+v, want one limit of 35 denials, error 7", got)
	}
	want := []struct {
		id              string
		denied, err, ad uint64
	}{{"a", 14, 4, 0}, {"b", 9, 2, 4}, {"c", 7, 6, 0}}
	keys := got[0].Keys
	if len(keys) != len(want) {
		t.Fatalf("merge: keys %+v, want %v (d is only in a fullness ranking)", keys, want)
	}
	for i, w := range want {
		if k := keys[i]; k.ID != w.id || k.Denied != w.denied || k.Error != w.err || k.Admitted != w.ad {
			t.Errorf("key %d: %s denied %d error %d admitted %d, want %s %d %d %d", i, k.ID, k.Denied, k.Error, k.Admitted, w.id, w.denied, w.err, w.ad)
		}
	}
	full := merge([][]limitSummary{p1, p2}, 1, Query{N: 10, By: ByFullness})
	if k := full[0].Keys; len(k) != 1 || k[0].ID != "d" || k[0].Denied != 1 || k[0].Fullness != 0.5 {
		t.Errorf("merge by fullness: %+v, want d alone (denied 1, fullness 0.5)", k)
	}
}
