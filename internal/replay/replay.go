package replay

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/decisionlog"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/service"
)

// Options configure a replay.
type Options struct {
	// Candidate is the config tried; CandidateName names it in the report.
	Candidate     *config.Config
	CandidateName string
	// Baseline, when not nil, is what the candidate is compared with;
	// otherwise each record's config (the one its log's header names,
	// through Load, when its files still load as that version), else the
	// candidate.
	Baseline     *config.Config
	BaselineName string
	// Load loads the config of a log's header from its files; nil loads
	// none.
	Load func(files []string) (*config.Config, error)
	// Keys is how many changed keys the report lists per limit (0: 10).
	Keys int
	// MemoryBytes bounds each replay store (0: 1 GiB): a log of more keys
	// than it holds replays inexactly (the store evicts).
	MemoryBytes int64
}

// sampledKey is the entry of the descriptor that stands, in a replayed
// request, for the verdicts of the descriptors the log sampled out: a
// request override of 0 that denies when one of them denied.
var sampledKey = config.Entry{Key: "rls-replay", Value: "sampled-out"}

// Run replays logs (each a log's records in the order of its file) and
// reports. The decisions and resets of all logs are replayed in time
// order (the order of the files for equal instants).
func Run(logs [][]*decisionlog.Record, opts Options) (*Report, error) {
	if opts.Candidate == nil {
		return nil, fmt.Errorf("replay: no candidate config")
	}
	if opts.Keys <= 0 {
		opts.Keys = 10
	}
	if opts.MemoryBytes <= 0 {
		opts.MemoryBytes = 1 << 30
	}
	r := &runner{opts: opts, headers: map[string]*decisionlog.Record{}, loaded: map[string]*config.Config{}, limits: map[string]*limitStats{}}
	var recs [][]*decisionlog.Record // by log: its decisions and resets
	for _, log := range logs {
		var mine []*decisionlog.Record
		for _, rec := range log {
			switch rec.Kind {
			case decisionlog.Header:
				if h := r.headers[rec.Config]; h == nil {
					r.headers[rec.Config] = rec
				}
				if r.switches == nil {
					sw := rec.Switches
					r.switches = &sw
				} else if *r.switches != rec.Switches {
					r.note("the logs' headers differ in the server's switches (count_denied_hits, shadow, quota_all): the first one's are used")
				}
				if rec.Sample < 1 {
					r.sample = min(r.sample, rec.Sample)
				}
				if rec.Hashed {
					r.hashed = true
				}
			default:
				mine = append(mine, rec)
			}
		}
		recs = append(recs, mine)
	}
	if r.switches == nil {
		r.switches = &decisionlog.Switches{}
	}
	r.base, r.cand = r.newSide(), r.newSide()
	defer r.base.store.Close()
	defer r.cand.store.Close()
	r.cand.svc.SetConfig(opts.Candidate)
	r.cand.cfg = opts.Candidate
	for rec := range merged(recs) {
		if err := r.replay(rec); err != nil {
			return nil, err
		}
	}
	return r.report(), nil
}

// merged yields the records of logs in time order, each log's in its own
// order: the next record is the earliest of the logs' next ones (the
// first log's for equal instants). A log's records are in the order their
// decisions were made, which a clock that stepped back puts out of time
// order: that order is kept.
func merged(logs [][]*decisionlog.Record) func(yield func(*decisionlog.Record) bool) {
	return func(yield func(*decisionlog.Record) bool) {
		next := make([]int, len(logs))
		for {
			best := -1
			for i, log := range logs {
				if next[i] < len(log) && (best < 0 || log[next[i]].Time.Before(logs[best][next[best]].Time)) {
					best = i
				}
			}
			if best < 0 {
				return
			}
			rec := logs[best][next[best]]
			next[best]++
			if !yield(rec) {
				return
			}
		}
	}
}

// runner is one replay.
type runner struct {
	opts       Options
	headers    map[string]*decisionlog.Record // by config version
	loaded     map[string]*config.Config      // the baselines loaded, by version
	baseNames  map[string]string              // what each version's baseline is, for the report
	switches   *decisionlog.Switches
	sample     float64
	hashed     bool
	clk        clock
	base, cand *side
	limits     map[string]*limitStats // by domain and name
	rep        Report
	notes      map[string]bool
}

// side is the service of one config on its own store.
type side struct {
	store *memstore.Store
	svc   *service.Service
	cfg   *config.Config
	seen  *collector
}

// clock is the replay's virtual clock. Safe for concurrent use (the
// stores' sweepers read it).
type clock struct{ us atomic.Int64 }

func (c *clock) set(t time.Time) { c.us.Store(t.UnixMicro()) }
func (c *clock) now() time.Time  { return time.UnixMicro(c.us.Load()).UTC() }

func (r *runner) newSide() *side {
	s := &side{seen: &collector{}}
	s.store = memstore.New(memstore.Options{Now: r.clk.now, SweepEvery: time.Hour, MaxBytes: r.opts.MemoryBytes})
	s.svc = service.New(service.Options{Store: s.store, Now: r.clk.now, Observers: []service.Observer{s.seen},
		CountDeniedHits: r.switches.CountDeniedHits, ShadowAll: r.switches.Shadow, QuotaAll: r.switches.QuotaAll})
	return s
}

func (r *runner) note(s string) {
	if r.notes == nil {
		r.notes = map[string]bool{}
	}
	if !r.notes[s] {
		r.notes[s] = true
		r.rep.Notes = append(r.rep.Notes, s)
	}
}

// baselineFor returns the baseline of a record made on config version.
func (r *runner) baselineFor(version string) *config.Config {
	if r.opts.Baseline != nil {
		return r.opts.Baseline
	}
	if c, ok := r.loaded[version]; ok {
		return c
	}
	c := r.loadBaseline(version)
	r.loaded[version] = c
	if r.baseNames == nil {
		r.baseNames = map[string]string{}
	}
	if c == r.opts.Candidate {
		r.baseNames[version] = "the candidate (for the log's config " + version + ")"
	} else {
		r.baseNames[version] = "the log's config " + version + " (" + strings.Join(r.headers[version].Files, ", ") + ")"
	}
	return c
}

func (r *runner) loadBaseline(version string) *config.Config {
	h := r.headers[version]
	switch {
	case version == "" || h == nil:
		r.note(fmt.Sprintf("no header names the files of config %q: its records' baseline is the candidate", version))
		return r.opts.Candidate
	case r.opts.Load == nil:
		return r.opts.Candidate
	}
	cfg, err := r.opts.Load(h.Files)
	if err != nil {
		r.note(fmt.Sprintf("the log's config %s (%s) does not load (%v): its records' baseline is the candidate; give --baseline", version, strings.Join(h.Files, ", "), err))
		return r.opts.Candidate
	}
	if v := decisionlog.ConfigVersion(cfg); v != version {
		r.note(fmt.Sprintf("the files of the log's config %s (%s) hold version %s now: its records' baseline is the candidate; give --baseline", version, strings.Join(h.Files, ", "), v))
		return r.opts.Candidate
	}
	return cfg
}

// request builds the request that replays rec: its descriptors that the
// log keeps whole, and, when one of those it sampled out denied, the
// descriptor that denies in their stead. owners maps the request's
// descriptors to rec's (-1 for that one).
func request(rec *decisionlog.Record) (req *service.Request, owners []int, err error) {
	req = &service.Request{Domain: rec.Domain}
	sampledDenied := false
	for _, v := range rec.Limits {
		if rec.Descriptors[v.Descriptor].Sampled && !v.Admitted && !v.Shadow {
			sampledDenied = true
		}
	}
	for i, d := range rec.Descriptors {
		if d.Sampled {
			continue
		}
		sd := service.Descriptor{Entries: d.Entries, HasHits: true, Hits: d.Hits, Refund: d.Refund}
		if o := d.Override; o != nil {
			u, _ := engine.ParseUnit(o.Unit) // checked by the reader
			sd.Override = &service.Override{RequestsPerUnit: o.RequestsPerUnit, Unit: u, UnitMultiplier: o.UnitMultiplier}
		}
		req.Descriptors = append(req.Descriptors, sd)
		owners = append(owners, i)
	}
	if sampledDenied {
		req.Descriptors = append(req.Descriptors, service.Descriptor{Entries: []config.Entry{sampledKey}, HasHits: true, Hits: 1,
			Override: &service.Override{RequestsPerUnit: 0, Unit: engine.Second}})
		owners = append(owners, -1)
	}
	return req, owners, nil
}

// replay replays one decision or reset.
func (r *runner) replay(rec *decisionlog.Record) error {
	ctx := context.Background()
	if rec.Kind == decisionlog.Decision && (rec.Code == "UNAVAILABLE" || rec.Error != "") {
		r.rep.Skipped++ // the store failed: nothing was counted
		return nil
	}
	req, owners, err := request(rec)
	if err != nil {
		return err
	}
	if len(req.Descriptors) == 0 {
		r.rep.Skipped++
		return nil
	}
	r.clk.set(rec.Time)
	if baseline := r.baselineFor(rec.Config); r.base.cfg != baseline {
		r.base.svc.SetConfig(baseline)
		r.base.cfg = baseline
	}
	if rec.Kind == decisionlog.Reset {
		for _, s := range []*side{r.base, r.cand} {
			if _, err := s.svc.Reset(ctx, req); err != nil {
				return fmt.Errorf("line %d: reset: %w", rec.Line, err)
			}
		}
		r.rep.Resets++
		return nil
	}
	var codes [2]service.Code
	for i, s := range []*side{r.base, r.cand} {
		s.seen.reset()
		resp, err := s.svc.ShouldRateLimit(ctx, req)
		if err != nil {
			return fmt.Errorf("line %d: %w", rec.Line, err)
		}
		codes[i] = resp.Code
		for _, v := range s.seen.verdicts {
			if o := owners[v.owner]; o >= 0 {
				r.count(i, s.cfg, v, rec.Time)
			}
		}
	}
	r.rep.Decisions++
	if len(owners) != len(rec.Descriptors) {
		r.rep.Sampled++
	}
	if codes[0].String() == rec.Code {
		r.rep.Reproduced++
	} else if len(r.rep.NotReproduced) < 10 {
		r.rep.NotReproduced = append(r.rep.NotReproduced, Mismatch{Line: rec.Line, Time: rec.Time, Logged: rec.Code, Replayed: codes[0].String()})
	}
	if codes[0] != codes[1] {
		r.rep.Changed++
		if codes[1] == service.OverLimit {
			r.rep.NewlyDenied++
		} else {
			r.rep.NewlyAdmitted++
		}
	}
	if r.rep.From.IsZero() {
		r.rep.From = rec.Time
	}
	r.rep.To = rec.Time
	return nil
}

// collector keeps the verdicts of the decision in progress: a side
// replays one request at a time.
type collector struct{ verdicts []verdict }

type verdict struct {
	owner    int
	limit    *config.Limit
	domain   string
	desc     string
	entries  []config.Entry
	admitted bool
}

func (c *collector) reset()                        { c.verdicts = c.verdicts[:0] }
func (c *collector) ForConfig(*config.Config) any  { return nil }
func (c *collector) Reloaded(error)                {}
func (c *collector) Cleared(any, *service.Cleared) {}
func (c *collector) Decided(_ any, d *service.Decision) {
	for i := range d.Items {
		c.verdicts = append(c.verdicts, verdict{owner: d.Owners[i], limit: d.Limits[i], domain: d.Request.Domain,
			desc: strings.Clone(d.Items[i].Desc), entries: d.Request.Descriptors[d.Owners[i]].Entries, admitted: d.Results[i].Admitted})
	}
}

// count counts a limit's verdict on side i (0 baseline, 1 candidate).
func (r *runner) count(i int, cfg *config.Config, v verdict, at time.Time) {
	if v.limit.Index < 0 {
		return // a request's own limit
	}
	key := v.domain + "\x00" + v.limit.Label
	ls := r.limits[key]
	if ls == nil {
		ls = &limitStats{domain: v.domain, name: v.limit.Label, keys: map[string]*keyStats{}}
		r.limits[key] = ls
	}
	if i == 1 || ls.limit == nil {
		ls.limit, ls.index = v.limit, v.limit.Index
		if i == 1 {
			ls.inCandidate = true
		}
	}
	ks := ls.keys[v.desc]
	if ks == nil {
		ks = &keyStats{entries: v.entries}
		ls.keys[v.desc] = ks
	}
	side := &ls.sides[i]
	if v.admitted {
		side.Admitted++
		if ks.admitted[i] == 0 {
			side.KeysAdmitted++
		}
		ks.admitted[i]++
		return
	}
	side.Denied++
	if ks.denied[i] == 0 {
		side.KeysDenied++
		ks.firstDenied[i] = at
	}
	ks.denied[i]++
}

type limitStats struct {
	domain, name string
	limit        *config.Limit // the candidate's when it has it, else the baseline's
	index        int
	inCandidate  bool
	sides        [2]Counts
	keys         map[string]*keyStats // by counter identity
}

type keyStats struct {
	entries          []config.Entry
	admitted, denied [2]uint64
	firstDenied      [2]time.Time
}

// report builds the report.
func (r *runner) report() *Report {
	rep := r.rep
	rep.Candidate = r.opts.CandidateName
	rep.Baseline = r.opts.BaselineName
	if rep.Baseline == "" {
		var names []string
		for _, n := range r.baseNames {
			names = append(names, n)
		}
		slices.Sort(names)
		rep.Baseline = strings.Join(names, "; ")
	}
	if r.sample > 0 && r.sample < 1 {
		r.note(fmt.Sprintf("the log keeps %g of the keys: the counts are those of the kept keys; the verdicts of the limits of keys sampled out are taken as logged", r.sample))
		rep.Notes = r.rep.Notes
	}
	if r.hashed {
		r.note("the log's values are keyed hashes where the config did not name them: a candidate that names other values exactly (or adds wildcards) does not see them")
		rep.Notes = r.rep.Notes
	}
	var all []*limitStats
	for _, ls := range r.limits {
		all = append(all, ls)
	}
	slices.SortFunc(all, func(a, b *limitStats) int {
		return cmp.Or(cmp.Compare(a.domain, b.domain), cmpBool(b.inCandidate, a.inCandidate), cmp.Compare(a.index, b.index), cmp.Compare(a.name, b.name))
	})
	for _, ls := range all {
		lr := LimitReport{Domain: ls.domain, Name: ls.name, Descriptor: entriesJSON(ls.limit.Descriptor.PathEntries()), Baseline: ls.sides[0], Candidate: ls.sides[1]}
		var changed []*keyStats
		for _, ks := range ls.keys {
			if ks.denied[0] != ks.denied[1] {
				changed = append(changed, ks)
			}
		}
		slices.SortFunc(changed, func(a, b *keyStats) int {
			da, db := absDiff(a.denied[0], a.denied[1]), absDiff(b.denied[0], b.denied[1])
			return cmp.Or(cmp.Compare(db, da), a.firstDenied[1].Compare(b.firstDenied[1]), cmp.Compare(fmt.Sprint(a.entries), fmt.Sprint(b.entries)))
		})
		lr.KeysChanged = len(changed)
		for _, ks := range changed[:min(len(changed), r.opts.Keys)] {
			kc := KeyChange{Descriptor: entriesJSON(ks.entries), BaselineDenied: ks.denied[0], CandidateDenied: ks.denied[1]}
			if t := ks.firstDenied[1]; !t.IsZero() {
				kc.FirstDenied = &t
			}
			if t := ks.firstDenied[0]; !t.IsZero() {
				kc.BaselineFirstDenied = &t
			}
			lr.ChangedKeys = append(lr.ChangedKeys, kc)
		}
		rep.Limits = append(rep.Limits, lr)
	}
	if rep.Limits == nil {
		rep.Limits = []LimitReport{}
	}
	return &rep
}

func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

func absDiff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}

func entriesJSON(entries []config.Entry) []Entry {
	out := make([]Entry, len(entries))
	for i, e := range entries {
		out[i] = Entry{Key: e.Key, Value: e.Value}
	}
	return out
}
