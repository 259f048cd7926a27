#!/usr/bin/env bash
# Builds gpu-bundle/: everything needed to run ucpx's tests on the GPU machine,
# which has the NVIDIA driver but no Go and possibly no UCX.
#
#   gpu-bundle/bin/<pkg>.test  test binary of every package with tests (cgo/cuda -> cgo_cuda.test)
#   gpu-bundle/bin/ucpx        the command, when it builds
#   gpu-bundle/bin/chainpp, bin/ucx_perftest, bin/ucx_info, bench/vs-ucx-perftest.sh:
#                              the UCP-layer comparison with UCX's own tool (ucx_perftest and
#                              ucx_info from Debian's ucx-utils); run-perftest.sh runs it
#   gpu-bundle/_pkg/<pkg>/     each package's directory (tests read testdata/ and docs relative to it;
#                              "_" and gpu-bundle/go.mod keep `go ... ./...` from seeing these copies)
#   gpu-bundle/lib/            shared libraries the binaries need beyond glibc (UCX and its deps)
#   gpu-bundle/lib/ucx/        UCX transport modules (UCX_MODULE_DIR)
#   gpu-bundle/run.sh          runs the binaries and prints a summary (see its header)
#   gpu-bundle/run-perftest.sh runs bench/vs-ucx-perftest.sh with the bundled binaries
#   gpu-bundle/lib/libcgofloor.so: bench/capi-pingpong.sh's floor (FLOORLIB)
#   gpu-bundle/lib/libucpx.so, include/, python/, run-torch.sh: the C ABI, its header and
#                              Python module, and the script running the PyTorch check
#   gpu-bundle.tar.xz          all of it compressed, what the device tool carries
#
# libcuda is never bundled: the binaries dlopen the device's driver at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
bundle=$root/gpu-bundle
GO=${GO:-go}
export CGO_ENABLED=1

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib/ucx" "$bundle/_pkg"
# A module boundary: the copied sources below are not packages of ucpx.
printf 'module ucpx-gpu-bundle\n\ngo 1.24\n' >"$bundle/go.mod"

module=$($GO list -m)
built=()
failed=()
# Every package with test files; -e keeps going past packages that do not build yet.
while read -r pkg dir; do
	[ -n "$pkg" ] || continue
	rel=${pkg#"$module"}
	rel=${rel#/}
	[ -n "$rel" ] || rel=root
	name=${rel//\//_}
	echo "building $name.test"
	if $GO test -c -ldflags='-s -w' -o "$bundle/bin/$name.test" "$pkg"; then
		mkdir -p "$bundle/_pkg/$rel"
		cp -r "$dir"/. "$bundle/_pkg/$rel/"
		built+=("$name")
	else
		echo "warning: $pkg does not build; skipped" >&2
		failed+=("$pkg")
	fi
done < <($GO list -e -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Dir}}{{end}}' ./...)

if [ -d cmd/ucpx ]; then
	if $GO build -ldflags='-s -w' -o "$bundle/bin/ucpx" ./cmd/ucpx; then
		echo "built ucpx"
	else
		echo "warning: cmd/ucpx does not build yet; skipped" >&2
	fi
fi

# The UCP-layer comparison (bench/vs-ucx-perftest.sh): the chained ping-pong, UCX's
# ucx_perftest (ucx_info names the UCX version in the script's header) and the script;
# copy_deps below bundles their libraries (ucx_perftest also needs libgomp).
mkdir -p "$bundle/bench"
cp bench/vs-ucx-perftest.sh bench/nccl-ref.py "$bundle/bench/"
if $GO build -ldflags='-s -w' -o "$bundle/bin/chainpp" ./bench/chainpp; then
	echo "built chainpp"
else
	echo "warning: bench/chainpp does not build; skipped" >&2
fi
for tool in ucx_perftest ucx_info; do
	if [ -x "/usr/bin/$tool" ]; then
		cp -L "/usr/bin/$tool" "$bundle/bin/"
	else
		echo "warning: /usr/bin/$tool missing (Debian: apt-get install ucx-utils); run-perftest.sh needs it" >&2
	fi
done

# The C ABI (issue 19): libucpx.so with its header and the Python module, for C programs
# and python/test_torch_ucpx.py (PyTorch is on the device; run-torch.sh runs it).
if $GO build -buildmode=c-shared -ldflags='-s -w' -o "$bundle/lib/libucpx.so" ./capi/libucpx; then
	rm -f "$bundle/lib/libucpx.h" # cgo's; include/ucpx.h is the documented header
	mkdir -p "$bundle/include" "$bundle/python"
	cp include/ucpx.h "$bundle/include/"
	cp python/*.py "$bundle/python/"
	echo "built libucpx.so"
else
	echo "warning: capi/libucpx does not build; skipped" >&2
fi
# bench/capi-pingpong.sh's floor (FLOORLIB): a Go export that does nothing.
if $GO build -buildmode=c-shared -ldflags='-s -w' -o "$bundle/lib/libcgofloor.so" ./bench/cgofloor; then
	rm -f "$bundle/lib/libcgofloor.h"
else
	echo "warning: bench/cgofloor does not build; skipped" >&2
fi

# Shared libraries: what ldd resolves for the binaries and the UCX modules, minus
# glibc's own libraries and the toolchain runtime, which the device's newer
# Ubuntu has (bundling an older glibc would break the binaries there).
ucxmods=/usr/lib/x86_64-linux-gnu/ucx
is_system_lib() {
	case "$(basename "$1")" in
	libc.so.* | libm.so.* | libmvec.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | \
		libutil.so.* | libanl.so.* | libnss_*.so.* | libBrokenLocale.so.* | libthread_db.so.* | ld-linux*.so.* | \
		libgcc_s.so.* | libstdc++.so.* | linux-vdso.so.*) return 0 ;;
	esac
	return 1
}
copy_deps() {
	# ldd fails on static binaries (packages without cgo): nothing to copy then.
	{ ldd "$1" 2>/dev/null || true; } | awk '/=>/ && $3 ~ /^\// {print $3}' | while read -r lib; do
		is_system_lib "$lib" && continue
		case "$lib" in "$ucxmods"/*) continue ;; esac # modules go to lib/ucx only
		base=$(basename "$lib")
		[ -e "$bundle/lib/$base" ] || cp -L "$lib" "$bundle/lib/$base"
	done
	return 0
}
for f in "$bundle"/bin/* "$bundle"/lib/libucpx.so; do
	if [ -e "$f" ]; then copy_deps "$f"; fi
done
if [ -d "$ucxmods" ]; then
	for m in "$ucxmods"/*.so.0; do
		[ -e "$m" ] || continue
		cp -L "$m" "$bundle/lib/ucx/"
		copy_deps "$m"
	done
fi
# Dependencies of the bundled libraries themselves (UCX pulls in libnuma and friends).
for _ in 1 2; do
	for f in "$bundle"/lib/*.so*; do
		if [ -e "$f" ]; then copy_deps "$f"; fi
	done
done
for f in "$bundle"/lib/*.so* "$bundle"/lib/ucx/*.so*; do
	if [ -e "$f" ]; then
		chmod u+w "$f"
		strip --strip-unneeded "$f" 2>/dev/null || true
	fi
done

cat >"$bundle/run.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the GPU test binaries of this bundle (on the device machine).
#
#   run.sh [-run REGEX] [-bench REGEX] [NAME...]
#
# NAME selects binaries by name without .test (cgo_cuda, stream, ...); default all.
#   -run REGEX     passed as -test.run
#   -bench REGEX   passed as -test.bench (implies BENCH=1)
#   BENCH=1        also run benchmarks (-test.bench=. unless -bench is given)
#   BENCHTIME=1s   -test.benchtime
#   TIMEOUT=5m     -test.timeout of each binary
#   OUT=/dir       logs go to $OUT/gpu-bundle-logs (default /tmp)
#   UCPX_REQUIRE_GPU=1 (the default here) turns "no GPU" skips into failures.
#   CUDA_DEVICE_MAX_CONNECTIONS is left to the environment: ucpx sets 32 itself when
#                  it is unset (cgo/cuda.Load), which staged prepared partitions need
#                  (docs/gpu-runs.md, runs 60 and 222)
# Exit status: 0 when every binary exited 0.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
export UCX_MODULE_DIR="$here/lib/ucx"
export UCPX_REQUIRE_GPU=${UCPX_REQUIRE_GPU:-1}
logs=${OUT:-/tmp}/gpu-bundle-logs
mkdir -p "$logs"

run=""
bench=""
names=()
while [ $# -gt 0 ]; do
	case "$1" in
	-run) run=$2; shift 2 ;;
	-bench) bench=$2; BENCH=1; shift 2 ;;
	*) names+=("$1"); shift ;;
	esac
done
if [ ${#names[@]} -eq 0 ]; then
	for b in "$here"/bin/*.test; do names+=("$(basename "$b" .test)"); done
fi

args=(-test.v -test.count=1 "-test.timeout=${TIMEOUT:-5m}")
[ -n "$run" ] && args+=("-test.run=$run")
if [ "${BENCH:-0}" = 1 ]; then
	args+=("-test.bench=${bench:-.}" "-test.benchtime=${BENCHTIME:-1s}" -test.benchmem)
fi

nvidia-smi -L 2>/dev/null | sed 's/^/# /' || echo "# nvidia-smi not available"
status=0
summary=()
for name in "${names[@]}"; do
	bin=$here/bin/$name.test
	[ -x "$bin" ] || { echo "no binary $name.test" >&2; status=1; continue; }
	rel=${name//_//}
	dir=$here/_pkg/$rel
	[ -d "$dir" ] || dir=$here
	log=$logs/$name.log
	echo "=== $name (log: $log)"
	start=$(date +%s)
	(cd "$dir" && "$bin" "${args[@]}") >"$log" 2>&1
	rc=$?
	secs=$(( $(date +%s) - start ))
	pass=$(grep -cE '^\s*--- PASS' "$log")
	fail=$(grep -cE '^\s*--- FAIL' "$log")
	skip=$(grep -cE '^\s*--- SKIP' "$log")
	grep -E '^(Benchmark|\s*--- FAIL|panic:|FAIL|ok )' "$log" | head -100
	[ $rc -eq 0 ] || status=1
	summary+=("$(printf '%-28s %6s %6s %6s %6s %6ss' "$name" "$pass" "$fail" "$skip" "$rc" "$secs")")
done
echo
printf '%-28s %6s %6s %6s %6s %7s\n' binary PASS FAIL SKIP exit time
for line in "${summary[@]}"; do echo "$line"; done
cat "$logs"/*.log 2>/dev/null | grep -E '^Benchmark' >"$logs/benchmarks.txt" || true
exit $status
RUN
chmod +x "$bundle/run.sh"

cat >"$bundle/run-torch.sh" <<'TORCH'
#!/usr/bin/env bash
# Runs the C ABI's Python checks on the device machine: python/test_ucpx_host.py (host
# memory, no PyTorch) and python/test_torch_ucpx.py (two PyTorch processes exchanging
# CUDA tensors through libucpx.so). UCPX_REQUIRE_GPU=1 (the default here) makes a
# missing PyTorch or GPU a failure. Exit status 0 when both pass.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
export UCX_MODULE_DIR="$here/lib/ucx"
export UCPX_LIB="$here/lib/libucpx.so"
export UCPX_REQUIRE_GPU=${UCPX_REQUIRE_GPU:-1}
status=0
python3 "$here/python/test_ucpx_host.py" || status=1
python3 "$here/python/test_torch_ucpx.py" || status=1
exit $status
TORCH
chmod +x "$bundle/run-torch.sh"

cat >"$bundle/run-perftest.sh" <<'PERFTEST'
#!/usr/bin/env bash
# Runs bench/vs-ucx-perftest.sh (ucpx perf and bench/chainpp against ucx_perftest; see
# its header) on the device machine with this bundle's binaries and libraries: UCPX,
# PERFTEST and CHAINPP are the bundled ones. The script's other knobs (REPS,
# TRANSPORTS, LAT_ITERS, NETNS, STRICT, ...) pass through from the environment, e.g.
#   REPS=7 TRANSPORTS=shm bash gpu-bundle/run-perftest.sh
# Exit status: the script's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH="$here/lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
export UCX_MODULE_DIR="$here/lib/ucx"
export UCPX="$here/bin/ucpx" PERFTEST="$here/bin/ucx_perftest" CHAINPP="$here/bin/chainpp"
need=("$UCPX" "$PERFTEST")
[ "${CHAIN:-1}" = 0 ] || need+=("$CHAINPP")
for b in "${need[@]}"; do
	[ -x "$b" ] || { echo "run-perftest.sh: $b missing from the bundle" >&2; exit 1; }
done
# ucx_info (the UCX version in the script's header) is found on PATH.
export PATH="$here/bin:$PATH"
exec bash "$here/bench/vs-ucx-perftest.sh"
PERFTEST
chmod +x "$bundle/run-perftest.sh"

echo
du -sh "$bundle" "$bundle"/bin "$bundle"/lib
# The device transfer carries at most 64 MiB: the bundle also travels compressed, as
# gpu-bundle.tar.xz (carry it and run `tar xJf gpu-bundle.tar.xz` there first).
tar -C "$root" -cJf "$root/gpu-bundle.tar.xz" gpu-bundle
du -sh "$root/gpu-bundle.tar.xz"
size=$(du -sm "$root/gpu-bundle.tar.xz" | cut -f1)
if [ "$size" -gt 60 ]; then
	echo "warning: gpu-bundle.tar.xz is ${size} MiB, near the 64 MiB the device transfer allows" >&2
fi
echo "bundle: ${#built[@]} test binaries${failed:+, skipped (not building): ${failed[*]}}"
