package service

import (
	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
)

// Reservations (engine/reservation.go): a domain's reservation_key
// (config.Domain.ReservationKey) names the descriptor entry that carries a
// request's id. resolve takes that entry out of each descriptor before it
// is matched against the tree and keyed (it is part of no counter), and
// buildItems gives its value, bounded (engine.ReservationID), to the
// descriptor's items: on a limit that reserves, the first call with an id
// reserves and a later one settles, in the store.

// reservation returns the entries of a descriptor that count (its entries
// without the first one whose key is key) and that entry's value, ok
// false when there is none (the entries as they are). A stripped copy is
// appended to sc.strip, which the request's later descriptors may grow.
func (sc *scratch) reservation(key string, entries []config.Entry) (counted []config.Entry, id string, ok bool) {
	if key == "" {
		return entries, "", false
	}
	at := -1
	for j := range entries {
		if entries[j].Key == key {
			at = j
			break
		}
	}
	if at < 0 {
		return entries, "", false
	}
	start := len(sc.strip)
	sc.strip = append(sc.strip, entries[:at]...)
	sc.strip = append(sc.strip, entries[at+1:]...)
	return sc.strip[start:len(sc.strip):len(sc.strip)], engine.ReservationID(entries[at].Value), true
}
