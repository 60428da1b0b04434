#!/usr/bin/env bash
# Installs every Debian package kvfs builds, tests, benchmarks or demonstrates with.
# Idempotent: when all are present it does nothing (no apt-get update, no network; npm ci
# in tests/clients only while its node_modules is missing).
set -euo pipefail

PKGS=(
	build-essential cmake pkg-config git
	fuse3 libfuse3-dev
	libisal-dev
	librocksdb-dev
	liburing-dev
	libcmocka-dev
	libssl-dev
	libmicrohttpd-dev
	libcjson-dev
	clang clang-format
	curl fio
	# what the docs, the demo and the tests run: getfattr (docs/operations.md, the demo's
	# xattrs), python3 (test_mount's subprocess writers), rsync and tar (user-tools tests)
	attr python3 rsync tar
	# ip netns / ip link / tc: the cross-host tests (test_hosts: one namespace per daemon)
	iproute2
	# lb-sim's plots (docs/balancing.md)
	gnuplot-nox
	# replicated metadata: libraft (consensus) on libuv (its I/O), docs/meta.md
	libraft-dev libuv1-dev
	# images in the API (docs/serving.md): PNG, JPEG and WebP decoders
	libpng-dev libjpeg62-turbo-dev libwebp-dev
	# promtool (`promtool check metrics` on every daemon's /metrics in the tests)
	prometheus
)
# The official openai client's test (tests/clients, ctest test_openai_client) needs node and
# npm. A machine that has them from elsewhere (NodeSource's nodejs bundles npm and conflicts
# with Debian's npm package) keeps its own.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
	PKGS+=(nodejs npm)
fi

# The openai npm package at the version package-lock.json pins (registry.npmjs.org), once.
clients_ci() {
	local dir
	dir="$(cd "$(dirname "$0")/.." && pwd)/tests/clients"
	if [ -f "$dir/package-lock.json" ] && [ ! -d "$dir/node_modules/openai" ] &&
		command -v npm >/dev/null; then
		echo "install-deps: npm ci in tests/clients"
		# the registry out of reach is not a build failure: test_openai_client then
		# reports itself skipped (never passed)
		(cd "$dir" && npm ci --no-audit --no-fund) ||
			echo "install-deps: npm ci failed; test_openai_client will be skipped" >&2
	fi
}

missing=()
for p in "${PKGS[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done

if [ ${#missing[@]} -eq 0 ]; then
	clients_ci
	exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=
if [ "$(id -u)" -ne 0 ]; then
	SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
clients_ci
