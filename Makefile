# shardd — make targets. `make help` lists them.
GO       ?= go
BIN      ?= bin/shardd
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X github.com/shardd/shardd/pkg/version.Version=$(VERSION)
FUZZTIME ?= 10s

BENCHTIME ?= 20x
SCALE_BENCHTIME ?= 3x

DESTDIR  ?=
PREFIX   ?= /usr/local

CHAOS_ROUNDS ?= 200
CHAOS_SEED   ?=
CHAOS_OUT    ?= $(CURDIR)/bench/chaos-summary.json
CHAOS_JOBS   ?= 2000
CHAOS_SCALE_OUT ?= $(CURDIR)/bench/chaos-scale-summary.json
SOAK_DURATION ?= 1h
HISTORY_DURATION ?= 10m
SOAK_OUT      ?= $(CURDIR)/bench/soak.json
RACE_PKGS     ?= ./...
RACE_TIMEOUT  ?= 30m

.PHONY: help build test test-race lint fuzz bench chaos chaos-scale soak e2e-long e2e-compose run install verify-deploy clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-13s %s\n", $$1, $$2}'

build: ## build bin/shardd
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/shardd

# Most tests wait on etcd and on timers, not on the CPU (the whole suite
# uses about 50 s of CPU in its 100-odd seconds on 2 cores): four tests at
# a time in each package, four packages at a time. internal/e2e bounds its
# multi-process tests itself (3 at a time, fault tests one at a time).
TEST_PARALLEL ?= 4
TEST_PACKAGES ?= 4

test: ## run the default test suite (TEST_PACKAGES packages at a time, TEST_PARALLEL tests at a time in each; default 4 and 4)
	$(GO) test -p $(TEST_PACKAGES) -parallel $(TEST_PARALLEL) ./...

# A race-instrumented binary is 2-10x slower and uses 5-10x the memory:
# two packages at a time, and internal/e2e (whose shardd and etcd binaries
# are instrumented too, and whose fault tests judge timings) alone after
# them. RACE_TIMEOUT bounds each package's binary; RACE_PKGS narrows the run.
test-race: ## the default test suite under the race detector (-race): two packages at a time, then internal/e2e alone; RACE_PKGS (default ./...)
	@pkgs=$$($(GO) list $(RACE_PKGS)) || exit 1; \
	  rest=$$(echo "$$pkgs" | grep -v '/internal/e2e$$' || true); \
	  e2e=$$(echo "$$pkgs" | grep '/internal/e2e$$' || true); \
	  if [ -n "$$rest" ]; then echo "$(GO) test -race -p 2 -timeout $(RACE_TIMEOUT) <$$(echo $$rest | wc -w) packages>"; \
	    $(GO) test -race -p 2 -timeout $(RACE_TIMEOUT) $$rest || exit 1; fi; \
	  if [ -n "$$e2e" ]; then echo "$(GO) test -race -timeout $(RACE_TIMEOUT) $$e2e"; \
	    $(GO) test -race -timeout $(RACE_TIMEOUT) $$e2e; fi

lint: ## go vet, a gofmt check, and go.mod/go.sum tidy
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@$(GO) mod tidy -diff || { echo "go.mod/go.sum are not tidy: run go mod tidy"; exit 1; }

# FUZZTIME is a duration (10s) or an execution count (50000x). A duration
# races Go 1.26's fuzz coordinator at the deadline (go.dev/issue/75804): the
# run can fail with a bare "context deadline exceeded" and no failing input.
# Such a run is not a finding and is run once more; any other failure fails.
# A count has no deadline to race, so CI uses one.
fuzz: ## run every fuzz target for FUZZTIME each (default 10s)
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$target"; \
	    if ! out=$$($(GO) test $$pkg -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) 2>&1); then \
	      echo "$$out"; \
	      if echo "$$out" | grep -q 'Failing input written to' || ! echo "$$out" | grep -q 'context deadline exceeded'; then exit 1; fi; \
	      echo "== $$target stopped at the deadline without a finding; once more"; \
	      $(GO) test $$pkg -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME); \
	    else echo "$$out" | tail -3; fi; \
	  done; \
	done

bench: ## benchmarks (BENCHTIME trials, default 20x) and resource use; writes bench/results.json and .md
	$(GO) run ./internal/benchreport -benchtime $(BENCHTIME) $(BENCHFLAGS)

bench-scale: ## the long benchmarks: storms (10,000 HTTP jobs due at one second, 1,000 scripts), 100,000 jobs, a kill -9 and restart at 10,000; writes bench/scale.json and .md (BENCHFLAGS=-short: the short form CI runs)
	$(GO) run ./internal/benchreport -scale -benchtime $(SCALE_BENCHTIME) $(BENCHFLAGS)

chaos: ## the chaos suite: CHAOS_ROUNDS random faults (default 200) from CHAOS_SEED; summary in CHAOS_OUT (bench/chaos-summary.json)
	@mkdir -p bench
	SHARDD_CHAOS_ROUNDS=$(CHAOS_ROUNDS) SHARDD_CHAOS_SEED=$(CHAOS_SEED) SHARDD_CHAOS_OUT=$(CHAOS_OUT) \
	  $(GO) test ./internal/e2e -run '^TestChaos$$' -count=1 -v -timeout 3h

chaos-scale: ## the chaos suite with CHAOS_JOBS (default 2000) more one-item jobs, each firing once a minute, checked by the same ledger
	@mkdir -p bench
	SHARDD_CHAOS_ROUNDS=$(CHAOS_ROUNDS) SHARDD_CHAOS_SEED=$(CHAOS_SEED) SHARDD_CHAOS_OUT=$(CHAOS_SCALE_OUT) SHARDD_CHAOS_JOBS=$(CHAOS_JOBS) \
	  $(GO) test ./internal/e2e -run '^TestChaos$$' -count=1 -v -timeout 3h

e2e-long: ## the long runs: history as long as the run logs (an every-2-s job for HISTORY_DURATION, default 10m, paged against a ledger), dependency fault tests, dependencies under kill -9 (per-fire ledger of parent and child), a join during streaming, an embedded etcd cluster losing a member and its quorum, etcd restored from a snapshot and wiped
	SHARDD_E2E_LONG=1 $(GO) test ./pkg/engine -run '^TestDeps' -count=1 -v -timeout 10m
	SHARDD_E2E_LONG=1 SHARDD_HISTORY_DURATION=$(HISTORY_DURATION) $(GO) test ./internal/e2e -run '^(TestDependenciesUnderFaults|TestStreamingJoin|TestEmbeddedClusterQuorum|TestEtcdRestoredOrWiped|TestHistoryAsLongAsTheRunLogs)$$' -count=1 -v -timeout 45m

e2e-compose: ## docker-compose.yml and docker-compose.embedded.yml on a real Docker engine (installs and starts one, builds stand-in base images without a registry): spread, docker kill, network cuts, etcd leader cut, Prometheus targets, per-fire ledger
	bash internal/e2e/compose.sh

soak: ## the soak: 3 instances, mixed jobs, reloads and restarts for SOAK_DURATION (default 1h); summary in SOAK_OUT (bench/soak.json)
	@mkdir -p bench
	SHARDD_SOAK_DURATION=$(SOAK_DURATION) SHARDD_SOAK_OUT=$(SOAK_OUT) \
	  $(GO) test ./internal/e2e -run '^TestSoak$$' -count=1 -v -timeout 0

run: build ## run bin/shardd on jobs.example.yaml with the embedded etcd
	$(BIN) run --config jobs.example.yaml

install: build ## install binary, systemd unit, /etc/shardd (DESTDIR, PREFIX honoured)
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/shardd
	install -D -m 0644 systemd/shardd.service $(DESTDIR)/etc/systemd/system/shardd.service
	sed -i 's|/usr/local/bin/shardd|$(PREFIX)/bin/shardd|' $(DESTDIR)/etc/systemd/system/shardd.service
	install -d -m 0755 $(DESTDIR)/etc/shardd/jobs.d
	test -e $(DESTDIR)/etc/shardd/shardd.env || install -m 0640 systemd/shardd.env $(DESTDIR)/etc/shardd/shardd.env
	test -e $(DESTDIR)/etc/shardd/jobs.d/jobs.yaml || install -m 0644 jobs.example.yaml $(DESTDIR)/etc/shardd/jobs.d/jobs.yaml
	@if [ -z "$(DESTDIR)" ]; then \
	  id shardd >/dev/null 2>&1 || useradd --system --home-dir /var/lib/shardd --shell /usr/sbin/nologin shardd; \
	  systemctl daemon-reload 2>/dev/null || true; \
	  echo "installed; start with: systemctl enable --now shardd"; \
	fi

verify-deploy: build ## systemd-analyze verify, promtool check rules/config, docker-compose config
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	sed "s|/usr/local/bin/shardd|$(CURDIR)/$(BIN)|" systemd/shardd.service > $$tmp/shardd.service; \
	systemd-analyze verify $$tmp/shardd.service && echo "systemd-analyze verify: OK"; \
	promtool check rules deploy/alerts.yml; \
	cp deploy/alerts.yml $$tmp/alerts.yml; sed "s|/etc/prometheus/alerts.yml|$$tmp/alerts.yml|" deploy/prometheus.yml > $$tmp/prometheus.yml; \
	promtool check config $$tmp/prometheus.yml; \
	docker-compose -f docker-compose.yml config -q && docker-compose -f docker-compose.embedded.yml config -q && echo "docker-compose config: OK (both files)"

clean: ## remove build output
	rm -rf bin
