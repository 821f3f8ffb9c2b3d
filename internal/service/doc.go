// Package service answers rate-limit requests: it holds the current config
// (swapped atomically on reload), resolves each request descriptor to its
// limits (overrides, replaces, unlimited, shadow and quota modes), makes one
// store call per request, applies the store-error policy, and builds the
// per-descriptor statuses, response headers and metrics.
//
// It knows no wire protocol: the transports (envoyrls, authz, httpapi)
// convert to and from its Request and Response, and it reaches Redis or
// memory only through engine.Store.
package service
