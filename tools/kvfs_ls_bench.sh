#!/usr/bin/env bash
# kvfs_ls_bench.sh — cold `ls -lR`, `du -sh` and `stat` of every name (xargs, no listing) over
# LSFILES small files: through kvfs-mount and
# in a local directory on the same disk, in one run (issue 28, item 5; docs/benchmarks.md,
# "Cold ls -lR and du -sh"). Starts a local cluster (tools/kvfs-cluster.sh, 11 nodes) and a
# mount with /metrics, populates both sides with kvfs-mount-bench --populate, then per round
# and command drops the page cache (root) and times the command on each side, printing the
# FUSE requests the mount received for it (from its /metrics). With BASE_MOUNT=path/to/an/other
# kvfs-mount, a second mount of the same cluster by that binary is timed too (a same-run
# baseline). Stops everything at the end.
#
#   tools/kvfs_ls_bench.sh [BUILD]    (env: LSFILES=10000 ROUNDS=2 MOUNT_ARGS= BASE_MOUNT=
#                                      CMDS=stat: only that command)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
n=${LSFILES:-10000} rounds=${ROUNDS:-2}
export KVFS_BIN=$build/bin
# One unreplicated meta unless KVFS_META_REPLICAS says otherwise: the figures in
# docs/benchmarks.md were taken against one (the launcher's default is three).
export KVFS_META_REPLICAS=${KVFS_META_REPLICAS:-1}
for b in "$build/bin/kvfs-mount" "$build/tools/kvfs-mount-bench"; do
	[ -x "$b" ] || { echo "kvfs_ls_bench: $b not built" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || echo "kvfs_ls_bench: not root: the page cache is not dropped (warm runs)"
# shellcheck source=tools/bench_cluster.sh
. "$here/bench_cluster.sh"
bc_start ls-bench 11 || exit 1
mkdir -p "$dir/local/many"
mount_one() { # BIN MNT TAG: with its /metrics (the FUSE request counts)
	# shellcheck disable=SC2086
	bc_mount "$1" "$2" "$3" --metrics-listen 127.0.0.1:0 \
		--metrics-addr-file "$dir/$3.metrics" ${MOUNT_ARGS:-}
}
mount_one "$build/bin/kvfs-mount" "$dir/mnt" mount || exit 1
sides="mount local"
if [ -n "${BASE_MOUNT:-}" ]; then
	mount_one "$BASE_MOUNT" "$dir/mnt0" base || exit 1
	sides="mount base local"
fi
mkdir "$dir/mnt/bench"
"$build/tools/kvfs-mount-bench" --meta "$meta" --secret-file "$dir/cluster/secret" \
	--mnt "$dir/mnt/bench" --local "$dir/local/many" --files "$n" --size 4K --threads 8 \
	--populate || exit 1
# reqs TAG: "op count" of every FUSE request the mount TAG answered so far
reqs() {
	curl -s "http://$(cat "$dir/$1.metrics")/metrics" |
		awk '/^kvfs_mount_requests_total|^kvfs_mount_request_duration_seconds_(sum|count)/ {
			print $1, $2 }' | sort
}
now() { date +%s.%N; }
echo "kvfs_ls_bench: $n files of 4 KiB, $(nproc) cores, $(uname -r), load $(cut -d' ' -f1 /proc/loadavg)"
cmds=("ls -lR" "du -sh" stat)
[ -n "${CMDS:-}" ] && cmds=("$CMDS")
for r in $(seq 1 "$rounds"); do
	# the sides in turn, reversed every other round (a same-run A/B, load drifting)
	order=$sides
	[ $((r % 2)) = 0 ] && order=$(echo $sides | tr ' ' '\n' | tac | tr '\n' ' ')
	for cmd in "${cmds[@]}"; do
		for t in $order; do
			case $t in
			mount) d=$dir/mnt/many ;;
			base) d=$dir/mnt0/many ;;
			local) d=$dir/local/many ;;
			esac
			sync
			echo 3 >/proc/sys/vm/drop_caches 2>/dev/null
			sleep 1.2 # past the mount's entry timeout as well
			[ $t = local ] || reqs $t >"$dir/r1"
			if [ "$cmd" = stat ]; then # every name, no listing
				seq -f "$d/r0-%06g.kvb" 0 $((n - 1)) >"$dir/names"
				a=$(now)
				xargs -a "$dir/names" stat -c %s >/dev/null
			else
				a=$(now)
				$cmd "$d" >/dev/null
			fi
			b=$(now)
			printf 'round %d %-7s %-6s cold %7.3f s  load %s' "$r" "$cmd" "$t" \
				"$(awk "BEGIN { print $b - $a }")" "$(cut -d' ' -f1 /proc/loadavg)"
			if [ $t != local ]; then
				reqs $t >"$dir/r2"
				join "$dir/r1" "$dir/r2" | awk '/_total/ && $3 > $2 { o = $1; sub(/.*op="/, "", o);
					sub(/".*/, "", o); printf "  %s %d", o, $3 - $2 }'
				# mean time the mount spent in one LOOKUP (its handler: the meta round
				# trip, or the answer from a lease), from its request-duration histogram
				join "$dir/r1" "$dir/r2" | awk '
					/_duration_seconds_sum.*op="lookup"/ { s = $3 - $2 }
					/_duration_seconds_count.*op="lookup"/ { c = $3 - $2 }
					END { if (c > 0) printf "  lookup_us %.1f", s / c * 1e6 }'
				# directory leases so far (docs/meta.md; a mount without them has none)
				m=$dir/mnt; [ $t = base ] && m=$dir/mnt0
				awk '/^lease_(granted|hits|refused|revoked) / { printf "  %s %s", $1, $3 }' \
					"$m/.kvfs/stats" 2>/dev/null
			fi
			echo
		done
	done
done
