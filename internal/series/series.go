package series

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Other is the conventional overflow label value (Options.Overflow): the
// series into which a group's request values fold past its bound.
const Other = "_other"

// Options configure a Family.
type Options struct {
	// Labels names the label values that every counter of the family takes,
	// in order: the vectors' labels that are not curried.
	Labels []string
	// Counters are the family's counter vectors, each taking the values of
	// Labels. A vector with more labels is curried: one vector with a label
	// "result" curried to "ok" and to "over_limit" gives two counters. A
	// vector belongs to one family.
	Counters []*prometheus.CounterVec
	// Together makes all the counters of a series when the first of them is
	// used (a scrape then shows the others at 0); otherwise each counter is
	// made on its own first use.
	Together bool
	// Max bounds the distinct series of one group; 0 means the family has
	// no groups.
	Max int
	// Overflow are the label values after a group's prefix of the group's
	// overflow series (for a tail of one value, []string{Other}). Groups
	// with one prefix share it.
	Overflow []string
}

// Family is a set of counter vectors sharing label values, whose series
// come and go with the configs that a Reload declares: a series is made
// in the vectors on its first use, kept (the same counters) by a reload
// that declares its labels again, and deleted by one that does not. A
// request still counting on an older config's series never makes a
// deleted series again: what it counts is discarded. Groups hold the
// series whose labels end with request values, at most Options.Max per
// group, the rest counted in the group's overflow series.
//
// A series is one object per distinct label values: declared twice, or
// reached through several groups, it is the same series, kept while any
// of them is live. Label values that are not valid UTF-8 are made valid
// (each run of invalid bytes becomes U+FFFD), as Prometheus takes no other.
//
// New makes a Family; the zero value is not usable. Safe for concurrent
// use. Counting on a series whose counter exists, and finding a group's
// series that exists, take no lock and allocate nothing; making one takes
// the family's lock.
type Family struct {
	labels   []string
	vecs     []*prometheus.CounterVec
	together bool
	max      int
	overflow []string

	// discarded counts what removed series and groups count: nothing that
	// is exported. discardSeries is the series that a removed group gives.
	discarded     prometheus.Counter
	discardSeries *Series

	// reloading lets one Reload run at a time.
	reloading sync.Mutex
	// mu orders the making of series against their deletion by a reload.
	mu        sync.Mutex
	series    map[string]*Series   // by key: live, declared or made since the last reload
	groups    map[groupID]*Group   // live or declared since the last reload
	permanent map[*Series]struct{} // series no reload deletes
}

// maxCounters bounds Options.Counters, so that a series' counters need no
// allocation of their own.
const maxCounters = 8

// stackLabels is how many label values are decoded without allocating, to
// make or delete a series.
const stackLabels = 8

// groupID names a group across reloads: its prefix's key and its id.
type groupID struct{ prefix, id string }

// New returns a family of the counters of o. It panics when o is not
// consistent (a programmer's error).
func New(o Options) *Family {
	if len(o.Counters) == 0 || len(o.Counters) > maxCounters {
		panic(fmt.Sprintf("series.New: %d counters, want 1 to %d", len(o.Counters), maxCounters))
	}
	if o.Max > 0 && (len(o.Overflow) == 0 || len(o.Overflow) > len(o.Labels)) {
		panic(fmt.Sprintf("series.New: groups of %d series need overflow label values, 1 to %d of them, not %d", o.Max, len(o.Labels), len(o.Overflow)))
	}
	f := &Family{
		labels:    o.Labels,
		vecs:      o.Counters,
		together:  o.Together,
		max:       o.Max,
		overflow:  o.Overflow,
		discarded: prometheus.NewCounter(prometheus.CounterOpts{Name: "discarded", Help: "What counts on removed series."}),
		series:    make(map[string]*Series),
		groups:    make(map[groupID]*Group),
		permanent: make(map[*Series]struct{}),
	}
	f.discardSeries = &Series{f: f}
	f.discard(f.discardSeries)
	return f
}

// Series is the counters of one set of label values in a family, made on
// first use. Reload.Series, Group.Get and Family.Permanent give them; the
// zero value is not usable. Safe for concurrent use.
type Series struct {
	f   *Family
	key string // its label values (decode)
	// counters are by Options.Counters index, nil until made; when a
	// reload deletes the series (with f.mu held), the family's discarded
	// counter, for good.
	counters [maxCounters]atomic.Pointer[prometheus.Counter]
}

// Counter returns the series' counter of vector i (an index of
// Options.Counters), making the series in the vectors on first use (all
// of them with Options.Together). A removed series' counters count
// nothing.
func (s *Series) Counter(i int) prometheus.Counter {
	if c := s.counters[i].Load(); c != nil {
		return *c
	}
	return s.make(i)
}

func (s *Series) make(i int) prometheus.Counter {
	f := s.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if c := s.counters[i].Load(); c != nil {
		return *c // made meanwhile, or removed
	}
	var buf [stackLabels]string
	labels := s.labels(buf[:])
	for j, vec := range f.vecs {
		if j == i || (f.together && s.counters[j].Load() == nil) {
			c := vec.WithLabelValues(labels...)
			s.counters[j].Store(&c)
		}
	}
	return *s.counters[i].Load()
}

// Made reports whether a counter of s has been made: whether s is in the
// vectors (a removed series counts as made). It takes no lock and
// allocates nothing, for what exports a value beside the series of the
// limits in use only.
func (s *Series) Made() bool {
	for i := range s.f.vecs {
		if s.counters[i].Load() != nil {
			return true
		}
	}
	return false
}

// labels returns the label values of s, in dst when it has the room.
func (s *Series) labels(dst []string) []string {
	labels, err := decode(dst, s.key)
	if err != nil {
		panic(fmt.Sprintf("series: the key %q of a series: %v", s.key, err)) // keys are made by appendKey only
	}
	return labels
}

// discard makes s count nothing, for good. Requires f.mu held (or s not
// shared yet).
func (f *Family) discard(s *Series) {
	for i := range f.vecs {
		s.counters[i].Store(&f.discarded)
	}
}

// lookup returns the series whose key is key (of valid UTF-8 label
// values, of the family's number), making the object (not its counters)
// when there is none. Requires f.mu held.
func (f *Family) lookup(key []byte) *Series {
	if s := f.series[string(key)]; s != nil {
		return s
	}
	s := &Series{f: f, key: string(key)}
	f.series[s.key] = s
	return s
}

// checkLabels panics unless n is the family's number of label values.
func (f *Family) checkLabels(n int, what string) {
	if n != len(f.labels) {
		panic(fmt.Sprintf("series: %s of %d label values, want %d (%q)", what, n, len(f.labels), f.labels))
	}
}

// Permanent returns the series of labels, which no reload deletes (e.g.
// what counts requests that no config knows). Declaring the same labels in
// a reload gives the same series.
func (f *Family) Permanent(labels ...string) *Series {
	f.checkLabels(len(labels), "a permanent series")
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.lookup(appendKey(nil, validLabels(labels)))
	f.permanent[s] = struct{}{}
	return s
}

// Group is the series of one family whose label values are a prefix from
// the config and a tail from a request: at most the family's Max distinct
// tails, then the overflow series (the prefix and Options.Overflow).
// Reload.Group gives them; the zero value is not usable. Safe for
// concurrent use.
type Group struct {
	f        *Family
	prefix   string // the prefix's key
	overflow *Series
	mu       sync.RWMutex
	series   map[string]*Series // by the tail's key
	// removed is set, with f.mu and mu held, when a reload drops the group:
	// it then gives the family's discard series, for good.
	removed bool
}

// Get returns the series of the group's prefix and the label values tail
// (a key, built with AppendLabel or EndLabel), making the object when the
// group has fewer than Max tails, else the overflow series. Finding a tail
// that the group has takes no lock and allocates nothing; so does the
// overflow of a full group. It panics when the prefix and tail are not the
// family's number of values.
func (g *Group) Get(tail []byte) *Series {
	g.mu.RLock()
	s, removed, full := g.series[string(tail)], g.removed, len(g.series) >= g.f.max
	g.mu.RUnlock()
	switch {
	case s != nil:
		return s
	case removed:
		return g.f.discardSeries
	case full:
		return g.overflow
	}
	return g.add(tail)
}

func (g *Group) add(tail []byte) *Series {
	f := g.f
	f.mu.Lock() // before g.mu, as in Commit
	defer f.mu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.removed:
		return f.discardSeries
	case g.series[string(tail)] != nil:
		return g.series[string(tail)]
	case len(g.series) >= f.max:
		return g.overflow
	}
	labels, err := decode(nil, g.prefix+string(tail))
	if err != nil {
		panic(fmt.Sprintf("series: Group.Get(%q): not a key: %v", tail, err))
	}
	f.checkLabels(len(labels), "a group's series")
	s := f.lookup(appendKey(nil, validLabels(labels)))
	g.series[string(tail)] = s
	return s
}

// Reload declares the series and groups of a new config: those it
// declares are kept (or made), and Commit deletes the others. One reload
// runs at a time; counting goes on meanwhile, on the series of both
// configs.
type Reload struct {
	f      *Family
	series map[*Series]struct{} // declared
	groups map[groupID]*Group   // declared
	key    []byte               // scratch space for a key
	done   bool
}

// Reload starts a reload. The caller must Commit it: other reloads wait
// until then. A Reload is for one goroutine.
func (f *Family) Reload() *Reload {
	f.reloading.Lock()
	f.mu.Lock()
	n, groups := len(f.series), len(f.groups)
	f.mu.Unlock()
	return &Reload{f: f, series: make(map[*Series]struct{}, n), groups: make(map[groupID]*Group, groups)}
}

// Series declares the series of labels and returns it: the one that the
// previous config had, when it had those labels, so that it goes on
// counting. It panics when labels are not the family's number of values.
func (r *Reload) Series(labels ...string) *Series {
	f := r.f
	r.checkOpen()
	f.checkLabels(len(labels), "a series")
	r.key = appendKey(r.key[:0], validLabels(labels))
	f.mu.Lock()
	s := f.lookup(r.key)
	f.mu.Unlock()
	r.series[s] = struct{}{}
	return s
}

// Group declares the group of prefix and id (groups of one prefix with
// several ids are capped each on its own and share the overflow series)
// and returns it: the previous config's, with its series, when it had the
// same. It panics when the family has no groups or when prefix and
// overflow are not the family's number of values.
func (r *Reload) Group(id string, prefix ...string) *Group {
	f := r.f
	r.checkOpen()
	if f.max <= 0 {
		panic("series: Reload.Group on a family without groups (Options.Max)")
	}
	prefix = validLabels(prefix)
	overflow := append(append([]string(nil), prefix...), f.overflow...)
	f.checkLabels(len(overflow), "a group's prefix and overflow")
	gid := groupID{string(appendKey(nil, prefix)), id}
	f.mu.Lock()
	g := f.groups[gid]
	if g == nil {
		g = &Group{f: f, prefix: gid.prefix, overflow: f.lookup(appendKey(nil, overflow)), series: make(map[string]*Series)}
		f.groups[gid] = g
	}
	f.mu.Unlock()
	r.groups[gid] = g
	return g
}

// checkOpen panics when r was committed: what it would declare would be
// deleted by the next reload, or kept by none.
func (r *Reload) checkOpen() {
	if r.done {
		panic("series: a Reload declares after its Commit")
	}
}

// Commit ends the reload: the series that it did not declare, and that no
// declared group or Permanent holds, are deleted from the vectors, and
// count nothing from then on (a late count on them makes nothing); the
// groups it did not declare give nothing any more. A second Commit does
// nothing.
func (r *Reload) Commit() {
	if r.done {
		return
	}
	r.done = true
	f := r.f
	defer f.reloading.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	live := r.series
	for s := range f.permanent {
		live[s] = struct{}{}
	}
	for gid, g := range f.groups {
		g.mu.Lock()
		if r.groups[gid] != g {
			g.removed, g.series = true, nil
			delete(f.groups, gid)
		} else {
			live[g.overflow] = struct{}{}
			for _, s := range g.series {
				live[s] = struct{}{}
			}
		}
		g.mu.Unlock()
	}
	var buf [stackLabels]string
	for key, s := range f.series {
		if _, ok := live[s]; ok {
			continue
		}
		labels := s.labels(buf[:])
		for i, vec := range f.vecs {
			if c := s.counters[i].Load(); c != nil {
				vec.DeleteLabelValues(labels...)
			}
		}
		f.discard(s)
		delete(f.series, key)
	}
}
