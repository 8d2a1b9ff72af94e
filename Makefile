# shardd — make targets. `make help` lists them.
GO       ?= go
BIN      ?= bin/shardd
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X github.com/shardd/shardd/pkg/version.Version=$(VERSION)
FUZZTIME ?= 10s

BENCHTIME ?= 20x

.PHONY: help build test lint fuzz bench run clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

build: ## build bin/shardd
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/shardd

test: ## run the default test suite
	$(GO) test ./...

lint: ## go vet and a gofmt check
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

fuzz: ## run every fuzz target for FUZZTIME each (default 10s)
	@set -e; for pkg in $$($(GO) list ./...); do \
	  for target in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$target"; \
	    $(GO) test $$pkg -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME); \
	  done; \
	done

bench: ## run the benchmarks (BENCHTIME trials each, default 20x) and print their numbers
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) ./...

run: build ## run bin/shardd on jobs.example.yaml with the embedded etcd
	$(BIN) run --config jobs.example.yaml

clean: ## remove build output
	rm -rf bin
