package engine

import "time"

// Evaluate decides a request in memory: the all-or-nothing rule of Store
// over states[i], the state of items[i]'s counter (items sharing a counter
// share the *State). It writes results and reports whether the request is
// admitted; the states hold the outcome: consumed when admitted, unchanged
// (up to normalization, which changes no meaning) otherwise.
//
// Items are judged in order at the decision's instant now, each counter at
// its own instant (never earlier than what its state has seen: see
// algorithm); an item sees the consumption of earlier items of the same
// request on the same counter. Reset and retry durations are counted from
// now, so that they name the same instants whatever the counter's own. The
// Redis script implements the same phases step for step.
//
// The caller guards the states; Evaluate only reads items.
func Evaluate(now time.Time, items []Item, states []*State, results []Result) bool {
	var snapBuf [8]State
	var timeBuf [8]int64
	var dupBuf [8]bool
	snaps, times, dup := snapBuf[:0], timeBuf[:0], dupBuf[:0]
	if len(items) > len(snapBuf) {
		snaps, times, dup = make([]State, 0, len(items)), make([]int64, 0, len(items)), make([]bool, 0, len(items))
	}
	snaps, times, dup = snaps[:len(items)], times[:len(items)], dup[:len(items)]

	t := now.UnixMicro()
	reserving := normalize(t, items, states, results, snaps, times)
	if reserving {
		phases(items, states, results, dup)
	}
	judge(t, items, states, results, times, dup)
	admitted, over := Admit(items, results)
	if !admitted || over != nil {
		// Undo the judging pass. States shared by several items are restored
		// from the snapshot of their first item.
		for i := range items {
			if first(states, i) {
				*states[i] = snaps[i]
			}
		}
	}
	if admitted && over != nil {
		// Consume again the admitting items, without the quota groups that
		// are over.
		for i := range items {
			if it := &items[i]; results[i].Admitted && !over[it.Group] {
				apply(it, &results[i], states[i], times[i], dup[i])
			}
		}
	}
	chargeDenied(t, items, states, results, times, admitted, over)
	if reserving {
		reserveAndSettle(items, states, results, times, dup, admitted, over)
	}
	strike(t, items, states, results, times)
	for i := range items {
		it, st, r, tc := &items[i], states[i], &results[i], times[i]
		r.Remaining, r.Reset = status(it.Rule, st, tc, t)
		holdStatus(it.Rule, st, t, r, false)
	}
	return admitted
}

// status returns the remaining hits and the time to the reset of the
// counter st, at its instant tc, as of the decision's instant t: none
// remain while it is blocked, and it resets no earlier than the block's
// end.
func status(rule *Rule, st *State, tc, t int64) (uint64, time.Duration) {
	reset := rule.alg.resetAt(rule, st, tc)
	if rule.blocked(st, tc) {
		return 0, micros(max(reset, st.BlockedUntil) - t)
	}
	return rule.alg.remaining(rule, st, tc), micros(reset - t)
}

// Status returns the remaining hits and the time to the reset that
// Evaluate reports for an item of r admitted at now whose counter the
// decision left as st. It brings st to now first (normalize), in place, as
// the judging pass does. A store that keeps its states elsewhere (Redis)
// computes the statuses of its admissions with it from the states written.
func (r *Rule) Status(st *State, now time.Time) (uint64, time.Duration) {
	t := now.UnixMicro()
	tc := r.alg.normalize(r, st, t)
	return status(r, st, tc, t)
}

// strike records a strike on the counter of each penalized item that its
// counter denied (not its block, not a refund), once per counter and
// request: the request's later items on a counter struck find it blocked.
// The item's retry is then no earlier than the block's end. A strike is
// kept whatever the request's outcome, as a charge of denied hits is.
func strike(t int64, items []Item, states []*State, results []Result, times []int64) {
	for i := range items {
		it, r := &items[i], &results[i]
		if r.Admitted || r.Blocked || it.Refund || !it.Rule.Penalized() {
			continue
		}
		st, tc := states[i], times[i]
		if it.Rule.blocked(st, tc) {
			continue // struck by an earlier item on the same counter
		}
		it.Rule.strike(st, tc)
		if !r.Never {
			r.RetryAfter = max(r.RetryAfter, micros(st.BlockedUntil-t))
		}
	}
}

// Peek judges a request as Evaluate would at now, and changes no state: a
// dry run, for explanations. results[i].Admitted, Never and RetryAfter are
// the judging pass's verdicts (an item sees the tentative consumption of
// earlier items of the request on its counter); Remaining and Reset are
// the limit's before the request. It reports whether the request would be
// admitted (Admit); count-denied hits are not charged.
func Peek(now time.Time, items []Item, states []*State, results []Result) bool {
	var copyBuf [8]State
	var ptrBuf [8]*State
	copies, ptrs := copyBuf[:0], ptrBuf[:0]
	if len(items) > len(copyBuf) {
		copies, ptrs = make([]State, 0, len(items)), make([]*State, 0, len(items))
	}
	copies, ptrs = copies[:len(items)], ptrs[:len(items)]
	for i := range items {
		if j := firstOf(states, i); j != i {
			ptrs[i] = ptrs[j] // shared by the items, as in the store
			continue
		}
		copies[i] = states[i].Clone()
		ptrs[i] = &copies[i]
	}
	snaps, times, dup := make([]State, len(items)), make([]int64, len(items)), make([]bool, len(items))
	t := now.UnixMicro()
	if normalize(t, items, ptrs, results, snaps, times) {
		phases(items, ptrs, results, dup)
	}
	judge(t, items, ptrs, results, times, dup)
	admitted, _ := Admit(items, results)
	for i := range items {
		it, r, tc := &items[i], &results[i], times[i]
		snap := &snaps[firstOf(ptrs, i)]
		r.Remaining, r.Reset = status(it.Rule, snap, tc, t)
		holdStatus(it.Rule, snap, t, r, true)
	}
	return admitted
}

// Clone returns a copy of st that shares nothing with it.
func (st *State) Clone() State {
	c := *st
	c.Log = append([]LogEntry(nil), st.Log...)
	c.Holds = st.Holds.clone()
	return c
}

// normalize is the first pass: the results cleared, and each item's
// counter, the first time the request meets it, normalized to t (its
// penalty forgiven, its reservations' due events swept: counted in the
// result of the first item on it whose rule reserves) and snapshotted;
// times[i] is the counter's own instant, shared by the later items on it.
// A counter that no item of the request reaches with a rule that reserves
// forgets its reservations first (holdingRule). It reports whether any
// item is a reservation call.
func normalize(t int64, items []Item, states []*State, results []Result, snaps []State, times []int64) (reserving bool) {
	for i := range items {
		results[i] = Result{}
		reserving = reserving || items[i].Reserving()
	}
	for i := range items {
		it, st := &items[i], states[i]
		if j := firstOf(states, i); j != i {
			times[i] = times[j]
			continue
		}
		hold := -1
		if st.Holds != nil || st.Held > 0 {
			hold = holdingRule(items, states, i)
		}
		times[i] = it.Rule.alg.normalize(it.Rule, st, t)
		it.Rule.forgive(st, times[i])
		if hold >= 0 && st.Holds != nil {
			r := &results[hold]
			r.Lapsed, r.LapsedHits = items[hold].Rule.sweep(st, times[i])
		}
		snaps[i] = *st
	}
	return reserving
}

// holdingRule returns the first item from i on whose counter is i's and
// whose rule reserves, and when there is none (a reload removed its
// reserve, an override shares its counter) makes the counter forget its
// reservations and returns -1: its hits held stay in its count until they
// leave it as any (a window's end), but are no longer carried, swept or
// settled, as a store that keeps them apart (Redis) does not read them
// for such a request. A log keeps its hits held beside its entries: they
// go.
func holdingRule(items []Item, states []*State, i int) int {
	for j := i; j < len(items); j++ {
		if states[j] == states[i] && items[j].Rule.Reserve != nil {
			return j
		}
	}
	st := states[i]
	if items[i].Rule.OwnKey() {
		st.Count -= min(st.Count, st.Held)
	}
	st.Held, st.Holds = 0, nil
	return -1
}

// judge is the judging pass: each item in order at its counter's instant,
// its verdict in results[i], its hits consumed (or given back, or held
// for a reserve) tentatively when it admits. A settle, and a repeat of a
// reservation call on a counter (dup), admit without being judged.
func judge(t int64, items []Item, states []*State, results []Result, times []int64, dup []bool) {
	for i := range items {
		it, st, r := &items[i], states[i], &results[i]
		alg := it.Rule.alg
		tc := times[i]
		hits := judgedHits(it, r, dup[i])
		switch {
		case dup[i] || r.Phase > Reserving:
			r.Admitted = true
		case !it.Refund && it.Rule.blocked(st, tc):
			r.Blocked = true
			retryBlocked(alg, it.Rule, hits, st, tc, t, r)
		case it.Refund || alg.admits(it.Rule, st, tc, hits):
			r.Admitted = true
			apply(it, r, st, tc, dup[i])
		default:
			retry(alg, it.Rule, hits, st, tc, t, r)
		}
	}
}

// retry writes into r when the denied item of rule and hits could pass,
// as of the decision's instant t (the counter's is tc), or that it never
// can. While the counter holds hits of reservations, no later than its
// table's next event: a hold may end by itself then.
func retry(alg algorithm, rule *Rule, hits uint64, st *State, tc, t int64, r *Result) {
	at := alg.retryAt(rule, st, tc, hits)
	if at == never {
		r.Never, r.RetryAfter = true, 0
		return
	}
	if st.Held > 0 {
		if ev := st.Holds.nextEvent(); ev > 0 {
			at = min(at, ev)
		}
	}
	r.Never, r.RetryAfter = false, micros(at-t)
}

// retryBlocked writes into r when the item that its counter's block
// denied could pass: at the block's end, or later when the count would
// still deny it then (a client that waits so long is not struck again).
func retryBlocked(alg algorithm, rule *Rule, hits uint64, st *State, tc, t int64, r *Result) {
	if alg.admits(rule, st, tc, hits) {
		r.RetryAfter = micros(st.BlockedUntil - t)
		return
	}
	retry(alg, rule, hits, st, tc, t, r)
	if !r.Never {
		r.RetryAfter = max(r.RetryAfter, micros(st.BlockedUntil-t))
	}
}

// chargeDenied takes the hits of the CountDenied items that the request's
// outcome left unconsumed (the item denied, the request denied, or its
// quota group over), past their limits, and says when each denied one
// could pass with its debt: after the others, in order (at once when only
// the hits that the denied request took back denied it). A denied one
// keeps what remained just before its charge (RemainingBeforeCharge).
func chargeDenied(t int64, items []Item, states []*State, results []Result, times []int64, admitted bool, over map[int32]bool) {
	for i := range items {
		it, r := &items[i], &results[i]
		if !it.CountDenied || it.Refund || it.Reserving() || (admitted && r.Admitted && !over[it.Group]) {
			continue // a reservation call's hits are its hold's, or charged when it settles
		}
		alg := it.Rule.alg
		st, tc := states[i], times[i]
		if !r.Admitted && !r.Blocked { // none remained in a block
			r.RemainingBeforeCharge = alg.remaining(it.Rule, st, tc)
		}
		alg.consume(it.Rule, st, tc, it.Hits)
		switch {
		case r.Admitted, r.Blocked: // a block's end does not move
		case alg.admits(it.Rule, st, tc, it.Hits):
			// Denied only by hits the request took back: it passes now.
			r.Never, r.RetryAfter = false, 0
		default:
			retry(alg, it.Rule, it.Hits, st, tc, t, r)
		}
	}
}

// apply applies an admitted item to its counter at the counter's instant t:
// consumes its hits, or gives them back for a refund, or holds a reserve's
// (its result's phase); a settle and a repeat (dup) change nothing here.
func apply(it *Item, r *Result, st *State, t int64, dup bool) {
	alg := it.Rule.alg
	switch {
	case it.Refund:
		alg.giveBack(it.Rule, st, t, it.Hits)
	case dup || r.Phase > Reserving:
	case r.Phase == Reserving:
		alg.hold(it.Rule, st, t, it.holdHits())
	default:
		alg.consume(it.Rule, st, t, it.Hits)
	}
}

// firstOf returns the first item whose state is states[i].
func firstOf(states []*State, i int) int {
	for j := range i {
		if states[j] == states[i] {
			return j
		}
	}
	return i
}

// first reports whether states[i] is not shared with an earlier item.
func first(states []*State, i int) bool { return firstOf(states, i) == i }

// Admit is the all-or-nothing rule, applied to the verdicts of the judging
// pass (results[i].Admitted for items[i]): the request is admitted when every
// item that is neither shadow nor in a quota group admits, and, when there
// are quota groups, at least one of them admits entirely (a group is over
// when one of its non-shadow items does not admit). When the request is
// admitted but some quota groups are over, over holds them: their items are
// not consumed. Otherwise over is nil.
//
// The Redis scripts apply the same rule (decide/judge.lua, "the rule"); a
// cluster applies it to the verdicts gathered from its nodes.
func Admit(items []Item, results []Result) (admitted bool, over map[int32]bool) {
	admitted = true
	quota := false
	for i := range items {
		it := &items[i]
		switch {
		case it.Group != 0:
			quota = true
			if !it.Shadow && !results[i].Admitted {
				if over == nil {
					over = make(map[int32]bool)
				}
				over[it.Group] = true
			}
		case !it.Shadow && !results[i].Admitted:
			admitted = false
		}
	}
	if !quota {
		return admitted, nil
	}
	pass := false
	for i := range items {
		if g := items[i].Group; g != 0 && !over[g] {
			pass = true
			break
		}
	}
	if !admitted || !pass {
		return false, nil
	}
	return true, over
}
