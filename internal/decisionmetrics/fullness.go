package decisionmetrics

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/service"
)

// How full the keys of each limit are, without a series per key: every
// decision that leaves a key's counter at least half spent puts the key in
// a bounded sample of its limit, with how full it is and the instant its
// window resets; a scrape counts, per limit, the entries not yet reset at
// or above 50 %, 80 % and 100 % (rls_limit_keys_fullness). Keys below half
// full need no entry: a decision on one costs a comparison and, when its
// limit has entries, a lookup; one on a sampled key updates its entry in
// place. Neither allocates.

// The default bounds of the fullness sample.
const (
	DefaultFullnessKeysPerLimit = 10_000
	DefaultFullnessKeys         = 100_000
)

// fullLevel is how much of its limit a key has spent: the thresholds it
// reaches.
type fullLevel uint8

const (
	belowHalf  fullLevel = iota // not sampled
	halfFull                    // at least 50 %
	mostlyFull                  // at least 80 %
	full                        // 100 %: nothing remains
	numLevels
)

// aboveLabel is the above label of each level's series.
var aboveLabel = [numLevels]string{halfFull: "0.5", mostlyFull: "0.8", full: "1"}

// levelOf returns the level of a key that has remaining of capacity left.
// A limit of 0 is never full (it admits nothing by design, not because it
// is spent). The thresholds are exact: used ≥ ⌈capacity × 4/5⌉ and
// used ≥ ⌈capacity / 2⌉, without overflow.
func levelOf(remaining, capacity uint64) fullLevel {
	if remaining >= capacity {
		return belowHalf
	}
	used := capacity - remaining
	switch {
	case remaining == 0:
		return full
	case used >= capacity-capacity/5:
		return mostlyFull
	case used >= capacity-capacity/2:
		return halfFull
	}
	return belowHalf
}

// sampleID names a sample: the labels of its limit's series.
type sampleID struct{ domain, limit string }

// fullness keeps the samples of the current config's limits (and of each
// domain's request overrides) and exports them as a prometheus.Collector.
// A sample holds at most perLimit keys and all samples at most total;
// beyond that a key displaces the expired entries of its sample first, then
// the least full and soonest to reset of its level or below, and is
// dropped when there are none (rls_limit_keys_fullness_dropped_total
// counts the entries displaced and the decisions dropped). Safe for
// concurrent use.
type fullness struct {
	perLimit int
	total    int64
	clock    func() int64 // nanoseconds; entries expire by it
	size     atomic.Int64 // entries in all live samples
	dropped  prometheus.Counter
	desc     *prometheus.Desc

	mu      sync.Mutex
	gen     uint64                  // of the current config's samples; requires mu
	samples map[sampleID]*keySample // the current config's, made on first use; requires mu
}

// newFullness returns a fullness whose entries expire by now (nil: the
// monotonic clock).
func newFullness(perLimit, total int, now func() time.Time) *fullness {
	if perLimit <= 0 {
		perLimit = DefaultFullnessKeysPerLimit
	}
	if total <= 0 {
		total = DefaultFullnessKeys
	}
	return &fullness{
		perLimit: perLimit,
		total:    int64(total),
		clock:    nanoClock(now),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "rls_limit_keys_fullness_dropped_total",
			Help: fmt.Sprintf("What the fullness sample (rls_limit_keys_fullness) could not keep once full (%d keys per limit, %d in all): entries displaced by a key as full or fuller, and decisions whose key found no place. Expired entries are not counted.", perLimit, total),
		}),
		desc: prometheus.NewDesc("rls_limit_keys_fullness",
			"Keys (counters) of a limit that a decision left at least half spent and whose window has not reset since, by domain, limit (as in rls_decisions_total) and above: 0.5, 0.8 or 1 of the limit spent (cumulative: above=\"0.5\" counts them all). From a bounded sample (rls_limit_keys_fullness_dropped_total); a key blocked by a penalty counts as full until its block ends; leased limits are not sampled. A limit's series appear with its first key at least half full.",
			[]string{"domain", "limit", "above"}, nil),
		samples: map[sampleID]*keySample{},
	}
}

// Describe implements prometheus.Collector.
func (f *fullness) Describe(ch chan<- *prometheus.Desc) {
	ch <- f.desc
	f.dropped.Describe(ch)
}

// Collect implements prometheus.Collector: per sample of the current
// config, its entries not yet expired, per threshold. Expired entries are
// forgotten on the way.
func (f *fullness) Collect(ch chan<- prometheus.Metric) {
	f.dropped.Collect(ch)
	now := f.clock()
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, ks := range f.samples {
		c := ks.counts(now)
		var above int
		for lv := full; lv > belowHalf; lv-- {
			above += c[lv]
			ch <- prometheus.MustNewConstMetric(f.desc, prometheus.GaugeValue, float64(above), id.domain, id.limit, aboveLabel[lv])
		}
	}
}

// forConfig makes the samples of cfg's limits: those of the previous
// config whose domain, label and capacity cfg has again are kept (with
// their keys) and set in byLimit and override (the service's per-limit
// metrics of cfg); the others are forgotten. It returns the generation of
// cfg's samples, for sampleFor.
func (f *fullness) forConfig(cfg *config.Config, byLimit []limitMetrics, override map[string]*limitMetrics) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gen++
	old := f.samples
	f.samples = map[sampleID]*keySample{}
	if len(old) > 0 {
		keep := func(id sampleID, capacity uint64, into *atomic.Pointer[keySample]) {
			ks := f.samples[id] // one shared by limits of the same labels
			if ks == nil {
				if ks = old[id]; ks == nil || ks.capacity != capacity {
					return
				}
				f.samples[id] = ks
			}
			into.Store(ks)
		}
		for _, d := range cfg.Domains() {
			keep(sampleID{d.Name, service.OverrideLabel}, 0, &override[d.Name].sample)
			walk(d.Descriptors, func(l *config.Limit) {
				if l.Rule != nil {
					keep(sampleID{d.Name, l.Label}, l.Rule.Capacity(), &byLimit[l.Index].sample)
				}
			})
		}
	}
	for id, ks := range old {
		if f.samples[id] != ks {
			ks.kill()
		}
	}
	return f.gen
}

// sampleFor returns the sample of the limit id (of that capacity, 0 for a
// domain's overrides) for the config of generation gen, made now and
// stored in slot, or nil when gen is no longer current.
func (f *fullness) sampleFor(slot *atomic.Pointer[keySample], gen uint64, id sampleID, capacity uint64) *keySample {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ks := slot.Load(); ks != nil {
		return ks
	}
	if gen != f.gen {
		return nil
	}
	ks := f.samples[id]
	if ks == nil {
		ks = &keySample{f: f, capacity: capacity, index: map[string]int32{}, soonest: math.MaxInt64}
		f.samples[id] = ks
	}
	slot.Store(ks)
	return ks
}

// nanoClock returns a clock in nanoseconds that reads now, or when now is
// nil the monotonic clock (since an arbitrary instant): one clock reading
// where time.Now takes two, and blind to steps of the wall clock. Only
// differences of its readings mean anything.
func nanoClock(now func() time.Time) func() int64 {
	if now != nil {
		return func() int64 { return now().UnixNano() }
	}
	start := time.Now()
	return func() int64 { return int64(time.Since(start)) }
}

// reserve takes a place among the total, reporting false when there is
// none.
func (f *fullness) reserve() bool {
	for {
		n := f.size.Load()
		if n >= f.total {
			return false
		}
		if f.size.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// sample records how full item it's key is after its result r: in the
// sample of c, the metrics of limit l of domain dom in cm. now is the
// fullness clock's reading, read (once per request, into *now) when an
// entry needs it; 0 means not yet. Leased limits are left out: an answer
// from a process's slice says what the slice holds, not what remains of
// the counter.
func (f *fullness) sample(cm *configMetrics, dom *config.Domain, c *limitMetrics, l *config.Limit, it *engine.Item, r *engine.Result, now *int64) {
	if it.Rule.Lease {
		return
	}
	capacity := it.Rule.Capacity()
	lv := levelOf(r.Remaining, capacity)
	ks := c.sample.Load()
	if lv == belowHalf && (ks == nil || ks.n.Load() == 0) {
		return // the common case
	}
	if ks == nil {
		if l.Index < 0 {
			capacity = 0 // a domain's overrides: one sample, any capacity
		}
		if ks = f.sampleFor(&c.sample, cm.fullGen, sampleID{dom.Name, l.Label}, capacity); ks == nil {
			return
		}
	}
	if *now == 0 {
		*now = f.clock()
	}
	ks.observe(it.Desc, lv, *now, *now+int64(r.Reset))
}

// forget takes the keys of c's items, whose counters a reset cleared, out
// of their limits' samples in cm.
func (f *fullness) forget(cm *configMetrics, c *service.Cleared) {
	for i, l := range c.Limits {
		if ks := cm.metricsOf(c.Domain, l).sample.Load(); ks != nil {
			ks.forget(c.Items[i].Desc)
		}
	}
}

// keySample is the sampled keys of one limit (or of one domain's request
// overrides): each key that a decision left at least half full, with its
// level and the instant its window resets, when the entry expires. The
// zero value is not usable: sampleFor makes them. Safe for concurrent use.
type keySample struct {
	f        *fullness
	capacity uint64       // the limit's when made (0: a domain's overrides)
	n        atomic.Int32 // len(entries), read without mu

	mu      sync.Mutex
	index   map[string]int32 // key → its entry; requires mu
	entries []sampleEntry    // requires mu
	dead    bool             // the limit left the config; requires mu
	// soonest is at most the earliest expiry of the entries (MaxInt64 for
	// none): a sweep before it finds nothing. Requires mu.
	soonest int64
	// floor, while the sample is full and nothing expired, is the lowest
	// level among the entries: keys below it are dropped without a scan.
	// Requires mu.
	floor   fullLevel
	scratch []int64 // requires mu
}

// sampleEntry is one sampled key.
type sampleEntry struct {
	key   string
	until int64 // on the fullness clock: its window resets, the entry expires
	level fullLevel
}

// observe records that a decision at now left key at level lv until its
// reset at until: a new entry, one updated in place, or one removed when
// the key is below half full again (a refund, a token bucket that
// refilled).
func (ks *keySample) observe(key string, lv fullLevel, now, until int64) {
	if until <= now {
		lv = belowHalf // resets at once: nothing to count
	}
	if lv == belowHalf && ks.n.Load() == 0 {
		return
	}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if ks.dead {
		return
	}
	if i, ok := ks.index[key]; ok {
		if lv == belowHalf {
			ks.remove(int(i))
			return
		}
		e := &ks.entries[i]
		if lv < e.level {
			ks.floor = belowHalf
		}
		e.level, e.until = lv, until
		ks.soonest = min(ks.soonest, until)
		return
	}
	if lv == belowHalf {
		return
	}
	if len(ks.entries) >= ks.f.perLimit || !ks.f.reserve() {
		if !ks.makeRoom(lv, now) || !ks.f.reserve() {
			ks.f.dropped.Inc()
			return
		}
	}
	key = strings.Clone(key) // not the request's buffer
	ks.index[key] = int32(len(ks.entries))
	ks.entries = append(ks.entries, sampleEntry{key: key, until: until, level: lv})
	ks.n.Store(int32(len(ks.entries)))
	ks.soonest = min(ks.soonest, until)
}

// forget takes key out of the sample, if it is in.
func (ks *keySample) forget(key string) {
	if ks.n.Load() == 0 {
		return
	}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if i, ok := ks.index[key]; ok && !ks.dead {
		ks.remove(int(i))
	}
}

// remove forgets entry i. Requires ks.mu held.
func (ks *keySample) remove(i int) {
	last := len(ks.entries) - 1
	delete(ks.index, ks.entries[i].key)
	if i != last {
		ks.entries[i] = ks.entries[last]
		ks.index[ks.entries[i].key] = int32(i)
	}
	ks.entries[last] = sampleEntry{}
	ks.entries = ks.entries[:last]
	ks.n.Store(int32(last))
	ks.f.size.Add(-1)
	ks.floor = belowHalf
}

// makeRoom frees places for a key of level lv in a full sample (or when
// all samples are): it forgets the expired entries, else evicts a sixteenth
// of the entries (at least one), the least full first and among those of
// one level the soonest to reset, of level lv or below. It reports whether
// it freed any. Requires ks.mu held.
func (ks *keySample) makeRoom(lv fullLevel, now int64) bool {
	if now >= ks.soonest && ks.compact(func(e *sampleEntry) bool { return e.until > now }) > 0 {
		return true
	}
	if lv < ks.floor {
		return false
	}
	var count [numLevels]int
	for i := range ks.entries {
		count[ks.entries[i].level]++
	}
	// Evict every entry below level cut, and need of level cut.
	want := max(1, len(ks.entries)/16)
	left, cut, need := want, belowHalf, 0
	for l := halfFull; l <= lv && left > 0; l++ {
		cut, need = l, min(count[l], left)
		left -= need
	}
	if left == want {
		for l := halfFull; l < numLevels; l++ {
			if count[l] > 0 {
				ks.floor = l // every entry is fuller than lv
				break
			}
		}
		return false
	}
	// Of level cut, those that reset before the need-th soonest, then as
	// many as needed of those that reset at that instant.
	threshold, ties := int64(math.MaxInt64), need
	if need < count[cut] {
		untils := ks.scratch[:0]
		for i := range ks.entries {
			if ks.entries[i].level == cut {
				untils = append(untils, ks.entries[i].until)
			}
		}
		threshold = nthSmallest(untils, need-1)
		for _, u := range untils {
			if u < threshold {
				ties--
			}
		}
		ks.scratch = untils[:0]
	}
	evicted := ks.compact(func(e *sampleEntry) bool {
		switch {
		case e.level > cut:
			return true
		case e.level < cut || e.until < threshold:
			return false
		case e.until == threshold && ties > 0:
			ties--
			return false
		}
		return true
	})
	ks.f.dropped.Add(float64(evicted))
	return evicted > 0
}

// compact keeps the entries for which keep is true and forgets the others,
// and returns how many it forgot. Requires ks.mu held.
func (ks *keySample) compact(keep func(*sampleEntry) bool) int {
	kept, soonest := 0, int64(math.MaxInt64)
	for i := range ks.entries {
		e := &ks.entries[i]
		if !keep(e) {
			delete(ks.index, e.key)
			continue
		}
		if kept != i {
			ks.entries[kept] = *e
			ks.index[e.key] = int32(kept)
		}
		soonest = min(soonest, e.until)
		kept++
	}
	gone := len(ks.entries) - kept
	clear(ks.entries[kept:])
	ks.entries = ks.entries[:kept]
	ks.n.Store(int32(kept))
	ks.f.size.Add(int64(-gone))
	ks.soonest, ks.floor = soonest, belowHalf
	return gone
}

// counts forgets the entries expired at now and returns how many of the
// others are at each level.
func (ks *keySample) counts(now int64) (c [numLevels]int) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if now >= ks.soonest {
		ks.compact(func(e *sampleEntry) bool { return e.until > now })
	}
	for i := range ks.entries {
		c[ks.entries[i].level]++
	}
	return c
}

// kill forgets every entry of a sample whose limit left the config; what
// decisions on the old config still record is ignored.
func (ks *keySample) kill() {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.dead = true
	ks.f.size.Add(int64(-len(ks.entries)))
	ks.entries, ks.index, ks.scratch = nil, nil, nil
	ks.n.Store(0)
}

// nthSmallest returns the k-th smallest of xs (from 0), reordering xs
// (quickselect, Hoare's partition around the median of three).
func nthSmallest(xs []int64, k int) int64 {
	lo, hi := 0, len(xs)-1
	for lo < hi {
		mid := lo + (hi-lo)/2
		// Order xs[lo] ≤ xs[mid] ≤ xs[hi]; the median is the pivot.
		if xs[mid] < xs[lo] {
			xs[mid], xs[lo] = xs[lo], xs[mid]
		}
		if xs[hi] < xs[lo] {
			xs[hi], xs[lo] = xs[lo], xs[hi]
		}
		if xs[hi] < xs[mid] {
			xs[hi], xs[mid] = xs[mid], xs[hi]
		}
		pivot := xs[mid]
		i, j := lo, hi
		for i <= j {
			for xs[i] < pivot {
				i++
			}
			for xs[j] > pivot {
				j--
			}
			if i <= j {
				xs[i], xs[j] = xs[j], xs[i]
				i++
				j--
			}
		}
		// xs[lo..j] ≤ pivot ≤ xs[i..hi], and xs[j+1..i-1] == pivot.
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return xs[k]
		}
	}
	return xs[k]
}
