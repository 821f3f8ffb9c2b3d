package service

import (
	"context"

	"github.com/rlsproject/rls/internal/httpdesc"
)

// CheckHTTP decides a plain HTTP request (nginx auth_request, ext_authz)
// against domain: its descriptors come from the domain's http_descriptors
// applied to r, one hit each. The response always carries both header
// drafts. It returns ErrUnknownDomain when the config has no such domain;
// a domain whose http_descriptors produce nothing for r answers OK.
func (s *Service) CheckHTTP(ctx context.Context, domain string, r httpdesc.Request) (*Response, error) {
	cur := s.current.Load()
	if cur == nil {
		return nil, ErrUnknownDomain
	}
	dom := cur.cfg.Domain(domain)
	if dom == nil {
		return nil, ErrUnknownDomain
	}
	sc := s.scratch.Get().(*scratch)
	defer s.release(sc)
	sc.built = dom.HTTPDescriptors.Build(r, sc.built[:0])
	req := &sc.httpReq
	req.Domain, req.Descriptors = domain, req.Descriptors[:0]
	for _, entries := range sc.built {
		req.Descriptors = append(req.Descriptors, Descriptor{Entries: entries})
	}
	if len(req.Descriptors) == 0 {
		// Nothing to decide: OK with no limit.
		sc.decision = Decision{Request: req, Domain: dom, Response: &Response{Code: OK}}
		s.observe(cur, &sc.decision)
		return sc.decision.Response, nil
	}
	// The entries come from the config's actions and from header values
	// that the HTTP server already bounds, so validate's limits on client
	// supplied descriptors do not apply.
	return s.decide(ctx, req, HeadersBoth)
}
