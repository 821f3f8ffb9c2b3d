package service

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/memstore"
)

// tally is an Observer that keeps what it is told, for tests. Safe for
// concurrent use.
type tally struct {
	mu sync.Mutex
	// codes counts the answers by code: OK, OVER_LIMIT, error.
	codes map[string]int
	// verdicts counts each limit's verdicts, by label: ok, over_limit,
	// shadow_over_limit.
	verdicts           map[string]map[string]int
	storeErrors, timed int // store calls failed, timed
	unmatched, never   int // descriptors unmatched, requests that never pass
	reloads            []error
	clears, cleared    int // Reset calls, counters cleared
	configs            int
	// domains counts the answers by the config's domain, "" for none.
	domains map[string]int
	// statesOK says every decision on a domain came with the state that
	// ForConfig made for the config of that domain.
	statesOK bool
}

func newTally() *tally {
	return &tally{codes: map[string]int{}, verdicts: map[string]map[string]int{}, domains: map[string]int{}, statesOK: true}
}

// tallyState is what the tally's ForConfig returns.
type tallyState struct{ cfg *config.Config }

func (r *tally) ForConfig(cfg *config.Config) any {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.configs++
	return &tallyState{cfg}
}

func (r *tally) Reloaded(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reloads = append(r.reloads, err)
}

func (r *tally) Decided(state any, d *Decision) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case d.Response == nil:
		r.codes["error"]++
	default:
		r.codes[d.Response.Code.String()]++
		if d.Response.Never {
			r.never++
		}
	}
	if d.StoreErr != nil {
		r.storeErrors++
	}
	if d.StoreTime > 0 {
		r.timed++
	}
	r.unmatched += d.Unmatched
	name := ""
	if d.Domain != nil {
		name = d.Domain.Name
		if st, ok := state.(*tallyState); !ok || st.cfg.Domain(name) != d.Domain {
			r.statesOK = false
		}
	}
	r.domains[name]++
	for i := range d.Items {
		v := "over_limit"
		switch {
		case d.Results[i].Admitted:
			v = "ok"
		case d.Items[i].Shadow:
			v = "shadow_over_limit"
		}
		l := d.Limits[i].Label
		if r.verdicts[l] == nil {
			r.verdicts[l] = map[string]int{}
		}
		r.verdicts[l][v]++
	}
}

func (r *tally) Cleared(_ any, c *Cleared) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clears++
	r.cleared += c.Counters
}

// TestObserversAllocateNothing: telling observers of a decision costs no
// allocation (the Decision lives in the request's scratch), for each kind
// of answer: decided, unknown domain, nothing to count, store failed, and
// CheckHTTP's.
func TestObserversAllocateNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops scratch: make test counts allocations in a run without -race")
	}
	for _, tc := range []struct {
		name string
		opts Options
		req  *Request
	}{
		{"decided", Options{}, &Request{Domain: "api", Descriptors: []Descriptor{desc("remote_address", "10.0.0.1")}}},
		{"unknown domain", Options{}, &Request{Domain: "nope", Descriptors: []Descriptor{desc("k", "v")}}},
		{"nothing to count", Options{}, &Request{Domain: "api", Descriptors: []Descriptor{desc("whitelisted", "w")}}},
		{"store failed, allowed", Options{Store: failingStore{errors.New("down")}, OnStoreError: FailAllow}, &Request{Domain: "api", Descriptors: []Descriptor{desc("user", "u")}}},
	} {
		var allocs [2]float64
		for i, observers := range [][]Observer{nil, {nopObserver{}, nopObserver{}}} {
			svc := observedService(t, tc.opts, observers)
			decide := func() { svc.ShouldRateLimit(context.Background(), tc.req) }
			decide()
			allocs[i] = testing.AllocsPerRun(100, decide)
		}
		if allocs[1] != allocs[0] {
			t.Errorf("%s: %v allocations with observers, %v without; want the same", tc.name, allocs[1], allocs[0])
		}
	}
	r := httpReq{headers: map[string]string{"x-api-key": "k9"}, addr: "192.0.2.1"}
	var allocs [2]float64
	for i, observers := range [][]Observer{nil, {nopObserver{}}} {
		svc := observedService(t, Options{}, observers)
		check := func() { svc.CheckHTTP(context.Background(), "other", r) } // other: no http_descriptors
		check()
		allocs[i] = testing.AllocsPerRun(100, check)
	}
	if allocs[1] != allocs[0] {
		t.Errorf("CheckHTTP with nothing to decide: %v allocations with an observer, %v without; want the same", allocs[1], allocs[0])
	}
}

// observedService is a service built with opts on testConfig, told to
// observers only, on a memory store (unless opts has a store) whose clock
// stands still.
func observedService(t *testing.T, opts Options, observers []Observer) *Service {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(testConfig))
	if err != nil {
		t.Fatal(err)
	}
	if opts.Store == nil {
		ms := memstore.New(memstore.Options{Now: storetest.NewClock(storetest.T0).Now})
		t.Cleanup(func() { ms.Close() })
		opts.Store = ms
	}
	opts.Observers = observers
	svc := New(opts)
	svc.SetConfig(cfg)
	return svc
}
