package redisstore

import (
	"bufio"
	"context"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine"
	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/redistest"
)

// TestWireContract: every constant of the wire contract has the same value
// in Go (wire.go) and in Lua (scripts/prelude.lua), and neither side has a
// name the other lacks; every algorithm of the engine has its file
// (scripts/alg/<name>.lua), which declares its code (ALG_<NAME>) and
// registers it, no other file names that code, and every file of the
// scripts is in the library.
func TestWireContract(t *testing.T) {
	goSide := map[string]string{
		"REQUEST_HEAD":               strconv.Itoa(requestHead),
		"REQUEST_MODE":               strconv.Itoa(requestMode),
		"REQUEST_INSTANT":            strconv.Itoa(requestInstant),
		"REQUEST_DEADLINE":           strconv.Itoa(requestDeadline),
		"DEADLINE_PACK":              strconv.Quote(deadlinePack),
		"REQUEST_ITEMS":              strconv.Itoa(requestItems),
		"ITEM_FIELDS":                strconv.Itoa(itemFields),
		"PLAIN_ITEM_FIELDS":          strconv.Itoa(plainItemFields),
		"ITEM_KEY":                   strconv.Itoa(itemKey),
		"SAME_KEY":                   strconv.Quote(sameKey),
		"ITEM_RULE":                  strconv.Itoa(itemRule),
		"ITEM_HITS":                  strconv.Itoa(itemHits),
		"ITEM_OPTS":                  strconv.Itoa(itemOpts),
		"OPTS_GROUP":                 strconv.Itoa(optsGroup),
		"RULE_PATTERN":               strconv.Quote(rulePattern),
		"STATE_NUMBER":               strconv.Quote(stateNumber),
		"FLAG_REFUND":                strconv.Itoa(flagRefund),
		"FLAG_SHADOW":                strconv.Itoa(flagShadow),
		"FLAG_COUNT_DENIED":          strconv.Itoa(flagCountDenied),
		"FLAG_DENIED":                strconv.Itoa(flagDenied),
		"MODE_CHARGE":                strconv.Quote(modeCharge),
		"MODE_PEEK":                  strconv.Quote(modePeek),
		"LOG_TOTAL":                  strconv.Quote(logTotal),
		"MODE_FINAL":                 strconv.Quote(modeFinal),
		"MODE_RESERVE":               strconv.Quote(modeReserve),
		"REPLY_HEAD":                 strconv.Itoa(replyHead),
		"REPLY_ITEM_FIELDS":          strconv.Itoa(replyItemFields),
		"VERDICT_DENIED":             strconv.Itoa(verdictDenied),
		"VERDICT_ADMITTED":           strconv.Itoa(verdictAdmitted),
		"VERDICT_EXPIRED":            strconv.Itoa(verdictExpired),
		"VERDICT_ADMITTED_STATES":    strconv.Itoa(verdictAdmittedStates),
		"RETRY_NEVER":                strconv.Itoa(retryNever),
		"REPLY_ITEM_DENIED":          strconv.Itoa(replyItemDenied),
		"REPLY_ITEM_ADMITTED":        strconv.Itoa(replyItemAdmitted),
		"REPLY_ITEM_CHARGED":         strconv.Itoa(replyItemCharged),
		"REPLY_ITEM_BLOCKED":         strconv.Itoa(replyItemBlocked),
		"REPLY_ITEM_BLOCKED_CHARGED": strconv.Itoa(replyItemBlockedCharged),
		"TB_MAX_AHEAD":               strconv.Itoa(tbMaxAhead),
		"UNDO_WINDOW":                strconv.Quote(undoWindow),
		"UNDO_TAT":                   strconv.Quote(undoTAT),
		"UNDO_ZREM":                  strconv.Quote(undoZRem),
		"UNDO_ZADD":                  strconv.Quote(undoZAdd),
		"UNDO_PUBLISH":               strconv.Quote(undoPublish),
		"RESERVING_ITEMS":            strconv.Quote(reservingItems),
		"RESERVING_ITEM_FIELDS":      strconv.Itoa(reservingItemFields),
		"ITEM_RESERVATION":           strconv.Itoa(itemReservation),
	}
	// The key layout's parts the scripts derive are the engine's.
	goSide["FREED_CHANNEL"] = strconv.Quote(engine.FreedChannel(""))
	goSide["HASH_EXPIRY"] = strconv.Quote(engine.HashExpiry)
	goSide["PENALTY_SUFFIX"] = strconv.Quote(engine.PenaltyField(""))
	// decide/reserve.lua names its own part of the contract, in its block
	// (the library's top level is near Lua's 200 locals).
	records, events := engine.ReservationKeys("")
	reserveSide := map[string]string{
		"HELD_SUFFIX":           strconv.Quote(engine.HeldField("")),
		"RECORDS_SUFFIX":        strconv.Quote(records),
		"EVENTS_SUFFIX":         strconv.Quote(events),
		"REPLY_HOLD_FIELDS":     strconv.Itoa(replyHoldFields),
		"PHASE_NONE":            strconv.Itoa(phaseNone),
		"PHASE_RESERVING":       strconv.Itoa(phaseReserving),
		"PHASE_SETTLING":        strconv.Itoa(phaseSettling),
		"PHASE_SETTLED_AGAIN":   strconv.Itoa(phaseSettledAgain),
		"PHASE_SETTLING_UNHELD": strconv.Itoa(phaseSettlingUnheld),
		"UNDO_HOLD":             strconv.Quote(undoHold),
		"MAX_SWEEP":             strconv.Itoa(engine.MaxSweep),
	}
	reserveLua := luaConstants(script("decide/reserve.lua"))
	for name, want := range reserveSide {
		if got := reserveLua[name]; got != want {
			t.Errorf("decide/reserve.lua: %s = %q, Go has %s", name, got, want)
		}
	}
	luaSide := luaConstants(script("prelude.lua"))
	for name, want := range goSide {
		got, ok := luaSide[name]
		switch {
		case !ok:
			t.Errorf("prelude.lua has no constant %s (Go: %s)", name, want)
		case got != want:
			t.Errorf("prelude.lua: %s = %s, Go has %s", name, got, want)
		}
	}
	for name, v := range luaSide {
		if _, ok := goSide[name]; !ok {
			t.Errorf("prelude.lua's %s = %s has no Go counterpart in wire.go (add it to both and to this test)", name, v)
		}
	}

	// Every file of the scripts, and whether the library assembles it.
	inLibrary := map[string]bool{}
	err := fs.WalkDir(scripts, "scripts", func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			inLibrary[strings.TrimPrefix(path, "scripts/")] = false
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range libraryFiles() {
		if _, ok := inLibrary[f]; !ok {
			t.Errorf("the library assembles %s, which is not among the scripts", f)
		}
		inLibrary[f] = true
	}
	for f, in := range inLibrary {
		if !in {
			t.Errorf("scripts/%s is not in the library (libraryHead, libraryTail or an algorithm's file)", f)
		}
	}
	// Each algorithm: its file, its code there and nowhere else.
	algFiles := map[string]bool{}
	for code, name := range engine.Algorithms() {
		file, constant := algorithmScript(name), "ALG_"+strings.ToUpper(name)
		algFiles[file] = true
		src := script(file)
		if got := luaConstants(src)[constant]; got != strconv.Itoa(code) {
			t.Errorf("%s: local %s = %q, want the engine's code %d", file, constant, got, code)
		}
		if !strings.Contains(src, "algorithms["+constant+"] =") {
			t.Errorf("%s does not register the algorithm (algorithms[%s] = ...)", file, constant)
		}
		for f := range inLibrary {
			if f != file && strings.Contains(script(f), constant) {
				t.Errorf("scripts/%s names %s, which only %s may", f, constant, file)
			}
		}
	}
	for f := range inLibrary {
		if strings.HasPrefix(f, "alg/") && !algFiles[f] {
			t.Errorf("scripts/%s is not the file of an algorithm of the engine (%v)", f, engine.Algorithms())
		}
	}
}

// luaConstants returns the constants that src declares at the start of a
// line (local NAME = 'text' or an integer), by name, their values as Go
// literals.
func luaConstants(src string) map[string]string {
	constant := regexp.MustCompile(`^ *local ([A-Z][A-Z0-9_]*) = ('[^']*'|-?[0-9]+)`)
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(src))
	for sc.Scan() {
		if m := constant.FindStringSubmatch(sc.Text()); m != nil {
			v := m[2]
			if strings.HasPrefix(v, "'") {
				v = strconv.Quote(strings.Trim(v, "'"))
			}
			out[m[1]] = v
		}
	}
	return out
}

// TestUnknownAlgorithmCode: a code the scripts do not know is an error, and
// nothing of the call is decided (not even its earlier requests). The
// rule of the refused request is not kept (a later call is refused too).
func TestUnknownAlgorithmCode(t *testing.T) {
	srv := redistest.Start(t)
	s := newStore(t, Options{URL: srv.URL(), Prefix: "unknown:"})
	good := []engine.Item{{Desc: "d/k=v", Rule: storetest.Rule(engine.FixedWindow, 5, time.Minute, 0), Hits: 1}}
	bad := []engine.Item{{Desc: "d/k=w", Rule: storetest.Rule(engine.FixedWindow, 5, time.Minute, 0), Hits: 1}}
	args := []any{2}
	args = newRequest(modeFinal, "", time.Now(), good, []string{s.base(&good[0])}).appendArgs(args)
	badReq := newRequest(modeFinal, "", time.Now(), bad, []string{s.base(&bad[0])})
	badReq.items[0].rule = "9" + badReq.items[0].rule.(string)[1:]
	args = badReq.appendArgs(args)
	for range 2 {
		err := s.backends[0].conn.Call(context.Background(), lib.decide, []string{s.base(&good[0])}, args...)
		if err == nil || !strings.Contains(err.Error(), "unknown algorithm in rule 9|") {
			t.Fatalf("decide with algorithm code 9 = %v, want an error naming the rule", err)
		}
	}
	keys, err := s.backends[0].conn.Client().Keys(context.Background(), "unknown:*").Result()
	if err != nil || len(keys) != 0 {
		t.Errorf("keys after the refused call: %v (%v), want none", keys, err)
	}
}
