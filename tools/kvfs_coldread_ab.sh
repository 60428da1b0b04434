#!/usr/bin/env bash
# kvfs_coldread_ab.sh — issue 28's cold KV read (FILES files of SIZE, read whole one at a time
# by one thread after the page cache is dropped) through this build's kvfs-mount and, with
# BASE_MOUNT=path/to/another/kvfs-mount, through a second mount of the same cluster by that
# binary, alternated ROUNDS times in both orders (a same-run baseline), and the same files in
# a local directory on the same disk in every round (docs/benchmarks.md, "Cold reads: the
# first stripe fetched at OPEN"). Prints MiB/s and p50/p99 per file for each side and round,
# the mounts' open_prefetches so far, and the load average. Starts a local cluster
# (tools/kvfs-cluster.sh, 11 nodes; TLS unless KVFS_INSECURE_PLAINTEXT=1) and stops it at the
# end. Needs root (drop_caches).
#
#   tools/kvfs_coldread_ab.sh [BUILD]   (env: FILES=500 SIZE=2M ROUNDS=4 BASE_MOUNT=
#                                        MOUNT_ARGS= BASE_ARGS= WORK=/var/tmp)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
files=${FILES:-500} size=${SIZE:-2M} rounds=${ROUNDS:-4}
export KVFS_BIN=$build/bin
mb=$build/tools/kvfs-mount-bench
[ -x "$mb" ] || { echo "kvfs_coldread_ab: $mb not built" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "kvfs_coldread_ab: needs root (drop_caches)" >&2; exit 1; }
# shellcheck source=tools/bench_cluster.sh
. "$here/bench_cluster.sh"
bc_start cold 11 || exit 1
mkdir -p "$dir/local/kv"
# shellcheck disable=SC2086
bc_mount "$build/bin/kvfs-mount" "$dir/mnt" mount ${MOUNT_ARGS:-} || exit 1
sides="mount local"
if [ -n "${BASE_MOUNT:-}" ]; then
	# shellcheck disable=SC2086
	bc_mount "$BASE_MOUNT" "$dir/mnt0" base ${BASE_ARGS:-} || exit 1
	sides="mount base local"
fi
# The files once, through this build's mount (both mounts see the same cluster files).
mkdir "$dir/mnt/kv"
"$mb" --dir "$dir/mnt/kv" --op write --files "$files" --size "$size" --threads 1 >/dev/null || exit 1
"$mb" --dir "$dir/local/kv" --op write --files "$files" --size "$size" --threads 1 >/dev/null ||
	exit 1
echo "kvfs_coldread_ab: $files files of $size, $(nproc) cores, $(uname -r), transport" \
	"$([ -n "${KVFS_INSECURE_PLAINTEXT:-}" ] && echo plaintext || echo TLS)," \
	"load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
	[ $((r % 2)) = 0 ] && sides=$(tr ' ' '\n' <<<"$sides" | tac | tr '\n' ' ')
	for t in $sides; do
		case $t in
		mount) d=$dir/mnt ;;
		base) d=$dir/mnt0 ;;
		local) d=$dir/local ;;
		esac
		sync
		echo 3 >/proc/sys/vm/drop_caches
		sleep 1.2 # past the mounts' entry timeouts: every name looked up again
		l=$("$mb" --dir "$d/kv" --op read --files "$files" --size "$size" --threads 1)
		rate=$(grep -o '[0-9.]* MiB/s' <<<"$l")
		lat=$(grep -oE 'p50 [0-9.]+ ms p99 [0-9.]+ ms' <<<"$l")
		st=
		[ $t = local ] || st=$(grep -hE '^open_prefetches =' "$d/.kvfs/stats" 2>/dev/null)
		printf 'round %d %-6s %s  %s  %s  load %s\n' "$r" "$t" "$rate" "$lat" "$st" \
			"$(cut -d' ' -f1 /proc/loadavg)"
	done
done
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
