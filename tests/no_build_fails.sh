#!/bin/sh
# A test binary that cannot find the build must not look like a pass (build_tutil.h): run
# from a directory without bin/ and without KVFS_BUILD_DIR it exits non-zero naming
# KVFS_BUILD_DIR; with KVFS_TEST_ALLOW_SKIP=1 it skips (exit 0 from cmocka, or 77).
# Usage: no_build_fails.sh TEST_BINARY
set -u
bin=$1
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
out=$(env -u KVFS_BUILD_DIR -u KVFS_TEST_ALLOW_SKIP "$bin" 2>&1)
rc=$?
if [ "$rc" -eq 0 ]; then
	echo "FAIL: $bin without the build exited 0:"
	echo "$out"
	exit 1
fi
case $out in
*KVFS_BUILD_DIR*) ;;
*)
	echo "FAIL: $bin without the build does not say how to find it:"
	echo "$out"
	exit 1
	;;
esac
env -u KVFS_BUILD_DIR KVFS_TEST_ALLOW_SKIP=1 "$bin" >/dev/null 2>&1
skip=$?
if [ "$skip" -ne 0 ] && [ "$skip" -ne 77 ]; then
	echo "FAIL: $bin with KVFS_TEST_ALLOW_SKIP=1 did not skip (exit $skip)"
	exit 1
fi
echo "ok: exit $rc without the build; skips when asked"
