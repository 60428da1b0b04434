#!/usr/bin/env bash
# Serving benchmark (docs/benchmarks.md, "## Serving"): one shared-prefix workload
# (kvinfer-load) against, in one run:
#   embedded `kvinfer serve` with the prefix cache off, then on (a fresh --kv-dir);
#   `kvinfer gateway` + 2 prefill + 2 decode workers (fresh shared --kv-dir) per policy.
# Prints one line per configuration and the cache on/off ratios.
#
#   tools/kvinfer-serve-bench.sh [BUILD] [PRESET] [REQUESTS] [CONCURRENCY] [PREFIX_WORDS] [MAX_TOKENS] [POLICIES]
# defaults: build small 16 4 250 8 "rr least cache"; env THREADS (engine threads per process,
# default 2), PREFIXES (distinct shared prefixes, default 2), HANDOFFS (gateway --handoff
# values to run per policy, default "fs"; "fs direct" compares the two), KVROOT (where the
# fresh kv dirs go, e.g. a kvfs mount; default the temp dir), EMBEDDED (0 skips the embedded
# runs), GW_ARGS (more `kvinfer gateway` flags, e.g. "--local-prefill 64").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
preset=${2:-small}
requests=${3:-16}
conc=${4:-4}
words=${5:-250}
maxtok=${6:-8}
policies=${7-rr least cache}
handoffs=${HANDOFFS:-fs}
embedded=${EMBEDDED:-1}
threads=${THREADS:-2}
prefixes=${PREFIXES:-2}
K=$build/bin/kvinfer
L=$build/tools/kvinfer-load
work=$(mktemp -d /tmp/kvinfer-serve-bench.XXXXXX)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
	pids=()
}
kvroot=${KVROOT:-$work}
kvtmp=$(mktemp -d "$kvroot/kvinfer-serve-bench-kv.XXXXXX")
trap 'cleanup; rm -rf "$work" "$kvtmp"' EXIT
wait_file() { for _ in $(seq 1 600); do [ -s "$1" ] && return 0; sleep 0.1; done; echo "timeout: $1" >&2; exit 1; }

"$build/tools/kvinfer-synth" --preset "$preset" --type q8_0 -o "$work/model.gguf" >/dev/null
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/secret"
common=(-m "$work/model.gguf" -t "$threads" --ignore-eos --ctx 2048)
load=(--requests "$requests" --concurrency "$conc" --prefixes "$prefixes" --prefix-words "$words"
	--max-tokens "$maxtok")
echo "preset $preset (q8_0), $requests requests, $conc concurrent, $prefixes prefixes of $words words," \
	"$maxtok tokens each, $threads engine threads per process, $(nproc) cores"

run_embedded() { # label, extra flags
	rm -f "$work/port"
	"$K" serve --open-gateway "${common[@]}" --port 0 --port-file "$work/port" "${@:2}" 2>"$work/$1.log" &
	pids+=($!)
	wait_file "$work/port"
	"$L" --port "$(cat "$work/port")" --label "$1" "${load[@]}" | tee -a "$work/results"
	cleanup
}

if [ "$embedded" != 0 ]; then
	run_embedded cache-off --no-cache
	mkdir -p "$kvtmp/kv-on"
	run_embedded cache-on --kv-dir "$kvtmp/kv-on"
fi

for pol in $policies; do for ho in $handoffs; do
	kv=$kvtmp/kv-$pol-$ho
	label=disagg-$pol
	[ "$ho" = fs ] || label=disagg-$pol-$ho
	mkdir -p "$kv"
	rm -f "$work"/wp* "$work/gport"
	for i in 0 1; do
		"$K" prefill "${common[@]}" --kv-dir "$kv" --secret-file "$work/secret" \
			--port-file "$work/wpp$i" 2>"$work/pf$i.log" &
		pids+=($!)
		"$K" decode "${common[@]}" --kv-dir "$kv" --secret-file "$work/secret" \
			--port-file "$work/wpd$i" 2>"$work/dc$i.log" &
		pids+=($!)
	done
	for f in wpp0 wpp1 wpd0 wpd1; do wait_file "$work/$f"; done
	"$K" gateway --open-gateway --prefill "127.0.0.1:$(cat "$work/wpp0"),127.0.0.1:$(cat "$work/wpp1")" \
		--decode "127.0.0.1:$(cat "$work/wpd0"),127.0.0.1:$(cat "$work/wpd1")" \
		--secret-file "$work/secret" --policy "$pol" --handoff "$ho" ${GW_ARGS:-} --port 0 \
		--port-file "$work/gport" 2>"$work/gw-$pol-$ho.log" &
	pids+=($!)
	wait_file "$work/gport"
	sleep 0.3 # first health check
	"$L" --port "$(cat "$work/gport")" --label "$label" "${load[@]}" | tee -a "$work/results"
	cleanup
done; done

awk '/^cache-off/ {for (i = 1; i <= NF; i++) { if ($i == "req/s") r0 = $(i-1); if ($i == "p50") t0 = $(i+1) } }
     /^cache-on/  {for (i = 1; i <= NF; i++) { if ($i == "req/s") r1 = $(i-1); if ($i == "p50") t1 = $(i+1) } }
     END { if (r0 > 0 && t1 > 0) printf "cache on vs off (embedded): throughput x%.2f, TTFT p50 x%.2f better\n", r1 / r0, t0 / t1 }' \
	"$work/results"
for pol in $policies; do
	awk -v a="disagg-$pol" -v b="disagg-$pol-direct" '
	function get(line) { for (i = 1; i <= NF; i++) { if ($i == "req/s") r = $(i-1); if ($i == "p50") t = $(i+1) } }
	$1 == a { get(); ra = r; ta = t } $1 == b { get(); rb = r; tb = t }
	END { if (ra > 0 && tb > 0) printf "handoff direct vs fs (%s): throughput x%.2f, TTFT p50 x%.2f better\n", a, rb / ra, ta / tb }' \
		"$work/results"
done
