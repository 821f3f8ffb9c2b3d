package service

import "github.com/rlsproject/rls/internal/engine"

// never reports whether a denied request can never pass as it is: with
// every item that a wait could lift counted as admitted (all but the
// engine.Result.Never ones), the all-or-nothing rule still denies it.
func never(items []engine.Item, results []engine.Result) bool {
	var buf [8]engine.Result
	lifted := buf[:0]
	if len(results) > len(buf) {
		lifted = make([]engine.Result, 0, len(results))
	}
	for _, r := range results {
		lifted = append(lifted, engine.Result{Admitted: r.Admitted || !r.Never})
	}
	admitted, _ := engine.Admit(items, lifted)
	return !admitted
}

// logImpossible logs a request that can never pass (Response.Never), at a
// bounded rate, with the first limit that never admits: the client (or the
// proxy's hits_addend) asks for more than the config allows.
func (s *Service) logImpossible(d *Decision) {
	s.neverLog.Do(func() {
		for i := range d.Items {
			if r := &d.Results[i]; r.Never && !d.Items[i].Shadow {
				l := d.Limits[i]
				s.log.Warn("a request asks more hits than a limit can ever admit: denied, with no Retry-After",
					"domain", d.Domain.Name, "limit", l.Label, "hits", d.Items[i].Hits, "capacity", l.Rule.Capacity(), "algorithm", l.Rule.Algorithm())
				return
			}
		}
	})
}
