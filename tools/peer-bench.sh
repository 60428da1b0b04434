#!/usr/bin/env bash
# kvinfer against llama.cpp on the same GGUF files, alternating runs, medians of ROUNDS rounds.
#
#   tools/peer-bench.sh MODEL.gguf [MODEL.gguf ...]
#
# Environment: KVINFER (default build/bin/kvinfer), LLAMA_BENCH (path to llama.cpp's
# llama-bench, built from source outside this repository), ROUNDS (5), THREADS (2),
# PROMPT (512), GEN (64), LLAMA_PRELOAD (a library for LD_PRELOAD when running llama-bench),
# LLAMA_NO_AMX=1 (builds such a library with cc: it makes llama.cpp's AMX permission probe
# fail, for a VM that reports AMX in cpuid but faults on tile instructions; see
# docs/benchmarks.md), LOG (every raw line, default /tmp/peer-bench.log),
# KVINFER_BASE (optional: an older kvinfer build, run in the same rotation as "before").
#
# Each round runs, for every model, `kvinfer bench` and `llama-bench -r 1` once each, the order
# flipped every round so that neither always gets the quieter moment. The table gives medians:
# prefill and decode tok/s of both, their ratios, and kvinfer's decode as a fraction of the
# read-bandwidth roofline measured in the same kvinfer run. On a shared machine the absolute
# figures move with the load; the ratios and the roofline fraction are what to compare.
set -euo pipefail

KVINFER=${KVINFER:-build/bin/kvinfer}
LLAMA_BENCH=${LLAMA_BENCH:?set LLAMA_BENCH to llama.cpp\'s llama-bench}
ROUNDS=${ROUNDS:-5}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-512}
GEN=${GEN:-64}
LOG=${LOG:-/tmp/peer-bench.log}
[ $# -ge 1 ] || {
	echo "usage: $0 MODEL.gguf [MODEL.gguf ...]" >&2
	exit 2
}
for m in "$@"; do [ -r "$m" ] || {
	echo "$0: cannot read $m" >&2
	exit 1
}; done
[ -x "$KVINFER" ] || {
	echo "$0: $KVINFER not built" >&2
	exit 1
}
[ -x "$LLAMA_BENCH" ] || {
	echo "$0: $LLAMA_BENCH is not executable" >&2
	exit 1
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: >"$LOG"

if [ "${LLAMA_NO_AMX:-0}" = 1 ]; then
	cat >"$tmp/noamx.c" <<'CEOF'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>
/* arch_prctl(ARCH_REQ_XCOMP_PERM, ...) fails: llama.cpp then skips its AMX path */
long syscall(long n, ...)
{
	va_list ap;
	long a[6];
	va_start(ap, n);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if (n == SYS_arch_prctl && a[0] == 0x1023) {
		errno = EPERM;
		return -1;
	}
	long (*real)(long, ...) = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
	return real(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}
CEOF
	cc -O2 -shared -fPIC -o "$tmp/noamx.so" "$tmp/noamx.c" -ldl
	LLAMA_PRELOAD="$tmp/noamx.so"
fi

run_kvinfer() { # model idx [binary prefix]
	local out bin=${3:-$KVINFER} p=${4:-k}
	out=$("$bin" bench -m "$1" --threads "$THREADS" --prompt "$PROMPT" --gen "$GEN" \
		--skip-kernels 1 2>&1) || {
		echo "$out" >&2
		return 1
	}
	echo "$out" >>"$LOG"
	sed -n 's/.*prefill: .* = \([0-9.]*\) tok\/s;.*/\1/p' <<<"$out" >>"$tmp/${p}p$2"
	sed -n 's/.*decode: .* = \([0-9.]*\) tok\/s (by CPU.*/\1/p' <<<"$out" >>"$tmp/${p}d$2"
	[ "$p" = k ] || return 0
	sed -n 's/.*decode: .*: \([0-9]*\)% of it.*/\1/p' <<<"$out" >>"$tmp/kr$2"
	sed -n 's/.*read stream \([0-9.]*\) GB\/s, best.*/\1/p' <<<"$out" >>"$tmp/rs$2"
}

run_llama() { # model idx
	local out
	out=$(env ${LLAMA_PRELOAD:+LD_PRELOAD="$LLAMA_PRELOAD"} "$LLAMA_BENCH" -m "$1" \
		-t "$THREADS" -p "$PROMPT" -n "$GEN" -r 1 -o md 2>&1) || {
		echo "$out" >&2
		return 1
	}
	echo "$out" >>"$LOG"
	awk -F'|' -v t="pp$PROMPT" 'NF > 3 && $(NF-2) ~ t {split($(NF-1), a, " "); print a[1]}' \
		<<<"$out" >>"$tmp/lp$2"
	awk -F'|' -v t="tg$GEN" 'NF > 3 && $(NF-2) ~ t {split($(NF-1), a, " "); print a[1]}' \
		<<<"$out" >>"$tmp/ld$2"
}

median() { sort -g "$1" | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$LOG"
for ((r = 1; r <= ROUNDS; r++)); do
	i=0
	for m in "$@"; do
		i=$((i + 1))
		if ((r % 2)); then
			run_kvinfer "$m" $i
			run_llama "$m" $i
			[ -z "${KVINFER_BASE:-}" ] || run_kvinfer "$m" $i "$KVINFER_BASE" b
		else
			[ -z "${KVINFER_BASE:-}" ] || run_kvinfer "$m" $i "$KVINFER_BASE" b
			run_llama "$m" $i
			run_kvinfer "$m" $i
		fi
	done
	echo "round $r/$ROUNDS done, load $(cut -d' ' -f1 /proc/loadavg)" >&2
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$LOG"

echo
echo "| file | prefill kvinfer / llama.cpp (median) | decode kvinfer / llama.cpp (median) | decode / read roofline (read GB/s) |"
echo "|---|---|---|---|"
i=0
for m in "$@"; do
	i=$((i + 1))
	kp=$(median "$tmp/kp$i") lp=$(median "$tmp/lp$i")
	kd=$(median "$tmp/kd$i") ld=$(median "$tmp/ld$i")
	kr=$(median "$tmp/kr$i") rs=$(median "$tmp/rs$i")
	awk -v f="$(basename "$m" .gguf)" -v kp="$kp" -v lp="$lp" -v kd="$kd" -v ld="$ld" \
		-v kr="$kr" -v rs="$rs" 'BEGIN {
		printf "| %s | %.0f / %.0f tok/s = %.2fx | %.1f / %.1f tok/s = %.2fx | %d %% (%.1f) |\n",
		       f, kp, lp, kp / lp, kd, ld, kd / ld, kr, rs }'
done
if [ -n "${KVINFER_BASE:-}" ]; then
	echo
	echo "| file | before: prefill kvinfer / llama.cpp | before: decode kvinfer / llama.cpp |"
	echo "|---|---|---|"
	i=0
	for m in "$@"; do
		i=$((i + 1))
		bp=$(median "$tmp/bp$i") lp=$(median "$tmp/lp$i")
		bd=$(median "$tmp/bd$i") ld=$(median "$tmp/ld$i")
		awk -v f="$(basename "$m" .gguf)" -v bp="$bp" -v lp="$lp" -v bd="$bd" -v ld="$ld" \
			'BEGIN { printf "| %s | %.0f / %.0f tok/s = %.2fx | %.1f / %.1f tok/s = %.2fx |\n",
			         f, bp, lp, bp / lp, bd, ld, bd / ld }'
	done
fi
echo
echo "per-run figures (kvinfer prefill, llama prefill, kvinfer decode, llama decode):"
i=0
for m in "$@"; do
	i=$((i + 1))
	echo "  $(basename "$m"): $(paste -sd' ' "$tmp/kp$i") | $(paste -sd' ' "$tmp/lp$i") |" \
		"$(paste -sd' ' "$tmp/kd$i") | $(paste -sd' ' "$tmp/ld$i")"
	[ -z "${KVINFER_BASE:-}" ] ||
		echo "    before: $(paste -sd' ' "$tmp/bp$i") | $(paste -sd' ' "$tmp/bd$i")"
done
