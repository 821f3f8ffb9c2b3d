package topkeys

import (
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/service"
)

// Defaults of Options.
const (
	DefaultK     = 64
	DefaultEvery = time.Second
)

// Options configure Keys.
type Options struct {
	// K is the number of keys kept per limit in each ranking (denied,
	// fullness): the sketch's size. 0 means DefaultK.
	K int
	// Now is the clock that cuts windows: the store's clock where a test
	// moves it; nil means time.Now.
	Now func() time.Time
	// Process names this process among those that publish on Board (a
	// name no other process has).
	Process string
	// Board, when not nil, is where the processes sharing the store
	// publish their summaries (Publish) and read each other's (Top).
	Board Board
	// Every is how often Publish publishes; 0 means DefaultEvery. A
	// summary stays on the board three times as long.
	Every  time.Duration
	Logger *slog.Logger
}

// Keys is the top keys of every limit of the current config: a
// service.Observer. Safe for concurrent use.
type Keys struct {
	k       int
	now     func() time.Time
	process string
	board   Board
	every   time.Duration
	log     *slog.Logger
	failed  rate.Sometimes // bounds the log of failed publications

	mu   sync.Mutex                // guards kept
	kept map[limitID]*limitSketch  // the current config's sketches, by identity
	cur  atomic.Pointer[configSet] // the current config's
}

var _ service.Observer = (*Keys)(nil)

// New returns the top keys of opts.
func New(opts Options) *Keys {
	k := &Keys{k: opts.K, now: opts.Now, process: opts.Process, board: opts.Board, every: opts.Every, log: opts.Logger,
		failed: rate.Sometimes{Interval: time.Minute}}
	if k.k <= 0 {
		k.k = DefaultK
	}
	if k.now == nil {
		k.now = time.Now
	}
	if k.every <= 0 {
		k.every = DefaultEvery
	}
	if k.log == nil {
		k.log = slog.New(slog.DiscardHandler)
	}
	return k
}

// K returns the keys kept per limit and ranking.
func (k *Keys) K() int { return k.k }

// MaxBytes bounds the memory the sketch of one limit holds, whatever the
// number of distinct keys: 2K entries of at most entryBytes each (an
// entry holds a key's identity and its descriptor shortened to 128 bytes
// a key or value; a usual one takes 250 to 400 bytes).
func (k *Keys) MaxBytes() int64 { return 2 * int64(k.k) * entryBytes() }

// limitID identifies a limit across configs: a reload that keeps a limit
// (same domain, node, label and counter) keeps its sketch.
type limitID struct{ domain, path, label, rule string }

// configSet is what ForConfig makes of a config: the sketch of each limit.
type configSet struct {
	cfg     *config.Config
	byIndex []*limitSketch // by Limit.Index; nil for an unlimited one
	order   []*limitSketch // in config order (domains by name)
}

// limitSketch is one limit's sketch with what names it. Its sketch is made
// at its first decision.
type limitSketch struct {
	domain string
	path   []config.Entry // the config node's path: key and value per level
	label  string
	limit  atomic.Pointer[config.Limit] // of the latest config that has it

	mu         sync.Mutex
	start, end int64   // µs: the window sk holds; end 0 before the first decision
	sk         *sketch // nil before the first decision
	k          int
}

// ForConfig implements service.Observer: the sketches of cfg's limits,
// those of the previous config's that cfg keeps carried over.
func (k *Keys) ForConfig(cfg *config.Config) any {
	cs := &configSet{cfg: cfg, byIndex: make([]*limitSketch, len(cfg.Limits()))}
	k.mu.Lock()
	defer k.mu.Unlock()
	kept := make(map[limitID]*limitSketch, len(k.kept))
	for _, d := range cfg.Domains() {
		for _, l := range limitsOf(d.Descriptors, nil) {
			if l.Rule == nil {
				continue
			}
			id := limitID{domain: d.Name, path: l.Descriptor.Path, label: l.Label, rule: l.Rule.ID + "/" + ruleShape(l.Rule)}
			ls := k.kept[id]
			if ls == nil {
				ls = kept[id]
			}
			if ls == nil {
				ls = &limitSketch{domain: d.Name, path: l.Descriptor.PathEntries(), label: l.Label, k: k.k}
			}
			ls.limit.Store(l)
			kept[id] = ls
			cs.byIndex[l.Index] = ls
			cs.order = append(cs.order, ls)
		}
	}
	k.kept = kept
	k.cur.Store(cs)
	return cs
}

// ruleShape is what of a rule makes a sketch's counts meaningless when it
// changes: the limit and burst (fullness is relative to them).
func ruleShape(r *engine.Rule) string {
	var b strings.Builder
	b.WriteString(r.Algorithm())
	b.WriteByte(':')
	b.WriteString(strconv.FormatUint(r.Capacity(), 10))
	return b.String()
}

// limitsOf appends the limits of nodes and their subtrees, in config order.
func limitsOf(nodes []*config.Descriptor, dst []*config.Limit) []*config.Limit {
	for _, n := range nodes {
		dst = append(dst, n.Limits...)
		dst = limitsOf(n.Children, dst)
	}
	return dst
}

// Reloaded implements service.Observer: nothing to do.
func (k *Keys) Reloaded(error) {}

// Decided implements service.Observer: each limit's verdict on its key,
// and how full it left it. Request overrides (a request's own limit) are
// not kept.
func (k *Keys) Decided(state any, d *service.Decision) {
	cs, _ := state.(*configSet)
	if cs == nil || len(d.Items) == 0 {
		return
	}
	var now int64 // read once, at the first limit kept
	for i := range d.Items {
		l := d.Limits[i]
		if l.Index < 0 || l.Index >= len(cs.byIndex) || cs.byIndex[l.Index] == nil {
			continue
		}
		if now == 0 {
			now = k.now().UnixMicro()
		}
		it, r := &d.Items[i], &d.Results[i]
		cs.byIndex[l.Index].observe(now, it.Rule, it.Desc, d.Request.Descriptors[d.Owners[i]].Entries, verdictOf(it, r))
	}
}

// Cleared implements service.Observer: a reset key leaves the sketches of
// the limits reset.
func (k *Keys) Cleared(state any, c *service.Cleared) {
	cs, _ := state.(*configSet)
	if cs == nil {
		return
	}
	for i, l := range c.Limits {
		if l.Index < 0 || l.Index >= len(cs.byIndex) || cs.byIndex[l.Index] == nil {
			continue
		}
		ls := cs.byIndex[l.Index]
		ls.mu.Lock()
		if ls.sk != nil {
			ls.sk.remove(c.Items[i].Desc)
		}
		ls.mu.Unlock()
	}
}

// verdictOf is a limit's decision on its key: its verdict, how full it
// left the key (the share of the limit, a token bucket's burst, spent; 1
// for a key blocked by a penalty) and the hits its counter holds. A leased
// limit's result tells what the process's slice holds, not the counter:
// it reads full when denied, else empty.
func verdictOf(it *engine.Item, r *engine.Result) verdict {
	v := verdict{admitted: r.Admitted}
	c := it.Rule.Capacity()
	switch {
	case it.Rule.Lease:
		if !r.Admitted {
			v.fullness = 1
		}
		return v
	case r.Remaining < c:
		v.used = c - r.Remaining
	}
	switch {
	case r.Blocked || c == 0:
		v.fullness = 1
	default:
		v.fullness = float64(v.used) / float64(c)
	}
	return v
}

// observe counts one decision at now (µs) in the sketch of the window
// holding now. An instant before the window's start (a clock that stepped
// back) counts in the window held.
func (ls *limitSketch) observe(now int64, r *engine.Rule, id string, entries []config.Entry, v verdict) {
	ls.mu.Lock()
	if now >= ls.end {
		ls.roll(r, now)
	}
	ls.sk.observe(id, entries, v)
	ls.mu.Unlock()
}

// roll makes the sketch that of the window holding now. Requires ls.mu
// held.
func (ls *limitSketch) roll(r *engine.Rule, now int64) {
	ls.start, ls.end = windowOf(r, now)
	if ls.sk == nil {
		ls.sk = newSketch(ls.k)
		return
	}
	ls.sk.reset()
}

// windowOf returns the window of r holding now (µs): a calendar window, or
// the epoch-aligned period of r's window (a fixed window's own; for the
// algorithms whose window slides or that refill, the period of their
// length that holds now).
func windowOf(r *engine.Rule, now int64) (start, end int64) {
	if b, ok := r.CalendarBounds(now); ok {
		return b[1], b[2]
	}
	w := max(r.Window.Microseconds(), 1)
	start = now - now%w
	if now < 0 && now%w != 0 {
		start -= w
	}
	return start, start + w
}
