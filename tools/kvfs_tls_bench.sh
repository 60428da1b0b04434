#!/usr/bin/env bash
# kvfs_tls_bench.sh — what the encrypted transport costs (docs/benchmarks.md, "Transport: TLS vs
# plaintext"): kvfs-store-bench and kvfs-mount-bench with the default TLS transport and with
# KVFS_INSECURE_PLAINTEXT=1, in one run, ROUNDS rounds alternating which goes first; prints
# each round and the best of each mode with the ratio TLS/plaintext.
# Each run starts its own cluster (tools/kvfs-cluster.sh, meta + 11 nodes, 10+1) and, for the
# mount bench, its own mount; everything it starts it stops. Needs root for FUSE.
#
#   tools/kvfs_tls_bench.sh [BUILD]     (env: FILES=300 SIZE=2M THREADS=4 ROUNDS=3)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
files=${FILES:-300} size=${SIZE:-2M} threads=${THREADS:-4} rounds=${ROUNDS:-3}
export KVFS_BIN=$build/bin
# One unreplicated meta unless KVFS_META_REPLICAS says otherwise: the figures in
# docs/benchmarks.md were taken against one (the launcher's default is three).
export KVFS_META_REPLICAS=${KVFS_META_REPLICAS:-1}
dir=$(mktemp -d /var/tmp/kvfs-tlsbench-XXXXXX)
mnt=$dir/mnt
cleanup() {
	fusermount3 -u "$mnt" 2>/dev/null || true
	KVFS_INSECURE_PLAINTEXT= bash "$here/kvfs-cluster.sh" stop "$dir/cluster" >/dev/null 2>&1 || true
	rm -rf "$dir"
}
trap cleanup EXIT

# store MODE -> "write_MiB/s read_MiB/s"
store() {
	local env=()
	[ "$1" = plain ] && env=(KVFS_INSECURE_PLAINTEXT=1)
	env "${env[@]}" "$build/tools/kvfs-store-bench" --files "$files" --size "$size" \
		--threads "$threads" --cold=false --work "$dir/store" 2>/dev/null |
		awk '/^store write/{w=$7} /^store read/{r=$7} END{print w, r}'
	rm -rf "$dir/store"
}

# mount MODE -> "mount_write mount_read library_write library_read" (MiB/s)
mount_run() {
	local env=()
	[ "$1" = plain ] && env=(KVFS_INSECURE_PLAINTEXT=1)
	env "${env[@]}" bash "$here/kvfs-cluster.sh" start "$dir/cluster" 11 >"$dir/start.log" 2>&1 ||
		{ cat "$dir/start.log" >&2; return 1; }
	local meta
	meta=$(paste -sd, "$dir/cluster/meta.addr")
	mkdir -p "$mnt" "$dir/local"
	env "${env[@]}" "$build/bin/kvfs-mount" --secret-file "$dir/cluster/secret" \
		--log-file "$dir/mount.log" "$meta" "$mnt"
	mkdir "$mnt/bench"
	env "${env[@]}" "$build/tools/kvfs-mount-bench" --meta "$meta" \
		--secret-file "$dir/cluster/secret" --mnt "$mnt/bench" --local "$dir/local" \
		--files "$files" --size "$size" --threads "$threads" --rounds 1 --replace=false \
		>"$dir/mb.out" 2>"$dir/mb.err" || echo "kvfs-mount-bench failed: $(tail -3 "$dir/mb.err")" >&2
	sed -n '/^best of/,$p' "$dir/mb.out" |
		awk '/^mount write/{mw=$7} /^mount read/{mr=$8} /^library write/{lw=$7}
		     /^library read/{lr=$8} END{print mw, mr, lw, lr}'
	for _ in $(seq 50); do fusermount3 -u "$mnt" 2>/dev/null && break; sleep 0.2; done
	env "${env[@]}" bash "$here/kvfs-cluster.sh" stop "$dir/cluster" >/dev/null 2>&1
	rm -rf "$dir/cluster" "$dir/local"
}

max() { awk -v a="$1" -v b="$2" 'BEGIN{print (a > b ? a : b)}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", (b > 0 ? a / b : 0)}'; }

echo "== kvfs-tls-bench: $files files of $size, $threads threads, $rounds rounds" \
	"($(nproc) cores, $(uname -r), $(openssl version | cut -d' ' -f1-2))"
echo "   kernel TLS ULP: $(grep -qw tls /proc/sys/net/ipv4/tcp_available_ulp && echo yes || echo no)"
declare -A best
for k in tls_sw tls_sr plain_sw plain_sr tls_mw tls_mr tls_lw tls_lr plain_mw plain_mr \
	plain_lw plain_lr; do best[$k]=0; done
for r in $(seq 1 "$rounds"); do
	order="tls plain"
	[ $((r % 2)) -eq 0 ] && order="plain tls"
	for m in $order; do
		out=$(store "$m") # not <(...): the next run must wait for this one's cleanup
		read -r sw sr <<<"$out"
		echo "round $r $m store: write $sw MiB/s, read $sr MiB/s (warm)"
		best[${m}_sw]=$(max "${best[${m}_sw]}" "$sw")
		best[${m}_sr]=$(max "${best[${m}_sr]}" "$sr")
	done
	for m in $order; do
		out=$(mount_run "$m")
		read -r mw mr lw lr <<<"$out"
		echo "round $r $m mount-bench: mount write $mw, read $mr; library write $lw," \
			"read $lr MiB/s (cold reads)"
		best[${m}_mw]=$(max "${best[${m}_mw]}" "$mw")
		best[${m}_mr]=$(max "${best[${m}_mr]}" "$mr")
		best[${m}_lw]=$(max "${best[${m}_lw]}" "$lw")
		best[${m}_lr]=$(max "${best[${m}_lr]}" "$lr")
	done
done
echo "best of $rounds rounds, MiB/s      TLS   plaintext   TLS/plaintext"
for k in "store write:sw" "store read:sr" "mount write:mw" "mount read:mr" \
	"library write (mount-bench):lw" "library read (mount-bench):lr"; do
	n=${k%%:*} s=${k##*:}
	printf '%-32s %8s %10s %8s\n' "$n" "${best[tls_$s]}" "${best[plain_$s]}" \
		"$(ratio "${best[tls_$s]}" "${best[plain_$s]}")"
done
