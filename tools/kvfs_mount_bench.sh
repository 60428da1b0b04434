#!/usr/bin/env bash
# kvfs_mount_bench.sh — the FUSE mount benchmark (docs/benchmarks.md, "FUSE mount"), one run:
#   1. kvfs-mount-bench: FILES block files of SIZE written then read cold, through the mount,
#      through libkvfs directly, and as plain files in a local directory (same disk);
#   2. fio (ioengine io_uring) on the mount and on the local directory: the same files;
#   3. `ls -l` and `du -s` over LSFILES files on the mount and in a local directory.
# Starts its own local cluster (tools/kvfs-cluster.sh, 11 nodes) and mount, stops both at the
# end. Needs root for drop_caches (else the cold reads use O_DIRECT; the output says which).
#
#   tools/kvfs_mount_bench.sh [BUILD]     (env: FILES=2000 SIZE=2M THREADS=4 ROUNDS=2
#                                          LSFILES=20000 KEEP=1 to keep the state dir)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
files=${FILES:-2000} size=${SIZE:-2M} threads=${THREADS:-4} rounds=${ROUNDS:-2}
lsfiles=${LSFILES:-20000}
export KVFS_BIN=$build/bin
# One unreplicated meta unless KVFS_META_REPLICAS says otherwise: the figures in
# docs/benchmarks.md were taken against one (the launcher's default is three).
export KVFS_META_REPLICAS=${KVFS_META_REPLICAS:-1}
for b in "$build/bin/kvfs-mount" "$build/tools/kvfs-mount-bench"; do
	[ -x "$b" ] || { echo "kvfs_mount_bench: $b not built (make build)" >&2; exit 1; }
done
command -v fio >/dev/null || { echo "kvfs_mount_bench: fio not installed" >&2; exit 1; }

dir=$(mktemp -d /var/tmp/kvfs-mbench-XXXXXX)
mnt=$dir/mnt
cleanup() {
	fusermount3 -u "$mnt" 2>/dev/null || true
	bash "$here/kvfs-cluster.sh" stop "$dir/cluster" >/dev/null 2>&1 || true
	[ -n "${KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
bash "$here/kvfs-cluster.sh" start "$dir/cluster" 11 >/dev/null
meta=$(paste -sd, "$dir/cluster/meta.addr")
mkdir -p "$mnt" "$dir/local"
"$build/bin/kvfs-mount" --secret-file "$dir/cluster/secret" --log-file "$dir/mount.log" \
	"$meta" "$mnt"
mkdir "$mnt/bench"

drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
now() { date +%s.%N; }

echo "== kvfs-mount-bench ($(nproc) cores, $(uname -r))"
"$build/tools/kvfs-mount-bench" --meta "$meta" --secret-file "$dir/cluster/secret" \
	--mnt "$mnt/bench" --local "$dir/local" --files "$files" --size "$size" \
	--threads "$threads" --rounds "$rounds"

# fio: THREADS jobs, each FILES/THREADS files of SIZE, written whole with 1 MiB io_uring
# writes, then (page cache dropped) read back.
fio_run() { # target rw
	local per=$((files / threads))
	fio --name=kvb --directory="$1" --ioengine=io_uring --rw="$2" --bs=1M --filesize="$size" \
		--nrfiles="$per" --openfiles=1 --file_service_type=sequential --numjobs="$threads" \
		--create_on_open=1 --fallocate=none --iodepth=4 --group_reporting --thread \
		2>&1 | grep -E '^ +(READ|WRITE):' | sed 's/^ *//'
}
echo "== fio (ioengine=io_uring, $threads jobs x $((files / threads)) files of $size, bs 1M)"
for t in mount local; do
	d=$mnt/fio
	[ $t = local ] && d=$dir/local/fio
	mkdir -p "$d"
	echo "$t write: $(fio_run "$d" write)"
	drop
	echo "$t read (cold): $(fio_run "$d" read)"
	rm -rf "$d"
done

echo "== ls -l / du -s over $lsfiles files of 4 KiB"
mkdir -p "$dir/local/many"
"$build/tools/kvfs-mount-bench" --meta "$meta" --secret-file "$dir/cluster/secret" \
	--mnt "$mnt/bench" --local "$dir/local/many" --files "$lsfiles" --size 4K --threads 8 \
	--populate
for t in mount local; do
	d=$mnt/many
	[ $t = local ] && d=$dir/local/many
	for cmd in "ls -l" "du -s"; do
		drop
		sleep 1.2 # past the mount's entry/attr timeouts too
		a=$(now)
		n=$($cmd "$d" | wc -l)
		b=$(now)
		$cmd "$d" >/dev/null
		c=$(now)
		printf '%-6s %-6s cold %6.3f s  warm %6.3f s  (%s lines)\n' "$t" "$cmd" \
			"$(awk "BEGIN{print $b - $a}")" "$(awk "BEGIN{print $c - $b}")" "$n"
	done
done
du -s "$mnt/many" "$dir/local/many"
echo "mount stats:"
cat "$mnt/.kvfs/stats" | grep -E '^(commits|reads|writes|commit_errors|retries|inval_waits|inval_wait_us) '
