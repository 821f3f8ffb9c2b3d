package ruletest

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rlsproject/rls/internal/config"
	"github.com/rlsproject/rls/internal/memstore"
	"github.com/rlsproject/rls/internal/overrides"
	"github.com/rlsproject/rls/internal/service"
)

// Result is the outcome of one case.
type Result struct {
	Case *Case
	// Failure says what went wrong first, "step N: got …, want …"; "" when
	// the case passed.
	Failure string
}

// Run runs every case of f against cfg, in order, and writes "PASS name"
// or "FAIL name: step N: got …, want …" per case to w.
func Run(cfg *config.Config, f *File, w io.Writer) (passed, failed int) {
	for _, c := range f.Cases {
		r := RunCase(cfg, c)
		if r.Failure == "" {
			passed++
			fmt.Fprintf(w, "PASS %s\n", c.Name)
			continue
		}
		failed++
		fmt.Fprintf(w, "FAIL %s: %s\n", c.Name, r.Failure)
	}
	return passed, failed
}

// clock is a case's virtual clock: the store reads it, the runner sets it.
// Safe for concurrent use (the store's sweeper reads it too).
type clock struct{ us atomic.Int64 }

func (c *clock) set(t time.Time) { c.us.Store(t.UnixMicro()) }
func (c *clock) now() time.Time  { return time.UnixMicro(c.us.Load()).UTC() }

// RunCase runs c against cfg: a fresh memory store whose clock is the
// case's, the real service on it (both header drafts on), and the steps in
// order until one fails.
func RunCase(cfg *config.Config, c *Case) Result {
	var clk clock
	store := memstore.New(memstore.Options{Now: clk.now, SweepEvery: time.Hour})
	defer store.Close()
	keep := overrides.New(must(overrides.NewMemory("", clk.now)), overrides.Options{Now: clk.now})
	svc := service.New(service.Options{Store: store, Headers: service.HeadersBoth, Now: clk.now, Overrides: keep})
	svc.SetConfig(cfg)
	pending := slices.Clone(c.Overrides)
	slices.SortStableFunc(pending, func(a, b Override) int { return cmp.Compare(a.At, b.At) })
	// setDue sets the overrides due by t, each at its own instant.
	setDue := func(t time.Time) string {
		for len(pending) > 0 && !c.Start.Add(pending[0].At).After(t) {
			o := pending[0]
			pending = pending[1:]
			clk.set(c.Start.Add(o.At))
			if _, err := keep.Set(context.Background(), o.Change, "rls test"); err != nil {
				return fmt.Sprintf("the override at line %d:%d: %v", o.Line, o.Column, err)
			}
		}
		return ""
	}
	if msg := setDue(c.Start); msg != "" {
		return Result{Case: c, Failure: msg}
	}
	t := c.Start
	for i, s := range c.Steps {
		switch s.When {
		case At:
			t = c.Start.Add(s.Offset)
		case After:
			t = t.Add(s.Offset)
		case Instant:
			t = s.Time
		}
		fail := func(format string, args ...any) Result {
			return Result{Case: c, Failure: fmt.Sprintf("step %d: ", i+1) + fmt.Sprintf(format, args...)}
		}
		if cfg.Domain(s.Domain) == nil {
			return fail("got domain %q, want a domain of the config (%s)", s.Domain, domainNames(cfg))
		}
		for k := range s.Repeat {
			if k > 0 {
				t = t.Add(s.Every)
			}
			if msg := setDue(t); msg != "" {
				return fail("%s", msg)
			}
			clk.set(t)
			where := fmt.Sprintf(" (at +%s)", t.Sub(c.Start))
			if s.Repeat > 1 {
				where = fmt.Sprintf(" (request %d of %d, at +%s)", k+1, s.Repeat, t.Sub(c.Start))
			}
			resp, err := s.send(svc)
			if err != nil {
				return fail("got error %q, want %s%s", err, s.Expect, where)
			}
			if resp.Code != s.Expect {
				return fail("got %s, want %s%s%s", resp.Code, s.Expect, why(resp), where)
			}
			if k < s.Repeat-1 {
				continue
			}
			if msg := s.checkStatuses(resp); msg != "" {
				return fail("%s%s", msg, where)
			}
			if msg := s.checkHeaders(resp); msg != "" {
				return fail("%s%s", msg, where)
			}
		}
	}
	return Result{Case: c}
}

// must returns v, panicking on err: for what cannot fail (a memory
// backend without a file).
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// send asks svc for the step's request.
func (s *Step) send(svc *service.Service) (*service.Response, error) {
	ctx := context.Background()
	if s.HTTP != nil {
		return svc.CheckHTTP(ctx, s.Domain, s.HTTP)
	}
	return svc.ShouldRateLimit(ctx, &service.Request{Domain: s.Domain, Descriptors: s.Descriptors, HitsAddend: s.HitsAddend})
}

// why says, for a failed verdict, which limit bound each descriptor, e.g.
// "; statuses[0]: OVER_LIMIT remote_address/1s remaining 0 reset 1s".
func why(resp *service.Response) string {
	var b strings.Builder
	for i := range resp.Statuses {
		fmt.Fprintf(&b, "; statuses[%d]: %s", i, statusText(&resp.Statuses[i]))
	}
	return b.String()
}

func statusText(st *service.Status) string {
	if st.Limit == nil {
		if st.Remaining == math.MaxUint32 {
			return st.Code.String() + " unlimited"
		}
		return st.Code.String() + " no limit"
	}
	s := fmt.Sprintf("%s %s remaining %d reset %s", st.Code, st.Limit.Label, st.Remaining, wireSeconds(st.ResetAfter))
	if st.Never {
		s += " (never passes)"
	}
	if st.Limit.Rule != nil && st.Limit.Rule.Lease {
		// Decided here as on any store; on Redis the same verdicts, from
		// slices, with remaining what the slice holds.
		s += " (leased)"
	}
	return s
}

// wireSeconds is d as duration_until_reset carries it: whole seconds,
// rounded up.
func wireSeconds(d time.Duration) time.Duration {
	return time.Duration(service.CeilSeconds(d)) * time.Second
}

// checkStatuses returns what differs between the response's statuses and
// the step's expectations, "" when nothing does.
func (s *Step) checkStatuses(resp *service.Response) string {
	if len(resp.Statuses) < len(s.Statuses) {
		return fmt.Sprintf("got %d statuses, want %d or more", len(resp.Statuses), len(s.Statuses))
	}
	for i, e := range s.Statuses {
		st := &resp.Statuses[i]
		if e.Code != nil && st.Code != *e.Code {
			return fmt.Sprintf("got statuses[%d] %s, want %s", i, st.Code, *e.Code)
		}
		if e.Limit != nil {
			got := ""
			if st.Limit != nil {
				got = st.Limit.Label
			}
			if got != *e.Limit {
				return fmt.Sprintf("got statuses[%d] limit %s, want %s", i, limitName(got), limitName(*e.Limit))
			}
		}
		if e.Remaining != nil && st.Remaining != *e.Remaining {
			return fmt.Sprintf("got statuses[%d] remaining %s, want %s", i, remainingText(st.Remaining), remainingText(*e.Remaining))
		}
		if e.Reset != nil && wireSeconds(st.ResetAfter) != *e.Reset {
			return fmt.Sprintf("got statuses[%d] reset %s, want %s", i, wireSeconds(st.ResetAfter), *e.Reset)
		}
	}
	return ""
}

func limitName(label string) string {
	if label == "" {
		return "none"
	}
	return fmt.Sprintf("%q", label)
}

func remainingText(r uint32) string {
	if r == math.MaxUint32 {
		return "unlimited"
	}
	return fmt.Sprint(r)
}

// checkHeaders returns what differs between the response's headers and
// the step's expectations, "" when nothing does.
func (s *Step) checkHeaders(resp *service.Response) string {
	for _, e := range s.Headers {
		v, ok := header(resp, e.Name)
		switch {
		case e.Absent && ok:
			return fmt.Sprintf("got header %s %q, want none", e.Name, v)
		case e.Absent:
		case !ok:
			return fmt.Sprintf("got no header %s, want %q", e.Name, e.Value)
		case v != e.Value:
			return fmt.Sprintf("got header %s %q, want %q", e.Name, v, e.Value)
		}
	}
	return ""
}

func header(resp *service.Response, name string) (string, bool) {
	for _, h := range resp.Headers {
		if strings.EqualFold(h.Key, name) {
			return h.Value, true
		}
	}
	return "", false
}

func domainNames(cfg *config.Config) string {
	var names []string
	for _, d := range cfg.Domains() {
		names = append(names, d.Name)
	}
	if len(names) == 0 {
		return "it has none"
	}
	return strings.Join(names, ", ")
}
