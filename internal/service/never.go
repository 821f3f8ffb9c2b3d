package service

import (
	"github.com/rlsproject/rls/internal/descriptors"
	"github.com/rlsproject/rls/internal/engine"
)

// never reports whether a denied request can never pass as it is: an item
// outside the quota groups never admits its hits (engine.Result.Never), or
// the quota groups alone deny it and each of them holds such an item.
// Shadow items never deny, so they do not count.
func never(items []engine.Item, results []engine.Result) bool {
	quotaOnly, groups := true, false
	for i := range items {
		it, r := &items[i], &results[i]
		if it.Group != 0 {
			groups = true
		}
		if it.Shadow || r.Admitted || it.Group != 0 {
			continue
		}
		if r.Never {
			return true
		}
		quotaOnly = false // a denial that a wait lifts
	}
	if !quotaOnly || !groups {
		return false
	}
	for i := range items {
		if g := items[i].Group; g != 0 && !groupNever(items, results, g) {
			return false
		}
	}
	return true
}

// groupNever reports whether quota group g holds a non-shadow item that
// never admits.
func groupNever(items []engine.Item, results []engine.Result, g int32) bool {
	for i := range items {
		if items[i].Group == g && !items[i].Shadow && results[i].Never {
			return true
		}
	}
	return false
}

// impossible counts a request that can never pass, and logs it at a
// bounded rate with the first limit that never admits: the client (or the
// proxy's hits_addend) asks for more than the config allows.
func (s *Service) impossible(cur *loaded, dom *descriptors.Domain, items []engine.Item, results []engine.Result) {
	cur.domains[dom.Name].countImpossible()
	s.neverLog.Do(func() {
		for i := range items {
			if r := &results[i]; r.Never && !items[i].Shadow {
				l := items[i].Limit
				s.log.Warn("a request asks more hits than a limit can ever admit: denied, with no Retry-After",
					"domain", dom.Name, "limit", l.Label, "hits", items[i].Hits, "capacity", engine.Capacity(l), "algorithm", l.Algorithm.String())
				return
			}
		}
	})
}
