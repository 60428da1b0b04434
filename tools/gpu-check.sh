#!/usr/bin/env bash
# gpu-check.sh — the one prepared run for a GPU machine (issue 9, docs/cuda.md): builds the
# CUDA kernels and the device engine, runs the GPU tests (each kernel against its CPU
# reference; the device engine against the CPU engine), a short benchmark with same-run
# baselines (kernels; engine prefill/decode tokens/s on the 1B shape, GPU vs CPU), and writes
# a report. Well under 5 minutes on an H200.
#
#   tools/gpu-check.sh [build-dir]        (default build-gpucheck, created fresh)
#
# Report: $OUT/gpu-report.txt when OUT is set, else ./gpu-report.txt; the full build and test
# output goes to gpu-log.txt beside it. Exit status: 0 when nothing failed (skips, e.g. the
# NCCL test on one GPU, are counted and reported, never as passes), 1 when a build step, a test
# or the benchmark failed. FORCE_DIRECT=1 skips the CMake attempt, FORCE_SHIM=1 uses the cmocka
# shim even where cmocka exists (both for trying the fallback on a CPU machine).
#
# Build: the project's CMake (-DKVFS_CUDA=ON) when it configures; a GPU machine often lacks
# the project's other dependencies (RocksDB, FUSE, ISA-L, cmocka) and cannot install them, so
# the script then builds the kernel library, the tests and the benchmark directly with nvcc
# and cc (cmocka replaced by tests/cmocka_shim when absent).
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
BUILD=${1:-build-gpucheck}
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
DEST=${OUT:-$ROOT}
mkdir -p "$DEST"
REPORT=$DEST/gpu-report.txt
LOG=$DEST/gpu-log.txt
JOBS=${JOBS:-16}
BUDGET=${BUDGET:-270} # seconds for the whole run; later steps are skipped past it
START=$(date +%s)
FAILED=0
SKIPPED=0
: >"$REPORT"
: >"$LOG"

export PATH="/usr/local/cuda/bin:$PATH"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

say() { printf '%s\n' "$*" | tee -a "$REPORT"; }
elapsed() { echo $(($(date +%s) - START)); }
left() { echo $((BUDGET - $(elapsed))); }
section() {
	say ""
	say "== $* ($(elapsed)s)"
	printf '\n===== %s (%ss)\n' "$*" "$(elapsed)" >>"$LOG"
}

# run_step NAME TIMEOUT CMD...: runs CMD with its output in the log; returns its exit status.
run_step() {
	local name=$1 t=$2 rc
	shift 2
	printf '$ %s\n' "$*" >>"$LOG"
	timeout "$t" "$@" >>"$LOG" 2>&1
	rc=$?
	[ "$rc" -eq 124 ] && say "$name: TIMEOUT after ${t}s"
	return "$rc"
}

section "machine"
say "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
	"($(git status --porcelain 2>/dev/null | wc -l | tr -d ' ') files changed in the tree)"
if command -v nvidia-smi >/dev/null 2>&1; then
	say "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
		--format=csv,noheader 2>/dev/null | paste -sd ';' -)"
else
	say "gpu: nvidia-smi not found"
fi
if ! command -v nvcc >/dev/null 2>&1; then
	say "nvcc: NOT FOUND — cannot build the CUDA kernels"
	say "RESULT: FAIL"
	exit 1
fi
say "nvcc: $(nvcc --version | tail -n 1)"
if [ ! -f "$CUDA_HOME/include/cuda_runtime.h" ]; then
	CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
fi
say "cuda home: $CUDA_HOME"

# Architectures: the machine's own when nvidia-smi tells it (faster to build), else 90 and 100.
ARCHS="90;100"
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
if [[ $cap =~ ^[0-9]+$ ]]; then
	ARCHS=$cap
fi
# Only what this nvcc can build (an older toolkit knows no sm_100); its own list when it has one.
known=$(nvcc --list-gpu-arch 2>/dev/null | sed -n 's/^compute_\([0-9]*\)$/\1/p' | tr '\n' ' ')
if [ -n "$known" ]; then
	keep=""
	IFS=';' read -r -a arr <<<"$ARCHS"
	for a in "${arr[@]}"; do
		case " $known " in
		*" $a "*) keep="${keep:+$keep;}$a" ;;
		*) say "nvcc cannot build sm_$a: left out" ;;
		esac
	done
	[ -n "$keep" ] && ARCHS=$keep
fi
say "cuda architectures: $ARCHS"

# Does the CUDA runtime see the GPU nvidia-smi shows, and does code built for $ARCHS run on it?
# A GPU test that reports "skipped: no GPU" on a machine with a GPU is a failure (a driver /
# runtime mismatch, a missing device node), never a skip; this probe says which it is.
GPU_EXPECTED=0
if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
	GPU_EXPECTED=1
fi
PROBE_DIR=$(mktemp -d /tmp/gpu-check-probe.XXXXXX)
cat >"$PROBE_DIR/probe.cu" <<'EOF_PROBE'
#include <cstdio>
#include <cuda_runtime.h>
__global__ void one(int *p) { *p = 42; }
int main()
{
	int n = 0, drv = 0, rt = 0, h = 0, *d = nullptr;
	cudaError_t e = cudaGetDeviceCount(&n);
	cudaDriverGetVersion(&drv);
	cudaRuntimeGetVersion(&rt);
	printf("cuda probe: %d device(s) (%s), driver API %d, runtime %d", n, cudaGetErrorString(e),
	       drv, rt);
	if (e != cudaSuccess || n < 1) {
		printf("\n");
		return 1;
	}
	e = cudaMalloc(&d, sizeof(int));
	if (e == cudaSuccess) {
		one<<<1, 1>>>(d);
		e = cudaGetLastError();
	}
	if (e == cudaSuccess)
		e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
	printf(", test kernel: %s\n", e == cudaSuccess && h == 42 ? "ran" : cudaGetErrorString(e));
	return e != cudaSuccess || h != 42;
}
EOF_PROBE
pgen=""
IFS=';' read -r -a arr <<<"$ARCHS"
for a in "${arr[@]}"; do pgen="$pgen -gencode arch=compute_$a,code=sm_$a"; done
# shellcheck disable=SC2086 # $pgen: a flag list
if timeout 60 nvcc $pgen -o "$PROBE_DIR/probe" "$PROBE_DIR/probe.cu" >>"$LOG" 2>&1; then
	say "$(timeout 30 "$PROBE_DIR/probe" 2>&1 | head -n 3)"
else
	say "cuda probe: did not build (see gpu-log.txt)"
fi
rm -rf "$PROBE_DIR"
[ "$GPU_EXPECTED" -eq 1 ] && say "nvidia-smi shows a GPU: a GPU test that skips counts as FAIL"

# ---- build ------------------------------------------------------------------------------

# Where a CUDA library lives: the toolkit, or the pip wheels (nvidia-*) of the image's Python.
find_lib() { # find_lib NAME -> directory holding libNAME.so*
	local d py
	for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME/targets/x86_64-linux/lib" \
		/usr/lib/x86_64-linux-gnu /usr/local/lib; do
		if compgen -G "$d/lib$1.so*" >/dev/null; then
			echo "$d"
			return 0
		fi
	done
	py=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0] + "/x"))' \
		2>/dev/null) || return 1
	for d in "$py"/*/lib; do
		if compgen -G "$d/lib$1.so*" >/dev/null; then
			echo "$d"
			return 0
		fi
	done
	return 1
}

# A library directory may hold only libX.so.N (wheels): give the linker a libX.so beside it.
link_dir_for() { # link_dir_for NAME DIR -> a directory with libNAME.so
	if [ -e "$2/lib$1.so" ]; then
		echo "$2"
		return
	fi
	local shim=$BUILD/direct/libshim
	mkdir -p "$shim"
	ln -sf "$(compgen -G "$2/lib$1.so.*" | head -n 1)" "$shim/lib$1.so"
	echo "$shim"
}

direct_build() {
	local D=$BUILD/direct O gen="" a f cudart blas nccl_inc nccl_lib cm_inc cm_lib
	O=$D/obj
	mkdir -p "$O" "$BUILD/tests" "$BUILD/tools"
	IFS=';' read -r -a arr <<<"$ARCHS"
	for a in "${arr[@]}"; do gen="$gen -gencode arch=compute_$a,code=sm_$a"; done

	cudart=$(find_lib cudart) || { say "direct build: libcudart not found"; return 1; }
	blas=$(find_lib cublas) || { say "direct build: libcublas not found"; return 1; }
	nccl_inc=""
	for f in "$CUDA_HOME/include" /usr/include \
		"$(dirname "$(find_lib nccl 2>/dev/null || echo /nonexistent/lib)")/include"; do
		[ -f "$f/nccl.h" ] && nccl_inc=$f && break
	done
	nccl_lib=$(find_lib nccl) || nccl_lib=""
	# cmocka: the real one if it compiles and links, else the shim.
	cm_inc="-I$ROOT/tests/cmocka_shim"
	cm_lib=""
	if [ -z "${FORCE_SHIM:-}" ] && printf '#include <stdarg.h>\n#include <stddef.h>\n#include <setjmp.h>\n#include <stdint.h>\n#include <cmocka.h>\nint main(void){return 0;}\n' |
		cc -x c - -o "$D/cmocka-probe" -lcmocka >/dev/null 2>&1; then
		cm_inc=""
		cm_lib="-lcmocka"
	fi
	say "direct build: cudart $cudart, cublas $blas, nccl ${nccl_lib:-none}," \
		"cmocka ${cm_lib:-shim}"

	# cuBLAS's headers: the toolkit's, else those of the wheel its library came from.
	local blas_inc=""
	if [ ! -f "$CUDA_HOME/include/cublas_v2.h" ] && [ -f "$blas/../include/cublas_v2.h" ]; then
		blas_inc="-I$blas/../include"
	fi
	local cflags="-O2 -g -std=c11 -D_GNU_SOURCE -DKVFS_HAVE_CUDA=1 -Wall -Wextra \
		-I$ROOT/common -I$ROOT/kernels -I$CUDA_HOME/include $blas_inc"
	local nvflags="-O3 -std=c++17 $gen -I$ROOT/common -I$ROOT/kernels -DKVFS_HAVE_CUDA=1 $blas_inc"
	[ -n "$nccl_inc" ] && nvflags="$nvflags -I$nccl_inc"
	local srcs=() cus=()
	srcs+=("$ROOT/common/log.c")
	for f in "$ROOT"/kernels/*.c; do
		case $(basename "$f") in
		kvk_nocuda.c) ;;
		kvk_nccl_none.c) [ -z "$nccl_lib" ] || [ -z "$nccl_inc" ] && srcs+=("$f") ;;
		*) srcs+=("$f") ;;
		esac
	done
	for f in "$ROOT"/kernels/cuda/*.cu; do
		if [ "$(basename "$f")" = kvk_nccl.cu ] && { [ -z "$nccl_lib" ] || [ -z "$nccl_inc" ]; }; then
			continue
		fi
		cus+=("$f")
	done
	# Compile in parallel; a failure of any file fails the build.
	{
		for f in "${srcs[@]}"; do echo "cc $cflags -c $f -o $O/$(basename "$f").o"; done
		for f in "${cus[@]}"; do echo "nvcc $nvflags -c $f -o $O/$(basename "$f").o"; done
	} >"$D/compile.txt"
	xargs -P "$JOBS" -I{} -d '\n' sh -c '{} || exit 255' <"$D/compile.txt" >>"$LOG" 2>&1 ||
		return 1
	rm -f "$D/libkvk.a"
	ar rcs "$D/libkvk.a" "$O"/*.o || return 1

	local ldl
	ldl="-L$(link_dir_for cudart "$cudart") -L$(link_dir_for cublas "$blas")"
	local rp="-Wl,-rpath,$cudart -Wl,-rpath,$blas" libs="-lcublas -lcudart"
	if [ -n "$nccl_lib" ] && [ -n "$nccl_inc" ]; then
		ldl="$ldl -L$(link_dir_for nccl "$nccl_lib")"
		rp="$rp -Wl,-rpath,$nccl_lib"
		libs="$libs -lnccl"
	fi
	# Each program on its own: one that does not build (reported later as "not built")
	# does not keep the others from running.
	local t out rc=0 eng_srcs=() crypto=""
	# The device engine (engine/fwd_dev.c) and what it needs of the engine; the model code
	# needs libcrypto (SHA-256 fingerprints). Without the KV connector (liburing): the test
	# is built with KVFS_TEST_NO_KVX, and the bench is kvinfer_bench.c as its own program.
	for f in fwd.c fwd_dev.c kv.c pool.c model.c gguf.c gguf_meta.c kvinfer_cli.c \
		kvinfer_eng.c; do
		eng_srcs+=("$ROOT/engine/$f")
	done
	eng_srcs+=("$ROOT/common/cfg.c")
	local probe='#include <openssl/evp.h>\nint main(void){return EVP_sha256() == 0;}\n'
	if [ -z "${FORCE_NO_SSL_HEADERS:-}" ] && printf '%b' "$probe" |
		cc -x c - -o "$D/crypto-probe" -lcrypto >/dev/null 2>&1; then
		crypto=-lcrypto
	else
		# No openssl headers (a CUDA image seldom has libssl-dev) but usually the library
		# itself: declare the eight EVP calls engine/model.c makes (OpenSSL >= 1.1 ABI) and
		# link the library by its path.
		local so
		so=$(ldconfig -p 2>/dev/null | sed -n 's/^[[:space:]]*libcrypto\.so\.[0-9.]* (libc6,x86-64) => //p' |
			head -n 1)
		[ -n "$so" ] || so=$(compgen -G "/usr/lib/x86_64-linux-gnu/libcrypto.so.[0-9]*" | head -n 1)
		mkdir -p "$D/ssl/openssl"
		cat >"$D/ssl/openssl/evp.h" <<'EOF_EVP'
/* gpu-check.sh's stand-in for <openssl/evp.h>: the EVP calls engine/model.c makes. */
#include <stddef.h>
typedef struct evp_md_ctx_st EVP_MD_CTX;
typedef struct evp_md_st EVP_MD;
typedef struct engine_st ENGINE;
EVP_MD_CTX *EVP_MD_CTX_new(void);
void EVP_MD_CTX_free(EVP_MD_CTX *ctx);
const EVP_MD *EVP_sha256(void);
int EVP_DigestInit_ex(EVP_MD_CTX *ctx, const EVP_MD *type, ENGINE *impl);
int EVP_DigestUpdate(EVP_MD_CTX *ctx, const void *d, size_t cnt);
int EVP_DigestFinal_ex(EVP_MD_CTX *ctx, unsigned char *md, unsigned int *s);
int EVP_Digest(const void *data, size_t count, unsigned char *md, unsigned int *size,
	       const EVP_MD *type, ENGINE *impl);
EOF_EVP
		if [ -n "$so" ] && printf '%b' "$probe" | timeout 60 cc -x c - -x none -I"$D/ssl" -o "$D/crypto-probe" "$so" \
			>/dev/null 2>&1; then
			crypto="$so"
			cflags="$cflags -I$D/ssl"
			say "direct build: no openssl headers; using $so with declared EVP calls"
		else
			say "direct build: no libcrypto (openssl headers): the engine programs" \
				"(test_fwd_dev, kvinfer-bench) cannot be built"
		fi
	fi
	# The programs build in parallel (the engine's sources compile once per program).
	local pids=() names=()
	for t in test_kernels test_kernels_cuda test_kernels_ref kvk_gpu_bench test_fwd_dev \
		test_vit kvinfer_bench; do
		local extra=()
		case $t in
		kvk_gpu_bench) f=$ROOT/tools/kvk_gpu_bench.c out=$BUILD/tools/kvk-gpu-bench ;;
		test_fwd_dev)
			[ -n "$crypto" ] || continue
			f=$ROOT/tests/test_fwd_dev.c out=$BUILD/tests/test_fwd_dev
			extra=(-DKVFS_TEST_NO_KVX=1 "-I$ROOT/engine" "-I$ROOT/tests"
				"$ROOT/tests/ref_fwd.c" "$ROOT/tests/fwd_checks.c" "${eng_srcs[@]}")
			;;
		test_vit) # the vision tower (engine/vit.c, vit_dev.c) vs the CPU tower on the GPU
			[ -n "$crypto" ] || continue
			f=$ROOT/tests/test_vit.c out=$BUILD/tests/test_vit
			extra=("-I$ROOT/engine" "-I$ROOT/tests" "$ROOT/tests/ref_vit.c"
				"$ROOT/engine/vit.c" "$ROOT/engine/vit_dev.c" "$ROOT/engine/gguf_write.c"
				"${eng_srcs[@]}")
			;;
		kvinfer_bench) # `kvinfer bench` as a program of its own: same code, same flags
			[ -n "$crypto" ] || continue
			f=$ROOT/engine/kvinfer_bench.c out=$BUILD/bin/kvinfer-bench
			mkdir -p "$BUILD/bin"
			extra=(-Dkvinfer_cmd_bench=main "-I$ROOT/engine" "${eng_srcs[@]}")
			;;
		*) f=$ROOT/tests/$t.c out=$BUILD/tests/$t ;;
		esac
		# shellcheck disable=SC2086 # word splitting of flag lists is intended
		cc $cflags $cm_inc "$f" "${extra[@]}" -o "$out" "$D/libkvk.a" $ldl $rp $libs \
			$cm_lib $crypto -lstdc++ -lpthread -lm >"$D/build-$t.log" 2>&1 &
		pids+=($!)
		names+=("$t")
	done
	local i
	for i in "${!pids[@]}"; do
		if ! wait "${pids[$i]}"; then
			say "direct build: ${names[$i]} FAILED to build"
			rc=1
		fi
		cat "$D/build-${names[$i]}.log" >>"$LOG"
	done
	return "$rc"
}

section "build"
rm -rf "$BUILD"
MODE=cmake
bstart=$(date +%s)
if [ -z "${FORCE_DIRECT:-}" ] && run_step "cmake configure" 120 cmake -S "$ROOT" -B "$BUILD" -DKVFS_CUDA=ON \
	-DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS"; then
	# The library first (everything needs it), then each program on its own.
	for target in kvfs_kernels test_kernels_ref test_kernels_cuda test_kernels kvk-gpu-bench \
		test_fwd_dev test_vit kvinfer; do
		if ! run_step "cmake build $target" 240 cmake --build "$BUILD" -j "$JOBS" \
			--target "$target"; then
			say "build: $target FAILED (cmake); see gpu-log.txt"
			grep -E 'error' "$LOG" | tail -n 10 >>"$REPORT"
			FAILED=1
			[ "$target" = kvfs_kernels ] && break
		fi
	done
else
	MODE=direct
	say "no CMake build (configure failed: missing project dependencies?, or FORCE_DIRECT);" \
		"building the kernels directly"
	rm -rf "$BUILD"
	if ! direct_build; then
		say "build: FAILED (direct); see gpu-log.txt"
		grep -E 'error' "$LOG" | tail -n 10 >>"$REPORT"
		FAILED=1
	fi
fi
say "build: mode $MODE, $(($(date +%s) - bstart))s"

# ---- tests ------------------------------------------------------------------------------

# test_one NAME TIMEOUT KIND CMD...: PASS (0), SKIP (77) or FAIL (anything else) into the
# report. KIND gpu: needs one GPU, so a skip where nvidia-smi shows one is a FAIL; cpu / gpu2
# (needs two GPUs): a skip is a skip.
test_one() {
	local name=$1 t=$2 kind=$3 rc
	shift 3
	if [ "$(left)" -lt "$t" ] && [ "$(left)" -lt 30 ]; then
		say "$name: NOT RUN (time budget spent)"
		FAILED=1
		return
	fi
	if [ ! -x "$1" ]; then
		say "$name: FAIL (not built)"
		FAILED=1
		return
	fi
	local s
	s=$(date +%s)
	run_step "$name" "$t" "$@"
	rc=$?
	case $rc in
	0) say "$name: PASS ($(($(date +%s) - s))s)" ;;
	77)
		if [ "$kind" = gpu ] && [ "$GPU_EXPECTED" -eq 1 ]; then
			say "$name: FAIL (skipped, but nvidia-smi shows a GPU; see the cuda probe:" \
				"$(tail -n 1 "$LOG"))"
			FAILED=1
		else
			say "$name: SKIP ($(tail -n 1 "$LOG"))"
			SKIPPED=$((SKIPPED + 1))
		fi
		;;
	*)
		say "$name: FAIL (exit $rc)"
		grep -E '^\[  (ERROR|FAILED) |^\[   LINE   \]|error' "$LOG" | tail -n 20 >>"$REPORT"
		FAILED=1
		;;
	esac
}

section "tests"
# Whatever was built runs; a program that was not built counts as a failure.
test_one "test_kernels_ref (CPU references)" 60 cpu "$BUILD/tests/test_kernels_ref"
# Timeouts: a few times the expected run (test_kernels_cuda: about 10 s, mostly the CPU
# references), so a hang (a stream waiting on an event that never comes) leaves the budget
# for the benchmark and the sanitizer.
test_one "test_kernels --gpu" 60 gpu "$BUILD/tests/test_kernels" --gpu
test_one "test_kernels_cuda" 90 gpu "$BUILD/tests/test_kernels_cuda"
test_one "test_kernels_cuda --nccl" 60 gpu2 "$BUILD/tests/test_kernels_cuda" --nccl
# The device engine against the CPU engine: host backend (no GPU needed), then on the GPU.
test_one "test_fwd_dev (device engine, host backend)" 60 cpu "$BUILD/tests/test_fwd_dev"
test_one "test_fwd_dev --cuda (device engine on the GPU)" 90 gpu "$BUILD/tests/test_fwd_dev" --cuda
# The vision tower on the GPU against the CPU tower and the scalar reference (docs/vision.md).
test_one "test_vit --cuda (vision tower on the GPU)" 60 gpu "$BUILD/tests/test_vit" --cuda

# ---- benchmark ----------------------------------------------------------------------------

section "benchmark"
BENCH=$BUILD/tools/kvk-gpu-bench
if [ ! -x "$BENCH" ]; then
	say "benchmark: NOT RUN (not built)"
	FAILED=1
elif [ "$(left)" -lt 40 ]; then
	say "benchmark: NOT RUN (time budget spent)"
else
	quick=()
	[ "$(left)" -lt 180 ] && quick=(--quick) && say "(quick mode: little time left)"
	# The limits each figure is a fraction of: vendor figures (dense FP16 tensor TFLOP/s, HBM
	# GB/s) by GPU name; the H200's where the name is not known.
	gname=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
	case $gname in
	*H200*) lim=(--peak 989 --hbm 4800) ;;
	*H100*PCIe*) lim=(--peak 756 --hbm 2000) ;;
	*H100*NVL*) lim=(--peak 835 --hbm 3900) ;;
	*H100*) lim=(--peak 989 --hbm 3350) ;;
	*A100*) lim=(--peak 312 --hbm 2039) ;;
	*) lim=(--peak 989 --hbm 4800) ;;
	esac
	say "limits (${gname:-unknown GPU}): dense FP16 tensor ${lim[1]} TFLOP/s, HBM ${lim[3]} GB/s"
	quick+=("${lim[@]}")
	printf '$ %s %s\n' "$BENCH" "${quick[*]}" >>"$LOG"
	# leave about 80 s for the engine benchmark that follows
	tb=$(($(left) - 80))
	[ "$tb" -lt 30 ] && tb=30
	timeout "$tb" "$BENCH" "${quick[@]}" >"$BUILD/bench.txt" 2>>"$LOG"
	rc=$?
	tee -a "$REPORT" "$LOG" <"$BUILD/bench.txt"
	if [ "$rc" -eq 77 ] && [ "$GPU_EXPECTED" -eq 1 ]; then
		say "benchmark: FAIL (no GPU found, but nvidia-smi shows one)"
		FAILED=1
	elif [ "$rc" -eq 77 ]; then
		SKIPPED=$((SKIPPED + 1))
		say "benchmark: SKIP (no GPU)"
	elif [ "$rc" -ne 0 ]; then
		say "benchmark: FAIL (exit $rc)"
		FAILED=1
	fi
	# The issue's bars, read from the figures above.
	bar() { # bar LABEL KEY-REGEX FIELD MIN
		local v
		v=$(awk -v k="^$2:\$" -v f="$3" '$1 ~ k { for (i = 1; i < NF; i++) if ($i == f) print $(i + 1) }' \
			"$BUILD/bench.txt" | head -n 1)
		if [ -z "$v" ]; then
			say "bar $1: no figure"
		elif awk -v v="$v" -v m="$4" 'BEGIN { exit !(v >= m) }'; then
			say "bar $1: MET ($v >= $4)"
		else
			say "bar $1: NOT MET ($v < $4)"
		fi
	}
	bar "pack >= 0.7 x D2H copy" kv_pack_GBps "ratio_to_d2h:" 0.7
	bar "unpack >= 0.7 x H2D copy" kv_unpack_GBps "ratio_to_h2d:" 0.7
	bar "F16 GEMM >= 0.6 x dense peak" 'gemm_f16_[0-9]+_TFLOPs' "ratio_to_peak:" 0.6 # 4096 if quick
	bar "decode GEMV (Q8_0) >= 0.5 x HBM" q8_0_gemv_GBps "ratio_to_hbm:" 0.5
	# the value itself, not a ratio: the field after the key
	bar "prefill attention >= 100 TFLOP/s" attn_prefill_TFLOPs "attn_prefill_TFLOPs:" 100
	# Each figure as a fraction of its limit, in one place.
	say "fractions of the limits:"
	for kf in 'gemm_f16_[0-9]+_TFLOPs ratio_to_peak:' 'attn_prefill_TFLOPs ratio_to_peak:' \
		'q4_k_gemm_TFLOPs ratio_to_peak:' 'q8_0_gemv_GBps ratio_to_hbm:' \
		'q4_k_gemv_GBps ratio_to_hbm:'; do
		read -r k f <<<"$kf"
		v=$(awk -v k="^$k:\$" -v f="$f" '$1 ~ k { for (i = 1; i < NF; i++) if ($i == f) print $(i + 1) }' \
			"$BUILD/bench.txt" | head -n 1)
		say "  ${k%%_\[*}: ${v:-no figure} ($f)"
	done
fi

# ---- engine benchmark: kvinfer bench on the 1B shape, GPU vs CPU in the same run ------------

section "engine benchmark (llama-1b shape, random F16 weights)"
KVB=()
LINEBUF=()
command -v stdbuf >/dev/null 2>&1 && LINEBUF=(stdbuf -oL)
if [ -x "$BUILD/bin/kvinfer" ]; then
	KVB=("$BUILD/bin/kvinfer" bench)
elif [ -x "$BUILD/bin/kvinfer-bench" ]; then
	KVB=("$BUILD/bin/kvinfer-bench")
fi
# tok/s of a bench run's "prefill:" or "decode:" line.
toks() { sed -n "s/^  $1:.* = \([0-9.]*\) tok\/s.*/\1/p" "$2" | head -n 1; }
# engine_bench DEVICE TIMEOUT OUTFILE ARGS...: one kvinfer bench run; its exit status.
engine_bench() {
	local dev=$1 t=$2 out=$3
	shift 3
	printf '$ %s --shape llama-1b --type f16 --device %s %s\n' "${KVB[*]}" "$dev" "$*" >>"$LOG"
	# stdbuf: line-buffered, so the lines printed before a timeout kill reach the file.
	timeout "$t" "${LINEBUF[@]}" "${KVB[@]}" --shape llama-1b --type f16 --device "$dev" \
		--skip-kernels 1 "$@" >"$out" 2>"$out.err"
	local rc=$?
	cat "$out" "$out.err" >>"$LOG"
	return "$rc"
}
if [ ${#KVB[@]} -eq 0 ]; then
	say "engine benchmark: NOT RUN (kvinfer not built)"
	FAILED=1
elif [ "$(left)" -lt 60 ]; then
	say "engine benchmark: NOT RUN (time budget spent)"
else
	# GPU: a 512-token prompt in one chunk of 512, then 64 decoded tokens. CPU baseline in
	# the same run: a short one (64 tokens, 8 decoded, all cores), since tokens/s hardly
	# depend on the length at this size and a long CPU run would not fit the budget.
	t=$(($(left) - 30))
	[ "$t" -gt 120 ] && t=120
	engine_bench cuda "$t" "$BUILD/engine-gpu.txt" --prompt 512 --gen 64 --batch 512
	rg=$?
	gp=$(toks prefill "$BUILD/engine-gpu.txt")
	gd=$(toks decode "$BUILD/engine-gpu.txt")
	if grep -q "no GPU found" "$BUILD/engine-gpu.txt.err" && [ "$GPU_EXPECTED" -eq 0 ]; then
		say "engine on GPU: SKIP (no GPU)"
		SKIPPED=$((SKIPPED + 1))
	elif [ "$rg" -ne 0 ] || [ -z "$gp" ]; then
		say "engine on GPU: FAIL (kvinfer bench --device cuda, exit $rg)"
		tail -n 5 "$BUILD/engine-gpu.txt.err" >>"$REPORT"
		FAILED=1
	else
		grep -E '^  (prefill|decode):' "$BUILD/engine-gpu.txt" | sed 's/^/  gpu /' |
			tee -a "$REPORT"
		t=$(($(left) - 10))
		[ "$t" -gt 90 ] && t=90
		[ "$t" -lt 20 ] && t=20
		engine_bench cpu "$t" "$BUILD/engine-cpu.txt" --threads "$(nproc 2>/dev/null || echo 4)" \
			--prompt 64 --gen 8 --batch 64
		rc_cpu=$?
		cp_=$(toks prefill "$BUILD/engine-cpu.txt")
		cd_=$(toks decode "$BUILD/engine-cpu.txt")
		if [ "$rc_cpu" -eq 0 ] && [ -n "$cp_" ] && [ -n "$cd_" ]; then
			grep -E '^  (prefill|decode):' "$BUILD/engine-cpu.txt" | sed 's/^/  cpu /' |
				tee -a "$REPORT"
			say "engine_prefill_tok_s: gpu $gp cpu $cp_ ratio_gpu_to_cpu:" \
				"$(awk -v a="$gp" -v b="$cp_" 'BEGIN { printf "%.1f", a / b }')"
			say "engine_decode_tok_s: gpu $gd cpu $cd_ ratio_gpu_to_cpu:" \
				"$(awk -v a="$gd" -v b="$cd_" 'BEGIN { printf "%.1f", a / b }')"
		else
			say "engine on CPU (baseline): no figure (exit $rc_cpu); the GPU figures stand alone"
		fi
	fi
fi

# ---- sanitizer (last: only with time to spare) ----------------------------------------------
# The GPU tests again (KVK_TEST_QUICK: the first 3 shapes of each list) under
# compute-sanitizer: memcheck (out-of-bounds / misaligned accesses)
# and racecheck (shared-memory races). Errors it finds fail the run; a sanitizer that cannot
# run on this machine, or runs out of time, is reported and not counted.
section "sanitizer"
SAN=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
# The __global__ functions of kernels/cuda/*.cu (attn_kernel, move_kernel<...>, ...).
OUR_KERNELS='(attn|attn_dense|fa|embed|rope|swiglu|convert|add|add_bias|kv_store|q8_0_gemv|kq_gemv|kq_gemm|move|argmax|topk|rmsnorm)_kernel|rmsnorm_rows'

if [ ! -x "$SAN" ]; then
	say "sanitizer: not available (compute-sanitizer missing)"
else
	# memcheck and racecheck of the kernels, then memcheck of the device engine (its pointer
	# arithmetic into the paged pool, tables and activations) with what time is left.
	for run in "memcheck test_kernels_cuda" "racecheck test_kernels_cuda" \
		"memcheck test_fwd_dev --cuda"; do
		read -r tool prog arg <<<"$run"
		name="$tool $prog${arg:+ $arg}" out=$BUILD/san-$tool-$prog.txt
		t=$(($(left) - 10))
		if [ ! -x "$BUILD/tests/$prog" ]; then
			say "sanitizer $name: NOT RUN ($prog not built)"
			continue
		fi
		if [ "$t" -lt 30 ]; then
			say "sanitizer $name: NOT RUN (time budget spent)"
			continue
		fi
		[ "$t" -gt 150 ] && t=150
		printf '$ KVK_TEST_QUICK=1 %s --tool %s %s %s\n' "$SAN" "$tool" "$prog" "$arg" >>"$LOG"
		# shellcheck disable=SC2086 # $arg: no argument or one word
		KVK_TEST_QUICK=1 timeout "$t" "$SAN" --tool "$tool" --error-exitcode 99 \
			"$BUILD/tests/$prog" $arg >"$out" 2>&1
		rc=$?
		cat "$out" >>"$LOG"
		case $rc in
		0) say "sanitizer $name: clean" ;;
		77) say "sanitizer $name: SKIP (no GPU; not counted)" ;;
		99)
			# racecheck may not model the mbarrier/TMA synchronisation of cuBLAS's Hopper
			# kernels: hazards it reports only inside library kernels are shown, not
			# counted; one in any of our kernels (kernels/cuda/*.cu) fails the run.
			if [ "$tool" = racecheck ] && ! grep -qE "$OUR_KERNELS" "$out"; then
				say "sanitizer $name: hazards reported only in library (cuBLAS) kernels," \
					"not counted:"
			else
				say "sanitizer $name: ERRORS FOUND"
				FAILED=1
			fi
			grep -E '^=========' "$out" | head -n 25 >>"$REPORT"
			;;
		124) say "sanitizer $name: not finished in ${t}s (not counted)" ;;
		*)
			say "sanitizer $name: could not run or tests failed under it (exit $rc, not" \
				"counted): $(grep -m 1 -E 'Error|error' "$out")"
			;;
		esac
	done
fi

section "result"
if [ "$FAILED" -eq 0 ]; then
	say "RESULT: PASS, $SKIPPED skipped (total $(elapsed)s)"
else
	say "RESULT: FAIL (total $(elapsed)s)"
fi
say "report: $REPORT, full log: $LOG"
exit "$FAILED"
