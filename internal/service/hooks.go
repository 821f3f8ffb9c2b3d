package service

import (
	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
)

// The service's hooks, for what a front end adds to rls's own behaviour
// (the compatibility package plugs another server's stats and answer rules
// in here). The service knows nothing of what uses them.

// Observer is told what the service decides. Its methods are called
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
	// Decided is told each request that the store decided (not the ones
	// answered per --on-store-error, not explanations), once its statuses
	// are filled, with the state ForConfig returned for its config.
	Decided(state any, d *Decision)
}

// Decision is one decided request, as observers see it: the store's items
// and their results. Valid only during the call.
type Decision struct {
	Request *Request
	// Items are what the store judged; Limits[i] is the limit of Items[i],
	// Owners[i] the index of its descriptor in Request.Descriptors, and
	// Results[i] its result.
	Items   []engine.Item
	Limits  []*config.Limit
	Owners  []int
	Results []engine.Result
	// Admitted is the request's verdict before any answer rule.
	Admitted bool
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
