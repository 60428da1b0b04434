#!/usr/bin/env bash
# Long-prompt prefill, this build against an older one (KVINFER_BASE), alternating runs, with
# the attention share of each prefill (issue 25: flash-style CPU attention).
#
#   KVINFER_BASE=/path/to/old/kvinfer tools/attn-bench.sh MODEL.gguf [MODEL.gguf ...]
#
# Environment: KVINFER (default build-rel/bin/kvinfer), KVINFER_BASE (required: the build to
# compare with; it must print "prefill attention:", i.e. have kvi_engine_attn_cpu_s),
# PROMPTS ("2048 4096"), ROUNDS (3), THREADS (2), LOG (raw lines, default /tmp/attn-bench.log).
#
# Each round runs every (model, prompt) once on both builds, which one goes first flipping
# every round. Printed per (model, prompt, build): the best of ROUNDS prefill rate by the wall
# clock and by CPU time / threads, and the attention CPU seconds (lowest) with their share of
# the prefill's CPU time. On a shared machine the wall figure moves with the load; the CPU-time
# figures and the new / old ratios are what to compare.
set -euo pipefail

KVINFER=${KVINFER:-build-rel/bin/kvinfer}
KVINFER_BASE=${KVINFER_BASE:?set KVINFER_BASE to the kvinfer to compare with}
PROMPTS=${PROMPTS:-2048 4096}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
LOG=${LOG:-/tmp/attn-bench.log}
[ $# -ge 1 ] || {
	echo "usage: $0 MODEL.gguf [MODEL.gguf ...]" >&2
	exit 2
}
: >"$LOG"
res=$(mktemp)
trap 'rm -f "$res"' EXIT

one() { # build-label kvinfer model prompt
	local out
	out=$("$2" bench -m "$3" --threads "$THREADS" --prompt "$4" --gen 0 --skip-kernels 1 2>&1)
	echo "== $1 $3 $4" >>"$LOG"
	echo "$out" >>"$LOG"
	# prefill: N tokens (chunk C) in T s = W tok/s; by CPU time / threads R tok/s
	local w r a s
	w=$(echo "$out" | sed -n 's/.*prefill: .* = \([0-9.]*\) tok\/s;.*/\1/p')
	r=$(echo "$out" | sed -n 's/.*by CPU time \/ threads \([0-9.]*\) tok\/s.*/\1/p')
	a=$(echo "$out" | sed -n 's/.*prefill attention: \([0-9.]*\) CPU s of \([0-9.]*\).*/\1 \2/p')
	echo "$1 $(basename "$3") $4 $w $r $a" >>"$res"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((i = 0; i < ROUNDS; i++)); do
	for m in "$@"; do
		for p in $PROMPTS; do
			if ((i % 2 == 0)); then
				one new "$KVINFER" "$m" "$p"
				one old "$KVINFER_BASE" "$m" "$p"
			else
				one old "$KVINFER_BASE" "$m" "$p"
				one new "$KVINFER" "$m" "$p"
			fi
		done
	done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-24s %6s %-4s %10s %10s %9s %9s %6s\n' model prompt build "wall tok/s" "cpu tok/s" \
	"attn CPU s" "prefill CPU s" share
awk '{k = $2 " " $3 " " $1
	if (!(k in w) || $4 > w[k]) w[k] = $4
	if (!(k in r) || $5 > r[k]) r[k] = $5
	if (!(k in a) || $6 < a[k]) { a[k] = $6; c[k] = $7 }
} END {
	for (k in w) {
		split(k, f, " ")
		printf "%-24s %6s %-4s %10.1f %10.1f %9.2f %9.2f %5.0f%%\n", f[1], f[2], f[3], w[k], r[k], a[k], c[k], 100 * a[k] / c[k]
	}
}' "$res" | sort
awk '{k = $2 " " $3
	if ($1 == "new") { if (!(k in rn) || $5 > rn[k]) rn[k] = $5; if (!(k in an) || $6 < an[k]) an[k] = $6 }
	else { if (!(k in ro) || $5 > ro[k]) ro[k] = $5; if (!(k in ao) || $6 < ao[k]) ao[k] = $6 }
} END {
	for (k in rn) printf "%s: prefill by CPU time new/old %.2fx, attention CPU s old/new %.2fx\n", k, rn[k] / ro[k], ao[k] / an[k]
}' "$res" | sort
