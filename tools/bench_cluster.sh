# shellcheck shell=bash
# bench_cluster.sh — sourced, not run: the scratch cluster and mounts of the mount A/B
# benches (kvfs_coldread_ab.sh, kvfs_seqread_bench.sh, kvfs_ls_bench.sh). Everything it
# starts is stopped and its directory removed at exit (KEEP=1 keeps the directory).
# The caller sets $here (this directory) before sourcing.
#
#   bc_start TAG NODES            sets dir (scratch, under $WORK or /var/tmp) and meta (every
#                                 meta address, comma-separated); starts tools/kvfs-cluster.sh
#   bc_mount BIN MNT LOG [ARG..]  mounts the cluster at MNT (created) with the cluster's secret,
#                                 logging to $dir/LOG.log; unmounted at exit
: "${here:?bench_cluster.sh: set here (the tools directory) before sourcing}"
bc_mounts=()

bc_cleanup() {
	local m
	for m in "${bc_mounts[@]}"; do fusermount3 -u "$m" 2>/dev/null || true; done
	bash "$here/kvfs-cluster.sh" stop "$dir/cluster" >/dev/null 2>&1 || true
	[ -n "${KEEP:-}" ] || rm -rf "$dir"
}

bc_start() { # TAG NODES
	dir=$(mktemp -d "${WORK:-/var/tmp}/kvfs-$1-XXXXXX") || return 1
	trap bc_cleanup EXIT
	bash "$here/kvfs-cluster.sh" start "$dir/cluster" "$2" >/dev/null || return 1
	meta=$(paste -sd, "$dir/cluster/meta.addr")
}

bc_mount() { # BIN MNT LOG [ARG...]
	local bin=$1 mnt=$2 log=$3
	shift 3
	mkdir -p "$mnt"
	"$bin" --secret-file "$dir/cluster/secret" --log-file "$dir/$log.log" "$@" "$meta" "$mnt" ||
		return 1
	bc_mounts+=("$mnt")
}
