# ucpx — see README.md. `make demo` and `make test` do all set-up on a fresh Debian 12 machine.
GO ?= go
export CGO_ENABLED = 1

.PHONY: all deps build demo test vet race bench ptx gpu-bundle clean fuzz soak libucpx

all: build

# deps installs the system packages the cgo build needs (Debian's UCX). It is a no-op when present.
deps:
	@bash scripts/deps.sh

build: deps
	$(GO) build ./...
	$(GO) build -o bin/ucpx ./cmd/ucpx

demo: build
	./bin/ucpx demo

vet: deps
	$(GO) vet ./...

test: deps vet
	$(GO) test -race -count=1 -timeout 20m ./...
	$(MAKE) fuzz

# fuzz runs each fuzz target (decoders of a peer's bytes) for FUZZTIME; the corpus is
# committed under */testdata/fuzz. A count of executions, not a duration: Go 1.26's
# fuzz coordinator can fail a duration run at its deadline with a bare "context
# deadline exceeded" and no failing input (golang/go#75804, seen in CI here).
FUZZTIME ?= 40000x
FUZZ_TARGETS = FuzzOpenRkey FuzzOpenAddress FuzzControl FuzzHandshakeServer FuzzHandshakeClient FuzzDecodePull
fuzz:
	@for f in $(FUZZ_TARGETS); do \
		$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) ./ucp || exit 1; \
	done
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./bootstrap
	$(GO) test -run '^$$' -fuzz '^FuzzUnmarshalHandshake$$' -fuzztime $(FUZZTIME) ./prepare
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeIPCMessage$$' -fuzztime $(FUZZTIME) ./protocol

# soak sends a million checksummed messages over each transport (CI runs a short form
# inside make test).
soak:
	UCPX_SOAK_MESSAGES=1000000 $(GO) test -count=1 -timeout 60m -run 'TestSoak' -v ./tests

bench: build libucpx
	bash bench/vs-ucx-perftest.sh
	bash bench/capi-pingpong.sh

# libucpx builds the C ABI, bin/libucpx.so, declared by include/ucpx.h (python/ucpx.py
# loads it). cgo's own generated header is dropped: include/ucpx.h is the documented one.
libucpx: deps
	$(GO) build -buildmode=c-shared -o bin/libucpx.so ./capi/libucpx
	rm -f bin/libucpx.h

# ptx regenerates the committed PTX from device/*.cu (needs nvcc; running needs only the driver).
ptx:
	bash scripts/ptx.sh

# gpu-bundle builds GPU test binaries, ucpx and the UCX libraries they need into gpu-bundle/.
gpu-bundle: deps
	bash scripts/gpu-bundle.sh

clean:
	rm -rf bin gpu-bundle gpu-bundle.tar.xz
