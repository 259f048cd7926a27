#!/usr/bin/env bash
# The C ABI's cost on the latency path: an 8 B tag ping-pong over libucpx.so
# (capi/c/pingpong.c, one ucpx_tag_sendrecv call per iteration on each side) against
# `ucpx perf` tag_lat, the Go API, at the same size over shared memory. Runs are
# interleaved REPS times; each run's value is the median of its last 2048 one-way
# latencies (ucx_perftest's "typical"). Both the median over runs and the best run of
# each tool are compared: on a small shared machine a run whose two processes had to
# share a core with other work measures time slices (tens of µs), so the verdict uses the
# best runs, each tool's own cost with the cores to itself.
#
# Target: C / Go <= TARGET (1.05: the C ABI adds at most 5 %).
#
# The floor: every ucpx_* call from C enters Go (a cgo callback). The script also
# times a C loop calling a Go export that does nothing (bench/cgofloor), in the same
# run, so the C ABI's overhead can be read against the cost of entering Go at all.
#
# Environment knobs [defaults]: REPS [5] ITERS [50000] WARMUP [2000] SIZE [8]
#   TLS [shm] UCPX [bin/ucpx] LIB [bin/libucpx.so] TARGET [1.05] STRICT [0] (1: exit 1 on a miss)
#   FLOORLIB [bin/libcgofloor.so]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-5}
ITERS=${ITERS:-50000}
WARMUP=${WARMUP:-2000}
SIZE=${SIZE:-8}
TLS=${TLS:-shm}
UCPX=${UCPX:-bin/ucpx}
LIB=${LIB:-bin/libucpx.so}
TARGET=${TARGET:-1.05}
STRICT=${STRICT:-0}
FLOORLIB=${FLOORLIB:-bin/libcgofloor.so}
die() { echo "capi-pingpong: $*" >&2; exit 1; }

[ -x "$UCPX" ] || go build -o "$UCPX" ./cmd/ucpx || die "go build ./cmd/ucpx failed"
if [ ! -e "$LIB" ]; then
	go build -buildmode=c-shared -o "$LIB" ./capi/libucpx || die "building $LIB failed"
	rm -f "${LIB%.so}.h"
fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
libdir=$(cd "$(dirname "$LIB")" && pwd)
cc -O2 -Wall -Iinclude -o "$TMP/pingpong" capi/c/pingpong.c -L"$libdir" -l"$(basename "$LIB" .so | sed 's/^lib//')" \
	-Wl,-rpath,"$libdir" || die "building capi/c/pingpong.c failed"

if [ ! -e "$FLOORLIB" ]; then
	go build -buildmode=c-shared -o "$FLOORLIB" ./bench/cgofloor || die "building bench/cgofloor failed"
	rm -f "${FLOORLIB%.so}.h"
fi
floordir=$(cd "$(dirname "$FLOORLIB")" && pwd)
cc -O2 -o "$TMP/cgofloor" bench/cgofloor-loop.c -L"$floordir" -l"$(basename "$FLOORLIB" .so | sed 's/^lib//')" \
	-Wl,-rpath,"$floordir" || die "building bench/cgofloor-loop.c failed"

median() { sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else printf "%.4f\n", (v[NR/2]+v[NR/2+1])/2}'; }

go_vals=() c_vals=()
for rep in $(seq "$REPS"); do
	out=$("$UCPX" perf --json --transport shm --tls "$TLS" --tests tag_lat --sizes "$SIZE" \
		--iters "$ITERS" --warmup "$WARMUP" --timeout 2m 2>"$TMP/ucpx.err") || { cat "$TMP/ucpx.err" >&2; die "ucpx perf failed"; }
	g=$(echo "$out" | grep -m1 '"lat_last2048_us"' | sed -E 's/.*: *([0-9.eE+-]+),?/\1/')
	wire=$TMP/wire.$rep
	mkdir -p "$wire"
	UCX_TLS=$TLS timeout 120 "$TMP/pingpong" 1 "$wire" "$ITERS" "$WARMUP" "$SIZE" >"$TMP/peer.out" 2>&1 &
	peer=$!
	c_out=$(UCX_TLS=$TLS timeout 120 "$TMP/pingpong" 0 "$wire" "$ITERS" "$WARMUP" "$SIZE") || { cat "$TMP/peer.out" >&2; die "C ping-pong failed"; }
	wait "$peer" || { cat "$TMP/peer.out" >&2; die "C ping-pong peer failed"; }
	c=$(echo "$c_out" | awk '/^lat_last2048_us/ {print $2}')
	printf 'run %d: go %.3f us  c %.3f us\n' "$rep" "$g" "$c"
	go_vals+=("$g")
	c_vals+=("$c")
done
gm=$(printf '%s\n' "${go_vals[@]}" | median)
cm=$(printf '%s\n' "${c_vals[@]}" | median)
gb=$(printf '%s\n' "${go_vals[@]}" | sort -g | head -1)
cb=$(printf '%s\n' "${c_vals[@]}" | sort -g | head -1)
ratio=$(awk -v c="$cm" -v g="$gm" 'BEGIN {printf "%.3f", c / g}')
best=$(awk -v c="$cb" -v g="$gb" 'BEGIN {printf "%.3f", c / g}')
verdict=$(awk -v r="$best" -v t="$TARGET" 'BEGIN {print (r <= t) ? "PASS" : "MISS"}')
floor=$("$TMP/cgofloor" 1000000 | awk '/^noop_call_ns/ {print $2}')
echo
echo "=== C ABI vs Go API, $SIZE B tag ping-pong over $TLS (one-way us, median of the last 2048 of each run; $REPS runs) ==="
printf '%-24s %12s %12s\n' "" "median run" "best run"
printf '%-24s %12s %12s\n' "ucpx perf (Go API)" "$gm" "$gb"
printf '%-24s %12s %12s\n' "C over libucpx.so" "$cm" "$cb"
printf '%-24s %12s %12s   target <= %s (best runs): %s\n' "C / Go" "$ratio" "$best" "$TARGET" "$verdict"
awk -v c="$cm" -v g="$gm" -v f="$floor" 'BEGIN {printf "C ABI overhead per one-way (median runs): %.0f ns; one C->Go call that does nothing: %s ns (best of 5 x 1e6 calls)\n", (c - g) * 1000, f}'
[ "$STRICT" = 1 ] && [ "$verdict" = MISS ] && exit 1
exit 0
