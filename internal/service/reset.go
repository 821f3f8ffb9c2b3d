package service

import (
	"context"

	"github.com/rlsproject/rls/internal/config"
)

// ResetResult says what a Reset cleared. A value, built per call.
type ResetResult struct {
	Domain      string
	Descriptors []ResetDescriptor
	// Cleared is the number of counters that held state and were cleared
	// (a counter never used, or whose window ended, holds none).
	Cleared int
}

// ResetDescriptor is what a Reset did to one descriptor of the request.
type ResetDescriptor struct {
	Entries []config.Entry
	// Limits are the limits whose counters were reset, in the config's
	// order; empty when the descriptor matched no limit.
	Limits []*config.Limit
}

// Reset clears the counters of every limit that req's descriptors match,
// as a decision would find them (all windows, all algorithms; not those a
// replaces rule or unlimited sets aside), so that they start afresh. Hits
// and refunds of the request are ignored. It returns an *InvalidError for
// a malformed request; an unknown domain clears nothing. The observers are
// told of a reset that reached the store (Cleared).
func (s *Service) Reset(ctx context.Context, req *Request) (*ResetResult, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	res := &ResetResult{Domain: req.Domain, Descriptors: make([]ResetDescriptor, len(req.Descriptors))}
	for i := range req.Descriptors {
		res.Descriptors[i].Entries = req.Descriptors[i].Entries
	}
	cur := s.current.Load()
	var dom *config.Domain
	if cur != nil {
		dom = cur.cfg.Domain(req.Domain)
	}
	if dom == nil || len(req.Descriptors) == 0 {
		return res, nil
	}
	sc := &scratch{table: s.overridesOf(cur.cfg)}
	replaced, _ := sc.resolve(dom, req)
	sc.buildItems(req, newResponse(len(req.Descriptors)), replaced, s.all)
	if len(sc.items) == 0 {
		return res, nil
	}
	n, err := s.store.Reset(ctx, sc.items)
	if err != nil {
		return nil, err
	}
	for i, l := range sc.limits {
		d := &res.Descriptors[sc.owner[i]]
		d.Limits = append(d.Limits, l)
	}
	res.Cleared = n
	c := Cleared{Request: req, Domain: dom, Items: sc.items, Limits: sc.limits, Owners: sc.owner, Counters: n}
	for i, o := range s.observers {
		o.Cleared(cur.observed[i], &c)
	}
	return res, nil
}
