#!/usr/bin/env bash
# Installs every Debian package kvfs builds, tests, benchmarks or demonstrates with.
# Idempotent: when all are present it does nothing (no apt-get update, no network).
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
	# promtool (`promtool check metrics` on every daemon's /metrics in the tests)
	prometheus
)

missing=()
for p in "${PKGS[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done

if [ ${#missing[@]} -eq 0 ]; then
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
