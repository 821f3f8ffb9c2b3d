package overrides

import (
	"context"
	"fmt"
	"testing"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
)

// benchOverrides returns n overrides of domain api on tenant: half exact
// values ("t000123"), half prefixes ("p000123-*"), as a keeper loads them.
func benchOverrides(n int) map[string]*Override {
	out := make(map[string]*Override, n)
	for i := range n {
		v := fmt.Sprintf("t%06d", i)
		if i%2 == 1 {
			v = fmt.Sprintf("p%06d-*", i)
		}
		o := &Override{Key: Key{Domain: "api", Descriptor: []engine.Entry{{Key: "tenant", Value: v}}}, RequestsPerUnit: uint32(100 + i%7)}
		out[o.ID()] = o
	}
	return out
}

// BenchmarkApply: what finding the override of a limit costs a decision
// with 0, 1,000 and 100,000 overrides in its domain, for a descriptor
// that an exact override matches, one that a prefix matches, and one that
// none does. The cost does not grow with the overrides (compare
// config's BenchmarkMatchWildcards, the config's own wildcard index).
func BenchmarkApply(b *testing.B) {
	cfg, err := config.Parse("limits.yaml", []byte(testConfig))
	if err != nil {
		b.Fatal(err)
	}
	dom := cfg.Domain("api")
	for _, n := range []int{0, 1000, 100000} {
		t := buildTable(cfg, newEntries(cfg, benchOverrides(n), nil, t0), nil)
		for _, shape := range []struct{ name, value string }{
			{"exact", fmt.Sprintf("t%06d", n/2/2*2)},
			{"prefix", fmt.Sprintf("p%06d-eu-1", n/2/2*2+1)},
			{"miss", "nobody-at-all"},
		} {
			es := []engine.Entry{{Key: "tenant", Value: shape.value}}
			l := dom.Match(es).Limits[0]
			if hit := t.Apply("api", es, l) != l; hit != (n > 0 && shape.name != "miss") {
				b.Fatalf("overrides=%d %s: hit %v", n, shape.name, hit)
			}
			b.Run(fmt.Sprintf("overrides=%d/%s", n, shape.name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					t.Apply("api", es, l)
				}
			})
		}
	}
}

// BenchmarkChange: what one change costs a process that holds n
// overrides (a Set on the memory backend: stored, applied, the table
// rebuilt).
func BenchmarkChange(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		b.Run(fmt.Sprintf("overrides=%d", n), func(b *testing.B) {
			f := newFixture(b, "")
			recs := benchOverrides(n)
			m := f.k.backend.(*Memory)
			for id, o := range recs {
				m.records[id] = encode(o)
			}
			m.version = 1
			if err := f.k.Load(context.Background()); err != nil {
				b.Fatal(err)
			}
			c := Change{Key: Key{Domain: "api", Descriptor: entries("tenant=t000000")}}
			i := 0
			for b.Loop() {
				i++
				c.RequestsPerUnit = uint32(i%1000 + 1)
				if _, err := f.k.Set(context.Background(), c, "bench"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
