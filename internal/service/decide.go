package service

import (
	"context"
	"math"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/overrides"
	"github.com/rlsproject/rls/internal/tracing/spans"
)

// A decision, in phases: resolve each descriptor's limits in the domain's
// tree, build the store's items, apply them in one store call, fill the
// statuses, tell the observers, then write the headers and run the answer
// rules (answer.go).

// scratch holds the per-request buffers, reused through a pool.
type scratch struct {
	items    []engine.Item
	results  []engine.Result
	owner    []int           // descriptor index of each item
	limits   []*config.Limit // the limit of each item
	key      []byte          // identities of the request's descriptors, back to back
	spans    [][2]int        // each limited descriptor's identity in key
	nodes    []*config.Descriptor
	built    [][]config.Entry // CheckHTTP's descriptors
	httpReq  Request          // CheckHTTP's request
	decision Decision         // what the observers are told
	// table is the runtime overrides in force on the decision's config
	// (nil: none), which resolve's limits are read through.
	table *overrides.Table
}

// ShouldRateLimit decides req. It returns an *InvalidError for a malformed
// request and an error wrapping ErrStoreUnavailable (or the context's error)
// when the store fails under FailError.
func (s *Service) ShouldRateLimit(ctx context.Context, req *Request) (*Response, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	return s.decide(ctx, req, s.headers)
}

// decide answers a valid request with the headers of mode, in an
// rls.decide span when the service traces (tracing.go).
func (s *Service) decide(ctx context.Context, req *Request, mode HeaderMode) (*Response, error) {
	ctx, span := spans.Start(ctx, s.tracer, SpanDecide, trace.SpanKindInternal)
	if span.Recording() {
		span.Set(AttrDomain.String(req.Domain), AttrDescriptors.Int(len(req.Descriptors)))
	}
	resp, err := s.decideIn(ctx, req, mode)
	if span.Recording() && err == nil {
		span.Set(AttrCode.String(resp.Code.String()))
	}
	span.End(err)
	return resp, err
}

// decideIn is decide's work, phase by phase.
func (s *Service) decideIn(ctx context.Context, req *Request, mode HeaderMode) (*Response, error) {
	cur := s.current.Load()
	if req.Config != nil && (cur == nil || cur.cfg != req.Config) {
		return nil, ErrConfigChanged
	}
	var dom *config.Domain
	if cur != nil {
		dom = cur.cfg.Domain(req.Domain)
	}
	resp := newResponse(len(req.Descriptors))
	sc := s.scratch.Get().(*scratch)
	defer s.release(sc)
	d := &sc.decision
	*d = Decision{Request: req, Domain: dom, Response: resp}
	var nodes []*config.Descriptor // what the answer rules see: nil for an unknown domain
	if dom == nil {
		// Unknown domain: OK with no limit, as envoyproxy/ratelimit does,
		// even with an override.
		for i := range resp.Statuses {
			resp.Statuses[i].Code = OK
		}
		d.Unmatched = len(req.Descriptors)
	} else {
		sc.table = s.overridesOf(cur.cfg)
		replaced, unmatched := s.match(ctx, sc, dom, req)
		d.Unmatched, nodes = unmatched, sc.nodes
		sc.buildItems(req, resp, replaced, s.all)
		if len(sc.items) > 0 {
			if err := s.judge(ctx, sc, resp, mode != HeadersOff); err != nil {
				return s.storeFailed(cur, sc, resp, mode, err)
			}
		}
	}
	s.observe(cur, d)
	s.finishAnswer(req, nodes, resp, mode)
	return resp, nil
}

// release puts sc back in the pool, without the references its request
// left (config, strings, the answer).
func (s *Service) release(sc *scratch) {
	for i := range sc.items {
		sc.items[i] = engine.Item{}
		sc.limits[i] = nil
	}
	d := &sc.decision // its slices are sc's own buffers
	d.Request, d.Domain, d.Response, d.StoreErr = nil, nil, nil, nil
	sc.table = nil
	clear(sc.httpReq.Descriptors)
	sc.httpReq.Domain = ""
	s.scratch.Put(sc)
}

// newResponse returns an OK response with n statuses.
func newResponse(n int) *Response {
	r := &Response{Code: OK}
	if n <= len(r.statusBuf) {
		r.Statuses = r.statusBuf[:n:n]
	} else {
		r.Statuses = make([]Status, n)
	}
	return r
}

// match resolves the descriptors of req in dom (resolve), in an rls.match
// span when the decision is traced.
func (s *Service) match(ctx context.Context, sc *scratch, dom *config.Domain, req *Request) (replaced map[string]bool, unmatched int) {
	_, span := spans.Child(ctx, s.tracer, SpanMatch, trace.SpanKindInternal)
	replaced, unmatched = sc.resolve(dom, req)
	if span.Recording() {
		span.Set(AttrDescriptors.Int(len(req.Descriptors)), AttrUnmatched.Int(unmatched))
	}
	span.End(nil)
	return replaced, unmatched
}

// resolve matches each descriptor of req that has no override in dom,
// into sc.nodes (nil for an override or no match), and returns the names
// of the limits that the matched limits replace and the number of
// descriptors without an override that matched no node with limits.
func (sc *scratch) resolve(dom *config.Domain, req *Request) (replaced map[string]bool, unmatched int) {
	sc.nodes = sc.nodes[:0]
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		var node *config.Descriptor
		if d.Override == nil {
			node = dom.Match(d.Entries)
			if node == nil || len(node.Limits) == 0 {
				unmatched++
			}
			if node != nil {
				for _, l := range node.Limits {
					for _, name := range l.Replaces {
						if replaced == nil {
							replaced = make(map[string]bool)
						}
						replaced[name] = true
					}
				}
			}
		}
		sc.nodes = append(sc.nodes, node)
	}
	return replaced, unmatched
}

// buildItems turns the resolved limits of req into sc.items, one per limit
// that counts (not replaced, not unlimited), each as the runtime overrides
// in sc.table make it, with sc.owner[i] the index of
// item i's descriptor, and gives unlimited descriptors their status.
// all says what the server's switches make of every limit.
func (sc *scratch) buildItems(req *Request, resp *Response, replaced map[string]bool, all allLimits) {
	items := sc.items[:0]
	owner := sc.owner[:0]
	limits := sc.limits[:0]
	sc.key, sc.spans = sc.key[:0], sc.spans[:0]
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		st := &resp.Statuses[i]
		st.Code = OK
		node := sc.nodes[i]
		first := len(items)
		unlimited := false
		for _, l := range d.limits(node) {
			switch useOf(l, replaced) {
			case replacedUse:
				continue
			case unlimitedUse:
				unlimited = true
				continue
			}
			if d.Override == nil {
				l = sc.table.Apply(req.Domain, d.Entries, l) // a runtime override, on the same counter
			}
			if len(items) == first {
				// The descriptor's identity goes into the request's key buffer;
				// its offsets are parked in Desc's place until the buffer
				// becomes one string below.
				start := len(sc.key)
				sc.key = engine.AppendDescriptorKey(sc.key, req.Domain, d.Entries, node.KeyShares(len(d.Entries)))
				sc.spans = append(sc.spans, [2]int{start, len(sc.key)})
			}
			var group int32
			if all.quota || (node != nil && node.QuotaMode) {
				group = int32(i + 1)
			}
			items = append(items, engine.Item{
				Rule:        l.Rule,
				Hits:        req.hits(d),
				Refund:      d.Refund,
				Shadow:      all.shadowed(l),
				CountDenied: (all.countDenied || l.CountDeniedHits) && !d.Refund,
				Group:       group,
			})
			owner = append(owner, i)
			limits = append(limits, l)
		}
		if unlimited && len(items) == first {
			st.Remaining = math.MaxUint32
		}
	}
	sc.items, sc.owner, sc.limits = items, owner, limits
	if len(items) > 0 {
		// One allocation for the identities of all descriptors.
		keys := string(sc.key)
		span := -1
		for i := range items {
			if i == 0 || owner[i] != owner[i-1] {
				span++
			}
			items[i].Desc = keys[sc.spans[span][0]:sc.spans[span][1]]
		}
	}
}

// hits returns the hits of descriptor d of req.
func (req *Request) hits(d *Descriptor) uint64 {
	if d.HasHits {
		return d.Hits
	}
	return uint64(max(req.HitsAddend, 1))
}

// limits are the limits that apply to d, which matched node (nil when it
// matched none): its override's, or node's.
func (d *Descriptor) limits(node *config.Descriptor) []*config.Limit {
	switch {
	case d.Override != nil:
		return []*config.Limit{overrideLimit(d.Override)}
	case node != nil:
		return node.Limits
	}
	return nil
}

// limitUse is what a request does with one of its limits.
type limitUse uint8

const (
	enforcedUse  limitUse = iota // an item is made of it
	replacedUse                  // another limit of the request replaces it by name
	unlimitedUse                 // unlimited: nothing to count
)

// useOf says what a request whose limits replace the names in replaced
// does with l. The one rule of which limits become items, for decisions
// and explanations.
func useOf(l *config.Limit, replaced map[string]bool) limitUse {
	switch {
	case l.Name != "" && replaced[l.Name]:
		return replacedUse
	case l.Unlimited:
		return unlimitedUse
	}
	return enforcedUse
}

// allLimits is what the server's switches make of every limit: count
// denied hits (--count-denied-hits), quota mode (QUOTA_MODE), shadow mode
// (--shadow).
type allLimits struct{ countDenied, quota, shadow bool }

// shadowed reports whether l is judged in shadow mode: its own
// shadow_mode, or --shadow.
func (a allLimits) shadowed(l *config.Limit) bool { return l.Shadow || a.shadow }

// judge has the store judge sc.items (at least one) and fills resp's
// statuses from the results (with every limit's policy when withLimits);
// a failed store call's error is returned, with nothing filled.
func (s *Service) judge(ctx context.Context, sc *scratch, resp *Response, withLimits bool) error {
	if cap(sc.results) < len(sc.items) {
		sc.results = make([]engine.Result, len(sc.items))
	}
	results := sc.results[:len(sc.items)]
	admitted, took, err := s.apply(ctx, sc.items, results)
	d := &sc.decision
	d.StoreTime = took
	if err != nil {
		return err
	}
	d.Items, d.Limits, d.Owners, d.Results = sc.items, sc.limits, sc.owner, results
	if !admitted {
		resp.Code = OverLimit
	}
	s.fillStatuses(resp, d, withLimits)
	if !admitted {
		if resp.Never = never(sc.items, results); resp.Never {
			s.logImpossible(d)
		}
	}
	return nil
}

// apply asks the store to judge items into results, in an rls.store span
// when the decision is traced. When the store does I/O, the call is timed
// (took) and bounded by the caller's deadline less answerMargin.
func (s *Service) apply(ctx context.Context, items []engine.Item, results []engine.Result) (admitted bool, took time.Duration, err error) {
	ctx, span := spans.Child(ctx, s.tracer, SpanStore, trace.SpanKindInternal)
	if span.Recording() {
		span.Set(AttrStore.String(s.storeName), AttrItems.Int(len(items)))
	}
	if !s.storeDoesIO {
		admitted, err = s.store.Apply(ctx, items, results)
	} else {
		start := time.Now()
		if deadline, ok := ctx.Deadline(); ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline.Add(-answerMargin(deadline.Sub(start))))
			defer cancel()
		}
		admitted, err = s.store.Apply(ctx, items, results)
		took = time.Since(start)
	}
	if span.Recording() && err == nil {
		span.Set(AttrAdmitted.Bool(admitted))
	}
	span.End(err)
	return admitted, took, err
}

// answerMargin is how long before its caller's deadline (gRPC's
// grpc-timeout: Envoy's timeout on the rate-limit call) a request stops
// waiting for the store and is answered per --on-store-error, given left,
// the time that was left: a tenth of it, between 1 and 5 milliseconds.
func answerMargin(left time.Duration) time.Duration {
	return min(max(left/10, time.Millisecond), 5*time.Millisecond)
}

//END
