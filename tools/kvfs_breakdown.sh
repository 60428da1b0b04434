#!/usr/bin/env bash
# kvfs_breakdown.sh — where the time of one block goes through the FUSE mount (issue 28, item 1;
# docs/benchmarks.md, "Where the time of one block goes"). Starts a local cluster (11 nodes,
# tools/kvfs-cluster.sh, every daemon with /metrics) and a kvfs-mount with /metrics, then:
#   write   FILES files of SIZE with one cp (one file at a time, one process);
#   read    the same files cold (page cache dropped: needs root, else it says so) by name with
#           one cat (LOOKUP, OPEN, READs, RELEASE per file);
# and from the /metrics of the mount and the nodes, before and after each phase, prints per
# file: the FUSE requests (count, ms), the client library's stages and meta round trips
# (kvfs_client_*), and the nodes' request and disk time. Stops everything at the end.
#
#   tools/kvfs_breakdown.sh [BUILD]     (env: FILES=100 SIZE=2M, DROP=0 warm reads,
#                                        KVFS_INSECURE_PLAINTEXT=1 for the plaintext transport,
#                                        MOUNT_ARGS="--lookup-layout=false" extra mount flags,
#                                        KEEP=1 keeps the state dir)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
files=${FILES:-100} size=${SIZE:-2M}
export KVFS_BIN=$build/bin KVFS_METRICS=1
# One unreplicated meta unless KVFS_META_REPLICAS says otherwise: the figures in
# docs/benchmarks.md were taken against one (the launcher's default is three).
export KVFS_META_REPLICAS=${KVFS_META_REPLICAS:-1}
for b in "$build/bin/kvfs-mount" "$build/bin/kvfs-node"; do
	[ -x "$b" ] || { echo "kvfs_breakdown: $b not built" >&2; exit 1; }
done
command -v curl >/dev/null || { echo "kvfs_breakdown: curl not installed" >&2; exit 1; }

dir=$(mktemp -d /var/tmp/kvfs-breakdown-XXXXXX)
mnt=$dir/mnt
cleanup() {
	fusermount3 -u "$mnt" 2>/dev/null || true
	bash "$here/kvfs-cluster.sh" stop "$dir/cluster" >/dev/null 2>&1 || true
	[ -n "${KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
bash "$here/kvfs-cluster.sh" start "$dir/cluster" 11 >/dev/null
mkdir -p "$mnt"
"$build/bin/kvfs-mount" --secret-file "$dir/cluster/secret" --log-file "$dir/mount.log" \
	--metrics-listen 127.0.0.1:0 --metrics-addr-file "$dir/mount.metrics" ${MOUNT_ARGS:-} \
	"$(paste -sd, "$dir/cluster/meta.addr")" "$mnt"
mkdir "$mnt/b"
mpid=$(pgrep -f "kvfs-mount .*$dir/mount.log" | head -1)

# snap NAME: every histogram's _sum and _count, summed over the mount (prefix m:) and the nodes
# (prefix n:), one "key value" line each.
snap() {
	{
		curl -s "http://$(cat "$dir/mount.metrics")/metrics" | sed 's/^/m:/'
		for f in "$dir"/cluster/node*.metrics; do
			curl -s "http://$(cat "$f")/metrics" | sed 's/^/n:/'
		done
	} | awk '$1 ~ /_(sum|count)(\{|$)/ { v[$1] += $2 } END { for (k in v) print k, v[k] }' \
		| sort >"$dir/$1"
	# the mount's page faults (minor, major): fresh buffers fault in page by page
	awk '{ print "m:faults_minor_count", $10; print "m:faults_major_count", $12 }' \
		"/proc/$mpid/stat" >>"$dir/$1"
	sort -o "$dir/$1" "$dir/$1"
}
# show A B TITLE: per file, every series that moved between snapshots A and B.
show() {
	echo "$3 (per file; count, ms)"
	join "$dir/$1" "$dir/$2" | awk -v n="$files" '
		{ d = $3 - $2; k = $1; if (d <= 0) next
		  if (k ~ /_count/) { sub(/_count/, "", k); c[k] = d; if (!(k in s)) s[k] = 0 }
		  else { sub(/_sum/, "", k); s[k] = d } }
		END { for (k in s) printf "  %-78s %6.2f %9.3f\n", k, c[k] / n, s[k] * 1e3 / n }' | sort
}
drop() { [ "${DROP:-1}" = 1 ] || return 0; sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || echo "  (no drop_caches: not root)"; }
now() { date +%s.%N; }

mkdir "$dir/src"
head -c "$size" /dev/urandom >"$dir/src/f0"
for i in $(seq "$files"); do ln "$dir/src/f0" "$dir/src/f$i"; done
rm "$dir/src/f0"
cat "$dir"/src/* >/dev/null
echo "== kvfs_breakdown: $files files x $size, one at a time, $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)," \
	"transport $([ "${KVFS_INSECURE_PLAINTEXT:-0}" = 1 ] && echo plaintext || echo TLS)," \
	"mount flags: ${MOUNT_ARGS:-none}"
snap s0
t0=$(now)
cp "$dir"/src/* "$mnt/b/"
t1=$(now)
snap s1
drop
snap s2
t2=$(now)
# by name, as an engine opens its block files: no directory listing (READDIRPLUS would bring
# every name's attributes, and the kernel would send no LOOKUP)
seq -f "$mnt/b/f%g" "$files" | xargs cat >/dev/null
t3=$(now)
snap s3
awk -v a="$t0" -v b="$t1" -v n="$files" 'BEGIN { printf "write: %.3f ms per file (wall)\n", (b - a) * 1e3 / n }'
show s0 s1 "write"
awk -v a="$t2" -v b="$t3" -v n="$files" 'BEGIN { printf "cold read: %.3f ms per file (wall)\n", (b - a) * 1e3 / n }'
show s2 s3 "cold read"
