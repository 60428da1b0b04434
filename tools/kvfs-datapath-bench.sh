#!/usr/bin/env bash
# kvfs-datapath-bench.sh — issue 28's table in one run: the same KV-block workload against a
# local directory and a kvfs mount on the same disk, step by step (each step on both sides
# before the next, so each ratio compares the same minute), then the table with the
# kvfs/local ratio and the issue's bar for each line (docs/benchmarks.md, "The data path
# against the local directory").
#
#   KV write       FILES files of SIZE, one thread, open/write/close each (kvfs-mount-bench --dir)
#   KV read cold   page cache dropped, the same files read whole by one thread (MiB/s, p50 ms)
#   KV read warm   the same again without dropping anything
#   seq read       one BIG file written, page cache dropped, read by one thread in 1 MiB reads
#                  (at most the mount's --max-file, 1 GiB by default)
#   cold stat      page cache dropped, `stat` of every file by name (xargs, no listing)
#   ls -lR, du -sh page cache dropped before each
#   kvx-bench      --load-only: cold block load through the connector vs raw read() of the same
#                  block files, on each side (needs MODEL, a GGUF; made with kvinfer-synth
#                  --preset llama-1b --type q8_0 when unset: 2 MiB blocks, 31 of them)
#   rm -rf         the FILES files
#
# Starts its own cluster (tools/kvfs-cluster.sh, NODES nodes, TLS unless the caller exports
# KVFS_INSECURE_PLAINTEXT=1) and mount (MOUNT_ARGS added), stops both at the end. Needs root
# (drop_caches). GlusterFS is not part of it (not installed on the dev VM).
#
#   tools/kvfs-datapath-bench.sh [BUILD]   (env: FILES=2000 SIZE=2M BIG=1G NODES=11 KVX_REPS=3
#                                           MODEL= MOUNT_ARGS= WORK=/var/tmp KEEP=)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
files=${FILES:-2000} size=${SIZE:-2M} big=${BIG:-1G} nodes=${NODES:-11} reps=${KVX_REPS:-3}
export KVFS_BIN=$build/bin
mb=$build/tools/kvfs-mount-bench
for b in "$build/bin/kvfs-mount" "$mb" "$build/tools/kvx-bench" "$build/tools/kvinfer-synth"; do
	[ -x "$b" ] || { echo "kvfs-datapath-bench: $b not built" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "kvfs-datapath-bench: needs root (drop_caches)" >&2; exit 1; }

dir=$(mktemp -d "${WORK:-/var/tmp}/kvfs-dp-XXXXXX")
mnt=$dir/mnt
cleanup() {
	fusermount3 -u "$mnt" 2>/dev/null
	bash "$here/kvfs-cluster.sh" stop "$dir/cluster" >/dev/null 2>&1
	[ -n "${KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
bash "$here/kvfs-cluster.sh" start "$dir/cluster" "$nodes" >/dev/null || exit 1
meta=$(head -1 "$dir/cluster/meta.addr")
mkdir -p "$mnt" "$dir/local"
# shellcheck disable=SC2086
"$build/bin/kvfs-mount" --secret-file "$dir/cluster/secret" --log-file "$dir/mount.log" \
	${MOUNT_ARGS:-} "$meta" "$mnt" || exit 1
model=${MODEL:-}
if [ -z "$model" ]; then
	model=$dir/model.gguf
	"$build/tools/kvinfer-synth" --preset llama-1b --type q8_0 -o "$model" >/dev/null || exit 1
fi

declare -A R # R[side.metric]
side_dir() { [ "$1" = local ] && echo "$dir/local" || echo "$mnt"; }
drop() {
	sync
	echo 3 >/proc/sys/vm/drop_caches
	sleep 1.2 # past the mount's entry and attribute timeouts too
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }
# field NAME LINE: the number after NAME in a kvfs-mount-bench --dir line
field() { awk -v k="$1" '{ for (i = 1; i < NF; i++) if ($i == k) { print $(i + 1); exit } }' <<<"$2"; }
mib() { awk '{ for (i = 2; i <= NF; i++) if ($i == "MiB/s") print $(i - 1) }' <<<"$1"; }
bench() { # SIDE OP SUBDIR FILES SIZE -> the bench line (also printed)
	local out rc
	out=$("$mb" --dir "$(side_dir "$1")/$3" --op "$2" --files "$4" --size "$5" --threads 1)
	rc=$?
	echo "$1: $out" >&2
	echo "$out"
	return $rc
}

echo "kvfs-datapath-bench: $files files of $size, one file of $big, $nodes nodes, $(nproc) cores," \
	"$(uname -r), transport $([ -n "${KVFS_INSECURE_PLAINTEXT:-}" ] && echo plaintext || echo TLS)," \
	"load $(cut -d' ' -f1-3 /proc/loadavg)"
sides="local kvfs"
for s in $sides; do mkdir -p "$(side_dir $s)/kv" "$(side_dir $s)/big"; done

for s in $sides; do
	l=$(bench $s write kv "$files" "$size") || exit 1
	R[$s.write]=$(mib "$l")
	R[$s.write99]=$(field p99 "$l")
done
for s in $sides; do
	drop
	l=$(bench $s read kv "$files" "$size") || exit 1
	R[$s.cold]=$(mib "$l")
	R[$s.cold50]=$(field p50 "$l")
	l=$(bench $s read kv "$files" "$size") || exit 1
	R[$s.warm]=$(mib "$l")
done
for s in $sides; do
	bench $s write big 1 "$big" >/dev/null || exit 1
	drop
	l=$(bench $s read big 1 "$big") || exit 1
	R[$s.seq]=$(mib "$l")
	rm -f "$(side_dir $s)/big/f000000.kvb"
done
for s in $sides; do
	d=$(side_dir $s)/kv
	seq -f "$d/f%06g.kvb" 0 $((files - 1)) >"$dir/names.$s"
	drop
	t=$(now)
	xargs -a "$dir/names.$s" stat -c %s >/dev/null || exit 1
	R[$s.stat]=$(awk -v n="$files" -v t="$(since "$t")" 'BEGIN { printf "%.0f", n / t }')
	for cmd in "ls -lR" "du -sh"; do
		drop
		t=$(now)
		$cmd "$d" >/dev/null || exit 1
		R[$s.${cmd%% *}]=$(since "$t")
	done
	echo "$s: stat ${R[$s.stat]} files/s, ls -lR ${R[$s.ls]} s, du -sh ${R[$s.du]} s" >&2
done
# kvx-bench: the mount first, the local directory second (--also-dir); its passes alternate
# the connector's load and the raw read on each side.
"$build/tools/kvx-bench" --model "$model" --kv-dir "$mnt" --also-dir "$dir/local" --load-only \
	--reps "$reps" >"$dir/kvx.out" 2>&1 || { cat "$dir/kvx.out"; exit 1; }
grep -E '^(---|pass|per pass|best)' "$dir/kvx.out" >&2
kvx() { # SIDE-INDEX (1 mount, 2 local) FIELD(load|raw|ratio)
	awk -v n="$1" -v f="$2" '/^best:/ { if (++i == n) { if (f == "load") print $4;
		else if (f == "raw") print $7; else print $14 } }' "$dir/kvx.out"
}
R[kvfs.kvxload]=$(kvx 1 load) R[kvfs.kvxraw]=$(kvx 1 raw) R[kvfs.kvxratio]=$(kvx 1 ratio)
R[local.kvxload]=$(kvx 2 load) R[local.kvxraw]=$(kvx 2 raw) R[local.kvxratio]=$(kvx 2 ratio)
for s in $sides; do
	t=$(now)
	rm -rf "$(side_dir $s)/kv" || exit 1
	R[$s.rm]=$(since "$t")
done

# The table: "workload | local | kvfs | kvfs/local | bar | met"
row() { # LABEL LOCAL KVFS RATIO BAR OK
	printf '| %s | %s | %s | %s | %s | %s |\n' "$@"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
ok() { awk -v x="$1" -v op="$2" -v y="$3" 'BEGIN { m = op == ">=" ? x >= y : x <= y;
	print m ? "met" : "**not met**" }'; }
echo
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
row workload local kvfs kvfs/local bar ""
row --- ---: ---: ---: --- ---
r=$(ratio "${R[kvfs.write]}" "${R[local.write]}")
row "KV write MiB/s (p99 ms)" "${R[local.write]} (${R[local.write99]})" \
	"${R[kvfs.write]} (${R[kvfs.write99]})" "$r" "≥ 0.5" "$(ok "$r" '>=' 0.5)"
r=$(ratio "${R[kvfs.cold]}" "${R[local.cold]}")
r2=$(ratio "${R[kvfs.cold50]}" "${R[local.cold50]}")
row "KV read cold MiB/s (p50 ms)" "${R[local.cold]} (${R[local.cold50]})" \
	"${R[kvfs.cold]} (${R[kvfs.cold50]})" "$r (p50 $r2)" "≥ 0.8 (p50 ≤ 2)" \
	"$(ok "$r" '>=' 0.8) ($(ok "$r2" '<=' 2))"
r=$(ratio "${R[kvfs.warm]}" "${R[local.warm]}")
row "KV read warm MiB/s" "${R[local.warm]}" "${R[kvfs.warm]}" "$r" "≥ 0.9" "$(ok "$r" '>=' 0.9)"
r=$(ratio "${R[kvfs.seq]}" "${R[local.seq]}")
row "sequential read, one $big file, MiB/s" "${R[local.seq]}" "${R[kvfs.seq]}" "$r" "≥ 0.8" \
	"$(ok "$r" '>=' 0.8)"
r=$(ratio "${R[kvfs.stat]}" "${R[local.stat]}")
row "\`stat\` of $files files cold /s" "${R[local.stat]}" "${R[kvfs.stat]}" "$r" "≥ 0.5" \
	"$(ok "$r" '>=' 0.5)"
for cmd in "ls -lR" "du -sh"; do
	k=${cmd%% *}
	r=$(ratio "${R[kvfs.$k]}" "${R[local.$k]}")
	row "\`$cmd\` cold, s" "${R[local.$k]}" "${R[kvfs.$k]}" "$r (time)" "≤ 2" \
		"$(ok "$r" '<=' 2)"
done
r=$(ratio "${R[kvfs.rm]}" "${R[local.rm]}")
row "\`rm -rf\` $files files, s" "${R[local.rm]}" "${R[kvfs.rm]}" "$r (time)" "–" ""
row "kvx-bench load / raw read MiB/s, same side" \
	"${R[local.kvxload]} / ${R[local.kvxraw]} = ${R[local.kvxratio]}" \
	"${R[kvfs.kvxload]} / ${R[kvfs.kvxraw]} = ${R[kvfs.kvxratio]}" "–" "kvfs ≥ 0.9" \
	"$(ok "${R[kvfs.kvxratio]}" '>=' 0.9)"
