#!/usr/bin/env bash
# kvfs_write_ab.sh — the write path's cost per block, two builds alternated in one run (issue 28,
# item 4; docs/benchmarks.md, "Writes with fewer copies"). For each round and each build: a
# fresh local cluster (one meta, 11 nodes, 10+1) and kvfs-mount from that build, FILES files of
# SIZE written one at a time by one thread (`kvfs-mount-bench --dir --op write`: open, 1 MiB
# writes, close), and the CPU time every process of the path spent on them, from
# /proc/PID/stat (utime + stime) before and after: the mount, the nodes together, meta, and
# the writer itself (its share is the kernel's copy of the data into FUSE). Prints per round
# and build: MiB/s, p50 ms a file, and CPU ms per file of each, then the same as medians.
#
#   tools/kvfs_write_ab.sh BUILD_A BUILD_B   (env: FILES=300 SIZE=2M ROUNDS=3,
#                                             KVFS_INSECURE_PLAINTEXT=1 for plaintext,
#                                             MOUNT_ARGS_A / MOUNT_ARGS_B: extra kvfs-mount
#                                             flags of each side,
#                                             PERF=1: `perf record -g` of the whole machine
#                                             during each write phase, into the state dir,
#                                             KEEP=1 keeps it)
# Both builds need bin/kvfs-mount, bin/kvfs-node, bin/kvfs-meta and tools/kvfs-mount-bench.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 2 ] || { echo "usage: kvfs_write_ab.sh BUILD_A BUILD_B" >&2; exit 2; }
builds=("$(cd "$1" && pwd)" "$(cd "$2" && pwd)")
files=${FILES:-300} size=${SIZE:-2M} rounds=${ROUNDS:-3}
export KVFS_META_REPLICAS=1
for b in "${builds[@]}"; do
	for x in bin/kvfs-mount bin/kvfs-node bin/kvfs-meta tools/kvfs-mount-bench; do
		[ -x "$b/$x" ] || { echo "kvfs_write_ab: $b/$x not built" >&2; exit 1; }
	done
done
tck=$(getconf CLK_TCK)
top=$(mktemp -d /var/tmp/kvfs-wab-XXXXXX)
cur=""
cleanup() {
	if [ -n "$cur" ]; then
		fusermount3 -u "$cur/mnt" 2>/dev/null || true
		KVFS_BIN=$cur/bin bash "$here/kvfs-cluster.sh" stop "$cur/cluster" >/dev/null 2>&1 || true
	fi
	[ -n "${KEEP:-}" ] || rm -rf "$top"
}
trap cleanup EXIT

ticks() { # pid...: utime + stime summed
	local t=0 p
	for p in "$@"; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat"))); done
	echo "$t"
}

# run BUILD LABEL MOUNT_ARGS: one round of one build; prints one result line.
run() {
	local b=$1 label=$2 margs=$3 d
	d=$(mktemp -d "$top/$label-XXXX")
	cur=$d
	ln -s "$b/bin" "$d/bin"
	KVFS_BIN=$b/bin bash "$here/kvfs-cluster.sh" start "$d/cluster" 11 >/dev/null
	mkdir -p "$d/mnt"
	# shellcheck disable=SC2086
	"$b/bin/kvfs-mount" --secret-file "$d/cluster/secret" --log-file "$d/mount.log" $margs \
		"$(paste -sd, "$d/cluster/meta.addr")" "$d/mnt"
	mkdir "$d/mnt/w"
	local mpid metapid npids
	mpid=$(pgrep -f "kvfs-mount .*$d/mount.log" | head -1)
	metapid=$(awk '$1 == "meta" { print $2 }' "$d/cluster/pids")
	npids=$(awk '$1 ~ /^node/ { print $2 }' "$d/cluster/pids" | tr '\n' ' ')
	# warm-up: connections to every node, the writer's first buffers
	"$b/tools/kvfs-mount-bench" --dir "$d/mnt/w" --op write --files 20 --size "$size" \
		--threads 1 >/dev/null
	rm -f "$d/mnt/w"/*
	sync
	local m0 n0 t0 load perfpid=""
	m0=$(ticks "$mpid")
	n0=$(ticks $npids)
	t0=$(ticks "$metapid")
	load=$(cut -d' ' -f1 /proc/loadavg)
	if [ "${PERF:-0}" = 1 ]; then
		perf record -a -g -o "$top/$label.perf" -q 2>/dev/null &
		perfpid=$!
	fi
	local out wu ws
	out=$( { TIMEFORMAT='%U %S'; time "$b/tools/kvfs-mount-bench" --dir "$d/mnt/w" --op write \
		--files "$files" --size "$size" --threads 1; } 2>&1)
	[ -n "$perfpid" ] && { kill -INT "$perfpid"; wait "$perfpid" || true; }
	local m1 n1 t1
	m1=$(ticks "$mpid")
	n1=$(ticks $npids)
	t1=$(ticks "$metapid")
	read -r wu ws < <(tail -1 <<<"$out")
	local mibs p50
	mibs=$(grep -o '[0-9.]* MiB/s' <<<"$out" | head -1 | cut -d' ' -f1)
	p50=$(grep -o 'p50 [0-9.]*' <<<"$out" | head -1 | cut -d' ' -f2)
	awk -v l="$label" -v f="$files" -v tck="$tck" -v mib="$mibs" -v p50="$p50" -v load="$load" \
		-v mo=$((m1 - m0)) -v no=$((n1 - n0)) -v to=$((t1 - t0)) -v wu="$wu" -v ws="$ws" '
		BEGIN { k = 1000 / tck / f; w = (wu + ws) * 1000 / f
			printf "%-8s load %5s  %7.1f MiB/s  p50 %6s ms  cpu ms/file: mount %5.2f nodes %5.2f meta %5.2f writer %5.2f total %6.2f\n",
				l, load, mib, p50, mo * k, no * k, to * k, w, (mo + no + to) * k + w }'
	fusermount3 -u "$d/mnt"
	KVFS_BIN=$b/bin bash "$here/kvfs-cluster.sh" stop "$d/cluster" >/dev/null 2>&1 || true
	cur=""
	# Not removed until the end: on an ext4 without a journal (this VM's) every new inode is
	# searched past those deleted in the last ~30 s (recently_deleted), and the next round's
	# chunk files would pay for this one's.
}

echo "== kvfs_write_ab: $files files x $size, one at a time, $(nproc) cores," \
	"transport $([ "${KVFS_INSECURE_PLAINTEXT:-0}" = 1 ] && echo plaintext || echo TLS)"
echo "   A = ${builds[0]} ${MOUNT_ARGS_A:-}"
echo "   B = ${builds[1]} ${MOUNT_ARGS_B:-}"
res=$top/results
for ((r = 1; r <= rounds; r++)); do
	run "${builds[0]}" "A$r" "${MOUNT_ARGS_A:-}" | tee -a "$res"
	run "${builds[1]}" "B$r" "${MOUNT_ARGS_B:-}" | tee -a "$res"
done
echo "medians:"
for x in A B; do
	grep "^$x" "$res" | awk -v x="$x" '
		{ for (i = 1; i <= NF; i++) if ($i ~ /^(MiB\/s|mount|nodes|meta|writer|total)$/) v[$i, NR] = ($i == "MiB/s") ? $(i - 1) : $(i + 1); n = NR }
		function med(k,   a, i, j, t) { for (i = 1; i <= n; i++) a[i] = v[k, i]
			for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
			return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
		END { printf "%s  %7.1f MiB/s  cpu ms/file: mount %5.2f nodes %5.2f meta %5.2f writer %5.2f total %6.2f\n",
			x, med("MiB/s"), med("mount"), med("nodes"), med("meta"), med("writer"), med("total") }'
done
