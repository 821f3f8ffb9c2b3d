package series

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/rlsproject/rls/internal/engine/storetest"
)

// model is what a family should export, kept the plain way: one object
// per live set of label values, groups as maps, no locks, no encoding.
type model struct {
	together bool
	max      int
	live     map[[2]string]*modelSeries
	groups   map[[2]string]*modelGroup // by prefix and id
	perm     *modelSeries
}

type modelSeries struct {
	labels  [2]string
	removed bool
	made    [3]bool
	count   [3]float64
}

type modelGroup struct {
	prefix   string
	overflow *modelSeries
	members  map[string]*modelSeries
	removed  bool
}

// modelConfig is one loaded config's handles: the family's and the
// model's, side by side.
type modelConfig struct {
	series  []*Series
	mseries []*modelSeries
	groups  []*Group
	mgroups []*modelGroup
}

func (m *model) get(labels [2]string) *modelSeries {
	s := m.live[labels]
	if s == nil {
		s = &modelSeries{labels: labels}
		m.live[labels] = s
	}
	return s
}

func (m *model) count(s *modelSeries, i int) {
	if s.removed {
		return
	}
	for j := range s.made {
		s.made[j] = s.made[j] || j == i || m.together
	}
	s.count[i]++
}

func (m *model) member(g *modelGroup, tail string) *modelSeries {
	switch {
	case g.removed:
		return &modelSeries{removed: true}
	case g.members[tail] != nil:
		return g.members[tail]
	case len(g.members) >= m.max:
		return g.overflow
	}
	s := m.get([2]string{g.prefix, tail})
	g.members[tail] = s
	return s
}

// reload declares fixed series and groups (by prefix and id) in the model.
func (m *model) reload(fixed [][2]string, groups [][2]string) (ms []*modelSeries, mg []*modelGroup) {
	declared := map[[2]string]bool{m.perm.labels: true}
	for _, l := range fixed {
		ms = append(ms, m.get(l))
		declared[l] = true
	}
	kept := map[[2]string]*modelGroup{}
	for _, id := range groups {
		g := m.groups[id]
		if g == nil {
			g = &modelGroup{prefix: id[0], overflow: m.get([2]string{id[0], Other}), members: map[string]*modelSeries{}}
		}
		kept[id] = g
		mg = append(mg, g)
		declared[g.overflow.labels] = true
		for _, s := range g.members {
			declared[s.labels] = true
		}
	}
	for id, g := range m.groups {
		if kept[id] != g {
			g.removed = true
		}
	}
	m.groups = kept
	for l, s := range m.live {
		if !declared[l] {
			s.removed = true
			delete(m.live, l)
		}
	}
	return ms, mg
}

func (m *model) exported() []string {
	var out []string
	names := []string{`hits_total{domain=%s,limit=%s,result=ok} %g`, `hits_total{domain=%s,limit=%s,result=over} %g`, `waits_total{domain=%s,limit=%s} %g`}
	for _, s := range m.live {
		for i, made := range s.made {
			if made {
				out = append(out, fmt.Sprintf(names[i], s.labels[0], s.labels[1], s.count[i]))
			}
		}
	}
	sort.Strings(out)
	return out
}

// Random loads and counts, on the current config and on older ones (late
// requests), checked after every step against the model: what is
// exported, and the counts.
func TestRandomAgainstModel(t *testing.T) {
	for _, together := range []bool{false, true} {
		t.Run(fmt.Sprint("together=", together), func(t *testing.T) {
			seed := storetest.Seed(t)
			rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
			const max = 2
			fx := newFixture(t, Options{Together: together, Max: max, Overflow: []string{Other}})
			m := &model{together: together, max: max, live: map[[2]string]*modelSeries{}, groups: map[[2]string]*modelGroup{}}
			m.perm = m.get([2]string{"_unknown", ""})
			perm := fx.f.Permanent("_unknown", "")
			prefixes := []string{"a", "b"}
			values := []string{"x", "y", "v0", "v1", "v2", Other} // v* are tails too; Other is an overflow's
			var configs []*modelConfig
			for step := range 600 {
				var what string
				switch op := rng.IntN(10); {
				case op == 0 || len(configs) == 0:
					var fixed, groups [][2]string
					for _, p := range prefixes {
						for _, v := range values {
							if rng.IntN(4) == 0 {
								fixed = append(fixed, [2]string{p, v})
							}
						}
						for _, id := range []string{"1", "2"} {
							if rng.IntN(2) == 0 {
								groups = append(groups, [2]string{p, id})
							}
						}
					}
					c := &modelConfig{}
					r := fx.f.Reload()
					for _, l := range fixed {
						c.series = append(c.series, r.Series(l[0], l[1]))
					}
					for _, id := range groups {
						c.groups = append(c.groups, r.Group(id[1], id[0]))
					}
					r.Commit()
					c.mseries, c.mgroups = m.reload(fixed, groups)
					configs = append(configs, c)
					what = fmt.Sprintf("load %q, groups %q", fixed, groups)
				default:
					c := configs[len(configs)-1]
					if rng.IntN(3) == 0 {
						c = configs[rng.IntN(len(configs))] // a late request
					}
					i := rng.IntN(3)
					switch k := rng.IntN(5); {
					case k == 0:
						perm.Counter(i).Inc()
						m.count(m.perm, i)
						what = fmt.Sprintf("count %d on the permanent series", i)
					case k < 3 && len(c.series) > 0:
						j := rng.IntN(len(c.series))
						c.series[j].Counter(i).Inc()
						m.count(c.mseries[j], i)
						what = fmt.Sprintf("count %d on %q", i, c.mseries[j].labels)
					case len(c.groups) > 0:
						j := rng.IntN(len(c.groups))
						v := values[2+rng.IntN(3)]
						c.groups[j].Get(tail(v)).Counter(i).Inc()
						m.count(m.member(c.mgroups[j], v), i)
						what = fmt.Sprintf("count %d on group %s's tail %s", i, c.mgroups[j].prefix, v)
					default:
						continue
					}
				}
				if got, want := fx.exported(t), m.exported(); !slices.Equal(got, want) {
					t.Fatalf("step %d (seed %d): %s: exported\n\t%s\nwant\n\t%s", step, seed, what, strings.Join(got, "\n\t"), strings.Join(want, "\n\t"))
				}
			}
		})
	}
}
