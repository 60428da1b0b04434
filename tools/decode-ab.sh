#!/bin/sh
# Decode A/B of two kvinfer builds on the same files, alternating per file and round, with the
# load average before each run: prints each build's decode wall rate, its CPU-time rate and
# (from builds that have them) the thread-time and pool lines of `kvinfer bench`.
#   KVINFER=path/to/kvinfer KVINFER_BASE=path/to/base/kvinfer [ROUNDS=3 PROMPT=16 GEN=32 THREADS=2] \
#     tools/decode-ab.sh FILE.gguf...
set -eu
: "${KVINFER:?set KVINFER}" "${KVINFER_BASE:?set KVINFER_BASE}"
ROUNDS=${ROUNDS:-3} PROMPT=${PROMPT:-16} GEN=${GEN:-32} THREADS=${THREADS:-2}
r=1
while [ "$r" -le "$ROUNDS" ]; do
	for f in "$@"; do
		for v in base new; do
			if [ "$v" = base ]; then bin=$KVINFER_BASE; else bin=$KVINFER; fi
			l=$(cut -d' ' -f1 /proc/loadavg)
			out=$("$bin" bench -m "$f" --threads "$THREADS" --prompt "$PROMPT" \
				--gen "$GEN" --skip-kernels 1 2>&1) || { echo "$out" >&2; exit 1; }
			d=$(echo "$out" | grep "decode:" | sed 's/; bandwidth.*//;s/.*= //')
			st=$(echo "$out" | grep -E "thread time|thread pool" | sed 's/^ *//' |
				tr '\n' ' ')
			echo "round $r $(basename "$f") $v load $l: $d $st"
		done
	done
	r=$((r + 1))
done
