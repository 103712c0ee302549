# distbuf build, test and run targets. `make run` and `make test` work on a
# fresh machine: both install missing system dependencies first.
GO      ?= go
BIN     := bin
PKGS    := ./...
RANKS   ?= 4
# The real MPI binding is used whenever pkg-config finds MPI (after deps).
MPI_TAGS = $$(pkg-config --exists mpi 2>/dev/null && echo mpi)
MPIRUN  ?= mpirun
MPIRUN_FLAGS ?= $$(if [ "$$(id -u)" = 0 ]; then echo --allow-run-as-root; fi) --oversubscribe
# The main job's flags: the design note's workload, a U(1) spin chain's
# two-site H·psi (RUN_FLAGS="-workload synthetic" for the random blocks).
RUN_FLAGS ?= -workload sectors

.PHONY: all deps test-deps build test unit mpitest fuzz mutate lint bench bench-mpi gpu-bench run clean

all: build

deps:
	@scripts/install-deps.sh

# The MPI tests also need MPICH, for their MPICH pass.
test-deps:
	@scripts/install-deps.sh --mpich

build: deps
	@mkdir -p $(BIN)
	$(GO) build -tags "$(MPI_TAGS)" -o $(BIN)/ranktest ./cmd/ranktest

# staticcheck at the version tools/go.mod pins, built from the tools module
# so that the library's go.mod needs only what the library uses.
STATICCHECK := $(BIN)/staticcheck

$(STATICCHECK): tools/go.mod tools/go.sum
	@mkdir -p $(BIN)
	$(GO) -C tools build -o ../$(STATICCHECK) honnef.co/go/tools/cmd/staticcheck

# lint also builds and vets everything with CGO_ENABLED=0: every package,
# command and test compiles without cgo (docs/MPI.md says what runs).
lint: $(STATICCHECK)
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags mpi $(PKGS)
	CGO_ENABLED=0 $(GO) build $(PKGS)
	CGO_ENABLED=0 $(GO) vet $(PKGS)
	$(STATICCHECK) $(PKGS)
	$(STATICCHECK) -tags mpi $(PKGS)
	cd tools && ../$(STATICCHECK) ./benchplot

unit:
	$(GO) test -race -count=1 $(PKGS)

# The MPI tests in four passes, each run under a timeout: Open MPI at every
# package's rank counts, then subsets funnelled (DISTBUF_MPI_THREAD=funneled),
# over TCP alone, and built against MPICH (scripts/test-mpi.sh says which).
mpitest: test-deps
	scripts/test-mpi.sh

# Short runs of every fuzz target over its corpus and a few seconds of new input.
fuzz:
	scripts/fuzz-smoke.sh

# Each ordering rule of devalloc's ledger taken out in turn: its test must fail.
mutate:
	scripts/mutate.sh

test: deps lint unit mpitest fuzz mutate

# Every benchmark: go test -bench of every package, the solve sweep and
# distbench's exchange, with their plots, under out/bench.
bench: deps
	scripts/bench.sh

# MPI ping-pong and message rate from Go against the same loops in C.
bench-mpi: deps
	scripts/bench-mpi.sh

# Builds the GPU test and benchmark binaries into gpubin/ and prints the
# command that runs every check and benchmark on the GPU machine.
gpu-bench:
	scripts/gpu-verify.sh build
	@echo 'On the GPU machine, from the repository root with gpubin/ carried along:'
	@echo '  scripts/gpu-verify.sh run "$$OUT"          # every step; or name steps, e.g. bench exchange solve'

run: build
	@if [ -n "$(MPI_TAGS)" ]; then \
	  echo "$(MPIRUN) $(MPIRUN_FLAGS) -n $(RANKS) $(BIN)/ranktest $(RUN_FLAGS)"; \
	  $(MPIRUN) $(MPIRUN_FLAGS) -n $(RANKS) $(BIN)/ranktest $(RUN_FLAGS); \
	else $(BIN)/ranktest $(RUN_FLAGS); fi

clean:
	rm -rf $(BIN)
