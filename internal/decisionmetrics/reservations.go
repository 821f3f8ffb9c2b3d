package decisionmetrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/service"
)

// Reservations (engine/reservation.go), per limit that reserves: what the
// reservation calls did (rls_reservations_total, by event) and the hits
// they hold now (rls_reservation_held_hits). Labels are the domain and
// the limit's label, from the config; the series are made when a config
// that has the limit loads, and deleted by a reload that drops it (or its
// reserve).

// reservationEvent is what a reservation call did, as the event label
// says it.
type reservationEvent uint8

const (
	eventReserved      reservationEvent = iota // a hold taken (the request admitted)
	eventSettled                               // a hold settled: released, the call's hits charged
	eventSettledAgain                          // a second settle of the same id: nothing charged
	eventSettledUnheld                         // a settle whose hold had ended by itself: its hits charged
	eventExpired                               // a hold not settled within its ttl: ended by itself
	numEvents
)

var eventLabel = [numEvents]string{"reserved", "settled", "settled_again", "settled_without_hold", "expired"}

// reservationMetrics are the reservation metrics of every limit that
// reserves. Safe for concurrent use.
type reservationMetrics struct {
	events *prometheus.CounterVec // domain, limit, event
	held   *prometheus.GaugeVec   // domain, limit
	mu     sync.Mutex
	live   map[[2]string]bool // the label values of the series of the current config; guarded by mu
}

func newReservationMetrics(reg prometheus.Registerer) *reservationMetrics {
	r := &reservationMetrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "rls_reservations_total",
			Help: "Reservation calls on limits that reserve (reserve: {estimate, ttl}), by domain, limit and event: reserved (a hold taken), settled (a hold released and the call's hits charged), settled_again (a second settle: nothing charged), settled_without_hold (its hold had ended by itself: its hits charged), expired (a hold not settled within its ttl, released; counted by the first decision on its counter within a ttl after).",
		}, []string{"domain", "limit", "event"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "rls_reservation_held_hits",
			Help: "Hits that reservations hold on limits that reserve, as this process's decisions moved them (holds taken less holds settled or ended); summed over the rls processes sharing a store, the hits held in it.",
		}, []string{"domain", "limit"}),
		live: map[[2]string]bool{},
	}
	if reg != nil {
		reg.MustRegister(r.events, r.held)
	}
	return r
}

// limitReservations are the reservation series of one limit.
type limitReservations struct {
	events [numEvents]prometheus.Counter
	held   prometheus.Gauge
}

// forConfig returns the reservation series of cfg's limits that reserve
// (by Limit.Index; nil for the others), and deletes the series of those
// the previous config had and cfg has not.
func (r *reservationMetrics) forConfig(cfg *config.Config) []*limitReservations {
	out := make([]*limitReservations, len(cfg.Limits()))
	live := map[[2]string]bool{}
	for _, d := range cfg.Domains() {
		walk(d.Descriptors, func(l *config.Limit) {
			if l.Rule == nil || l.Rule.Reserve == nil {
				return
			}
			lr := &limitReservations{held: r.held.WithLabelValues(d.Name, l.Label)}
			for e := range numEvents {
				lr.events[e] = r.events.WithLabelValues(d.Name, l.Label, eventLabel[e])
			}
			out[l.Index] = lr
			live[[2]string{d.Name, l.Label}] = true
		})
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.live {
		if !live[k] {
			r.held.DeleteLabelValues(k[0], k[1])
			for _, e := range eventLabel {
				r.events.DeleteLabelValues(k[0], k[1], e)
			}
		}
	}
	r.live = live
	return out
}

// count counts what item r's reservation call did, and what its
// counter's holds that ended by themselves gave back.
func (lr *limitReservations) count(r *engine.Result) {
	switch r.Phase {
	case engine.Reserving:
		if r.HoldHits > 0 {
			lr.events[eventReserved].Inc()
			lr.held.Add(float64(r.HoldHits))
		}
	case engine.Settling:
		lr.events[eventSettled].Inc()
		lr.held.Sub(float64(r.HoldHits))
	case engine.SettledAgain:
		lr.events[eventSettledAgain].Inc()
	case engine.SettlingUnheld:
		lr.events[eventSettledUnheld].Inc()
	}
	if r.Lapsed > 0 {
		lr.events[eventExpired].Add(float64(r.Lapsed))
		lr.held.Sub(float64(r.LapsedHits))
	}
}

// countReservations counts the reservation calls of d on limits that
// reserve.
func countReservations(cm *configMetrics, d *service.Decision) {
	for i, l := range d.Limits {
		if l.Index < 0 || l.Index >= len(cm.reservations) {
			continue // a request override: it never reserves
		}
		if lr := cm.reservations[l.Index]; lr != nil {
			lr.count(&d.Results[i])
		}
	}
}
