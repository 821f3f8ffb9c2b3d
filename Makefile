# rls: `make run` serves config/limits.yaml on the embedded store; `make test`
# runs everything that must pass (it installs redis-server and nginx first
# when it can).
GO       ?= go
BIN      := bin/rls
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X main.buildVersion=$(VERSION)
FUZZTIME ?= 5s

.PHONY: help run build test test-short fuzz-smoke bench soak lint fmt prereqs clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## build bin/rls
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/rls

run: build ## serve config/limits.yaml on the memory store (gRPC :8081, HTTP :8080), with rate-limit headers
	./$(BIN) serve --config config/limits.yaml --response-headers both

prereqs: ## install or name the programs the tests start (redis-server, nginx)
	@./scripts/prereqs.sh

test: prereqs ## everything that must pass: vet, race tests (real Redis, Redis Cluster, nginx), fuzz smoke
	$(GO) vet ./...
	@test -z "$$(gofmt -l . | grep -v '^vendor/')" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	$(GO) test -race -count=1 -timeout 10m ./...
	$(MAKE) fuzz-smoke

test-short: ## the tests without the race detector and the fuzz smoke (Redis and nginx tests still run)
	$(GO) test -count=1 ./...

fuzz-smoke: ## run every fuzz target briefly (FUZZTIME each)
	@set -e; for spec in $$($(GO) run ./scripts/fuzztargets); do \
		pkg=$${spec%%:*}; fn=$${spec##*:}; \
		echo "fuzz $$pkg $$fn ($(FUZZTIME))"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

bench: ## microbenchmarks, then the load harness (ceiling vs rls memory vs rls Redis, side by side)
	$(GO) test -run '^$$' -bench . -benchmem ./internal/...
	$(GO) run ./bench/loadtest $(LOADFLAGS)

soak: ## about a minute of distinct client addresses: no growth of goroutines or memory
	$(GO) run ./bench/soak

lint: ## vet and gofmt check
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }

fmt: ## gofmt everything
	gofmt -w .

clean: ## remove bin/
	rm -rf bin
