package engine

import "time"

// Evaluate decides a request in memory: the all-or-nothing rule of Store
// over states[i], the state of items[i]'s counter (items sharing a counter
// share the *State). It writes results and reports whether the request is
// admitted; the states hold the outcome: consumed when admitted, unchanged
// (up to normalization, which changes no meaning) otherwise.
//
// Items are judged in order at the single instant now; an item sees the
// consumption of earlier items of the same request on the same counter. The
// Redis script implements the same rule step for step.
//
// The caller guards the states; Evaluate only reads items.
func Evaluate(now time.Time, items []Item, states []*State, results []Result) bool {
	t := now.UnixMicro()
	n := len(items)
	var snapBuf [8]State
	snaps := snapBuf[:0]
	if n > len(snapBuf) {
		snaps = make([]State, 0, n)
	}
	snaps = snaps[:n]

	// Pass 1: judge each item, consuming tentatively in place.
	for i := range items {
		it, st := &items[i], states[i]
		if first(states, i) {
			normalize(it.Limit, st, t)
			snaps[i] = *st
		}
		r := &results[i]
		*r = Result{}
		switch {
		case it.Refund:
			r.Admitted = true
			giveBack(it.Limit, st, t, it.Hits)
		case admits(it.Limit, st, t, it.Hits):
			r.Admitted = true
			consume(it.Limit, st, t, it.Hits)
		default:
			r.RetryAfter = micros(retryAt(it.Limit, st, t, it.Hits) - t)
		}
	}

	admitted, quotaFail := decide(items, results)
	if !admitted || quotaFail != nil {
		// Undo pass 1. States shared by several items are restored from the
		// snapshot of their first item.
		for i := range items {
			if first(states, i) {
				*states[i] = snaps[i]
			}
		}
	}
	if admitted && quotaFail != nil {
		// Consume again, without the admitting items of the quota groups
		// that are over.
		for i := range items {
			it := &items[i]
			if !results[i].Admitted || quotaFail[it.Group] {
				continue
			}
			if it.Refund {
				giveBack(it.Limit, states[i], t, it.Hits)
			} else {
				consume(it.Limit, states[i], t, it.Hits)
			}
		}
	}
	for i := range items {
		it, st, r := &items[i], states[i], &results[i]
		r.Remaining = remaining(it.Limit, st, t)
		r.Reset = micros(resetAt(it.Limit, st, t) - t)
	}
	return admitted
}

// first reports whether states[i] is not shared with an earlier item.
func first(states []*State, i int) bool {
	for j := range i {
		if states[j] == states[i] {
			return false
		}
	}
	return true
}

// decide applies the all-or-nothing rule to the verdicts of pass 1. It returns
// whether the request is admitted and, when some admitting items must not be
// consumed because their quota group is over, the set of such groups (nil
// otherwise).
func decide(items []Item, results []Result) (admitted bool, quotaFail map[int32]bool) {
	admitted = true
	quota := false
	for i := range items {
		it := &items[i]
		if it.Group != 0 {
			quota = true
			continue
		}
		if !it.Shadow && !results[i].Admitted {
			admitted = false
		}
	}
	if !quota {
		return admitted, nil
	}
	over := GroupsOver(items, results)
	anyPass := false
	for i := range items {
		if g := items[i].Group; g != 0 && !over[g] {
			anyPass = true
		}
	}
	if !anyPass {
		admitted = false
	}
	if !admitted {
		return false, nil
	}
	for i := range items {
		if g := items[i].Group; g != 0 && over[g] && results[i].Admitted {
			return true, over
		}
	}
	return true, nil
}

// GroupsOver returns the quota groups in which some non-shadow item does not
// admit.
func GroupsOver(items []Item, results []Result) map[int32]bool {
	over := make(map[int32]bool)
	for i := range items {
		it := &items[i]
		if it.Group != 0 && !it.Shadow && !results[i].Admitted {
			over[it.Group] = true
		}
	}
	return over
}
