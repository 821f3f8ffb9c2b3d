// Package layering holds no code: its test enforces the import rules of
// the module's layers (docs/design.md, section 1): imports point inward, a request flows
// transport (envoyrls | authz | httpapi) → service → engine → store
// (memstore | redisstore, lease around it), and compatibility with envoyproxy/ratelimit
// stays at the edge. The rules are one table, in layering_test.go; every
// package of the module must have a row there.
package layering
