#!/usr/bin/env bash
# kvfs_seqread_bench.sh — one large file read sequentially by one thread (1 MiB reads), cold,
# through this build's kvfs-mount and, with BASE_MOUNT=path/to/another/kvfs-mount, through a
# second mount of the same cluster by that binary, alternated ROUNDS times (a same-run
# baseline; docs/benchmarks.md, "Sequential reads fetching ahead"). The local directory on the
# same disk is read in each round too. After each mount round: its FUSE reads and degraded
# stripe reads so far (.kvfs/stats). Starts a local cluster (tools/kvfs-cluster.sh, 11 nodes)
# and stops it at the end. Needs root (drop_caches).
#
#   tools/kvfs_seqread_bench.sh [BUILD]   (env: BIG=1G ROUNDS=3 BASE_MOUNT= MOUNT_ARGS=)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
big=${BIG:-1G} rounds=${ROUNDS:-3}
export KVFS_BIN=$build/bin
mb=$build/tools/kvfs-mount-bench
[ -x "$mb" ] || { echo "kvfs_seqread_bench: $mb not built" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "kvfs_seqread_bench: needs root (drop_caches)" >&2; exit 1; }
# shellcheck source=tools/bench_cluster.sh
. "$here/bench_cluster.sh"
bc_start seq 11 || exit 1
mkdir -p "$dir/local"
# shellcheck disable=SC2086
bc_mount "$build/bin/kvfs-mount" "$dir/mnt" mount ${MOUNT_ARGS:-} || exit 1
sides="mount local"
if [ -n "${BASE_MOUNT:-}" ]; then
	# shellcheck disable=SC2086
	bc_mount "$BASE_MOUNT" "$dir/mnt0" base ${MOUNT_ARGS:-} || exit 1
	sides="mount base local"
fi
"$mb" --dir "$dir/mnt" --op write --files 1 --size "$big" --threads 1 >/dev/null || exit 1
"$mb" --dir "$dir/local" --op write --files 1 --size "$big" --threads 1 >/dev/null || exit 1
echo "kvfs_seqread_bench: one file of $big, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
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
		sleep 1.2
		rate=$("$mb" --dir "$d" --op read --files 1 --size "$big" --threads 1 |
			grep -o '[0-9.]* MiB/s')
		st=
		[ $t = local ] || st=$(grep -hE '^(reads|client_degraded_reads) =' "$d/.kvfs/stats" |
			tr '\n' ' ')
		printf 'round %d %-6s %s  %s\n' "$r" "$t" "$rate" "$st"
	done
done
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
