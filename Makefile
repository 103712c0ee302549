# distbuf build, test and run targets. `make run` and `make test` work on a
# fresh machine: both install missing system dependencies first.
GO      ?= go
BIN     := bin
PKGS    := ./...

.PHONY: all deps build test unit lint bench run clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ranktest ./cmd/ranktest

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

unit:
	$(GO) test -race -count=1 $(PKGS)

test: deps lint unit

bench:
	$(GO) test -run '^$$' -bench . -benchmem $(PKGS)

run: build
	$(BIN)/ranktest

clean:
	rm -rf $(BIN)
