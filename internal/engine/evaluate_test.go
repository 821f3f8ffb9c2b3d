package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/descriptors"
)

// memStates gives each distinct counter (Desc + Limit.ID) one State, the way
// a store would.
type memStates map[string]*State

func (m memStates) evaluate(now time.Time, items []Item) (bool, []Result) {
	states := make([]*State, len(items))
	for i := range items {
		k := items[i].Key()
		if m[k] == nil {
			m[k] = new(State)
		}
		states[i] = m[k]
	}
	results := make([]Result, len(items))
	return Evaluate(now, items, states, results), results
}

func TestEvaluateAllOrNothing(t *testing.T) {
	perSecond := limit(descriptors.FixedWindow, 3, time.Second, 0)
	perMinute := limit(descriptors.FixedWindow, 5, time.Minute, 0)
	m := memStates{}
	req := func(hits uint64) []Item {
		return []Item{
			{Desc: "d/ip=1", Limit: perSecond, Hits: hits},
			{Desc: "d/ip=1", Limit: perMinute, Hits: hits},
		}
	}
	steps := []struct {
		at        time.Duration
		hits      uint64
		ok        bool
		remSecond uint64
		remMinute uint64
		okSecond  bool
		okMinute  bool
	}{
		{0, 2, true, 1, 3, true, true},
		{0, 2, false, 1, 3, false, true}, // the second denies: the minute is not consumed
		{0, 1, true, 0, 2, true, true},
		{sec, 2, true, 1, 0, true, true},
		{2 * sec, 1, false, 3, 0, true, false}, // the minute denies: the second is not consumed
	}
	for i, s := range steps {
		ok, res := m.evaluate(t0.Add(s.at), req(s.hits))
		if ok != s.ok || res[0].Admitted != s.okSecond || res[1].Admitted != s.okMinute {
			t.Fatalf("step %d: Evaluate(t0+%s, hits=%d) = %v (second %v, minute %v), want %v (%v, %v)",
				i, s.at, s.hits, ok, res[0].Admitted, res[1].Admitted, s.ok, s.okSecond, s.okMinute)
		}
		if res[0].Remaining != s.remSecond || res[1].Remaining != s.remMinute {
			t.Errorf("step %d: remaining = (%d, %d), want (%d, %d)", i, res[0].Remaining, res[1].Remaining, s.remSecond, s.remMinute)
		}
	}
}

func TestEvaluateAcrossDescriptors(t *testing.T) {
	l := limit(descriptors.TokenBucket, 2, time.Second, 2)
	m := memStates{}
	ok, _ := m.evaluate(t0, []Item{{Desc: "d/user=b", Limit: l, Hits: 2}})
	if !ok {
		t.Fatal("setup: user b's first 2 hits denied")
	}
	ok, res := m.evaluate(t0, []Item{{Desc: "d/user=a", Limit: l, Hits: 1}, {Desc: "d/user=b", Limit: l, Hits: 1}})
	if ok || !res[0].Admitted || res[1].Admitted {
		t.Fatalf("Evaluate(a, b) = %v (%v, %v), want false (true, false)", ok, res[0].Admitted, res[1].Admitted)
	}
	if res[0].Remaining != 2 {
		t.Errorf("user a remaining = %d after a denied request, want 2 (nothing consumed)", res[0].Remaining)
	}
	if res[1].RetryAfter != 500*ms {
		t.Errorf("user b retry after = %s, want 500ms", res[1].RetryAfter)
	}
}

func TestEvaluateShadow(t *testing.T) {
	enforced := limit(descriptors.FixedWindow, 10, time.Minute, 0)
	shadow := limit(descriptors.FixedWindow, 1, time.Second, 0)
	m := memStates{}
	req := []Item{{Desc: "d/k=v", Limit: enforced, Hits: 1}, {Desc: "d/k=v", Limit: shadow, Hits: 1, Shadow: true}}
	for i, want := range []struct {
		shadowOK  bool
		remaining uint64
	}{{true, 9}, {false, 8}, {false, 7}} {
		ok, res := m.evaluate(t0, req)
		if !ok || res[1].Admitted != want.shadowOK || res[0].Remaining != want.remaining {
			t.Fatalf("step %d: Evaluate = %v (shadow admitted %v, remaining %d), want true (%v, %d)",
				i, ok, res[1].Admitted, res[0].Remaining, want.shadowOK, want.remaining)
		}
		if res[1].Remaining != 0 {
			t.Errorf("step %d: shadow remaining = %d, want 0 (a denied shadow hit is not consumed past the limit)", i, res[1].Remaining)
		}
	}
}

func TestEvaluateQuotaGroups(t *testing.T) {
	l := limit(descriptors.FixedWindow, 1, time.Minute, 0)
	plain := limit(descriptors.FixedWindow, 100, time.Minute, 0)
	plain.ID = "plain"
	m := memStates{}
	req := []Item{
		{Desc: "d/quota=a", Limit: l, Hits: 1, Group: 1},
		{Desc: "d/quota=a", Limit: plain, Hits: 1, Group: 1},
		{Desc: "d/quota=b", Limit: l, Hits: 1, Group: 2},
		{Desc: "d/ip=1", Limit: plain, Hits: 1},
	}
	// 1: both quotas have room: everything is consumed.
	ok, res := m.evaluate(t0, req)
	if !ok || res[1].Remaining != 99 || res[2].Remaining != 0 || res[3].Remaining != 99 {
		t.Fatalf("request 1 = %v, remaining %d/%d/%d, want true, 99/0/99", ok, res[1].Remaining, res[2].Remaining, res[3].Remaining)
	}
	// 2: both quotas are over: denied, nothing consumed.
	ok, res = m.evaluate(t0, req)
	if ok || res[3].Remaining != 99 || res[1].Remaining != 99 {
		t.Fatalf("request 2 = %v, remaining ip %d, quota a plain %d, want false, 99, 99", ok, res[3].Remaining, res[1].Remaining)
	}
	// 3: a new quota c has room: admitted; quota a is over, so its plain
	// limit, which admits on its own, is not consumed.
	req = append(req, Item{Desc: "d/quota=c", Limit: l, Hits: 1, Group: 3})
	ok, res = m.evaluate(t0, req)
	if !ok || res[1].Remaining != 99 || res[3].Remaining != 98 || res[4].Remaining != 0 {
		t.Fatalf("request 3 = %v, remaining a-plain %d, ip %d, c %d, want true, 99, 98, 0", ok, res[1].Remaining, res[3].Remaining, res[4].Remaining)
	}
	if !res[1].Admitted || res[0].Admitted {
		t.Errorf("request 3 verdicts: quota a (%v, plain %v), want (false, true)", res[0].Admitted, res[1].Admitted)
	}
}

func TestEvaluateSameCounterTwice(t *testing.T) {
	// envoyproxy/ratelimit counts a descriptor that appears twice twice; so do
	// we, and the second sees the first.
	l := limit(descriptors.FixedWindow, 3, time.Minute, 0)
	m := memStates{}
	item := Item{Desc: "d/k=v", Limit: l, Hits: 2}
	ok, res := m.evaluate(t0, []Item{item, item})
	if ok || !res[0].Admitted || res[1].Admitted || res[0].Remaining != 3 {
		t.Fatalf("Evaluate(2+2 on 3) = %v (%v, %v) remaining %d, want false (true, false) 3", ok, res[0].Admitted, res[1].Admitted, res[0].Remaining)
	}
	item.Hits = 1
	ok, res = m.evaluate(t0, []Item{item, item})
	if !ok || res[0].Remaining != 1 || res[1].Remaining != 1 {
		t.Fatalf("Evaluate(1+1 on 3) = %v remaining (%d, %d), want true (1, 1)", ok, res[0].Remaining, res[1].Remaining)
	}
}

func TestEvaluateSlidingLogRestoredOnDenial(t *testing.T) {
	log := limit(descriptors.SlidingLog, 5, time.Minute, 0)
	strict := limit(descriptors.FixedWindow, 0, time.Minute, 0)
	m := memStates{}
	for i := range 3 {
		ok, res := m.evaluate(t0.Add(time.Duration(i)*sec), []Item{{Desc: "d/k=v", Limit: log, Hits: 1}})
		if !ok {
			t.Fatalf("setup hit %d denied: %+v", i, res)
		}
	}
	// A refund and a consumption on the log, denied by another limit: the log
	// must be exactly as before.
	ok, _ := m.evaluate(t0.Add(3*sec), []Item{
		{Desc: "d/k=v", Limit: log, Hits: 2, Refund: true},
		{Desc: "d/k=v", Limit: log, Hits: 4},
		{Desc: "d/other=x", Limit: strict, Hits: 1},
	})
	if ok {
		t.Fatal("request with a limit of 0 admitted")
	}
	st := m["d/k=v:"+log.ID]
	want := []int64{t0.UnixMicro(), t0.Add(sec).UnixMicro(), t0.Add(2 * sec).UnixMicro()}
	if fmt.Sprint(st.Log) != fmt.Sprint(want) {
		t.Errorf("log after a denied request = %v, want %v", st.Log, want)
	}
}

func BenchmarkEvaluate(b *testing.B) {
	windows := []*descriptors.Limit{
		limit(descriptors.FixedWindow, 1<<30, time.Second, 0),
		limit(descriptors.SlidingWindow, 1<<30, time.Minute, 0),
		limit(descriptors.TokenBucket, 1_000_000, time.Second, 1_000_000),
	}
	items := make([]Item, len(windows))
	states := make([]*State, len(windows))
	for i, l := range windows {
		items[i] = Item{Desc: "api/remote_address=10.0.0.1", Limit: l, Hits: 1}
		states[i] = new(State)
	}
	results := make([]Result, len(items))
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		Evaluate(now, items, states, results)
	}
}
