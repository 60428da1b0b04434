#!/usr/bin/env bash
# kvfs_warm_ab.sh — warm KV reads with and without --lease-pin, same cluster, same run
# (docs/benchmarks.md, "Warm reads with pinned names"). Two mounts of one local cluster, one
# with --lease-pin 0 (names answered from a directory lease are kept by the kernel no longer
# than the lease has left, < 1 s: main's behaviour) and one with --lease-pin 30s, each with
# FILES files of SIZE written through it, plus a local directory with the same files. Each is
# read whole once (priming: page cache, lease), then ROUNDS rounds alternate warm passes over
# the three (kvfs-mount-bench --dir --op read --threads 1), each pass SLEEP seconds after the
# previous pass over it (past the entry timeout, as when blocks are re-read seconds later).
# Prints each pass, the best of each side, the ratios, and the mounts' lookup counts.
#
#   tools/kvfs_warm_ab.sh [BUILD]   (env: FILES=1000 SIZE=2M ROUNDS=5 SLEEP=1.2 NODES=11)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
files=${FILES:-1000} size=${SIZE:-2M} rounds=${ROUNDS:-5} pause=${SLEEP:-1.2}
nodes=${NODES:-11}
export KVFS_BIN=$build/bin KVFS_META_REPLICAS=${KVFS_META_REPLICAS:-1}
mb=$build/tools/kvfs-mount-bench
dir=$(mktemp -d /var/tmp/kvfs-warmab-XXXXXX)
cleanup() {
	for s in nopin pin; do fusermount3 -u "$dir/$s" 2>/dev/null || true; done
	bash "$here/kvfs-cluster.sh" stop "$dir/cluster" >/dev/null 2>&1 || true
	[ -n "${KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
bash "$here/kvfs-cluster.sh" start "$dir/cluster" "$nodes" >/dev/null
meta=$(paste -sd, "$dir/cluster/meta.addr")
mkdir -p "$dir/nopin" "$dir/pin" "$dir/local/kv"
for s in nopin pin; do
	p=0
	[ $s = pin ] && p=30s
	"$build/bin/kvfs-mount" --secret-file "$dir/cluster/secret" --log-file "$dir/$s.log" \
		--lease-pin "$p" "$meta" "$dir/$s"
	mkdir "$dir/$s/$s" # one namespace: a directory per mount
done
side() { case $1 in local) echo "$dir/local/kv" ;; *) echo "$dir/$1/$1" ;; esac; }
echo "kvfs_warm_ab: $files files of $size, $nodes nodes, $(nproc) cores, $(uname -r)," \
	"load $(cut -d' ' -f1-3 /proc/loadavg)"
for s in local nopin pin; do
	"$mb" --dir "$(side $s)" --op write --files "$files" --size "$size" --threads 1 >/dev/null
	"$mb" --dir "$(side $s)" --op read --files "$files" --size "$size" --threads 1 >/dev/null
done
lookups() { awk '$1 == "lookups" { print $3 }' "$dir/$1/.kvfs/stats"; }
declare -A best l0
for s in nopin pin; do l0[$s]=$(lookups $s); done
for r in $(seq 1 "$rounds"); do
	sleep "$pause"
	for s in local nopin pin; do
		out=$("$mb" --dir "$(side $s)" --op read --files "$files" --size "$size" --threads 1)
		v=$(awk '{ for (i = 2; i <= NF; i++) if ($i == "MiB/s") print $(i - 1) }' <<<"$out")
		echo "round $r $s: $v MiB/s  (load $(cut -d' ' -f1 /proc/loadavg))"
		best[$s]=$(awk -v a="${best[$s]:-0}" -v b="$v" 'BEGIN { print (b > a ? b : a) }')
	done
done
for s in nopin pin; do
	echo "$s: best ${best[$s]} MiB/s, $(awk -v a="${best[$s]}" -v b="${best[local]}" \
		'BEGIN { printf "%.2f", a / b }')x local; lookups during the warm rounds:" \
		"$(($(lookups $s) - l0[$s]))"
done
echo "local: best ${best[local]} MiB/s; pin/nopin $(awk -v a="${best[pin]}" -v b="${best[nopin]}" \
	'BEGIN { printf "%.2f", a / b }'); load $(cut -d' ' -f1-3 /proc/loadavg)"
