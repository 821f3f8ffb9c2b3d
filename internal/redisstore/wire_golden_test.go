package redisstore

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata from what the code does")

// golden compares got with testdata/name, or writes it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := "testdata/" + name
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test -run %s -update writes it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("%s changed: the Go↔Lua contract (or the key layout) is not what it was; if that is meant, change both sides (wire.go, scripts/) and run go test -run %s -update.\ngot:\n%s\nwant:\n%s", name, t.Name(), got, want)
	}
}

// goldenRules are a rule of each algorithm, a named one and a calendar one.
func goldenRules() []*engine.Rule {
	return []*engine.Rule{
		storetest.Rule(engine.FixedWindow, 10, time.Second, 0),
		storetest.Rule(engine.SlidingWindow, 240, time.Hour, 0),
		engine.MustCompile(engine.Spec{Algorithm: engine.SlidingLog, Unit: engine.Minute, Multiplier: 1, Limit: 5, Name: "burst"}),
		storetest.Rule(engine.TokenBucket, 50, time.Second, 100),
		storetest.CalendarRule(engine.Month, 3, time.UTC),
	}
}

// TestRequestEncoding holds what newRequest and appendArgs send the decide
// function to testdata/request.golden: the positions of its arguments are
// the contract of prelude.lua (REQUEST_*, ITEM_*, FLAG_*).
func TestRequestEncoding(t *testing.T) {
	at := time.Date(2027, 2, 10, 12, 0, 0, 0, time.UTC)
	var items []engine.Item
	var bases []string
	for i, r := range goldenRules() {
		it := engine.Item{Desc: "api/k=v", Rule: r, Hits: uint64(i)}
		switch i {
		case 1:
			it.Refund = true
		case 2:
			it.Shadow, it.Group = true, 2
		case 3:
			it.CountDenied = true
		}
		items = append(items, it)
		bases = append(bases, engine.CounterKey("rls:", it.Desc, r))
	}
	req := newRequest(modeReserve, "", at, items, bases)
	req.deadline, req.undoAfter = 1802260800010000, 1802260800005000
	// A request with reservation calls: a limit that reserves, called with
	// an id and without one, beside one that does not.
	tokens := storetest.ReserveRule(engine.FixedWindow, 100000, time.Hour, 0, 4000, 5*time.Minute)
	resItems := []engine.Item{
		{Desc: "llm/tenant=acme", Rule: tokens, Hits: 1, Reservation: "req-1"},
		{Desc: "llm/tenant=acme", Rule: goldenRules()[0], Hits: 1, Reservation: "req-1"},
		{Desc: "llm/tenant=beta", Rule: tokens, Hits: 1},
	}
	var resBases []string
	for _, it := range resItems {
		resBases = append(resBases, engine.CounterKey("rls:", it.Desc, it.Rule))
	}
	rreq := newRequest(modeFinal, "", at, resItems, resBases)
	// A plain request: every item one hit, no flags, no group.
	plain := items[:2:2]
	plain[0].Hits, plain[1].Hits, plain[1].Refund = 1, 1, false
	preq := newRequest(modeFinal, "", at, plain, bases[:2])
	var b strings.Builder
	for _, r := range []*request{req, rreq, preq} {
		args := r.appendArgs(nil)
		if len(args) != r.argCount() {
			t.Errorf("%d arguments, argCount says %d", len(args), r.argCount())
		}
		for i, a := range args {
			v := fmt.Sprint(a)
			if s, ok := a.(string); ok && strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
				v = strconv.Quote(s) // packed numbers (requestDeadline)
			}
			fmt.Fprintf(&b, "%d\t%T\t%s\n", i+1, a, v)
		}
		b.WriteString("\n")
	}
	golden(t, "request.golden", b.String())
}

// TestReplyDecoding holds how parseReply and results read a reply of
// the decide function (as go-redis hands it over) to testdata/reply.golden: the
// statuses (with a charged denial), the undo log flattened into
// release.lua's arguments, and the view.
func TestReplyDecoding(t *testing.T) {
	raw := []any{int64(verdictAdmitted), int64(1802260800001234),
		int64(replyItemAdmitted), int64(7), int64(1000000), int64(0),
		int64(replyItemDenied), int64(0), int64(59000000), int64(retryNever),
		int64(replyItemCharged - 3), int64(0), int64(60000000), int64(59000000),
		[]any{
			[]any{undoWindow, "rls:{api/k=v}", "fw1s", int64(1802260800000000), int64(1000000), int64(1), int64(2)},
			[]any{undoTAT, "rls:{api/k=v}", "tb1s", int64(-40000)},
			[]any{undoZRem, "rls:{api/k=v}:sl60s:5:burst", int64(1), "1802260800001234-3/1"},
			[]any{undoZAdd, "rls:{api/k=v}:sl60s:5:burst", "60000000", int64(2), "1802260799000000", "1802260799000000-2/1"},
		},
		[]any{int64(8), int64(1000000), int64(1), int64(59000000), int64(3), int64(60000000)},
	}
	rep, err := parseReply(raw, 3, nil)
	if err != nil {
		t.Fatal(err)
	}
	results := make([]engine.Result, 3)
	admitted, err := rep.results(nil, results)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "verdict %d now %d admitted %v\n", rep.verdict, rep.now, admitted)
	for i, r := range results {
		fmt.Fprintf(&b, "item %d: %+v\n", i, r)
	}
	b.WriteString("undo (release.lua's arguments after the instant):\n")
	for _, a := range rep.undo {
		fmt.Fprintf(&b, "\t%T\t%v\n", a, a)
	}
	fmt.Fprintf(&b, "view %+v\n", rep.view)

	// An admission that carries states (verdictAdmittedStates): a fixed
	// window, a sliding window, a token bucket, and a counter with none.
	rules := goldenRules()
	var items []engine.Item
	var bases []string
	for _, r := range []*engine.Rule{rules[0], rules[1], rules[3], rules[0]} {
		items = append(items, engine.Item{Desc: "api/k=v", Rule: r, Hits: 1})
		bases = append(bases, engine.CounterKey("rls:", "api/k=v", r))
	}
	req := newRequest(modeFinal, "", time.UnixMicro(1802260800001234), items, bases)
	pack := func(nums ...float64) string {
		var v []byte
		for _, x := range nums {
			v = binary.LittleEndian.AppendUint64(v, math.Float64bits(x))
		}
		return string(v)
	}
	rawStates := []any{int64(verdictAdmittedStates), int64(1802260800001234),
		pack(1802260800000000, 3), pack(1802257200000000, 40, 200), pack(1802260800041234), nil}
	rep, err = parseReply(rawStates, 4, nil)
	if err != nil {
		t.Fatal(err)
	}
	results = make([]engine.Result, 4)
	admitted, err = rep.results(req, results)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "states: verdict %d now %d admitted %v\n", rep.verdict, rep.now, admitted)
	for i, r := range results {
		fmt.Fprintf(&b, "item %d: %+v\n", i, r)
	}

	// Items whose rules reserve carry their reservations (a reserve held,
	// a settle, a look that found a hold ended by itself) beside an item
	// whose rule does not.
	rawHolds := []any{int64(verdictAdmitted), int64(1802260800001234),
		int64(replyItemAdmitted), int64(6000), int64(3000000000), int64(0),
		int64(phaseReserving), int64(4000), int64(4000), int64(1), int64(0), int64(0), int64(0),
		int64(replyItemAdmitted), int64(9), int64(1000000), int64(0),
		int64(replyItemAdmitted), int64(90000), int64(3000000000), int64(0),
		int64(phaseSettling), int64(4000), int64(0), int64(0), int64(0), int64(1), int64(4000),
	}
	rep, err = parseReply(rawHolds, 3, []bool{true, false, true})
	if err != nil {
		t.Fatal(err)
	}
	results = make([]engine.Result, 3)
	admitted, err = rep.results(nil, results)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(&b, "reservations: verdict %d now %d admitted %v\n", rep.verdict, rep.now, admitted)
	for i, r := range results {
		fmt.Fprintf(&b, "item %d: %+v\n", i, r)
	}
	golden(t, "reply.golden", b.String())
	if _, err := parseReply(rawHolds[:len(rawHolds)-1], 3, []bool{true, false, true}); err == nil {
		t.Errorf("parseReply of a reply short of a reservation field = nil error, want one")
	}
	bad := slices.Clone(rawHolds)
	bad[6] = int64(9)
	if rep, err := parseReply(bad, 3, []bool{true, false, true}); err == nil {
		if _, err := rep.results(nil, results); err == nil {
			t.Errorf("a reply with phase 9 read without error")
		}
	}

	for _, bad := range []any{
		"x", []any{int64(9), int64(0)},
		raw[:5],
		append(slices.Clone(raw[:14]), "not a log"),
		append(slices.Clone(raw[:15]), []any{int64(1)}),
	} {
		if _, err := parseReply(bad, 3, nil); err == nil {
			t.Errorf("parseReply(%v) = nil error, want one", bad)
		}
	}
	for _, bad := range []any{
		rawStates[:5],
		append(slices.Clone(rawStates[:5]), "seven b"),
		append(slices.Clone(rawStates[:5]), int64(1)),
	} {
		if _, err := parseReply(bad, 4, nil); err == nil {
			t.Errorf("parseReply(%v) = nil error, want one", bad)
		}
	}
}

// TestRedisKeys holds the keys that decisions write in Redis (their names
// and types; a hash's fields with their states' numbers) to
// testdata/redis-keys.golden: the key layout of engine/key.go as the
// scripts apply it. A change is a data migration.
func TestRedisKeys(t *testing.T) {
	srv := redistest.Start(t)
	clock := storetest.NewClock(time.Date(2027, 2, 10, 12, 0, 0, 0, time.UTC))
	s := newStore(t, Options{URL: srv.URL(), Prefix: "golden:", Now: clock.Now})
	ctx := context.Background()
	for _, r := range goldenRules() {
		for _, e := range []engine.Entry{{Key: "remote_address", Value: "203.0.113.7"}, {Key: "k", Value: "a b%{x}:"}} {
			items := []engine.Item{{Desc: string(engine.AppendDescriptorKey(nil, "api", []engine.Entry{e}, nil)), Rule: r, Hits: 1}}
			if _, err := s.Apply(ctx, items, make([]engine.Result, 1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A limit that reserves: one hold, one settled reservation.
	tokens := storetest.ReserveRule(engine.FixedWindow, 100000, time.Hour, 0, 4000, 5*time.Minute)
	desc := string(engine.AppendDescriptorKey(nil, "llm", []engine.Entry{{Key: "tenant", Value: "acme"}}, nil))
	for _, call := range []struct {
		id   string
		hits uint64
	}{{"req-1", 1}, {"req-2", 1}, {"req-2", 3500}} {
		items := []engine.Item{{Desc: desc, Rule: tokens, Hits: call.hits, Reservation: call.id}}
		if _, err := s.Apply(ctx, items, make([]engine.Result, 1)); err != nil {
			t.Fatal(err)
		}
	}
	client := s.backends[0].conn.Client()
	keys, err := client.Keys(ctx, "golden:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		typ, err := client.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s\t%s\n", typ, k)
		if typ == "zset" && strings.HasSuffix(k, "!e") {
			members, err := client.ZRangeWithScores(ctx, k, 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range members {
				fmt.Fprintf(&b, "\t%v\t%d\n", m.Member, int64(m.Score))
			}
		}
		if typ != "hash" {
			continue
		}
		fields, err := client.HGetAll(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range slices.Sorted(maps.Keys(fields)) {
			nums, err := unpackState(fields[f])
			if err != nil {
				t.Fatalf("%s field %s: %v", k, f, err)
			}
			fmt.Fprintf(&b, "\t%s\t%v\n", f, nums)
		}
	}
	golden(t, "redis-keys.golden", b.String())
}

// unpackState returns the numbers of a state packed in a hash field
// (stateNumber each: little-endian float64s).
func unpackState(v string) ([]int64, error) {
	if len(v)%8 != 0 {
		return nil, fmt.Errorf("redis: a state of %d bytes, not float64s", len(v))
	}
	nums := make([]int64, len(v)/8)
	for i := range nums {
		nums[i] = int64(stateNumberAt(v, i))
	}
	return nums, nil
}
