// Package lease decides leased limits (engine.Rule.Lease) in process. It
// wraps a store shared by several processes (Redis) as an engine.Store:
// for each counter of a leased limit that a process uses, it takes a
// pre-paid slice of the counter from the store (a decision of that many
// hits, counted there when taken), spends it on later requests without a
// round trip, and releases what it did not spend. Since every hit a
// process admits from a slice was counted in the store before, the hits
// admitted across processes never exceed the limit: a leased limit is as
// exact as one decided in the store, and only slower to hand out its last
// hits. A slice is a Grant of package grant (internal/engine/grant): its
// sizing, the rule that a release must surely land in its window, and the
// ledger of its hits are that package's, shared with RLQS assignments.
//
// # Slices
//
// A slice is sized to last Hold at the rate this process sees on the
// counter, and to at most a quarter (grant.Share) of what the store said
// remains, so that near the limit slices shrink, and below 2 hits
// (grant.MinSize) none is taken: the last hits of a window are decided in
// the store, one request at a time, exactly. A new slice is taken, in the
// background, when half of the last one is spent; requests that find no
// slice go to the store as without lease.
//
// A fixed or calendar window's slice is spent only while the store is
// surely still in the window it was counted in: until the instant the
// take was sent plus the reset the store answered (the store decided at
// or after sending, so the window ends no earlier: grant.End). What is
// left then lapses with the window, where it counts nothing. Unused
// hits are released when the counter has had no hit for Quiet, at
// shutdown, and (token buckets) when the slice's lifetime ends, but only
// when the release is surely decided before the window ends
// (grant.ReleaseLands, with StoreTimeout): a release that reached the
// store in the next window would free hits of that window.
//
// A token bucket's slice is tokens taken from the bucket; they are spent
// within their lifetime (2 × Hold) and then released. Every hit admitted
// took a token of the bucket, at most that lifetime before.
//
// # Changed limits
//
// A counter's slices are taken, sized and released under the rule of the
// last request decided on it, as the service compiled it from the config
// current then: a reload (or anything else that changes a limit) applies
// to the next slice. When a request's rule admits less than the one the
// held slice was taken under (a lower limit or burst), that slice is not
// spent: it is released (or lapses, near its window's end), the request
// goes to the store, which decides it under the new rule, and a slice
// taken in flight under the old rule is released when it lands. A slice
// taken under a rule that admits no more than the new one is spent as it
// is. So after a change a window admits at most the new limit, but for
// what was admitted before the change and what slices taken under a limit
// no higher than the new one held then; the next windows admit at most the
// new limit.
//
// # Requests
//
// A request's items on leased limits that their slices cover are spent
// from them; the other items (unleased limits, leased ones without enough
// slice, refunds) go to the store as one request. The request is admitted
// when the store admits its part (all-or-nothing: the covered items admit);
// otherwise the hits spent are put back into the slices (unspent), but for
// count_denied_hits items, whose hits stay spent as the store would charge
// them. A request with
// quota groups goes to the store whole. A covered item's Remaining is what
// this process's slice holds: never more than is left across processes.
package lease
