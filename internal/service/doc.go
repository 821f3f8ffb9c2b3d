// Package service decides rate-limit requests: it holds the current config
// (swapped atomically on reload), resolves each request descriptor to its
// limits (overrides, replaces, unlimited, shadow and quota modes), makes one
// store call per request, applies the store-error policy, and builds the
// per-descriptor statuses, the response headers and the answer rules'
// changes. What watches a decision (rls's metrics, a front end's stats) is
// an Observer installed at start (hooks.go); explanations and resets are
// plain values that the HTTP transport writes.
//
// It knows no wire protocol and no metrics system: the transports
// (envoyrls, authz, httpapi) convert to and from its Request and Response,
// and it reaches Redis or memory only through engine.Store.
package service
