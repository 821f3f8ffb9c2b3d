package service

import (
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
)

// The service's hooks, for what watches or completes its answers: rls's
// own metrics (internal/decisionmetrics), and what a front end adds (the
// compatibility package plugs another server's stats and answer rules in
// here). The service knows nothing of what uses them.

// Observer is told what the service decides and clears: rls's own metrics
// (internal/decisionmetrics), a front end's stats. Its methods are called
// concurrently and must not block; they must not keep what they are given
// past the call.
type Observer interface {
	// ForConfig is called with each config as it becomes current, before
	// any decision on it; what it returns is handed back with every
	// decision made on that config (a request still deciding on an older
	// config gets that config's).
	ForConfig(cfg *config.Config) any
	// Reloaded is told the outcome of each load: nil when a config became
	// current, the error when the previous one stays.
	Reloaded(err error)
	// Decided is told each request answered (ShouldRateLimit, CheckHTTP):
	// judged by the store, answered without it (an unknown domain, no limit
	// to count) or per --on-store-error; not invalid requests, not
	// explanations. It is called once the statuses are filled, before the
	// headers and the answer rules, with the state ForConfig returned for
	// the config of the decision (nil when none is loaded).
	Decided(state any, d *Decision)
	// Cleared is told each Reset that reached the store.
	Cleared(state any, c *Cleared)
}

// Decision is one answered request, as observers see it. Valid only during
// the call.
type Decision struct {
	Request *Request
	// Domain is the request's domain in the config; nil when the config
	// has none (every descriptor is then answered OK with no limit).
	Domain *config.Domain
	// Response is the answer before the headers and the answer rules: its
	// Code, Never and statuses. nil when the request got an error (the
	// store failed under FailError).
	Response *Response
	// Unmatched counts the descriptors without an override that matched no
	// node with limits (all of them for an unknown domain).
	Unmatched int
	// Items are what the store judged; Limits[i] is the limit of Items[i],
	// Owners[i] the index of its descriptor in Request.Descriptors, and
	// Results[i] its result. Empty when the store judged nothing: no limit
	// to count, or a failed call.
	Items   []engine.Item
	Limits  []*config.Limit
	Owners  []int
	Results []engine.Result
	// Entries[j] are the entries of Request.Descriptors[j] that count: as
	// the request gave them but for the entry of the domain's
	// reservation_key (a request's id, matched by nothing and part of no
	// counter), which Items[i].Reservation carries. Empty when Items is.
	Entries [][]config.Entry
	// StoreErr is the error of a failed store call: Response is then the
	// store-error policy's answer.
	StoreErr error
	// StoreTime is how long the store call took, when the service times
	// it (Options.StoreDoesIO); 0 otherwise.
	StoreTime time.Duration
}

// Cleared is one Reset that reached the store, as observers see it. Valid
// only during the call.
type Cleared struct {
	// Request is the reset's request.
	Request *Request
	Domain  *config.Domain
	// Items are the counters reset (Items[i].Desc their descriptor's
	// identity), Limits[i] the limit of Items[i] and Owners[i] the index
	// of its descriptor in Request.Descriptors.
	Items  []engine.Item
	Limits []*config.Limit
	Owners []int
	// Counters is how many of them held state.
	Counters int
}

// AnswerRule is a last step on a decided answer, once its statuses and
// headers are written: it may change the answer's code (and then its
// headers), add headers and dynamic metadata. Rules run in order.
type AnswerRule interface {
	Finish(a *Answer)
}

// Answer is a decided answer, as answer rules see it.
type Answer struct {
	// Request is the request answered.
	Request  *Request
	Response *Response
	// Nodes[i] is the node that descriptor i matched (nil for none, or for
	// a request override); Nodes is nil when the config has no such
	// domain.
	Nodes []*config.Descriptor
}

// RemoveHeader removes the headers named key (as written) from the answer.
func (a *Answer) RemoveHeader(key string) {
	h := a.Response.Headers[:0]
	for _, x := range a.Response.Headers {
		if x.Key != key {
			h = append(h, x)
		}
	}
	a.Response.Headers = h
}

// HeaderRetryAfter is the name of the header that says when a denied
// request may come again: an answer rule that turns an answer OK removes
// it.
const HeaderRetryAfter = headerRetryAfter
