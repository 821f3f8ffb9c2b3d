// Package replay replays decision logs (internal/decisionlog) against a
// candidate config and a baseline, as rls replay does: each record is
// decided again at its instant on a virtual clock, by rls's own service
// on a memory store per config (as rls test does), and the report says,
// per limit, what each config admits and denies, the decisions that
// change and the keys that change most.
//
// It knows no transport and starts no server; it reads configs only
// through the loader it is given.
package replay
