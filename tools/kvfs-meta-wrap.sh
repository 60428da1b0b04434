#!/bin/bash
# A --meta-bin wrapper for kvfs-meta-bench (docs/benchmarks.md, "Where the replicated leader's
# CPU goes"): runs WRAP_BIN (a kvfs-meta) with the bench's arguments and records each daemon's
# CPU seconds (utime + stime from /proc every 0.2 s, the last value before it exits) as a line
# "TIME single|rN SECONDS" in WRAP_OUT (rN: the Raft replica --raft-id N). WRAP_PERF=1 runs
# the Raft replicas under `perf record` (WRAP_PERFG: call-graph option, default -g; WRAP_F:
# frequency, default 999) into WRAP_PDIR/rN.data; WRAP_PERF=2 adds the first single meta
# (single.data). Without perf, the daemon is exec'd (its pid is the bench's child).
#
#   WRAP_BIN=build/bin/kvfs-meta WRAP_OUT=/tmp/cpu.log \
#       build/tools/kvfs-meta-bench --seconds 3 --threads 64 --meta-bin tools/kvfs-meta-wrap.sh
BIN=${WRAP_BIN:?set WRAP_BIN to a kvfs-meta}
out=${WRAP_OUT:-/tmp/kvfs-meta-cpu.log}
pdir=${WRAP_PDIR:-/tmp}
id=single
prev=
for a in "$@"; do
	[ "$prev" = --raft-id ] && id=r$a
	prev=$a
done
perf=0
if [ "$id" != single ] && [ "${WRAP_PERF:-0}" -ge 1 ]; then
	perf=1
elif [ "$id" = single ] && [ "${WRAP_PERF:-0}" = 2 ] && [ ! -e "$pdir/single.data" ]; then
	perf=1
fi
me=$$
(
	hz=$(getconf CLK_TCK)
	last="0 0"
	pid=$me
	while [ -d /proc/$me ]; do
		if [ $perf = 1 ]; then # the daemon is perf's child
			ch=$(cat /proc/$me/task/*/children 2>/dev/null | awk '{print $1}')
			[ -n "$ch" ] && pid=$ch
		fi
		s=$(cut -d' ' -f14,15 /proc/$pid/stat 2>/dev/null) && [ -n "$s" ] && last=$s
		sleep 0.2
	done
	set -- $last
	echo "$(date +%T) $id $(echo "scale=2; ($1 + $2) / $hz" | bc)" >>"$out"
) </dev/null >/dev/null 2>&1 &
if [ $perf = 1 ]; then
	exec perf record ${WRAP_PERFG:--g} -F "${WRAP_F:-999}" -o "$pdir/$id.data" -- "$BIN" "$@"
fi
exec "$BIN" "$@"
