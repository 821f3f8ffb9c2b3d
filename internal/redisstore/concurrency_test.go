package redisstore

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
)

// TestConcurrencyKeys: a concurrency limit is a sorted set at its
// counter's key ("cc", with no lease_ttl in it) that expires lease_ttl
// after its newest acquisition; it stays on the main Redis whatever its
// lease_ttl (a per-second Redis holds windows under a minute, and a
// lease_ttl is no window); and a reload that changes the lease_ttl keeps
// the acquisitions in flight, which the new lease_ttl then judges.
func TestConcurrencyKeys(t *testing.T) {
	first, second := redistest.Start(t), redistest.Start(t)
	clock := storetest.NewClock(storetest.T0)
	s := newStore(t, Options{URL: first.URL(), PerSecond: &Options{URL: second.URL()}, Now: clock.Now})
	before := storetest.Rule(engine.Concurrency, 2, 30*time.Second, 0)
	after := storetest.Rule(engine.Concurrency, 2, 2*time.Minute, 0) // the config after a reload
	const desc = "d/user=u"
	key := engine.CounterKey(s.opts.Prefix, desc, before)
	ask := func(step string, l *engine.Rule, refund, want bool, remaining uint64) {
		t.Helper()
		res := make([]engine.Result, 1)
		ok, err := s.Apply(context.Background(), []engine.Item{{Desc: desc, Rule: l, Hits: 1, Refund: refund}}, res)
		if err != nil || ok != want || res[0].Remaining != remaining {
			t.Fatalf("%s: Apply = %v (remaining %d), %v; want %v (remaining %d)", step, ok, res[0].Remaining, err, want, remaining)
		}
	}
	pttl := func(want time.Duration) {
		t.Helper()
		if typ, err := redistest.Command(first.Addr(), "TYPE", key); err != nil || strings.TrimSpace(typ) != "zset" {
			t.Errorf("TYPE %s = %q, %v; want zset", key, typ, err)
		}
		out, err := redistest.Command(first.Addr(), "PTTL", key)
		if err != nil {
			t.Fatal(err)
		}
		ms, err := strconv.ParseInt(strings.TrimSpace(out), 10, 64)
		want += 24 * time.Hour // the scripts' pad (ttl_pad)
		if got := time.Duration(ms) * time.Millisecond; err != nil || got > want || got < want-2*time.Second {
			t.Errorf("PTTL %s = %q, want %s (a day's pad plus the lease_ttl after the newest acquisition)", key, out, want)
		}
	}
	ask("acquire", before, false, true, 1)
	ask("acquire", before, false, true, 0)
	if got, want := countersOf(t, first, "rls:"), []string{"rls:{d/user=u}:cc"}; !slices.Equal(got, want) {
		t.Errorf("counters on the main Redis: %q, want %q", got, want)
	}
	if got := countersOf(t, second, "rls:"); len(got) > 0 {
		t.Errorf("counters on the per-second Redis: %q, want none", got)
	}
	pttl(30 * time.Second)

	clock.Set(storetest.T0.Add(10 * time.Second))
	ask("acquire after the reload", after, false, false, 0)
	ask("release", after, true, true, 1)
	ask("acquire", after, false, true, 0)
	pttl(2 * time.Minute)
	// The acquisition of T0 left counts 2 minutes under the new lease_ttl.
	clock.Set(storetest.T0.Add(2*time.Minute - time.Millisecond))
	ask("acquire before the first lease ends", after, false, false, 0)
	clock.Set(storetest.T0.Add(2 * time.Minute))
	ask("acquire when it ends", after, false, true, 0)
}
