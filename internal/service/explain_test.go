package service

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/httpdesc"
)

func (f *fixture) explain(t *testing.T, req *Request) *Explanation {
	t.Helper()
	ex, err := f.svc.Explain(context.Background(), req)
	if err != nil {
		t.Fatalf("Explain(%s): %v", req.Domain, err)
	}
	if len(ex.Descriptors) != len(req.Descriptors) {
		t.Fatalf("Explain: %d descriptors explained for %d", len(ex.Descriptors), len(req.Descriptors))
	}
	return ex
}

// applies lists "label:applies" of a descriptor's limits.
func applies(de DescriptorExplanation) []string {
	var out []string
	for _, l := range de.Limits {
		out = append(out, l.Limit.Label+":"+l.Applies.String())
	}
	return out
}

// matchResult says how de, of ex, met the config, in the words of the
// explain endpoint's match.result.
func matchResult(ex *Explanation, de *DescriptorExplanation) string {
	switch {
	case ex.Dom == nil:
		return "unknown_domain"
	case de.Override:
		return "override"
	case de.Match.Stop == config.Matched && len(de.Match.Node.Limits) == 0:
		return "no_limits"
	}
	return de.Match.Stop.String()
}

// TestExplainConsumesNothing: an explanation reads the counters' state
// and leaves them as they were.
func TestExplainConsumesNothing(t *testing.T) {
	f := newFixture(t, Options{})
	ip := &Request{Domain: "api", Descriptors: []Descriptor{desc("remote_address", "10.0.0.1")}}
	f.check(t, ip)
	f.check(t, ip)
	for range 5 {
		ex := f.explain(t, ip)
		de := ex.Descriptors[0]
		if ex.Code != OK || matchResult(ex, &de) != "matched" || de.Match.Node.Path != "remote_address" || de.Hits != 1 {
			t.Fatalf("explanation %+v, want OK, matched remote_address, 1 hit", ex)
		}
		second := de.Limits[0].State
		if second == nil || second.Remaining != 1 || second.Reset != time.Second || !second.Admits {
			t.Fatalf("state of the 1s limit %+v, want 1 remaining, reset 1s, admits", second)
		}
		if minute := de.Limits[1].State; minute == nil || minute.Remaining != 3 {
			t.Fatalf("state of the 1m limit %+v, want 3 remaining", minute)
		}
	}
	if resp := f.check(t, ip); resp.Code != OK || resp.Statuses[0].Remaining != 0 {
		t.Errorf("third request after 5 explanations: %s remaining %d, want OK 0: explanations must consume nothing", resp.Code, resp.Statuses[0].Remaining)
	}
	ex := f.explain(t, ip)
	if ex.Code != OverLimit || ex.Descriptors[0].Code != OverLimit || ex.Never || ex.Descriptors[0].Limits[0].State.Admits {
		t.Errorf("explanation with the second full: %+v, want OVER_LIMIT (not never), the 1s limit not admitting", ex)
	}
	if got := f.seen.codes; got["OK"] != 3 || len(got) != 1 {
		t.Errorf("observers told of answers %v, want the 3 decisions only: explanations are not told", got)
	}
}

func TestExplainLimits(t *testing.T) {
	f := newFixture(t, Options{})
	four := desc("remote_address", "10.0.0.9")
	four.HasHits, four.Hits = true, 4
	over := desc("override_me", "x")
	over.Override = &Override{RequestsPerUnit: 7, Unit: engine.Minute}
	tests := []struct {
		name    string
		req     *Request
		code    Code
		never   bool
		applies [][]string
		results []string
	}{
		{
			name:    "replaces",
			req:     &Request{Domain: "api", Descriptors: []Descriptor{desc("api_key", "k1"), desc("plan", "gold")}},
			code:    OK,
			applies: [][]string{{"per_key:replaced"}, {"gold:enforced"}},
			results: []string{"matched", "matched"},
		},
		{
			name:    "unlimited, shadow, no limits",
			req:     &Request{Domain: "api", Descriptors: []Descriptor{desc("api_key", "vip"), desc("tenant", "t"), desc("user", "u"), desc("whitelisted", "w")}},
			code:    OK,
			applies: [][]string{{"api_key=vip/unlimited:unlimited"}, {"tenant/1m:shadow"}, {"user/1m:enforced", "try_strict:shadow"}, nil},
			results: []string{"matched", "matched", "matched", "no_limits"},
		},
		{
			name:    "never",
			req:     &Request{Domain: "api", Descriptors: []Descriptor{four}},
			code:    OverLimit,
			never:   true,
			applies: [][]string{{"remote_address/1s:enforced", "remote_address/1m:enforced"}},
			results: []string{"matched"},
		},
		{
			name:    "override",
			req:     &Request{Domain: "api", Descriptors: []Descriptor{over}},
			code:    OK,
			applies: [][]string{{"override:enforced"}},
			results: []string{"override"},
		},
		{
			name:    "unknown domain",
			req:     &Request{Domain: "nope", Descriptors: []Descriptor{desc("k", "v")}},
			code:    OK,
			applies: [][]string{nil},
			results: []string{"unknown_domain"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ex := f.explain(t, tc.req)
			if ex.Code != tc.code || ex.Never != tc.never {
				t.Errorf("code %s never %v, want %s %v", ex.Code, ex.Never, tc.code, tc.never)
			}
			for i, de := range ex.Descriptors {
				if got := applies(de); !reflect.DeepEqual(got, tc.applies[i]) {
					t.Errorf("descriptor %d limits %v, want %v", i, got, tc.applies[i])
				}
				if got := matchResult(ex, &de); got != tc.results[i] {
					t.Errorf("descriptor %d match %s (%+v), want %s", i, got, de.Match, tc.results[i])
				}
			}
		})
	}
	ex := f.explain(t, &Request{Domain: "api", Descriptors: []Descriptor{desc("api_key", "k1"), desc("plan", "gold")}})
	if by := ex.Descriptors[0].Limits[0].ReplacedBy; !reflect.DeepEqual(by, []string{"gold"}) {
		t.Errorf("per_key replaced by %v, want [gold]", by)
	}
}

func TestExplainStoreError(t *testing.T) {
	f := newFixture(t, Options{Store: failingStore{err: errors.New("connection refused")}})
	ex := f.explain(t, &Request{Domain: "api", Descriptors: []Descriptor{desc("remote_address", "10.0.0.1")}})
	if ex.StoreErr == nil || ex.Descriptors[0].Limits[0].State != nil || matchResult(ex, &ex.Descriptors[0]) != "matched" {
		t.Errorf("explanation on a failing store %+v, want the match, the limits without state and the store's error", ex)
	}
}

func TestExplainInvalid(t *testing.T) {
	f := newFixture(t, Options{})
	if _, err := f.svc.Explain(context.Background(), &Request{Domain: "api"}); err == nil {
		t.Error("Explain(no descriptors) = nil error, want InvalidArgument's")
	}
}

func TestExplainHTTP(t *testing.T) {
	f := newFixture(t, Options{})
	r := &httpdesc.StaticRequest{Method: "GET", Path: "/", Client: netip.MustParseAddr("192.0.2.7")}
	ex, err := f.svc.ExplainHTTP(context.Background(), "api", r)
	if err != nil {
		t.Fatal(err)
	}
	if len(ex.HTTP) != 2 || ex.HTTP[0].Entries == nil || ex.HTTP[0].Line != 4 || ex.HTTP[1].Entries != nil ||
		ex.HTTP[1].Reason != `no header "x-api-key"` {
		t.Fatalf("http_descriptors %+v, want the address's descriptor (test.yaml:4) and the api key's dropped for want of the header", ex.HTTP)
	}
	if len(ex.Descriptors) != 1 || ex.Descriptors[0].Match.Node.Path != "remote_address" {
		t.Errorf("descriptors %+v, want remote_address", ex.Descriptors)
	}
	ex, err = f.svc.ExplainHTTP(context.Background(), "nope", r)
	if err != nil || ex.Dom != nil || len(ex.Descriptors) != 0 {
		t.Errorf("ExplainHTTP(unknown domain) = %+v, %v; want an explanation of an unknown domain", ex, err)
	}
}
