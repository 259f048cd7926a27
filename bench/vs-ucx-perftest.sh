#!/usr/bin/env bash
# Compares the ucpx UCP layer (`ucpx perf`) with UCX's own ucx_perftest, back to back,
# on the same transports (identical UCX_TLS for both tools) and the same message
# sizes: tag_lat 8 B, tag_bw 4 MiB, put_bw 4 MiB (ucx_perftest: tag_lat, tag_bw,
# ucp_put_bw), over shared memory and over tcp. Every measurement is repeated REPS
# times and the median is reported, to tame the noise of a small shared machine.
#
# Targets: latency ucpx/perftest <= LAT_TARGET, bandwidth ucpx/perftest >= BW_TARGET.
#
# Like with like: ucx_perftest's "typical" latency is the median of its last 2048
# iterations (libperf's timing queue, TIMING_QUEUE_SIZE), so the latency compared is
# ucpx perf's lat_last2048_us, the same estimator over the same iterations; ucpx's
# median and p99 over all iterations are reported beside it (p99/p50: the tail).
#
# The chained ping-pong (bench/chainpp: each side's loop is a condition.Chain, every
# operation posted from the UCX completion callback of the one before, in C) runs in
# the same repetitions as tag_lat and is compared with the same ucx_perftest values
# (row chain_lat, target CHAIN_TARGET), with the same estimator.
#
# Environment knobs (defaults in brackets):
#   REPS [7]            repetitions of each measurement
#   TRANSPORTS ["shm tcp"]
#   LAT_ITERS [50000] LAT_WARMUP [2000]   BW_ITERS [500] BW_WARMUP [20]
#   LAT_ITERS_TCP [10000] BW_ITERS_TCP [100]  iterations over tcp (slower: keeps the run short)
#   UCPX [bin/ucpx]     PERFTEST [ucx_perftest]   PORT_BASE [random]
#   LAT_TARGET [1.10]   BW_TARGET [0.95]   CHAIN_TARGET [1.05]   CHAINPP [bin/chainpp]   CHAIN [1]
#   STRICT [0]          1: exit 1 when a target is missed
#
# Transport sets: shm -> UCX_TLS=shm, endpoints without peer error handling (UCX 1.13
# selects only tcp when it is on); tcp -> UCX_TLS=tcp with peer error handling on both
# sides (ucx_perftest -e), ucpx's default for endpoints. Both tools use registered
# buffers and hand their memory handle to UCX (ucx_perftest -z, ucpx RequestParam.MemH),
# except ucpx's tag_lat: it runs on the fused blocking calls (Endpoint.TagSendRecv), which
# take no handle (an 8-byte message goes eagerly, no protocol step uses one).
# Nothing is pinned: neither tool gets a CPU affinity.
set -euo pipefail

cd "$(dirname "$0")/.."
REPS=${REPS:-7}
TRANSPORTS=${TRANSPORTS:-"shm tcp"}
LAT_ITERS=${LAT_ITERS:-50000}
LAT_WARMUP=${LAT_WARMUP:-2000}
BW_ITERS=${BW_ITERS:-500}
BW_WARMUP=${BW_WARMUP:-20}
LAT_ITERS_TCP=${LAT_ITERS_TCP:-10000}
BW_ITERS_TCP=${BW_ITERS_TCP:-100}
UCPX=${UCPX:-bin/ucpx}
PERFTEST=${PERFTEST:-ucx_perftest}
PORT_BASE=${PORT_BASE:-$((20000 + RANDOM % 20000))}
STRICT=${STRICT:-0}
LAT_TARGET=${LAT_TARGET:-1.10}
BW_TARGET=${BW_TARGET:-0.95}
CHAIN_TARGET=${CHAIN_TARGET:-1.05}
CHAINPP=${CHAINPP:-bin/chainpp}
CHAIN=${CHAIN:-1}
LAT_SIZE=8
BW_SIZE=$((4 << 20))

die() { echo "vs-ucx-perftest: $*" >&2; exit 1; }

command -v "$PERFTEST" >/dev/null || die "$PERFTEST not found (Debian: apt-get install ucx-utils)"
if [ ! -x "$UCPX" ]; then
	echo "building $UCPX"
	go build -o "$UCPX" ./cmd/ucpx || die "go build failed"
fi

if [ "$CHAIN" = 1 ] && [ "$CHAINPP" = bin/chainpp ]; then
	go build -o "$CHAINPP" ./bench/chainpp || die "go build of bench/chainpp failed"
fi

TMP=$(mktemp -d)
SERVER_PID=""
cleanup() {
	if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
		kill "$SERVER_PID" 2>/dev/null || true
		wait "$SERVER_PID" 2>/dev/null || true
	fi
	rm -rf "$TMP"
}
trap cleanup EXIT

port=$PORT_BASE
next_port() { port=$((port + 1)); }

# perftest TLS PEERERR TEST SIZE ITERS WARMUP -> prints the value:
# typical latency (median of the last 2048 iterations) in usec for tag_lat, overall
# bandwidth in MB/s otherwise.
perftest() {
	local tls=$1 peererr=$2 test=$3 size=$4 iters=$5 warmup=$6
	# -z: pass the pre-registered memory handle, as ucpx perf passes RequestParam.MemH.
	local extra=(-z) out line field try
	[ "$peererr" = 1 ] && extra+=(-e)
	for try in 1 2 3; do
		next_port
		UCX_TLS=$tls timeout 120 "$PERFTEST" -p "$port" -t "$test" -s "$size" -n "$iters" -w "$warmup" \
			"${extra[@]}" -f -v >"$TMP/server.out" 2>&1 &
		SERVER_PID=$!
		sleep 0.3
		if out=$(UCX_TLS=$tls timeout 120 "$PERFTEST" 127.0.0.1 -p "$port" -t "$test" -s "$size" \
			-n "$iters" -w "$warmup" "${extra[@]}" -f -v 2>&1); then
			wait "$SERVER_PID" || true
			SERVER_PID=""
			break
		fi
		kill "$SERVER_PID" 2>/dev/null || true
		wait "$SERVER_PID" 2>/dev/null || true
		SERVER_PID=""
		[ "$try" = 3 ] && { echo "$out" >&2; cat "$TMP/server.out" >&2; die "ucx_perftest -t $test failed"; }
	done
	# CSV: iterations,typical_lat,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,overall_mr
	line=$(echo "$out" | grep -E '^ *[0-9]+,' | tail -1 | tr -d ' ')
	[ -n "$line" ] || { echo "$out" >&2; die "cannot parse ucx_perftest output"; }
	if [ "$test" = tag_lat ]; then field=2; else field=6; fi
	echo "$line" | cut -d, -f"$field"
}

# ucpx TRANSPORT TLS TEST SIZE ITERS WARMUP -> prints the value (same units; for tag_lat
# the median of the last 2048 iterations, as ucx_perftest's typical) and, for tag_lat,
# appends "p50 p99" (over all iterations) to $TMP/pctl.
ucpx() {
	local transport=$1 tls=$2 test=$3 size=$4 iters=$5 warmup=$6 out key
	out=$("$UCPX" perf --json --transport "$transport" --tls "$tls" --tests "$test" \
		--sizes "$size" --iters "$iters" --warmup "$warmup" --timeout 2m 2>"$TMP/ucpx.err") ||
		{ cat "$TMP/ucpx.err" >&2; die "ucpx perf --tests $test failed"; }
	# One result per run: take the field's first occurrence.
	field() { echo "$out" | grep -m1 "\"$1\"" | sed -E 's/.*: *([0-9.eE+-]+),?/\1/'; }
	if [ "$test" = tag_lat ]; then
		printf '%.3f\n' "$(field lat_last2048_us)"
		printf '%.3f %.3f\n' "$(field lat_p50_us)" "$(field lat_p99_us)" >>"$TMP/pctl"
	else
		printf '%.2f\n' "$(field bandwidth_mbs)"
	fi
	# Remember which UCX_TLS the peer process reported.
	echo "$out" | grep -m1 '"peer_tls"' | sed -E 's/.*: *"(.*)",?/\1/' >"$TMP/peer_tls"
}

# chainpp TLS PEERERR SIZE ITERS WARMUP -> prints the chained ping-pong's median
# one-way latency of the last 2048 iterations (us) and appends "p50 p99" to
# $TMP/chain_pctl.
chainpp() {
	local tls=$1 peererr=$2 size=$3 iters=$4 warmup=$5 extra=() out try
	[ "$peererr" = 1 ] && extra+=(-e)
	for try in 1 2 3; do
		next_port
		UCX_TLS=$tls timeout 120 "$CHAINPP" -p "$port" -s "$size" -n "$iters" -w "$warmup" "${extra[@]}" >"$TMP/server.out" 2>&1 &
		SERVER_PID=$!
		if out=$(UCX_TLS=$tls timeout 120 "$CHAINPP" -p "$port" -s "$size" -n "$iters" -w "$warmup" "${extra[@]}" 127.0.0.1 2>&1); then
			wait "$SERVER_PID" || true
			SERVER_PID=""
			break
		fi
		kill "$SERVER_PID" 2>/dev/null || true
		wait "$SERVER_PID" 2>/dev/null || true
		SERVER_PID=""
		[ "$try" = 3 ] && { echo "$out" >&2; cat "$TMP/server.out" >&2; die "chainpp failed"; }
	done
	# chain_lat_last2048_us X p50_us X p99_us X avg_us X iters N
	read -r _ v _ p50 _ p99 _ <<<"$(echo "$out" | grep -m1 '^chain_lat_last2048_us')"
	[ -n "$v" ] || { echo "$out" >&2; die "cannot parse chainpp output"; }
	echo "$p50 $p99" >>"$TMP/chain_pctl"
	printf '%.3f\n' "$v"
}

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else printf "%.6g\n", (v[NR/2]+v[NR/2+1])/2}'; }
# best: the lowest latency or the highest bandwidth of the repetitions.
best() { tr ' ' '\n' | grep -v '^$' | sort -g | if [ "$1" = lat ]; then head -1; else tail -1; fi; }

echo "=== ucx_perftest vs ucpx perf ==="
echo "date:      $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
echo "host:      $(uname -srm), nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "load:      $(cut -d' ' -f1-3 /proc/loadavg) (1/5/15 min)"
echo "UCX:       $(ucx_info -v 2>/dev/null | head -1 | sed 's/^# *//')"
echo "ucpx:      $UCPX ($(go version 2>/dev/null | cut -d' ' -f3 || echo 'go ?'))"
echo "reps:      $REPS (median reported); tag_lat -n $LAT_ITERS (tcp $LAT_ITERS_TCP) -w $LAT_WARMUP; bw -n $BW_ITERS (tcp $BW_ITERS_TCP) -w $BW_WARMUP"

rows=()
raw=()
tails=()
for tr in $TRANSPORTS; do
	case $tr in
	shm) tls=shm peererr=0 lat_iters=$LAT_ITERS bw_iters=$BW_ITERS ;;
	tcp) tls=tcp peererr=1 lat_iters=$LAT_ITERS_TCP bw_iters=$BW_ITERS_TCP ;;
	*) die "unknown transport $tr (want shm or tcp)" ;;
	esac
	for spec in "tag_lat tag_lat $LAT_SIZE $lat_iters $LAT_WARMUP" \
		"tag_bw tag_bw $BW_SIZE $bw_iters $BW_WARMUP" \
		"put_bw ucp_put_bw $BW_SIZE $bw_iters $BW_WARMUP"; do
		read -r test pttest size iters warmup <<<"$spec"
		pv="" uv="" cv=""
		: >"$TMP/pctl"
		: >"$TMP/chain_pctl"
		for ((r = 1; r <= REPS; r++)); do
			echo "  [$tr] $test $size B: rep $r/$REPS" >&2
			pv+="$(perftest "$tls" "$peererr" "$pttest" "$size" "$iters" "$warmup") "
			uv+="$(ucpx "$tr" "$tls" "$test" "$size" "$iters" "$warmup") "
			if [ "$test" = tag_lat ] && [ "$CHAIN" = 1 ]; then
				cv+="$(chainpp "$tls" "$peererr" "$size" "$iters" "$warmup") "
			fi
		done
		pm=$(echo "$pv" | median)
		um=$(echo "$uv" | median)
		kind=bw
		[ "$test" = tag_lat ] && kind=lat
		pb=$(echo "$pv" | best $kind)
		ub=$(echo "$uv" | best $kind)
		peer_tls=$(cat "$TMP/peer_tls" 2>/dev/null || echo "?")
		if [ "$test" = tag_lat ]; then
			unit=us
			row=$(awk -v p="$pm" -v u="$um" -v pb="$pb" -v ub="$ub" -v t="$LAT_TARGET" 'BEGIN {r = u / p; printf "%.3f %.3f %.2f <=%s %s %.3f %.3f %.2f", p, u, r, t, (r <= t ? "PASS" : "MISS"), pb, ub, ub / pb}')
			p50=$(cut -d' ' -f1 "$TMP/pctl" | tr '\n' ' ' | median)
			p99=$(cut -d' ' -f2 "$TMP/pctl" | tr '\n' ' ' | median)
			tails+=("$(awk -v tr="$tr" -v a="$p50" -v b="$p99" 'BEGIN {printf "%-9s %10.3f %10.3f %8.2f", tr, a, b, b / a}')")
			raw+=("tag_lat $size $tr: ucpx p50 p99 per repetition [$(tr '\n' ',' <"$TMP/pctl" | sed 's/,$//')]")
		else
			unit=MB/s
			row=$(awk -v p="$pm" -v u="$um" -v pb="$pb" -v ub="$ub" -v t="$BW_TARGET" 'BEGIN {r = u / p; printf "%.0f %.0f %.2f >=%s %s %.0f %.0f %.2f", p, u, r, t, (r >= t ? "PASS" : "MISS"), pb, ub, ub / pb}')
		fi
		shown=$tls
		[ "$peer_tls" = "$tls" ] || shown="$tls/$peer_tls"
		rows+=("$test $size $tr $shown $unit $row")
		raw+=("$test $size $tr: ucx_perftest [${pv% }] ucpx [${uv% }]")
		if [ -n "$cv" ]; then
			cm=$(echo "$cv" | median)
			cb=$(echo "$cv" | best lat)
			row=$(awk -v p="$pm" -v u="$cm" -v pb="$pb" -v ub="$cb" -v t="$CHAIN_TARGET" 'BEGIN {r = u / p; printf "%.3f %.3f %.2f <=%s %s %.3f %.3f %.2f", p, u, r, t, (r <= t ? "PASS" : "MISS"), pb, ub, ub / pb}')
			rows+=("chain_lat $size $tr $shown us $row")
			raw+=("chain_lat $size $tr: ucx_perftest [${pv% }] chained [${cv% }]")
			p50=$(cut -d' ' -f1 "$TMP/chain_pctl" | tr '\n' ' ' | median)
			p99=$(cut -d' ' -f2 "$TMP/chain_pctl" | tr '\n' ' ' | median)
			tails+=("$(awk -v tr="$tr chain" -v a="$p50" -v b="$p99" 'BEGIN {printf "%-9s %10.3f %10.3f %8.2f", tr, a, b, b / a}')")
		fi
	done
done

# --- cross-namespace tcp (issue 20): ucx_perftest and ucpx between two simulated hosts ---
# Two network namespaces joined by one veth pair, each end its own address (10.78.0.1,
# 10.78.0.2); both tools run with UCX_TLS=tcp and UCX_NET_DEVICES=eth0 in them, so
# every byte crosses the link (no shared memory, no loopback), with peer error handling
# (ucx_perftest -e, ucpx's default) and registered buffers (-z, MemH). ucpx's side is
# `ucpx demo-ring --perf` (ucx_perftest's estimators), its two ranks found through the
# bootstrap's rendezvous. Rows: tag_lat 8 B, tag_bw 4 MiB, transport tcp-netns.
# NETNS [auto]: 0 skips, 1 requires it (root and ip from iproute2), auto runs it where possible.
NETNS=${NETNS:-auto}
if [ "$NETNS" != 0 ] && { [ "$(id -u)" -ne 0 ] || ! command -v ip >/dev/null; }; then
	[ "$NETNS" = 1 ] && die "NETNS=1: the cross-namespace row needs root and ip (iproute2)"
	echo "cross-namespace row skipped: it needs root and ip (iproute2)" >&2
	NETNS=0
fi
if [ "$NETNS" != 0 ]; then
	ns_a=ucpxb$$a ns_b=ucpxb$$b
	cleanup_ns() { ip netns del "$ns_a" 2>/dev/null || true; ip netns del "$ns_b" 2>/dev/null || true; }
	trap 'cleanup_ns; cleanup' EXIT
	ip netns add "$ns_a" && ip netns add "$ns_b" || die "ip netns add failed"
	ip -n "$ns_a" link add eth0 type veth peer name eth0 netns "$ns_b" || die "veth pair failed"
	ip -n "$ns_a" addr add 10.78.0.1/24 dev eth0 && ip -n "$ns_b" addr add 10.78.0.2/24 dev eth0
	for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up && ip -n "$ns" link set eth0 up; done
	# UCX skips a device that is not running yet (the veth's carrier comes a moment later).
	for ns in "$ns_a" "$ns_b"; do
		for _ in $(seq 100); do ip -n "$ns" -o link show eth0 | grep -q 'state UP' && break; sleep 0.05; done
	done
	(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/netns.key")
	nsrun() { local ns=$1; shift; ip netns exec "$ns" env UCX_TLS=tcp UCX_NET_DEVICES=eth0 "$@"; }
	# xperftest TEST SIZE ITERS WARMUP: server in A, client in B; prints as perftest does.
	xperftest() {
		local test=$1 size=$2 iters=$3 warmup=$4 out line field
		next_port
		nsrun "$ns_a" timeout 120 "$PERFTEST" -p "$port" -t "$test" -s "$size" -n "$iters" -w "$warmup" -e -z -f -v >"$TMP/server.out" 2>&1 &
		SERVER_PID=$!
		sleep 0.3
		out=$(nsrun "$ns_b" timeout 120 "$PERFTEST" 10.78.0.1 -p "$port" -t "$test" -s "$size" -n "$iters" -w "$warmup" -e -z -f -v 2>&1) ||
			{ echo "$out" >&2; cat "$TMP/server.out" >&2; die "cross-namespace ucx_perftest -t $test failed"; }
		wait "$SERVER_PID" || true
		SERVER_PID=""
		line=$(echo "$out" | grep -E '^ *[0-9]+,' | tail -1 | tr -d ' ')
		if [ "$test" = tag_lat ]; then field=2; else field=6; fi
		echo "$line" | cut -d, -f"$field"
	}
	# xucpx TEST SIZE ITERS WARMUP: rank 0 in A (serving the rendezvous), rank 1 in B.
	xucpx() {
		local test=$1 size=$2 iters=$3 warmup=$4 out
		next_port
		local env=(UCPX_SIZE=2 UCPX_RENDEZVOUS=10.78.0.1:$port UCPX_AUTH_KEY_FILE=$TMP/netns.key)
		nsrun "$ns_b" "${env[@]}" UCPX_RANK=1 timeout 120 "$UCPX" demo-ring --perf "$test" --bytes "$size" \
			--iters "$iters" --warmup "$warmup" >"$TMP/rank1.out" 2>&1 &
		SERVER_PID=$!
		out=$(nsrun "$ns_a" "${env[@]}" UCPX_RANK=0 timeout 120 "$UCPX" demo-ring --perf "$test" --bytes "$size" \
			--iters "$iters" --warmup "$warmup" 2>&1) || { echo "$out" >&2; cat "$TMP/rank1.out" >&2; die "cross-namespace ucpx demo-ring --perf $test failed"; }
		wait "$SERVER_PID" || true
		SERVER_PID=""
		echo "$out" | grep -m1 "^perf $test" | sed -E 's/.*=([0-9.]+)$/\1/'
	}
	for spec in "tag_lat $LAT_SIZE $LAT_ITERS_TCP $LAT_WARMUP" "tag_bw $BW_SIZE $BW_ITERS_TCP $BW_WARMUP"; do
		read -r test size iters warmup <<<"$spec"
		pv="" uv=""
		for ((r = 1; r <= REPS; r++)); do
			echo "  [tcp-netns] $test $size B: rep $r/$REPS" >&2
			pv+="$(xperftest "$test" "$size" "$iters" "$warmup") "
			uv+="$(xucpx "$test" "$size" "$iters" "$warmup") "
		done
		pm=$(echo "$pv" | median)
		um=$(echo "$uv" | median)
		if [ "$test" = tag_lat ]; then
			pb=$(echo "$pv" | best lat)
			ub=$(echo "$uv" | best lat)
			row=$(awk -v p="$pm" -v u="$um" -v pb="$pb" -v ub="$ub" -v t="$LAT_TARGET" 'BEGIN {r = u / p; printf "%.3f %.3f %.2f <=%s %s %.3f %.3f %.2f", p, u, r, t, (r <= t ? "PASS" : "MISS"), pb, ub, ub / pb}')
			rows+=("$test $size tcp-netns tcp us $row")
		else
			pb=$(echo "$pv" | best bw)
			ub=$(echo "$uv" | best bw)
			row=$(awk -v p="$pm" -v u="$um" -v pb="$pb" -v ub="$ub" -v t="$BW_TARGET" 'BEGIN {r = u / p; printf "%.0f %.0f %.2f >=%s %s %.0f %.0f %.2f", p, u, r, t, (r >= t ? "PASS" : "MISS"), pb, ub, ub / pb}')
			rows+=("$test $size tcp-netns tcp MB/s $row")
		fi
		raw+=("$test $size tcp-netns: ucx_perftest [${pv% }] ucpx demo-ring --perf [${uv% }]")
	done
fi
# --- end of the cross-namespace block ---

echo
printf '%-8s %8s %-9s %-7s %-5s %13s %10s %6s %7s %-7s | %9s %9s %6s\n' test size transport UCX_TLS unit ucx_perftest ucpx ratio target verdict "best:pt" "best:ucpx" ratio
misses=0
for row in "${rows[@]}"; do
	read -r test size tr tls unit p u r target verdict pb ub rb <<<"$row"
	printf '%-8s %8s %-9s %-7s %-5s %13s %10s %6s %7s %-7s | %9s %9s %6s\n' "$test" "$size" "$tr" "$tls" "$unit" "$p" "$u" "$r" "$target" "$verdict" "$pb" "$ub" "$rb"
	[ "$verdict" = MISS ] && misses=$((misses + 1))
done
echo
echo "ratio = ucpx / ucx_perftest of the medians over the repetitions (the verdict); best = lowest latency /"
echo "highest bandwidth of the repetitions, the least disturbed by other load on the machine"
echo "latency: one-way us, both tools' typical = median of the last 2048 iterations of each run (ucx_perftest's"
echo "estimator; ucpx perf's lat_last2048_us); bandwidth: MB/s, MB = 2^20 B"
echo "UCX_TLS: the same value for both tools (ucpx's peer process reports its own; shown as a/b if it differed)"
echo "chain_lat: bench/chainpp, the same ping-pong as two condition.Chains (each operation posted from the UCX"
echo "callback that completed the one before, in C); compared with the same ucx_perftest values; its p50/p99 are"
echo "over the last 2048 iterations (the chain keeps their end times), tag_lat's over all"
echo "peer error handling: shm off (both tools), tcp on (ucx_perftest -e, ucpx default); memory handles passed (ucx_perftest -z;"
echo "ucpx's bandwidth tests; its tag_lat runs on the fused calls, which take none)"
if [ ${#tails[@]} -gt 0 ]; then
	echo
	echo "ucpx tag_lat $LAT_SIZE B tail (one-way us over all iterations, medians over the repetitions):"
	printf '%-9s %10s %10s %8s\n' transport p50 p99 p99/p50
	for l in "${tails[@]}"; do echo "$l"; done
fi
echo
echo "raw values per repetition:"
for l in "${raw[@]}"; do echo "  $l"; done
echo "misses: $misses"
if [ "$STRICT" = 1 ] && [ "$misses" -gt 0 ]; then
	exit 1
fi
