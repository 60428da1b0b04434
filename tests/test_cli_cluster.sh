#!/usr/bin/env bash
# The launcher and the CLI end to end: tools/kvfs-cluster.sh starts one meta
# (KVFS_META_REPLICAS=1) + 3 nodes (2+1) on loopback, `kvfs` puts, gets, lists, stats and removes, then the launcher stops exactly the
# PIDs it started. Usage: test_cli_cluster.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
export KVFS_BIN=$build/bin
kvfs=$build/bin/kvfs
dir=$(mktemp -d /tmp/kvfs-cli-XXXXXX)
pid4=""
trap '{ [ -n "$pid4" ] && kill "$pid4"; } 2>/dev/null || true; fusermount3 -u "$dir/mnt" 2>/dev/null || true
	"$src/tools/kvfs-cluster.sh" stop "$dir/c" >/dev/null 2>&1 || true
	"$src/tools/kvfs-cluster.sh" stop "$dir/r" >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

KVFS_META_REPLICAS=1 KVFS_META_ARGS="--k 2 --m 1 --node-timeout 2s" \
	"$src/tools/kvfs-cluster.sh" start "$dir/c" 3
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

# A node id meta does not know: named, and a failure (repair 99 exited 0 with an empty job).
for c in "drain 99" "repair 99" "node remove 99"; do
	# shellcheck disable=SC2086
	if "$kvfs" $c 2>"$dir/err"; then fail "kvfs $c exited 0"; fi
	grep -q "node 99: no such node" "$dir/err" || fail "kvfs $c: $(cat "$dir/err")"
done
# The progress bar is drawn only on a terminal: no \r into a log.
"$kvfs" scrub >"$dir/out" 2>"$dir/err" || true
if grep -q $'\r' "$dir/out" "$dir/err"; then fail "progress bar written to a file"; fi
grep -q "^scrub: " "$dir/out" || fail "scrub summary: $(cat "$dir/out")"
"$kvfs" jobs | grep -q "^job: scrub, " || fail "jobs after a scrub"
# A job with nothing to do says so and leaves the last real job on show.
"$kvfs" repair >"$dir/out" || fail "repair with every node up failed"
grep -q "^repair: nothing to do" "$dir/out" || fail "empty repair: $(cat "$dir/out")"
"$kvfs" jobs | grep -q "^job: scrub, " || fail "an empty repair replaced the last job in kvfs jobs"

# One node stopped by the launcher: a repair of it has nowhere to put a chunk (3 nodes, 2+1:
# every other node holds a chunk of each stripe), so it fails, and its failed chunks are not
# counted as done; then the launcher restarts the node and it is up again.
"$src/tools/kvfs-cluster.sh" stop-node "$dir/c" 1 >/dev/null
for ((t = 0; t < 100; t++)); do
	"$kvfs" status | grep -q "^nodes: 2 up of 3" && break
	sleep 0.1
done
"$kvfs" status | grep -q "^nodes: 2 up of 3" || fail "stop-node: meta still sees 3 nodes up"
id=$("$kvfs" status | awk '$2 == "down" { print $1 }')
if "$kvfs" repair "$id" >"$dir/out" 2>"$dir/err"; then fail "a repair that failed exited 0"; fi
read -r ok total failed < <(sed -n 's/^repair: \([0-9]*\) of \([0-9]*\) chunks, \([0-9]*\) failed.*/\1 \2 \3/p' "$dir/out")
if [ "${failed:-0}" -eq 0 ] || [ $((ok + failed)) != "$total" ]; then
	fail "repair summary (done + failed = total): $(cat "$dir/out")"
fi
"$src/tools/kvfs-cluster.sh" restart-node "$dir/c" 1 >/dev/null
"$kvfs" status | grep -q "^nodes: 3 up of 3" || fail "restart-node: the node is not up"
"$kvfs" get /a/b/x - | cmp - "$dir/in" || fail "get after the node restarted"
"$kvfs" rm -r /a
[ -z "$("$kvfs" ls /)" ] || fail "rm -r left something"

pids=$(awk '{print $2}' "$dir/c/pids")
"$src/tools/kvfs-cluster.sh" stop "$dir/c"
for p in $pids; do
	if kill -0 "$p" 2>/dev/null && tr '\0' ' ' <"/proc/$p/cmdline" | grep -q kvfs-; then
		fail "pid $p still running after stop"
	fi
done

# Replicated meta, the launcher's default (3 replicas): pids meta1..3, meta.addr one address a
# line, the CLI follows the leader; `kvfs meta status` shows one leader; the leader killed with SIGKILL,
# the same files read back and a new put works through another replica.
(unset KVFS_META_REPLICAS && KVFS_META_ARGS="--k 2 --m 1 --node-timeout 2s" \
	"$src/tools/kvfs-cluster.sh" start "$dir/r" 3 >/dev/null)
export KVFS_CLUSTER=$dir/r
[ "$(grep -c '^meta[123] ' "$dir/r/pids")" = 3 ] || fail "pids: meta1..3 expected"
[ "$(wc -l <"$dir/r/meta.addr")" = 3 ] || fail "meta.addr: 3 lines expected"
# The first line alone is a replica's address a tool can use (every replica answers RSTATUS).
"$kvfs" --meta "$(head -n1 "$dir/r/meta.addr")" meta status | grep -Eq ' (leader|follower) ' ||
	fail "meta status through the first line of meta.addr alone"
"$kvfs" put "$dir/in" /x
[ "$("$kvfs" meta status | grep -c ' leader  *yes ')" = 1 ] || fail "meta status: one leader"
# Any one line of meta.addr is enough: a follower names the leader (docs/meta.md, "Redirects").
for a in $(cat "$dir/r/meta.addr"); do
	"$kvfs" --meta "$a" get /x - | cmp - "$dir/in" || fail "get with only --meta $a"
done
# kvfs-mount takes the same list (where FUSE works here).
mnt=""
if [ -w /dev/fuse ] && command -v fusermount3 >/dev/null; then
	mnt=$dir/mnt
	mkdir -p "$mnt"
	"$build/bin/kvfs-mount" --secret-file "$dir/r/secret" --log-file "$dir/mount.log" \
		"$(paste -sd, "$dir/r/meta.addr")" "$mnt" || fail "kvfs-mount with 3 meta addresses"
	cmp "$mnt/x" "$dir/in" || fail "read through the mount"
fi
lead=$("$kvfs" meta status | awk '$3 == "leader" { print $2 }')
lpid=$(awk -v n="meta$lead" '$1 == n { print $2 }' "$dir/r/pids")
kill -KILL "$lpid"
"$kvfs" get /x - | cmp - "$dir/in" || fail "get after the meta leader was killed"
echo hi | "$kvfs" put - /y
[ "$("$kvfs" get /y -)" = hi ] || fail "put after the meta leader was killed"
r=0
for a in $(cat "$dir/r/meta.addr"); do # each surviving replica alone, the leader a new one
	r=$((r + 1))
	[ "$r" = "$lead" ] && continue
	[ "$("$kvfs" --meta "$a" get /y -)" = hi ] || fail "get with only --meta $a after the kill"
done
"$kvfs" meta status | grep -q "unreachable" || fail "meta status: the killed replica"
if [ -n "$mnt" ]; then
	cp "$dir/in" "$mnt/z" || fail "write through the mount after the leader was killed"
	cmp "$mnt/z" "$dir/in" || fail "read back through the mount"
	fusermount3 -u "$mnt"
fi
# The dead replica replaced online: replica 4 joins (--raft-join), is added and catches up, the
# dead one is removed; then a second old replica is killed, so the majority of the 3 voters
# left needs replica 4: reads and writes must go on through it.
p4=$((20000 + RANDOM % 12000))
r4=$((20000 + RANDOM % 12000))
"$build/bin/kvfs-meta" --db "$dir/r/meta4" --secret-file "$dir/r/secret" --listen "127.0.0.1:$p4" \
	--k 2 --m 1 --raft-id 4 --raft-peers "4=127.0.0.1:$r4" --raft-dir "$dir/r/raft4" \
	--raft-join </dev/null >"$dir/r/meta4.log" 2>&1 &
pid4=$!
sleep 0.3
"$kvfs" meta add 4 "127.0.0.1:$r4" >/dev/null || fail "meta add 4"
"$kvfs" meta remove "$lead" >/dev/null || fail "meta remove $lead (the killed leader)"
list4="$(paste -sd, "$dir/r/meta.addr"),127.0.0.1:$p4"
caught4() { # replica 4 has applied entries and trails the leader by at most 5 (heartbeats)
	"$kvfs" --meta "$list4" meta status |
		awk -v a="127.0.0.1:$p4" '$1 == a && $NF != "-" && $NF <= 5 && $(NF - 1) > 0 { ok = 1 } END { exit !ok }'
}
for ((t = 0; t < 50; t++)); do
	caught4 && break
	sleep 0.1
done
caught4 || fail "replica 4 lags: $("$kvfs" --meta "$list4" meta status)"
# Stop one more old replica: the group {4, the last old one} is 2 of 3 voters.
other=$("$kvfs" meta status | awk '$3 == "follower" { print $2; exit }')
kill -KILL "$(awk -v n="meta$other" '$1 == n { print $2 }' "$dir/r/pids")"
"$kvfs" --meta "$list4" get /x - | cmp - "$dir/in" || fail "get with replica 4 in the majority"
echo again | "$kvfs" --meta "$list4" put - /w
[ "$("$kvfs" --meta "$list4" get /w -)" = again ] || fail "put with replica 4 in the majority"
kill "$pid4"
wait "$pid4" 2>/dev/null || true
"$src/tools/kvfs-cluster.sh" stop "$dir/r" >/dev/null
echo "test_cli_cluster: ok"
