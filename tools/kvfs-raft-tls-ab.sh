#!/bin/bash
# Raft over TLS against plaintext Raft: kvfs-meta-bench from two builds, alternating run by run
# (docs/benchmarks.md, "Raft over TLS against plaintext Raft").
#
#   tools/kvfs-raft-tls-ab.sh BASE_BENCH NEW_BENCH [ROUNDS] [THREADS]
#
# BASE_BENCH, NEW_BENCH: kvfs-meta-bench binaries (each runs the kvfs-meta of its own build).
# Per run it prints the load average, the bench's create and MKDIR rates (1 meta and 3
# replicas), and the user+system CPU of the 3 Raft replicas (from /proc/PID/stat, sampled
# every 0.2 s, the last sample before each exits) per replicated op (MKDIR and file create
# phases, --seconds 3 each).
set -u
base=$1 new=$2 rounds=${3:-3} threads=${4:-64}
tck=$(getconf CLK_TCK)
for r in $(seq 1 "$rounds"); do
	for v in base new; do
		b=$base
		[ $v = new ] && b=$new
		d=$(mktemp -d /tmp/kvfs-raft-tls-ab.XXXXXX)
		load=$(cut -d' ' -f1-3 /proc/loadavg)
		"$b" --seconds 3 --threads "$threads" --dir "$d" >"$d.out" 2>&1 &
		bp=$!
		declare -A last=()
		while kill -0 $bp 2>/dev/null; do
			for p in $(pgrep -f -- "--raft-dir $d"); do
				t=$(awk '{print $14+$15}' /proc/"$p"/stat 2>/dev/null) &&
					[ -n "$t" ] && last[$p]=$t
			done
			sleep 0.2
		done
		tot=0
		for p in "${!last[@]}"; do tot=$((tot + ${last[$p]})); done
		c1=$(awk '/^file create \(ALLOC/{print $6}' "$d.out")
		m3=$(awk '/MKDIR, 3 replicas/{print $4}' "$d.out")
		c3=$(awk '/file create, 3 replicas/{print $5}' "$d.out")
		us=$(awk -v t="$tot" -v k="$tck" -v m="$m3" -v c="$c3" \
			'BEGIN{ if (m + c > 0) printf "%.0f", t / k * 1e6 / (3 * (m + c)); else print "?" }')
		echo "round $r $v load $load: create 1 meta $c1/s, create 3 replicas $c3/s," \
			"MKDIR 3 replicas $m3/s, replicas' CPU $us us per replicated op"
		unset last
		rm -rf "$d" "$d.out"
	done
done
