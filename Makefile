# rls: `make run` serves config/limits.yaml on the embedded store; `make test`
# runs everything that must pass (it installs redis-server, nginx and
# prometheus first when it can). Go 1.26 or newer (go.mod); deploy/ is a module of its own
# (Kubernetes, Grafana and Prometheus files and their tests) that needs 1.26.7.
GO       ?= go
BIN      := bin/rls
PREFIX   ?= /usr/local
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.buildVersion=$(VERSION)
FUZZTIME ?= 5s
PROMTOOL ?= promtool

.PHONY: help run build install uninstall test test-short test-store saturation docs-check deploy-check fuzz-smoke bench bench-accuracy bench-tokenbudget soak ui-shots lint fmt prereqs clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

# A first build downloads the modules cmd/rls needs and compiles about 400
# packages (gRPC and the Envoy protos are most of it): a few minutes on two
# cores, silent without -v. Later builds take seconds and list nothing.
build: ## build bin/rls (the first build downloads modules and compiles gRPC and the Envoy protos: a few minutes)
	@GOPROXY=off $(GO) list -deps ./cmd/rls >/dev/null 2>&1 || \
		echo "$(BIN): downloading the Go modules it needs (first build only; this prints nothing until it is done)"
	@echo "$(BIN): compiling; go build -v names each package it compiles (about 400 on a first build, a few minutes; none when cached)"
	CGO_ENABLED=0 $(GO) build -v -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/rls

# Rust's rustup also installs a program called rls (its old language server),
# often first on PATH: the note below says which one `rls` runs.
install: build ## install bin/rls as $(PREFIX)/bin/rls (PREFIX=/usr/local; DESTDIR for packaging)
	install -d '$(DESTDIR)$(PREFIX)/bin'
	install -m 0755 $(BIN) '$(DESTDIR)$(PREFIX)/bin/rls'
	@found=$$(command -v rls 2>/dev/null || true); \
	if [ -z "$(DESTDIR)" ] && [ "$$found" != "$(PREFIX)/bin/rls" ]; then \
		echo "note: 'rls' on your PATH is $${found:-nothing}, not $(PREFIX)/bin/rls (rustup installs a Rust 'rls'): run $(PREFIX)/bin/rls"; \
	fi

uninstall: ## remove $(PREFIX)/bin/rls
	rm -f '$(DESTDIR)$(PREFIX)/bin/rls'

run: build ## serve config/limits.yaml on the memory store (gRPC :8081, HTTP :8080), with rate-limit headers and the operator page (http://localhost:8080/ui/)
	./$(BIN) serve --config config/limits.yaml --response-headers both --ui

# The operator page's browser test (internal/ui/browser) in chromium, which
# also writes a screenshot of each view for the README.
ui-shots: ## write a screenshot of each view of the operator page into docs/ui/ (needs chromium)
	RLS_UI_SHOTS=$(CURDIR)/docs/ui $(GO) test -count=1 -run TestOperatorPage ./internal/ui/browser/

prereqs: ## install or name the programs the tests start (redis-server, nginx, chromium, prometheus and promtool)
	@./scripts/prereqs.sh

test: prereqs ## everything that must pass: vet, staticcheck, race tests (real Redis, Redis Cluster, nginx, the README's blocks), deploy/ checks (with promtool and Prometheus), fuzz smoke
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	@test -z "$$(gofmt -l . | grep -v '^vendor/')" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) test -race -count=1 -timeout 10m ./...
	@# The allocation tests skip under -race (its sync.Pool drops scratch).
	$(GO) test -count=1 -run 'AllocateNothing' ./internal/service/ ./internal/decisionmetrics/
	$(MAKE) saturation
	$(MAKE) deploy-check
	$(MAKE) fuzz-smoke

# Two rls processes on one Redis (with a process spinning on a core), then on
# a 3-master cluster, 64 closed-loop clients on two cores, at the default
# store timeout: errors only in a few stalls of the host, every hit counted
# once. It needs the machine to itself (the load
# is the point), so it is behind a build tag, out of `go test ./...`, and
# run alone, without the race detector. About 20 s.
saturation: ## two rls processes on Redis and on a cluster at saturation: no error, exact counts
	$(GO) test -tags saturation -count=1 ./e2e/saturation/

# The README's and docs/'s runnable blocks, run as written against a fresh
# bin/rls (and Redis, nginx), each group in its own network and process
# namespace; and every relative link and anchor of the Markdown files.
# Also part of `go test ./...`.
docs-check: ## run the README's runnable blocks and check the docs' links
	$(GO) test -count=1 ./docs/

# deploy/ is its own Go module (its tests import Kubernetes and Prometheus
# packages that rls itself does not need). promtool checks the alert rules
# and runs their unit tests (deploy/prometheus/rls-alerts_test.yaml); the Go
# tests then run a real Prometheus with the rules against a running rls.
deploy-check: ## check deploy/: Kubernetes manifests, Prometheus rules (promtool, and a real Prometheus) and the Grafana dashboard against a running rls
	@command -v $(PROMTOOL) >/dev/null 2>&1 || { echo "$(PROMTOOL) not found: make prereqs installs it (Debian/Ubuntu: apt-get install --no-install-recommends prometheus)"; exit 1; }
	$(PROMTOOL) check rules deploy/prometheus/rls-alerts.yaml
	$(PROMTOOL) test rules deploy/prometheus/rls-alerts_test.yaml
	cd deploy && $(GO) vet ./... && $(GO) test -count=1 ./...

# The tests that start Redis, on one Redis-protocol server named by path
# (Valkey, a Redis built by hand): the store's conformance, cluster,
# Sentinel, per-second, lease and RLQS tests, rls's own tests on Redis and
# the README's Redis blocks. The server so named wins over redis-server in
# PATH and over a container; each package logs its version line.
STORE_PKGS   ?= ./internal/redisconn/... ./internal/redisstore/... ./internal/redistest/... ./internal/lease/ ./internal/rlqs/ ./cmd/rls/
STORE_BLOCKS ?= TestRunnableBlocks/README.md/(redis|cluster|sentinel|per-second|concurrency|reset)$$
test-store: ## the Redis tests against one server: make test-store SERVER=/path/to/valkey-server [CLI=/path/to/valkey-cli]
	@test -n "$(SERVER)" || { echo "usage: make test-store SERVER=/path/to/valkey-server [CLI=/path/to/valkey-cli]"; exit 2; }
	@RLS_TEST_REDIS_SERVER='$(SERVER)' RLS_TEST_REDIS_CLI='$(CLI)' $(GO) run ./scripts/redisversion
	RLS_TEST_REDIS_SERVER='$(SERVER)' RLS_TEST_REDIS_CLI='$(CLI)' $(GO) test -count=1 $(STORE_PKGS)
	RLS_TEST_REDIS_SERVER='$(SERVER)' RLS_TEST_REDIS_CLI='$(CLI)' $(GO) test -count=1 -run '$(STORE_BLOCKS)' ./docs/

test-short: ## the tests without the race detector and the fuzz smoke (Redis and nginx tests still run)
	$(GO) test -count=1 ./...
	$(MAKE) deploy-check

fuzz-smoke: ## run every fuzz target briefly (FUZZTIME each)
	GO=$(GO) ./scripts/fuzz-smoke.sh $(FUZZTIME)

bench: ## microbenchmarks, then the load harness (ceiling vs rls memory vs rls Redis, side by side)
	$(GO) test -run '^$$' -bench . -benchmem ./internal/...
	$(GO) run ./bench/loadtest $(LOADFLAGS)

# A seeded synthetic trace (ACCURACYFLAGS: -requests, -seed, -min-load,
# -max-load) through sliding_window and fixed_window, every decision compared
# with the exact sliding window: the README's accuracy table. Seconds on
# two cores.
bench-accuracy: ## accuracy of sliding_window and fixed_window against the exact sliding log, on 10M synthetic requests
	$(GO) run ./bench/accuracy $(ACCURACYFLAGS)

# A seeded simulation of LLM token budgets (TOKENBUDGETFLAGS: -tenants,
# -minutes, -seed, -estimates ...): the worst overrun of a budget with
# count_denied_hits and with reserve, the README's table. Seconds.
bench-tokenbudget: ## worst overrun of LLM token budgets: count_denied_hits against reserve
	$(GO) run ./bench/tokenbudget $(TOKENBUDGETFLAGS)

soak: ## about a minute of distinct client addresses: no growth of goroutines or memory
	$(GO) run ./bench/soak

# staticcheck is a tool of the module (go.mod's tool line: its version is
# pinned there, and the module proxy serves it on a fresh machine).
lint: ## vet, staticcheck and gofmt check
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	cd deploy && $(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }

fmt: ## gofmt everything
	gofmt -w .

clean: ## remove bin/
	rm -rf bin
