package engine

import (
	"strconv"
	"strings"
	"time"
)

// Penalties escalate the answer to a client that keeps hitting a limit
// (penalty: [2m, 10m, 1h]): each denial by the limit's counter is a
// strike that blocks the counter for the next duration of the ladder (the
// last one for every strike past its end). While blocked every request
// on the counter is denied without being judged by it (Result.Blocked),
// and consumes nothing, as any denial; so the requests of a block are not
// strikes and do not climb the ladder. After PenaltyReset has passed
// since a block's end without a strike, the ladder starts over.
//
// The state lives with the counter's (State.Strikes and BlockedUntil)
// and changes in the same store call as the counter: Evaluate here, the
// Redis scripts' penalty.lua, which keeps it in a field of the
// descriptor's hash beside the counter's (PenaltyField).

// DefaultPenaltyReset is the quiet time after which a ladder starts over
// when a limit does not give penalty_reset.
const DefaultPenaltyReset = 24 * time.Hour

// MaxPenaltySteps bounds a ladder's length.
const MaxPenaltySteps = 16

// compilePenalty checks the penalty fields of s into r.
func compilePenalty(s *Spec, r *Rule, errs *specErrors) {
	if len(s.Penalty) == 0 {
		if s.PenaltyReset.Set {
			errs.add("penalty_reset", true, "penalty_reset is only for limits with a penalty")
		}
		return
	}
	if len(s.Penalty) > MaxPenaltySteps {
		errs.add("penalty", false, "penalty has %d steps; at most %d", len(s.Penalty), MaxPenaltySteps)
	}
	for _, d := range s.Penalty {
		if d < time.Millisecond || d > MaxWindow {
			errs.add("penalty", false, "penalty step %s is not between 1ms and 100 years", d)
			break
		}
	}
	reset := s.PenaltyReset.Or(DefaultPenaltyReset)
	if s.PenaltyReset.Set && (reset < time.Millisecond || reset > MaxWindow) {
		errs.add("penalty_reset", false, "penalty_reset %s is not between 1ms and 100 years", reset)
	}
	if s.Lease {
		errs.add("penalty", true, "penalty is not for lease: true limits (a slice's hits are decided in process, where no strike is kept)")
	}
	r.Penalty = append([]time.Duration(nil), s.Penalty...)
	r.PenaltyReset = reset
}

// Penalized reports whether r blocks after denials.
func (r *Rule) Penalized() bool { return len(r.Penalty) > 0 }

// forgive starts the ladder over when the quiet time after the last
// block has passed at t (part of normalizing a state).
func (r *Rule) forgive(st *State, t int64) {
	if r.Penalized() && st.Strikes > 0 && t >= st.BlockedUntil+r.PenaltyReset.Microseconds() {
		st.Strikes, st.BlockedUntil = 0, 0
	}
}

// blocked reports whether the counter is blocked at t under r.
func (r *Rule) blocked(st *State, t int64) bool {
	return r.Penalized() && t < st.BlockedUntil
}

// strike records a denial by r's counter at t: the next block.
func (r *Rule) strike(st *State, t int64) {
	st.Strikes++
	step := r.Penalty[min(int(st.Strikes), len(r.Penalty))-1]
	st.BlockedUntil = t + step.Microseconds()
}

// Prune returns the instant from which st is equivalent to the zero
// State (Expiry), after dropping, at the decision's instant t, its
// counter's part when that alone is already equivalent to none while a
// penalty or reservations keep the state: Redis forgets that part then
// (its field), and the counter's instant must not differ between stores
// when the clock steps back. (A window's count that is only hits held
// comes back with the next window, which carries them.)
func (r *Rule) Prune(st *State, t int64) int64 {
	if (st.Strikes > 0 || st.Holds != nil) && r.alg.expiry(r, st) <= t {
		*st = State{Log: st.Log[:0], Strikes: st.Strikes, BlockedUntil: st.BlockedUntil, Held: st.Held, Holds: st.Holds}
	}
	return r.Expiry(st)
}

// penaltyExpiry is the instant from which st's penalty part is
// forgotten (0 for none).
func (r *Rule) penaltyExpiry(st *State) int64 {
	if st.Strikes == 0 {
		return 0
	}
	return st.BlockedUntil + r.PenaltyReset.Microseconds()
}

// PenaltyArg is r's penalty as the Redis scripts take it: the reset and
// the ladder's steps in µs, joined by ':' ("" for none).
func (r *Rule) PenaltyArg() string {
	if !r.Penalized() {
		return ""
	}
	var b strings.Builder
	b.WriteString(strconv.FormatInt(r.PenaltyReset.Microseconds(), 10))
	for _, d := range r.Penalty {
		b.WriteByte(':')
		b.WriteString(strconv.FormatInt(d.Microseconds(), 10))
	}
	return b.String()
}

// PenaltyField is the field, in a descriptor's hash, of the penalty state
// of the counter whose field (rule ID) is id.
func PenaltyField(id string) string { return id + "!p" }
