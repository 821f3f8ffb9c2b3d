package service

import (
	"context"
	"strings"

	"github.com/rlsproject/rls/internal/config"
)

// ResetResult says what a Reset cleared.
type ResetResult struct {
	Domain      string            `json:"domain"`
	Descriptors []ResetDescriptor `json:"descriptors"`
	// Cleared is the number of counters that held state and were cleared
	// (a counter never used, or whose window ended, holds none).
	Cleared int `json:"cleared"`
}

// ResetDescriptor is what a Reset did to one descriptor of the request.
type ResetDescriptor struct {
	Entries []EntryJSON `json:"entries"`
	// Limits are the labels of the limits whose counters were reset, in
	// the config's order; empty when the descriptor matched no limit.
	Limits []string `json:"limits"`
}

// String writes the descriptor key=value,... as rls check takes it.
func (d ResetDescriptor) String() string {
	parts := make([]string, len(d.Entries))
	for i, e := range d.Entries {
		parts[i] = e.Key + "=" + e.Value
	}
	return strings.Join(parts, ",")
}

// Reset clears the counters of every limit that req's descriptors match,
// as a decision would find them (all windows, all algorithms; not those a
// replaces rule or unlimited sets aside), so that they start afresh. Hits
// and refunds of the request are ignored. It returns an *InvalidError for
// a malformed request; an unknown domain clears nothing.
func (s *Service) Reset(ctx context.Context, req *Request) (*ResetResult, error) {
	if err := req.validate(); err != nil {
		return nil, err
	}
	res := &ResetResult{Domain: req.Domain, Descriptors: make([]ResetDescriptor, len(req.Descriptors))}
	for i := range req.Descriptors {
		res.Descriptors[i] = ResetDescriptor{Entries: entriesJSON(req.Descriptors[i].Entries), Limits: []string{}}
	}
	cur := s.current.Load()
	var dom *config.Domain
	if cur != nil {
		dom = cur.cfg.Domain(req.Domain)
	}
	if dom == nil || len(req.Descriptors) == 0 {
		return res, nil
	}
	sc := new(scratch)
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
		d.Limits = append(d.Limits, l.Label)
	}
	res.Cleared = n
	s.forgetFullness(cur, dom, sc)
	s.m.resets.Inc()
	s.m.resetCounters.Add(float64(n))
	return res, nil
}
