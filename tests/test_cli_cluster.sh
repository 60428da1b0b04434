#!/usr/bin/env bash
# The launcher and the CLI end to end: tools/kvfs-cluster.sh starts meta + 3 nodes (2+1) on
# loopback, `kvfs` puts, gets, lists, stats and removes, then the launcher stops exactly the
# PIDs it started. Usage: test_cli_cluster.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
export KVFS_BIN=$build/bin
kvfs=$build/bin/kvfs
dir=$(mktemp -d /tmp/kvfs-cli-XXXXXX)
trap '"$src/tools/kvfs-cluster.sh" stop "$dir/c" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

KVFS_META_ARGS="--k 2 --m 1 --node-timeout 2s" "$src/tools/kvfs-cluster.sh" start "$dir/c" 3
[ "$(stat -c %a "$dir/c/secret")" = 600 ] || fail "secret not 0600"
[ "$(wc -l <"$dir/c/pids")" = 4 ] || fail "pids file should list meta + 3 nodes"
export KVFS_CLUSTER=$dir/c

"$kvfs" status | grep -q "^nodes: 3 up of 3" || fail "status: 3 nodes up"
head -c 1234567 /dev/urandom >"$dir/in"
"$kvfs" mkdir -p /a/b
"$kvfs" put "$dir/in" /a/b/x
"$kvfs" get /a/b/x "$dir/out"
cmp "$dir/in" "$dir/out" || fail "get returned other bytes"
"$kvfs" get /a/b/x - | cmp - "$dir/in" || fail "get to stdout"
echo hello | "$kvfs" put - /a/small
[ "$("$kvfs" get /a/small -)" = hello ] || fail "put from stdin"
[ "$("$kvfs" ls /a)" = "$(printf 'b/\nsmall')" ] || fail "ls /a"
"$kvfs" ls -l /a/b | grep -q " 1234567 .* x$" || fail "ls -l size"
"$kvfs" stat /a/b/x | grep -q "^size: 1234567$" || fail "stat size"
"$kvfs" stat /a/b/x | grep -q "^layout: k=2 m=1" || fail "stat layout"
"$kvfs" status | grep -q "^files: 2 " || fail "status files"
if "$kvfs" get /nope - 2>"$dir/err"; then fail "get of a missing file succeeded"; fi
grep -q "No such file" "$dir/err" || fail "missing-file error text"
if "$kvfs" rm /a 2>/dev/null; then fail "rm of a directory without -r succeeded"; fi
"$kvfs" rm -r /a
[ -z "$("$kvfs" ls /)" ] || fail "rm -r left something"

pids=$(awk '{print $2}' "$dir/c/pids")
"$src/tools/kvfs-cluster.sh" stop "$dir/c"
for p in $pids; do
	if kill -0 "$p" 2>/dev/null && tr '\0' ' ' <"/proc/$p/cmdline" | grep -q kvfs-; then
		fail "pid $p still running after stop"
	fi
done
echo "test_cli_cluster: ok"
