package replay

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/decisionlog"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/service"
)

// traceConfig has a limit of every algorithm, leased ones, a penalty, a
// calendar window, a wildcard, and one that counts denied hits; halve is
// the requests_per_unit that halving changes (%d).
const traceConfig = `
domain: api
descriptors:
  - key: ip
    rate_limits:
      - {unit: second, requests_per_unit: %[1]d}
      - {unit: minute, requests_per_unit: 30, algorithm: sliding_window}
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 40, algorithm: sliding_log}
      - {unit: second, requests_per_unit: 2, algorithm: token_bucket, burst: 4, lease: true}
  - key: login
    rate_limit: {unit: minute, requests_per_unit: 3, penalty: [10s, 30s], penalty_reset: 5m}
  - key: upload
    rate_limit: {unit: second, requests_per_unit: 2, algorithm: concurrency, lease_ttl: 5s}
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 40, calendar: true, lease: true}
  - key: path
    value: "/api/*"
    rate_limit: {unit: minute, requests_per_unit: 8, count_denied_hits: true}
---
domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: fixed_window, lease: true}
`

func parse(t testing.TB, dir string, perSecond int) (*config.Config, string) {
	t.Helper()
	path := filepath.Join(dir, fmt.Sprintf("limits-%d.yaml", perSecond))
	if err := os.WriteFile(path, []byte(fmt.Sprintf(traceConfig, perSecond)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, path
}

// step is one request of a trace (or a reset).
type step struct {
	at    time.Time
	req   *service.Request
	reset bool
}

var t0 = time.Date(2030, 3, 31, 23, 58, 0, 0, time.UTC) // a day's and a month's end within reach

// trace returns n seeded random steps over a few minutes: few keys, so
// that every limit denies; hits from 0 to 3; releases of uploads; resets
// now and then; and a request of another domain.
func trace(seed uint64, n int) []step {
	rng := rand.New(rand.NewPCG(seed, 3))
	pick := func(key string, k int) service.Descriptor {
		return service.Descriptor{Entries: []config.Entry{{Key: key, Value: fmt.Sprintf("%s%d", key, rng.IntN(k))}}}
	}
	var out []step
	at := t0
	for range n {
		at = at.Add(time.Duration(rng.IntN(100)) * time.Millisecond)
		if rng.IntN(50) == 0 {
			at = at.Add(-time.Duration(rng.IntN(200)) * time.Millisecond) // the clock steps back
		}
		req := &service.Request{Domain: "api", HitsAddend: uint32(rng.IntN(2))}
		switch rng.IntN(8) {
		case 0:
			req = &service.Request{Domain: "web", Descriptors: []service.Descriptor{pick("remote_address", 3)}}
		case 1:
			d := pick("upload", 3)
			if rng.IntN(2) == 0 {
				d.HasHits, d.Hits, d.Refund = true, 1, true
			}
			req.Descriptors = append(req.Descriptors, d)
		default:
			// One or two of the keys: requests denied by one limit leave the
			// others' counters alone, and the trace wants every limit full.
			keys := []string{"ip", "user", "login", "tenant"}
			for n := 1 + rng.IntN(4)/3; n > 0; n-- {
				d := pick(keys[rng.IntN(len(keys))], 3)
				if rng.IntN(5) == 0 {
					d.HasHits, d.Hits = true, uint64(rng.IntN(4))
				}
				req.Descriptors = append(req.Descriptors, d)
			}
			if rng.IntN(4) == 0 {
				req.Descriptors = append(req.Descriptors, service.Descriptor{Entries: []config.Entry{{Key: "path", Value: fmt.Sprintf("/api/v%d", rng.IntN(3))}}})
			}
		}
		out = append(out, step{at: at, req: req, reset: rng.IntN(100) == 0})
	}
	return out
}

// tally counts each limit's own verdicts in a direct run, per key too.
type tally struct {
	limits map[string]*[2]uint64            // by label: admitted, denied
	keys   map[string]map[string]*[2]uint64 // by label, then counter identity
}

func (t *tally) ForConfig(*config.Config) any  { return nil }
func (t *tally) Reloaded(error)                {}
func (t *tally) Cleared(any, *service.Cleared) {}
func (t *tally) Decided(_ any, d *service.Decision) {
	for i := range d.Items {
		label := d.Limits[i].Label
		if d.Limits[i].Index < 0 {
			continue
		}
		if t.limits[label] == nil {
			t.limits[label] = &[2]uint64{}
			t.keys[label] = map[string]*[2]uint64{}
		}
		k := t.keys[label][d.Items[i].Desc]
		if k == nil {
			k = &[2]uint64{}
			t.keys[label][d.Items[i].Desc] = k
		}
		v := 0
		if !d.Results[i].Admitted {
			v = 1
		}
		t.limits[label][v]++
		k[v]++
	}
}

// run decides steps on a fresh memory store at their instants with cfg,
// observed by obs, and returns the tally of every limit's verdicts.
func run(t testing.TB, cfg *config.Config, steps []step, obs ...service.Observer) *tally {
	t.Helper()
	var clk clock
	return runWithClock(t, cfg, steps, &clk, obs...)
}

// record runs steps under cfg with a decision log of opts, and returns the
// log's records.
func record(t testing.TB, cfg *config.Config, steps []step, opts decisionlog.Options) ([]*decisionlog.Record, *tally) {
	t.Helper()
	return recordOn(t, cfg, steps, opts, nil)
}

// recordOn is record on the store that newStore makes on the clock it is
// given (nil: a memory store).
func recordOn(t testing.TB, cfg *config.Config, steps []step, opts decisionlog.Options, newStore func(now func() time.Time) engine.Store) ([]*decisionlog.Record, *tally) {
	t.Helper()
	var clk clock
	opts.Path = filepath.Join(t.TempDir(), "decisions.log")
	opts.Now = clk.now
	l, err := decisionlog.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	l.Start()
	tl := runOn(t, cfg, steps, &clk, newStore, l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if st := l.Stats(); st.Dropped != 0 {
		t.Fatalf("the log dropped %d records", st.Dropped)
	}
	f, err := os.Open(opts.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var recs []*decisionlog.Record
	if err := decisionlog.Read(f, opts.Path, func(r *decisionlog.Record) error { recs = append(recs, r); return nil }); err != nil {
		t.Fatal(err)
	}
	return recs, tl
}

// runWithClock is run on the clock clk.
func runWithClock(t testing.TB, cfg *config.Config, steps []step, clk *clock, obs ...service.Observer) *tally {
	t.Helper()
	return runOn(t, cfg, steps, clk, nil, obs...)
}

// runOn is runWithClock on the store that newStore makes (nil: a memory
// store).
func runOn(t testing.TB, cfg *config.Config, steps []step, clk *clock, newStore func(now func() time.Time) engine.Store, obs ...service.Observer) *tally {
	t.Helper()
	var store engine.Store
	if newStore == nil {
		ms := memstore.New(memstore.Options{Now: clk.now, SweepEvery: time.Hour})
		defer ms.Close()
		store = ms
	} else {
		store = newStore(clk.now)
	}
	tl := &tally{limits: map[string]*[2]uint64{}, keys: map[string]map[string]*[2]uint64{}}
	svc := service.New(service.Options{Store: store, StoreDoesIO: newStore != nil, Now: clk.now, Observers: append(obs, tl)})
	svc.SetConfig(cfg)
	ctx := context.Background()
	for i, s := range steps {
		clk.set(s.at)
		var err error
		if s.reset {
			_, err = svc.Reset(ctx, s.req)
		} else {
			_, err = svc.ShouldRateLimit(ctx, s.req)
		}
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	return tl
}

func load(files []string) (*config.Config, error) { return config.Load(files...) }

// checkCounts holds the report's side (0 baseline, 1 candidate) to the
// tally of a direct run, limit by limit.
func checkCounts(t *testing.T, seed uint64, rep *Report, side int, want *tally, what string) {
	t.Helper()
	checkCountsWithin(t, seed, rep, side, want, what, 0)
}

// checkCountsWithin is checkCounts allowing each limit's admitted and
// denied counts to differ from the direct run's by one in share of its
// decisions (0: exactly).
func checkCountsWithin(t *testing.T, seed uint64, rep *Report, side int, want *tally, what string, share uint64) {
	t.Helper()
	got := map[string]Counts{}
	for _, l := range rep.Limits {
		got[l.Name] = [2]Counts{l.Baseline, l.Candidate}[side]
	}
	off := func(a, b, slack uint64) bool { return max(a, b)-min(a, b) > slack }
	for label, c := range want.limits {
		var slack uint64
		if share > 0 {
			slack = (c[0] + c[1]) / share
		}
		if g := got[label]; off(g.Admitted, c[0], slack) || off(g.Denied, c[1], slack) {
			t.Errorf("seed %d: %s: %s admitted %d denied %d, the direct run %d and %d", seed, what, label, g.Admitted, g.Denied, c[0], c[1])
		}
	}
	if len(got) < len(want.limits) {
		t.Errorf("seed %d: %s: %d limits reported, the direct run judged %d", seed, what, len(got), len(want.limits))
	}
}

// TestReplayIdentity: a log of a seeded trace (every algorithm, leased
// limits, a penalty, a calendar window, a wildcard, denied hits that
// count, releases, resets, a clock that steps back) replays under the
// config that wrote it to the codes it logged, changes no decision, and
// counts every limit's verdicts as the direct run did. The baseline is
// found from the log's header.
func TestReplayIdentity(t *testing.T) {
	seed := storetest.Seed(t)
	cfg, _ := parse(t, t.TempDir(), 2)
	denied := map[string]bool{}
	for round := range 4 {
		steps := trace(seed+uint64(round), 3000)
		recs, direct := record(t, cfg, steps, decisionlog.Options{})
		rep, err := Run([][]*decisionlog.Record{recs}, Options{Candidate: cfg, Load: load})
		if err != nil {
			t.Fatal(err)
		}
		resets := 0
		for _, s := range steps {
			if s.reset {
				resets++
			}
		}
		if rep.Decisions != len(steps)-resets || rep.Resets != resets || rep.Changed != 0 || rep.Reproduced != rep.Decisions || len(rep.Notes) != 0 {
			t.Fatalf("seed %d: %d decisions, %d resets, %d changed, %d reproduced, notes %q; want %d, %d, 0, all, none\n%v",
				seed+uint64(round), rep.Decisions, rep.Resets, rep.Changed, rep.Reproduced, rep.Notes, len(steps)-resets, resets, rep.NotReproduced)
		}
		if !strings.HasPrefix(rep.Baseline, "the log's config "+decisionlog.ConfigVersion(cfg)) {
			t.Errorf("baseline %q, want the log's config", rep.Baseline)
		}
		checkCounts(t, seed, rep, 0, direct, "baseline")
		checkCounts(t, seed, rep, 1, direct, "candidate")
		for _, l := range rep.Limits {
			denied[l.Name] = denied[l.Name] || l.Baseline.Denied > 0
		}
	}
	for name, d := range denied {
		if !d {
			t.Errorf("seed %d: %s denied nothing in 4 traces: they do not test it", seed, name)
		}
	}
	if len(denied) != 9 {
		t.Errorf("seed %d: %d limits judged, want the config's 9", seed, len(denied))
	}
}

// TestReplayHalving: replaying a log under a config whose per-second limit
// is halved reports exactly the verdicts a direct run of the halved config
// gives, and counts as changed the decisions whose code differs between
// the two direct runs.
func TestReplayHalving(t *testing.T) {
	seed := storetest.Seed(t)
	dir := t.TempDir()
	full, _ := parse(t, dir, 4)
	half, halfPath := parse(t, dir, 2)
	steps := trace(seed, 4000)
	recs, direct := record(t, full, steps, decisionlog.Options{})
	halved := run(t, half, steps)
	rep, err := Run([][]*decisionlog.Record{recs}, Options{Candidate: half, CandidateName: halfPath, Load: load})
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, seed, rep, 0, direct, "baseline")
	checkCounts(t, seed, rep, 1, halved, "candidate (halved)")
	var ip Counts
	for _, l := range rep.Limits {
		if l.Name == "ip/1s" {
			ip = l.Candidate
			if l.Candidate.Denied <= l.Baseline.Denied || l.KeysChanged == 0 || len(l.ChangedKeys) == 0 || l.ChangedKeys[0].FirstDenied == nil {
				t.Errorf("seed %d: ip/1s halved: %+v; want more denials and the keys that change, with their first denial", seed, l)
			}
		}
	}
	if rep.Changed == 0 || rep.NewlyDenied == 0 {
		t.Errorf("seed %d: halving ip/1s changed %d decisions (%d newly denied); want some", seed, rep.Changed, rep.NewlyDenied)
	}
	t.Logf("ip/1s halved: %d denied (was %d); %d decisions change", ip.Denied, direct.limits["ip/1s"][1], rep.Changed)
}

// TestReplaySampled: a log that keeps a share of the keys replays each
// kept key exactly (the verdicts of the keys sampled out taken as logged):
// the codes logged, and each limit's verdicts on the kept keys as the
// direct run gave them.
func TestReplaySampled(t *testing.T) {
	seed := storetest.Seed(t)
	cfg, _ := parse(t, t.TempDir(), 2)
	steps := trace(seed, 4000)
	recs, direct := record(t, cfg, steps, decisionlog.Options{Sample: 0.5})
	rep, err := Run([][]*decisionlog.Record{recs}, Options{Candidate: cfg, Load: load})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Reproduced != rep.Decisions || rep.Changed != 0 || rep.Sampled == 0 {
		t.Fatalf("seed %d: %d of %d reproduced, %d changed, %d sampled; want all, 0, some\n%v", seed, rep.Reproduced, rep.Decisions, rep.Changed, rep.Sampled, rep.NotReproduced)
	}
	// The kept keys: the descriptors the log did not mark sampled.
	kept := map[string]bool{}
	for _, r := range recs {
		for _, d := range r.Descriptors {
			if !d.Sampled {
				kept[fmt.Sprint(r.Domain, d.Entries)] = true
			}
		}
	}
	want := &tally{limits: map[string]*[2]uint64{}}
	for label, keys := range direct.keys {
		c := &[2]uint64{}
		for id, k := range keys {
			if kept[identityOf(id)] {
				c[0] += k[0]
				c[1] += k[1]
			}
		}
		if c[0]+c[1] > 0 {
			want.limits[label] = c
		}
	}
	checkCounts(t, seed, rep, 0, want, "baseline, kept keys")
}

// identityOf turns a counter identity of the trace's one-entry
// descriptors ("api/ip=ip3") back into the form kept uses.
func identityOf(id string) string {
	dom, rest, _ := strings.Cut(id, "/")
	k, v, _ := strings.Cut(rest, "=")
	return fmt.Sprint(dom, []config.Entry{{Key: k, Value: strings.ReplaceAll(v, "%2F", "/")}})
}

// TestReplayHashed: a log whose values are keyed hashes replays under the
// config that wrote it to the same verdicts (a hashed value stands for one
// value; a wildcard's matches still match it).
func TestReplayHashed(t *testing.T) {
	seed := storetest.Seed(t)
	cfg, _ := parse(t, t.TempDir(), 2)
	steps := trace(seed, 3000)
	recs, direct := record(t, cfg, steps, decisionlog.Options{HashKey: []byte("k")})
	rep, err := Run([][]*decisionlog.Record{recs}, Options{Candidate: cfg, Load: load})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Reproduced != rep.Decisions || rep.Changed != 0 {
		t.Fatalf("seed %d: %d of %d reproduced, %d changed\n%v", seed, rep.Reproduced, rep.Decisions, rep.Changed, rep.NotReproduced)
	}
	checkCounts(t, seed, rep, 0, direct, "baseline")
}

// TestReplayBaselineFallsBack: a log whose config's files are gone replays
// against the candidate as its baseline, and says so.
func TestReplayBaselineFallsBack(t *testing.T) {
	dir := t.TempDir()
	cfg, path := parse(t, dir, 2)
	recs, _ := record(t, cfg, trace(1, 50), decisionlog.Options{})
	os.Remove(path)
	rep, err := Run([][]*decisionlog.Record{recs}, Options{Candidate: cfg, Load: load})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], "does not load") || !strings.HasPrefix(rep.Baseline, "the candidate") {
		t.Errorf("notes %q, baseline %q; want one note that the log's config does not load, and the candidate as baseline", rep.Notes, rep.Baseline)
	}
}
