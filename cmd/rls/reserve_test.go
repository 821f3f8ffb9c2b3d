package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/rlsproject/rls/internal/engine/storetest"
	"github.com/rlsproject/rls/internal/proctest"
	"github.com/rlsproject/rls/internal/redistest"
)

// reserveBudgetConfig is a tenant's budget of 10000 tokens an hour, as
// LLM gateways send it: with reserve (an estimate of 500 tokens, the
// requests' max_tokens, held until the stream's end settles), or with
// count_denied_hits (a check of one hit at the request, the tokens
// charged at the stream's end).
const reserveBudgetConfig = `domain: llm
reservation_key: request_id
descriptors:
  - key: tenant
    value: reserved
    rate_limit: {unit: hour, requests_per_unit: 10000, reserve: {estimate: 500, ttl: 5m}}
  - key: tenant
    value: counted
    count_denied_hits: true
    rate_limit: {unit: hour, requests_per_unit: 10000}
`

// TestReserveTwoProcesses runs two rls processes (the binary) on one
// Redis and, in waves, 64 concurrent requests of one tenant, each sent to
// either process: every request's call comes first (with its id: a
// reserve of its estimate), then, for those admitted, the stream-end call
// with its tokens (at most the estimate: max_tokens is an upper bound) and
// the same id. With reserve the budget is never passed: the tokens charged
// are at most the budget, and the store's count is exactly their sum.
// With count_denied_hits (the same waves, no id), the first wave's 64
// checks all pass before any charge lands, and its charges pass the budget
// by far: what reserve is for.
func TestReserveTwoProcesses(t *testing.T) {
	const budget, estimate, concurrent, waves = 10000, 500, 64, 4
	seed := storetest.Seed(t)
	r := rand.New(rand.NewPCG(seed, 0x64))
	srv := redistest.Start(t)
	procs := proctest.ServeN(t, 2, reserveBudgetConfig, "--store", "redis", "--redis-url", srv.URL(), "--log-level", "warn", "--watch=false", "--store-timeout", "1s")
	client := &http.Client{Timeout: 10 * time.Second}
	// call sends one descriptor of tenant with id ("" for none) and hits
	// (-1: not set, the request's one hit; 0: a look).
	call := func(p *proctest.Served, tenant, id string, hits int) (bool, uint32) {
		entries := []map[string]string{{"key": "tenant", "value": tenant}}
		if id != "" {
			entries = append(entries, map[string]string{"key": "request_id", "value": id})
		}
		d := map[string]any{"entries": entries}
		if hits >= 0 {
			d["hits_addend"] = hits
		}
		body, _ := json.Marshal(map[string]any{"domain": "llm", "descriptors": []any{d}})
		resp, err := client.Post("http://"+p.HTTPAddr+"/json", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Error(err)
			return false, 0
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		var answer struct {
			Statuses []struct {
				LimitRemaining uint32 `json:"limitRemaining"`
			} `json:"statuses"`
		}
		if err := json.Unmarshal(out, &answer); err != nil || len(answer.Statuses) != 1 || resp.StatusCode != 200 && resp.StatusCode != 429 {
			t.Errorf("POST /json %s: %d %s (%v)", body, resp.StatusCode, out, err)
			return false, 0
		}
		return resp.StatusCode == 200, answer.Statuses[0].LimitRemaining
	}
	// run sends the waves on tenant (with ids when reserving) and returns
	// the tokens the store was asked to charge for admitted requests.
	run := func(tenant string, reserving bool) (charged uint64, admitted int) {
		for wave := range waves {
			tokens := make([]int, concurrent)
			for i := range tokens {
				tokens[i] = 100 + r.IntN(estimate-100+1)
			}
			ok := make([]bool, concurrent)
			var wg sync.WaitGroup
			for i := range concurrent {
				wg.Go(func() {
					id := ""
					if reserving {
						id = fmt.Sprintf("%s-%d-%d", tenant, wave, i)
					}
					ok[i], _ = call(procs[i%2], tenant, id, -1)
				})
			}
			wg.Wait()
			for i := range concurrent {
				if !ok[i] {
					continue // denied: the request is not served, its stream never ends
				}
				admitted++
				charged += uint64(tokens[i])
				wg.Go(func() {
					id := ""
					if reserving {
						id = fmt.Sprintf("%s-%d-%d", tenant, wave, i)
					}
					call(procs[(i+1)%2], tenant, id, tokens[i]) // the stream's end, on the other process
				})
			}
			wg.Wait()
		}
		return charged, admitted
	}

	charged, admitted := run("reserved", true)
	_, remaining := call(procs[0], "reserved", "", 0) // a look
	t.Logf("reserve: %d of %d requests admitted, %d tokens charged of a budget of %d, %d remaining", admitted, waves*concurrent, charged, budget, remaining)
	if charged > budget {
		t.Errorf("seed %d: reserve: %d tokens charged, past the budget of %d", seed, charged, budget)
	}
	if uint64(remaining) != budget-min(charged, budget) {
		t.Errorf("seed %d: reserve: %d remaining after %d tokens charged of %d: the store's count is not the tokens charged", seed, remaining, charged, budget)
	}
	if admitted < budget/estimate {
		t.Errorf("seed %d: reserve admitted %d requests, fewer than the budget's %d estimates", seed, admitted, budget/estimate)
	}

	counted, checked := run("counted", false)
	t.Logf("count_denied_hits: %d of %d requests admitted, %d tokens charged of a budget of %d", checked, waves*concurrent, counted, budget)
	if counted <= budget {
		t.Errorf("seed %d: count_denied_hits: %d tokens charged, within the budget: the 64 checks of the first wave should all pass before their charges", seed, counted)
	}
}
