package topkeys

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rlsproject/rls/internal/config"
)

// Board is where the processes sharing a store publish their summaries to
// each other: a note per process that expires unless pinned again. The
// running server gives one on Redis (redisstore.Board); nil on a store
// that one process holds.
type Board interface {
	// Pin puts note under id, replacing id's, for ttl.
	Pin(ctx context.Context, id string, note []byte, ttl time.Duration) error
	// Unpin takes id's note off.
	Unpin(ctx context.Context, id string) error
	// Notes returns every note not expired, by id.
	Notes(ctx context.Context) (map[string][]byte, error)
}

// MaxNote bounds a published summary: past it, fewer keys per limit are
// published (the least denied and least full go first).
const MaxNote = 4 << 20

// Order is what Top ranks keys by.
type Order uint8

// The orders.
const (
	ByDenied Order = iota
	ByFullness
)

// ParseOrder parses denied|fullness ("" is denied).
func ParseOrder(s string) (Order, error) {
	switch s {
	case "", "denied":
		return ByDenied, nil
	case "fullness":
		return ByFullness, nil
	}
	return 0, fmt.Errorf("%q is not denied or fullness", s)
}

func (o Order) String() string {
	if o == ByFullness {
		return "fullness"
	}
	return "denied"
}

// DefaultN is how many keys Top gives per limit when the query says none.
const DefaultN = 10

// Query asks Top for the keys of the limits of Domain ("" for every
// domain) named Name ("" for every limit; a limit's label, or its name),
// at most N per limit (0: DefaultN; at most K), heaviest first By.
type Query struct {
	Domain, Name string
	By           Order
	N            int
}

// Result is Top's answer.
type Result struct {
	Limits []LimitTop
	// Processes is how many processes' summaries it merges: this one and
	// the others whose summaries the board holds.
	Processes int
	// Note says what is missing from it (the board could not be read), ""
	// when nothing is.
	Note string
}

// LimitTop is the top keys of one limit, over its current window.
type LimitTop struct {
	Domain string
	// Path is the limit's config node: key and value per level (value ""
	// for any value).
	Path []config.Entry
	// Name is the limit's label (its name when it has one).
	Name string
	// Limit is the limit in this process's config; nil for a limit that
	// only other processes have.
	Limit       *config.Limit
	WindowStart time.Time
	WindowEnd   time.Time
	// Denials and Decisions are the window's, summed over the processes.
	Denials, Decisions uint64
	// Error bounds how much a key's Denied may exceed its true denials
	// (the sum over the processes of their sketches' least count, at most
	// Denials/K): true denials are in [Denied−Error, Denied].
	Error uint64
	Keys  []KeyTop
}

// KeyTop is one key of a limit.
type KeyTop struct {
	// ID is the counter's identity (engine.AppendDescriptorKey).
	ID string
	// Entries are the descriptor; Shortened says that a key or value was
	// cut (at 128 bytes, then "…" and a hash).
	Entries   []config.Entry
	Shortened bool
	// Denied is an upper bound of the key's denials in the window, and
	// Denied−Error a lower bound.
	Denied, Error uint64
	// Admitted is the key's admissions in the window: counted since the
	// key entered the sketch, plus the hits its counter held then (exact
	// on one process for fixed and calendar windows of one hit per
	// request); over processes, the most any one saw.
	Admitted uint64
	// Fullness is how much of the limit the key had spent at its latest
	// decision (0 to 1): the most any process saw.
	Fullness float64
}

// The published summary of a process (the board's note), in JSON.
type note struct {
	V       int            `json:"v"`
	Process string         `json:"process"`
	At      int64          `json:"at"` // µs
	Limits  []limitSummary `json:"limits"`
}

const noteVersion = 1

// limitSummary is one limit's sketch, as published.
type limitSummary struct {
	Domain    string      `json:"domain"`
	Path      [][2]string `json:"path"`
	Name      string      `json:"name"`
	Start     int64       `json:"start"` // µs
	End       int64       `json:"end"`
	K         int         `json:"k"`
	Denials   uint64      `json:"denials"`
	Decisions uint64      `json:"decisions"`
	// LeastDenied is the least count of a full denied ranking (what a key
	// absent from it may have been denied there at most), else 0.
	LeastDenied uint64       `json:"least_denied,omitempty"`
	Keys        []keySummary `json:"keys"`

	limit *config.Limit // this process's; not published
}

// keySummary is one entry, as published.
type keySummary struct {
	ID       string      `json:"id"`
	Entries  [][2]string `json:"entries"`
	Short    bool        `json:"short,omitempty"`
	InDenied bool        `json:"in_denied,omitempty"`
	Count    uint64      `json:"count,omitempty"`
	Err      uint64      `json:"err,omitempty"`
	InFull   bool        `json:"in_full,omitempty"`
	Denied   uint64      `json:"denied,omitempty"`
	Admitted uint64      `json:"admitted,omitempty"`
	Fullness float64     `json:"fullness,omitempty"`
}

// snapshot returns the summaries of the current config's limits that q's
// domain and name select (all with a zero Query's), over their windows
// holding now, with at most keys entries per ranking (0: all).
func (k *Keys) snapshot(now int64, q Query, keys int) []limitSummary {
	cs := k.cur.Load()
	if cs == nil {
		return nil
	}
	var out []limitSummary
	for _, ls := range cs.order {
		l := ls.limit.Load()
		if !q.selects(ls.domain, ls.label, l) {
			continue
		}
		out = append(out, ls.summary(now, keys, l))
	}
	return out
}

// selects reports whether q asks for the limit label of domain (l its
// limit here, nil for another process's).
func (q Query) selects(domain, label string, l *config.Limit) bool {
	if q.Domain != "" && q.Domain != domain {
		return false
	}
	return q.Name == "" || q.Name == label || (l != nil && l.Name == q.Name)
}

// summary returns ls's summary over the window holding now (empty when ls
// holds another), with at most keys entries per ranking (0: all).
func (ls *limitSketch) summary(now int64, keys int, l *config.Limit) limitSummary {
	s := limitSummary{Domain: ls.domain, Name: ls.label, K: ls.k, limit: l, Path: pairs(ls.path)}
	if l != nil && l.Rule != nil {
		s.Start, s.End = windowOf(l.Rule, now)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.sk == nil || now < ls.start || now >= ls.end {
		return s
	}
	sk := ls.sk
	s.Start, s.End = ls.start, ls.end
	s.Denials, s.Decisions, s.LeastDenied = sk.denials, sk.decisions, sk.leastDenied()
	pick := func(h []*entry, heavier func(a, b *entry) int) []*entry {
		if keys <= 0 || len(h) <= keys {
			return h
		}
		c := slices.Clone(h)
		slices.SortFunc(c, heavier)
		return c[:keys]
	}
	seen := make(map[*entry]bool)
	add := func(e *entry) {
		if seen[e] {
			return
		}
		seen[e] = true
		ks := keySummary{ID: e.id, Entries: pairs(e.entries), Short: e.short, InDenied: e.di >= 0, InFull: e.fi >= 0,
			Denied: e.denied, Admitted: e.admitted, Fullness: e.fullness}
		if ks.InDenied {
			ks.Count, ks.Err = e.count, e.err
		}
		s.Keys = append(s.Keys, ks)
	}
	for _, e := range pick(sk.denied.items, func(a, b *entry) int { return cmp.Compare(b.count, a.count) }) {
		add(e)
	}
	for _, e := range pick(sk.full.items, func(a, b *entry) int { return cmp.Compare(b.fullness, a.fullness) }) {
		add(e)
	}
	return s
}

func pairs(entries []config.Entry) [][2]string {
	out := make([][2]string, len(entries))
	for i, e := range entries {
		out[i] = [2]string{e.Key, e.Value}
	}
	return out
}

func unpairs(p [][2]string) []config.Entry {
	out := make([]config.Entry, len(p))
	for i, kv := range p {
		out[i] = config.Entry{Key: kv[0], Value: kv[1]}
	}
	return out
}

// Top returns the keys q asks for: this process's sketches merged with the
// summaries the other processes published on the board (when there is
// one). A board that cannot be read leaves the others out and says so in
// Note; Top itself does not fail.
func (k *Keys) Top(ctx context.Context, q Query) (*Result, error) {
	if q.N <= 0 {
		q.N = DefaultN
	}
	q.N = min(q.N, k.k)
	now := k.now().UnixMicro()
	all := [][]limitSummary{k.snapshot(now, q, 0)}
	res := &Result{Processes: 1}
	if k.board != nil {
		notes, err := k.board.Notes(ctx)
		if err != nil {
			res.Note = "the other processes' summaries could not be read: " + err.Error()
		}
		for id, b := range notes {
			if id == k.process {
				continue
			}
			var n note
			if err := json.Unmarshal(b, &n); err != nil || n.V != noteVersion {
				continue // another version's, or damaged: not counted
			}
			var sel []limitSummary
			for _, s := range n.Limits {
				if q.selects(s.Domain, s.Name, nil) && s.End > now {
					sel = append(sel, s)
				}
			}
			all = append(all, sel)
			res.Processes++
		}
	}
	res.Limits = merge(all, now, q)
	return res, nil
}

// merge merges the summaries of each process (all[0] this one's), limit by
// limit (domain, node, name and window), and ranks each limit's keys as q
// says. The limits come in this process's config order, then those only
// the others have, by domain and name.
func merge(all [][]limitSummary, now int64, q Query) []LimitTop {
	type group struct {
		top   LimitTop
		parts []*limitSummary
	}
	var order []*group
	byKey := map[string]*group{}
	for _, proc := range all {
		for i := range proc {
			s := &proc[i]
			key := fmt.Sprintf("%s\x00%q\x00%s\x00%d", s.Domain, s.Path, s.Name, s.Start)
			g := byKey[key]
			if g == nil {
				g = &group{top: LimitTop{Domain: s.Domain, Path: unpairs(s.Path), Name: s.Name, Limit: s.limit,
					WindowStart: time.UnixMicro(s.Start).UTC(), WindowEnd: time.UnixMicro(s.End).UTC()}}
				byKey[key] = g
				order = append(order, g)
			}
			g.parts = append(g.parts, s)
		}
	}
	out := make([]LimitTop, 0, len(order))
	local := len(all[0])
	for _, g := range order {
		g.top.Keys = mergeKeys(&g.top, g.parts, q)
		out = append(out, g.top)
	}
	// This process's first (as built), then the others' by domain and name.
	if rest := out[min(local, len(out)):]; len(rest) > 1 {
		slices.SortStableFunc(rest, func(a, b LimitTop) int {
			return cmp.Or(cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Name, b.Name))
		})
	}
	return out
}

// mergeKeys merges the keys of one limit's summaries (one per process)
// into top's totals and returns the q.N heaviest by q.By.
//
// A key's Denied sums, per process, its count where the denied ranking
// holds it, and that ranking's least count where it does not but is full
// (the most the key may have been denied there); Error sums the errors so
// counted, so the true denials are in [Denied−Error, Denied]. Admitted
// and Fullness are the most any process saw (they share the key's
// counter).
func mergeKeys(top *LimitTop, parts []*limitSummary, q Query) []KeyTop {
	type merged struct {
		KeyTop
		inDenied, inFull bool
		denied           []bool // by part: the part's denied ranking holds it
		lowDenied        uint64 // sum of denials counted since it came in, where no ranking counts it
	}
	var keys []*merged
	byID := map[string]*merged{}
	for pi, s := range parts {
		top.Denials += s.Denials
		top.Decisions += s.Decisions
		top.Error += s.LeastDenied
		for _, ks := range s.Keys {
			m := byID[ks.ID]
			if m == nil {
				m = &merged{KeyTop: KeyTop{ID: ks.ID, Entries: unpairs(ks.Entries), Shortened: ks.Short}, denied: make([]bool, len(parts))}
				byID[ks.ID] = m
				keys = append(keys, m)
			}
			m.Admitted = max(m.Admitted, ks.Admitted)
			m.Fullness = max(m.Fullness, ks.Fullness)
			m.inFull = m.inFull || ks.InFull
			if ks.InDenied {
				m.inDenied = true
				m.denied[pi] = true
				m.Denied += ks.Count
				m.Error += ks.Err
			} else {
				m.lowDenied += ks.Denied
			}
		}
	}
	var picked []*merged
	for _, m := range keys {
		if m.inDenied {
			for pi, s := range parts {
				if !m.denied[pi] {
					m.Denied += s.LeastDenied
					m.Error += s.LeastDenied
				}
			}
		} else {
			// In no denied ranking: what was counted since it came in.
			m.Denied = m.lowDenied
		}
		if (q.By == ByDenied && m.inDenied) || (q.By == ByFullness && m.inFull) {
			picked = append(picked, m)
		}
	}
	slices.SortFunc(picked, func(a, b *merged) int {
		if q.By == ByFullness {
			if c := cmp.Compare(b.Fullness, a.Fullness); c != 0 {
				return c
			}
		}
		return cmp.Or(cmp.Compare(b.Denied, a.Denied), cmp.Compare(b.Fullness, a.Fullness), strings.Compare(a.ID, b.ID))
	})
	out := make([]KeyTop, 0, min(q.N, len(picked)))
	for _, m := range picked[:min(q.N, len(picked))] {
		out = append(out, m.KeyTop)
	}
	return out
}

// PublishOnce publishes this process's summary on the board: every limit
// with decisions in its current window, at most K keys per ranking, fewer
// when the note would pass MaxNote.
func (k *Keys) PublishOnce(ctx context.Context) error {
	if k.board == nil {
		return nil
	}
	now := k.now().UnixMicro()
	var b []byte
	for keys := k.k; ; keys /= 2 {
		n := note{V: noteVersion, Process: k.process, At: now}
		for _, s := range k.snapshot(now, Query{}, keys) {
			if s.Decisions > 0 {
				n.Limits = append(n.Limits, s)
			}
		}
		var err error
		if b, err = json.Marshal(n); err != nil {
			return err
		}
		if len(b) <= MaxNote || keys <= 1 {
			break
		}
	}
	return k.board.Pin(ctx, k.process, b, 3*k.every)
}

// Publish publishes this process's summary on the board every Every until
// ctx ends, then takes it off. Without a board it returns at once.
func (k *Keys) Publish(ctx context.Context) {
	if k.board == nil {
		return
	}
	t := time.NewTicker(k.every)
	defer t.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, k.every)
		if err := k.PublishOnce(pctx); err != nil && ctx.Err() == nil {
			k.failed.Do(func() {
				k.log.Warn("top keys: the summary could not be published; other processes do not see this one's", "error", err)
			})
		}
		cancel()
		select {
		case <-ctx.Done():
			uctx, cancel := context.WithTimeout(context.Background(), time.Second)
			k.board.Unpin(uctx, k.process)
			cancel()
			return
		case <-t.C:
		}
	}
}
