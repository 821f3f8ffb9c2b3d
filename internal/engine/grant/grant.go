// Package grant is the policy of pre-paid hits of a shared counter,
// grants, for every holder of them: lease slices (internal/lease) and RLQS
// assignments (internal/rlqs). It sizes grants, says when a release
// surely lands, and moves their hits through a ledger; pure functions of
// time and counts, it knows nothing of stores, rules or protocols, and
// starts no goroutine.
//
// A grant is hits of one counter that a holder takes from the store ahead
// of the requests that spend them: a lease's slice (a process admits
// requests from it without a round trip), an RLQS assignment's tokens (an
// Envoy admits requests from its token bucket). The words mean one thing
// each:
//
//   - take: the store counts the hits when they are taken, as a decision of
//     that many hits (a take the store denies counts nothing);
//   - spend: a request is admitted from hits held (for an RLQS client, as
//     far as the server can tell: what its token bucket could admit);
//   - release: unspent hits go back to the counter they were counted on,
//     only when that surely lands before their window ends (ReleaseLands): a
//     release that reached the store in the next window would free hits of
//     that window;
//   - lapse: unspent hits that are not released stay counted until their
//     window ends, where they count nothing.
//
// # The invariant: taken before spent
//
// Every hit spent from a grant was counted by the store, in the window it
// counts in, before it was spent, and leaves it only by a release that
// lands in that window. So for a counter and one of its windows, with each
// grant term counting the hits taken in that window (the ledger):
//
//	store count = hits the store admitted + hits spent from grants
//	              + hits held + releases in flight + hits lapsed
//
// and the hits admitted in a window, by the store and from grants, are at
// most what the store counted in it: never more than the limit. The
// Ledger keeps these terms for a holder (taken = spent + held +
// releasing + released + lapsed, at every instant); TestGrantLedger
// (internal/engine/grant_test.go) drives grants against the engine's
// reference store on seeded random schedules (takes, spends, releases,
// window turns, changed limits, late releases) and checks the equation
// exactly after every step.
//
// A token bucket's grant is tokens taken from the bucket: they have no
// window, are spent within the grant's lifetime and then released, which
// lands whenever it lands (a bucket gets back no more than was taken).
//
// A reservation (an LLM request's estimate of its tokens, held until it
// settles: engine/reservation.go) is a grant whose holder is the store
// itself, for one request: its reserve takes the hold (a take the store
// denies holds nothing), its settle spends min(actual, hold) and releases
// the rest, landed at once (the same store call), and charges what the
// request used beyond its hold, past the limit if need be; a hold whose
// ttl passes is released by itself; at a window's turn the holds of the
// window that ends lapse there and are taken again in the next (a request
// in flight counts whole in every window it lives into). The same
// equation holds, with one term more, the hits charged beyond holds,
// which is what a window's count may pass its limit by;
// TestReservationLedger (internal/engine/reservation_test.go) books
// reservations with this package's Ledger against the reference store.
package grant

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/rlsproject/rls/internal/engine"
)

// Sizing of grants.
const (
	// Share: a grant is at most 1/Share of what the store said remains,
	// so that near the limit grants shrink, and the last hits of a window
	// are decided in the store, one request at a time.
	Share = 4
	// MinSize is the smallest grant worth a round trip.
	MinSize = 2
	// Margin is taken off a window's end as a holder knows it, for the
	// rates of its clock and the store's, which differ by far less.
	Margin = time.Millisecond
)

// Cap is the most hits one grant may take of remaining, what the store
// said remains of a counter: 1/Share of it.
func Cap(remaining uint64) uint64 { return remaining / Share }

// Size is the hits to take for a holder that sees rate hits a second and
// wants them to last span: rate × span rounded up, at most Cap(remaining)
// (what the store said remains of the counter, or its capacity) and
// engine.MaxHits; 0 when that is fewer than MinSize.
func Size(rate float64, span time.Duration, remaining uint64) uint64 {
	size := min(math.Ceil(rate*span.Seconds()), float64(Cap(remaining)), float64(engine.MaxHits))
	if !(size >= MinSize) { // NaN too
		return 0
	}
	return uint64(size)
}

// End is the instant until which the hits of a window that a take sent
// at sent was granted may be spent and released, when the store answered
// that its window resets in reset: the store decided at or after sent, so
// the window ends no earlier than sent + reset; Margin before it.
func End(sent time.Time, reset time.Duration) time.Time {
	return sent.Add(reset - Margin)
}

// ReleaseLands reports whether a release sent at now surely lands before
// end, the end of the window its hits were counted in as the holder knows
// it (no later than the store's), on a store whose timeout is timeout: a
// call is decided within twice its store's timeout of being made, or not
// at all (a store's timeout bounds a decision once sent; as much again is
// left for it to be sent), and Margin covers the clocks.
func ReleaseLands(now, end time.Time, timeout time.Duration) bool {
	return now.Add(2*timeout + Margin).Before(end)
}

// Grant is what a holder holds of one counter: hits taken and not yet
// spent, released or lapsed, and until when. The zero Grant holds nothing
// and is a window's; set Tokens for a token bucket's. A Grant changes only
// through a Ledger's methods. Not safe for concurrent use: its holder
// guards it.
type Grant struct {
	// Tokens marks a token bucket's grant: its hits have no window; they
	// are released when its lifetime ends, whenever that lands.
	Tokens bool
	held   uint64
	end    time.Time
}

// Held returns the hits g holds that may be spent at now, and for how
// long.
func (g *Grant) Held(now time.Time) (uint64, time.Duration) {
	if !now.Before(g.end) {
		return 0, 0
	}
	return g.held, g.end.Sub(now)
}

// Left returns the hits g holds, spendable or not (past its end, until
// they are released or lapse).
func (g *Grant) Left() uint64 { return g.held }

// Ledger counts what became of the hits of a holder's grants, and moves
// them: every change of a Grant is one of its methods, so that taken =
// spent + held + releasing + released + lapsed at every instant. The zero
// Ledger is empty. Its methods are safe for concurrent use on different
// grants; a grant's holder serializes the calls on it.
type Ledger struct {
	grants, taken, spent, held, releasing, released, lapsed, lapses, unlanded atomic.Uint64
}

// Counts are a Ledger's counts.
type Counts struct {
	Grants    uint64 // takes the store counted
	Taken     uint64 // their hits
	Spent     uint64 // hits spent
	Held      uint64 // hits held now
	Releasing uint64 // hits of releases sent, not landed yet
	Released  uint64 // hits released, landed
	Lapsed    uint64 // hits lapsed: held past their window, or a release that did not land
	Lapses    uint64 // grants (or releases) whose hits lapsed
	Unlanded  uint64 // of Lapsed, the hits of releases sent that failed
}

// Counts returns l's counts. Read while grants change, they may be of
// different instants.
func (l *Ledger) Counts() Counts {
	return Counts{
		Grants: l.grants.Load(), Taken: l.taken.Load(), Spent: l.spent.Load(), Held: l.held.Load(),
		Releasing: l.releasing.Load(), Released: l.released.Load(), Lapsed: l.lapsed.Load(),
		Lapses: l.lapses.Load(), Unlanded: l.unlanded.Load(),
	}
}

// Take adds hits that the store counted at now to g, to be spent before
// end (for a window's, End or the window's own end). Hits g held that may
// still be spent stay, and the whole is spent before the earlier end; hits
// whose end has passed are expired first (Expire): it returns the tokens
// of those to release (now Releasing), 0 for a window's.
func (l *Ledger) Take(g *Grant, now time.Time, hits uint64, end time.Time) (release uint64) {
	if g.held > 0 && now.Before(g.end) {
		end = earliest(end, g.end)
	} else {
		release = l.Expire(g, now)
	}
	l.grants.Add(1)
	l.taken.Add(hits)
	l.held.Add(hits)
	g.held += hits
	g.end = end
	return release
}

// Spend takes hits from g for a request at now, and reports whether g
// covered them: it holds them and may be spent at now.
func (l *Ledger) Spend(g *Grant, now time.Time, hits uint64) bool {
	if g.held == 0 || g.held < hits || !now.Before(g.end) {
		return false
	}
	g.held -= hits
	l.held.Add(-hits)
	l.spent.Add(hits)
	return true
}

// Unspend puts back hits spent from g for a request that was not admitted
// after all (another of its limits denied it).
func (l *Ledger) Unspend(g *Grant, hits uint64) {
	g.held += hits
	l.held.Add(hits)
	l.spent.Add(-hits)
}

// Release empties g for a release sent at now, on a store whose timeout is
// timeout, and returns its hits (now Releasing: Landed says what became of
// them); 0, and g as it was, when the release could land after their
// window (ReleaseLands): they stay held until they lapse.
func (l *Ledger) Release(g *Grant, now time.Time, timeout time.Duration) uint64 {
	if g.held == 0 || !g.Tokens && !ReleaseLands(now, g.end, timeout) {
		return 0
	}
	return l.releaseAll(g)
}

func (l *Ledger) releaseAll(g *Grant) uint64 {
	hits := g.held
	g.held = 0
	l.held.Add(-hits)
	l.releasing.Add(hits)
	return hits
}

// Landed records what became of a release of hits: landed in the store
// (ok), or not (an error, past its deadline): those lapse.
func (l *Ledger) Landed(hits uint64, ok bool) {
	l.releasing.Add(-hits)
	if ok {
		l.released.Add(hits)
		return
	}
	l.unlanded.Add(hits)
	l.lapse(hits)
}

// Keep puts back into g hits released from it that were not sent after all
// (the holder is closing): they are held again.
func (l *Ledger) Keep(g *Grant, hits uint64) {
	l.releasing.Add(-hits)
	g.held += hits
	l.held.Add(hits)
}

// Expire ends what g holds when its end has passed at now: a window's hits
// lapse; a token bucket's are returned to be released (now Releasing).
func (l *Ledger) Expire(g *Grant, now time.Time) (release uint64) {
	if g.held == 0 || now.Before(g.end) {
		return 0
	}
	if g.Tokens {
		return l.releaseAll(g)
	}
	l.Lapse(g)
	return 0
}

// Lapse drops what g holds: its hits stay counted where they were taken,
// unspent (too near their window's end for a release, a limit lowered, a
// counter reset).
func (l *Ledger) Lapse(g *Grant) {
	hits := g.held
	g.held = 0
	l.held.Add(-hits)
	l.lapse(hits)
}

func (l *Ledger) lapse(hits uint64) {
	if hits > 0 {
		l.lapsed.Add(hits)
		l.lapses.Add(1)
	}
}

// earliest is the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
