#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test ucpx: Debian's UCX
# (headers, libraries, ucx_perftest), pkg-config and a C compiler for cgo, and ip
# (iproute2) and unshare/nsenter (util-linux) for the tests across simulated hosts.
set -euo pipefail
need=()
dpkg -s libucx-dev >/dev/null 2>&1 || need+=(libucx-dev)
dpkg -s ucx-utils >/dev/null 2>&1 || need+=(ucx-utils)
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "installing: ${need[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}"
