// Package rlqs serves Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3, the rate_limit_quota HTTP filter)
// from rls's limits. A stream's domain is a config domain; a bucket id (a
// map) names the descriptor whose path has exactly the bucket's keys,
// matched from the top of the domain's tree as descriptors are. A bucket
// without limits is told ALLOW_ALL.
//
// A bucket with limits is assigned a token bucket that refills at its
// client's rate (with headroom) and lasts past its next report. Every
// token the client can spend of it is paid (taken) in the store first, as
// hits of the bucket's limits (so RLQS clients, RLS clients and nginx
// share one counter), in the window it can be spent in: at a report, up
// to the next window boundary; at each boundary while the assignment
// lasts, by the server on its own (Session.Tick). When a payment does not
// fit, the client is sent what does, or DENY_ALL until the limits have
// room. Only what the client's token bucket could not have spent is
// released (at a replacement, to the counters of the config that paid
// it, when that surely lands in their window): reports steer the sizes,
// never what is admitted (grant.go). The tokens paid are a Grant of
// package grant (internal/engine/grant), moved by the server's Ledger as
// lease slices are.
//
// It knows the service and the config; stores are the service's.
package rlqs
