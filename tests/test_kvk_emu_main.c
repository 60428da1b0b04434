/* test_kvk_emu: the CUDA emulation (tests/cuda-emu, docs/cuda-emu.md) against CUDA's documented
 * semantics, and every kind of fault it claims to report, reported. Built and run only with
 * -DKVFS_CUDA=EMU. Device 0 and 1 stay healthy; each fault case uses a device of its own
 * (faults are sticky), so the run asks for 12 emulated devices. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "test_kvk_emu.h"

/* CUDA runtime calls the C side needs (the emulator's, by their real names). */
int cudaSetDevice(int device);

enum {
	ERR_INVALID_VALUE = 1,
	ERR_INVALID_CONFIG = 9,
	ERR_BAD_HANDLE = 400,
	ERR_ILLEGAL_ADDRESS = 700,
	ERR_LAUNCH_FAILURE = 719
};
enum { BLAS_INVALID_VALUE = 7 };

static void use(int dev)
{
	assert_int_equal(cudaSetDevice(dev), 0);
}

/* What CUDA documents for each shuffle, computed here for 64 threads. */
static void test_shuffles(void **state)
{
	(void)state;
	use(0);
	int out[64 * 8];
	assert_int_equal(emu_shuffles(out), 0);
	for (int t = 0; t < 64; t++) {
		int lane = t % 32, w0 = t - lane, *o = out + t * 8;
		int want[8];
		want[0] = 100 + w0 + (lane ^ 1);
		want[1] = 100 + w0 + (lane ^ 16);
		want[2] = 100 + w0 + (lane + 3 < 32 ? lane + 3 : lane);
		int seg = lane & ~7;
		want[3] = 100 + w0 + (lane + 3 < seg + 8 ? lane + 3 : lane);
		want[4] = 100 + w0 + (lane >= 2 ? lane - 2 : lane);
		want[5] = 100 + w0 + 7;
		want[6] = 100 + w0 + (lane & ~15) + 33 % 16;
		unsigned b = 0;
		for (int l = 0; l < 32; l++)
			if ((w0 + l) % 3 == 0)
				b |= 1u << l;
		want[7] = (int)b;
		for (int i = 0; i < 8; i++)
			if (o[i] != want[i])
				fail_msg("thread %d op %d: got %d want %d", t, i, o[i], want[i]);
	}
}

static void test_barriers_shared(void **state)
{
	(void)state;
	use(0);
	enum { NB = 5 };
	int out[2 * NB];
	assert_int_equal(emu_reduce(out, NB), 0);
	for (int b = 0; b < NB; b++) {
		assert_int_equal(out[b], b * 1000 * 256 + 255 * 256 / 2);
		assert_int_equal(out[NB + b], b); /* each block its own shared memory */
	}
}

static void test_dyn_smem(void **state)
{
	(void)state;
	use(0);
	unsigned out[2] = {0, 0};
	assert_int_equal(emu_dyn_smem(out, 1024, 0), 0);
	assert_int_equal(out[0], 0xffffffffu); /* poisoned at block start */
	assert_int_equal(out[1], 7);
	/* Over 48 KiB needs the attribute, as on the GPU. */
	assert_int_equal(emu_dyn_smem(out, 64 << 10, 0), ERR_INVALID_VALUE);
	assert_int_equal(emu_dyn_smem(out, 64 << 10, 1), 0);
	unsigned char b = 0;
	assert_int_equal(emu_fresh_memory(&b), 0);
	assert_int_equal(b, 0xff);
}

#if defined(__SANITIZE_ADDRESS__)
#define EMU_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_TEST_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define EMU_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define EMU_TEST_TSAN 1
#endif
#endif

static char self[4096];

/* Runs this program with `mode` as its argument; its stderr (up to cap - 1 bytes, NUL
 * terminated) in err. Returns its wait status. Only the ASan and TSan builds have cases that
 * use it. */
__attribute__((unused)) static int run_self(const char *mode, char *err, size_t cap)
{
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	pid_t p = fork();
	if (p == 0) {
		dup2(pfd[1], 2);
		close(pfd[0]);
		execl(self, self, mode, (char *)NULL);
		_exit(127);
	}
	assert_true(p > 0);
	close(pfd[1]);
	size_t len = 0;
	ssize_t r;
	while ((r = read(pfd[0], err + len, cap - 1 - len)) > 0)
		len += (size_t)r;
	err[len] = 0;
	close(pfd[0]);
	int st = 0;
	assert_int_equal(waitpid(p, &st, 0), p);
	return st;
}

/* Static shared memory: poisoned for every block (block 1 and 2 do not see block 0's values),
 * the variables apart and aligned, and 32 KiB static + 20 KiB dynamic allowed with the
 * attribute (the fault without it is in test_kernel_faults). */
static void test_static_smem(void **state)
{
	(void)state;
	use(0);
	unsigned out[12];
	assert_int_equal(emu_static_smem(out), 0);
	for (unsigned b = 0; b < 3; b++) {
		assert_int_equal(out[b * 4], 0xffffffffu);
		assert_int_equal(out[b * 4 + 1], 7 + b);
		assert_int_equal(out[b * 4 + 2], b + 1);
		assert_int_equal(out[b * 4 + 3], 1);
	}
	float f[32];
	assert_int_equal(emu_smem_total(20 << 10, 1, f), 0);
	for (int i = 0; i < 32; i++)
		assert_true(f[i] == 3.0f);
}

/* A write one past a static shared array lands in a red zone: under ASan it is reported
 * (the child, this program with --smem-overflow, dies with the report); without, the next
 * variable keeps its value. */
static void test_smem_overflow(void **state)
{
	(void)state;
	use(0);
#ifdef EMU_TEST_ASAN
	static char err[1 << 16];
	int st = run_self("--smem-overflow", err, sizeof(err));
	assert_false(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	if (!strstr(err, "use-after-poison"))
		fail_msg("no ASan report from the overflow: %.2000s", err);
#else
	unsigned b = 0;
	assert_int_equal(emu_smem_overflow(4, &b), 0);
	assert_int_equal(b, 5);
#endif
}

/* Under TSan the CUDA threads synchronize only at barriers (docs/cuda-emu.md, "Races"): the
 * missing __syncthreads of race_kernel is a data race report naming it, in the default order
 * (no jitter needed), and reduce_kernel, which has its barriers, gives none. */
static void test_racecheck(void **state)
{
	(void)state;
#ifdef EMU_TEST_TSAN
	static char err[1 << 16];
	int st = run_self("--race", err, sizeof(err));
	assert_false(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	if (!strstr(err, "ThreadSanitizer: data race") || !strstr(err, "race_kernel"))
		fail_msg("no TSan report naming race_kernel: %.3000s", err);
	st = run_self("--no-race", err, sizeof(err));
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || strstr(err, "ThreadSanitizer"))
		fail_msg("a report for a kernel with its barriers: %.3000s", err);
#else
	skip(); /* only a TSan build (make test-emu-tsan) sees races */
#endif
}

static void test_launch_limits(void **state)
{
	(void)state;
	use(0);
	assert_int_equal(emu_launch_config(1, 1, 1, 1024), 0);
	assert_int_equal(emu_launch_config(1, 1, 1, 1025), ERR_INVALID_CONFIG);
	assert_int_equal(emu_launch_config(1, 65536, 1, 32), ERR_INVALID_CONFIG);
	assert_int_equal(emu_launch_config(1, 1, 65536, 32), ERR_INVALID_CONFIG);
	assert_int_equal(emu_launch_config(3, 65535, 1, 1), 0);
	assert_int_equal(emu_wrong_device_stream(0, 1), ERR_BAD_HANDLE);
	assert_int_equal(emu_launch_config(1, 1, 1, 32), 0); /* device unharmed */
}

/* Each fault kind on its own device: the sync reports it, and it stays. */
static void test_kernel_faults(void **state)
{
	(void)state;
	static const int kinds[] = {
	    EMU_FAULT_DIVERGENT_BARRIER, EMU_FAULT_PARTIAL_WARP, EMU_FAULT_EXITED_LANE,
	    EMU_FAULT_MIXED_OPS,	 EMU_FAULT_STATIC_SMEM,	 EMU_FAULT_SMEM_TOTAL,
	    EMU_FAULT_WMMA_ALIGN,	 EMU_FAULT_WMMA_LDM,	 EMU_FAULT_WMMA_DIVERGENT};
	static const int devs[] = {2, 3, 4, 5, 10, 11, 12, 13, 14};
	for (int i = 0; i < 9; i++) {
		use(devs[i]);
		int after = 0;
		assert_int_equal(emu_fault_kernel(kinds[i], &after), ERR_LAUNCH_FAILURE);
		assert_int_equal(after, ERR_LAUNCH_FAILURE);
	}
	use(0);
	assert_int_equal(emu_launch_config(1, 1, 1, 32), 0); /* other devices unharmed */
}

static void test_copies(void **state)
{
	(void)state;
	use(0);
	int after = -1;
	assert_int_equal(emu_bad_copy(0, &after), ERR_INVALID_VALUE);
	assert_int_equal(after, 0); /* a refused call leaves the device working */
	assert_int_equal(emu_pageable_d2h(), 0);
	use(6);
	assert_int_equal(emu_bad_copy(1, &after), ERR_ILLEGAL_ADDRESS);
	assert_int_equal(after, ERR_ILLEGAL_ADDRESS);
}

static void test_events(void **state)
{
	(void)state;
	use(0);
	assert_int_equal(emu_event_order(), 42);
}

static void test_gemm(void **state)
{
	(void)state;
	use(0);
	float c[6];
	assert_int_equal(emu_gemm(c), 0);
	/* C = A^T B: rows of A^T are (1 2 3 4), (5 6 7 8); B's columns e1, e2, (1 1 1 1). */
	const float want[6] = {1, 5, 2, 6, 10, 26};
	for (int i = 0; i < 6; i++)
		if (c[i] != want[i])
			fail_msg("C[%d] = %g, want %g", i, c[i], want[i]);
	int sync = -1;
	assert_int_equal(emu_bad_gemm(0, &sync), BLAS_INVALID_VALUE);
	assert_int_equal(sync, 0);
	use(7);
	assert_int_equal(emu_bad_gemm(1, &sync), 0);
	assert_int_equal(sync, ERR_ILLEGAL_ADDRESS);
}

/* nvcuda::wmma (mma.h): both layouts of each operand, an accumulator loaded column-major and
 * stored either way, padded ldm. Values are multiples of 1/4 (exact in f16, bf16 and every f32
 * sum), except a[0][0] = 1 + 2^-10: exact in f16, 1.0 once rounded to bf16, so the inputs are
 * seen to go through their type. A layout read the wrong way round changes most elements. */
static void test_wmma(void **state)
{
	(void)state;
	use(0);
	float a[256], b[256], c[256], d[16 * 20];
	for (int i = 0; i < 16; i++)
		for (int j = 0; j < 16; j++) {
			a[i * 16 + j] = (float)((i * 7 + j * 3) % 9 - 4) / 4;
			b[i * 16 + j] = (float)((i * 5 + j * 11) % 7 - 3) / 4;
			c[i * 16 + j] = (float)(i - 2 * j) / 4;
		}
	a[0] = 1.0f + 1.0f / 1024;
	for (int bf = 0; bf < 2; bf++) {
		assert_int_equal(emu_wmma(bf, a, b, c, d), 0);
		for (int m = 0; m < 16; m++)
			for (int n = 0; n < 16; n++) {
				double want = bf ? 0 : c[m * 16 + n];
				for (int k = 0; k < 16; k++) {
					double av = bf && m == 0 && k == 0 ? 1.0 : a[m * 16 + k];
					want += av * b[k * 16 + n];
				}
				float got = bf ? d[n * 16 + m] : d[m * 20 + n];
				if (got != (float)want)
					fail_msg("%s d[%d][%d] = %.9g, want %.9g",
						 bf ? "bf16" : "f16", m, n, got, want);
			}
	}
}

/* Without jitter a missing barrier goes unseen: threads run in order until they wait, so
 * thread 0's write lands before the reads, and blocks run in index order. With jitter, seeds
 * 1..8: some thread reads before the write in at least one run, and the blocks run in
 * another order, each once. */
static void test_jitter(void **state)
{
	(void)state;
#ifdef EMU_TEST_TSAN
	skip(); /* its kernel races on purpose: test_racecheck runs it under TSan */
#endif
	use(0);
	enum { NT = 128, NB = 16 };
	static int out[(NT + 1) * NB];
	int *turn = out + NT * NB;
	assert_int_equal(emu_jitter_race(0, NT, NB, out), 0);
	for (int b = 0; b < NB; b++) {
		for (int t = 0; t < NT; t++)
			assert_int_equal(out[b * NT + t], 1000 + 16 * b);
		assert_int_equal(turn[b], b);
	}
	int stale = 0, reordered = 0;
	for (int seed = 1; seed <= 8; seed++) {
		assert_int_equal(emu_jitter_race((unsigned long long)seed, NT, NB, out), 0);
		unsigned seen = 0;
		for (int b = 0; b < NB; b++) {
			for (int t = 0; t < NT; t++)
				stale += out[b * NT + t] != 1000 + seed + 16 * b;
			assert_true(turn[b] >= 0 && turn[b] < NB);
			seen |= 1u << turn[b];
			reordered += turn[b] != b;
		}
		assert_int_equal(seen, (1u << NB) - 1); /* a permutation */
	}
	assert_true(stale > 0);
	assert_true(reordered > 0);
}

static void test_nccl(void **state)
{
	(void)state;
	int got = 0;
	assert_int_equal(emu_nccl(0, 0, 1, &got), 0);
	assert_int_equal(got, 0x5a);
	assert_int_equal(emu_nccl(2, 0, 1, &got), 0);	  /* the abort ends the receive */
	assert_int_not_equal(emu_nccl(3, 0, 1, &got), 0); /* duplicate device refused */
	/* Sizes that differ: both devices fault (8 and 9: faults are sticky). */
	assert_int_equal(emu_nccl(1, 8, 9, &got), 1000 + ERR_LAUNCH_FAILURE);
}

/* Ranks in two processes (the peer is this program again, exec'd: --nccl-peer ID): 3 MiB
 * from the child to this process. */

static void test_nccl_processes(void **state)
{
	(void)state;
	use(0);
	char hex[257];
	assert_int_equal(emu_nccl_id(hex), 0);
	pid_t p = fork();
	if (p == 0) {
		execl(self, self, "--nccl-peer", hex, (char *)NULL);
		_exit(127);
	}
	assert_true(p > 0);
	int got = 0;
	assert_int_equal(emu_nccl_rank(hex, 0, 3 << 20, 0, 0, &got), 0);
	assert_int_equal(got, 0x33);
	int st = 0;
	assert_int_equal(waitpid(p, &st, 0), p);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "--nccl-peer")) {
		int got = 0;
		return emu_nccl_rank(argv[2], 1, 3 << 20, 1, 0x33, &got) ? 1 : 0;
	}
	if (argc == 2 && !strcmp(argv[1], "--race")) {
		int out[(64 + 1) * 2];
		return emu_jitter_race(0, 64, 2, out) ? 1 : 0;
	}
	if (argc == 2 && !strcmp(argv[1], "--no-race")) {
		int out[2 * 3];
		return emu_reduce(out, 3) ? 1 : 0;
	}
	if (argc == 2 && !strcmp(argv[1], "--smem-overflow")) {
		unsigned b = 0;
		return emu_smem_overflow(4, &b) ? 1 : 0;
	}
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return 1;
	self[n] = 0;
	setenv("KVK_EMU_DEVICES", "15", 1);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_shuffles),	   cmocka_unit_test(test_barriers_shared),
	    cmocka_unit_test(test_dyn_smem),	   cmocka_unit_test(test_static_smem),
	    cmocka_unit_test(test_smem_overflow),  cmocka_unit_test(test_racecheck),
	    cmocka_unit_test(test_launch_limits),  cmocka_unit_test(test_kernel_faults),
	    cmocka_unit_test(test_copies),	   cmocka_unit_test(test_events),
	    cmocka_unit_test(test_gemm),	   cmocka_unit_test(test_wmma),
	    cmocka_unit_test(test_jitter),	   cmocka_unit_test(test_nccl),
	    cmocka_unit_test(test_nccl_processes),
	};
	return cmocka_run_group_tests_name("kvk_emu", tests, NULL, NULL);
}
