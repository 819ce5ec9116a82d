GO ?= go
BIN := bin
LDFLAGS := -s -w -X main.version=$(shell git describe --always --dirty 2>/dev/null || echo dev)
PKGS := ./...

.PHONY: build test lint bench chaos demo dev clean compose-up compose-down packages

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...

# The runnerd and controlplane .deb packages (deploy/packages/, nfpm pinned
# in tools/packages/go.mod) of `make build`'s binaries, in bin/packages/.
PKG_VERSION ?= 0.$(shell git rev-list --count HEAD 2>/dev/null || echo 0)

packages: build
	deploy/packages/build.sh $(BIN) $(BIN)/packages $(PKG_VERSION)

lint:
	$(GO) vet $(PKGS)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

test: lint
	$(GO) test -race -count=1 -timeout 30m $(PKGS)

# B1–B6 of issue 14 (cmd/bench) on SQLite, and on PostgreSQL when
# RUNNERD_TEST_POSTGRES names a database, with River's own client beside B2
# there (tools/riverbench, a module of its own): the figures go into
# docs/performance.md (its generated section) and docs/bench.json. At most
# ten minutes; BENCHFLAGS=-quick for a token run; PROFILES=DIR keeps B2's
# CPU profiles in DIR.
PROFILES ?=

bench: build
	$(BIN)/bench --bin $(BIN) $(if $(PROFILES),--profiles $(PROFILES)) $(BENCHFLAGS)

# The long chaos campaign (integration/chaos; root, Docker, PostgreSQL's
# binaries): TURNS turns under faults drawn from SEED (random if unset);
# its table, seed and fault mix go to docs/reliability.md.
TURNS ?= 2000
SEED ?=

chaos:
	CHAOS_TURNS=$(TURNS) CHAOS_SEED=$(SEED) CHAOS_REPORT=$(CURDIR)/docs/reliability.md \
		$(GO) test -count=1 -timeout 90m -run '^TestChaos$$' -v ./integration/chaos/

SANDBOX ?= process
AGENT ?= lines

demo: build
	$(BIN)/demo --bin $(BIN) --sandbox $(SANDBOX) --agent $(AGENT)

dev: build
	$(BIN)/demo --bin $(BIN) --sandbox $(SANDBOX) --dev

# Two control-plane replicas on PostgreSQL and two host daemons, every image
# built here (deploy/compose/, docs/operations.md). Needs root and Docker.
compose-up:
	deploy/compose/up.sh

compose-down:
	deploy/compose/down.sh

clean:
	rm -rf $(BIN)
