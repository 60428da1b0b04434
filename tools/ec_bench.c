/* kvfs-ec-bench — erasure-coding throughput against memcpy, in one run, on the same buffers.
 *
 * A "file" of S stripes x k data chunks lives in one buffer bigger than the last-level cache
 * (as a client's file buffer would); parity and copies go to separate buffers of the same
 * shape. Four operations run in interleaved rounds over all stripes:
 *   memcpy      copies the k data chunks of each stripe (the baseline: same data bytes);
 *   encode      kvec_encode, data pointers straight into the file buffer;
 *   isal-raw    ec_encode_data with the same matrix, for the library's overhead;
 *   decode-1    kvec_reconstruct of one lost data chunk (a different one per stripe) from the
 *               other k-1 data chunks and parity.
 * Throughput is data bytes (k * chunk per stripe) per second, in GB/s (1e9), and as a ratio to
 * memcpy. Single-threaded, like one client write.
 */
#define KVFS_LOG_TAG "ec-bench"
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <isa-l/erasure_code.h>

#include "cfg.h"
#include "kvec.h"
#include "log.h"

struct conf {
	uint64_t chunk;
	int64_t k, m;
	double seconds;
	int64_t data_mb;
};

static const struct cfg_opt opts[] = {
    {"chunk", CFG_SIZE, offsetof(struct conf, chunk), KVEC_CHUNK_MIN, KVEC_CHUNK_MAX, "1M",
     "chunk size (multiple of 4K, 4K..16M)"},
    {"k", CFG_INT, offsetof(struct conf, k), 1, KVEC_MAX_K, "10", "data chunks per stripe"},
    {"m", CFG_INT, offsetof(struct conf, m), 1, KVEC_MAX_M, "1", "parity chunks per stripe"},
    {"seconds", CFG_SECS, offsetof(struct conf, seconds), 0.1, 60, "2",
     "measured time per operation (split over 4 interleaved rounds)"},
    {"data-mb", CFG_INT, offsetof(struct conf, data_mb), 1, 1 << 14, "128",
     "file buffer size in MiB (rounded up to whole stripes); keep it above the LLC"},
    CFG_END,
};

enum { OP_MEMCPY, OP_ENCODE, OP_RAW, OP_DECODE, NOPS };
static const char *const op_name[NOPS] = {"memcpy", "encode", "isal-raw", "decode-1"};

struct bench {
	int k, m;
	size_t cs;
	uint64_t nstripes;
	uint8_t *file, *copy, *parity, *rebuilt;
	struct kvec_codec *codec;
	uint8_t *raw_tbls;
};

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint8_t *data_chunk(const struct bench *b, uint64_t s, int j)
{
	return b->file + (s * b->k + j) * b->cs;
}

static uint8_t *parity_chunk(const struct bench *b, uint64_t s, int i)
{
	return b->parity + (s * b->m + i) * b->cs;
}

/* One pass of `op` over every stripe. Returns 0 or a negative errno. */
static int pass(struct bench *b, int op)
{
	for (uint64_t s = 0; s < b->nstripes; s++) {
		uint8_t *ch[KVEC_MAX_N];
		for (int j = 0; j < b->k; j++)
			ch[j] = data_chunk(b, s, j);
		for (int i = 0; i < b->m; i++)
			ch[b->k + i] = parity_chunk(b, s, i);
		int rc = 0;
		switch (op) {
		case OP_MEMCPY:
			for (int j = 0; j < b->k; j++)
				memcpy(b->copy + (s * b->k + j) * b->cs, ch[j], b->cs);
			break;
		case OP_ENCODE:
			rc = kvec_encode(b->codec, (const uint8_t *const *)ch, ch + b->k, b->cs);
			break;
		case OP_RAW:
			ec_encode_data((int)b->cs, b->k, b->m, b->raw_tbls, ch, ch + b->k);
			break;
		case OP_DECODE: {
			int lost = (int)(s % (uint64_t)b->k);
			ch[lost] = b->rebuilt + s * b->cs;
			uint64_t all = (1ull << (b->k + b->m)) - 1;
			rc = kvec_reconstruct(b->codec, ch, all & ~(1ull << lost), 1ull << lost,
					      b->cs);
			break;
		}
		}
		if (rc)
			return rc;
	}
	return 0;
}

static void *alloc_touched(size_t n)
{
	/* 2 MiB alignment lets THP back it; touching faults every page in before timing. */
	void *p = aligned_alloc(2u << 20, (n + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1));
	if (p)
		memset(p, 0, n);
	return p;
}

int main(int argc, char **argv)
{
	struct conf cf;
	int npos = 0;
	int rc = cfg_parse(opts, &cf, argc, argv, "", &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	if (npos > 0 || cf.chunk % KVEC_CHUNK_ALIGN) {
		fprintf(stderr,
			"usage: kvfs-ec-bench [--chunk 1M] [--k 10] [--m 1] [--seconds S]\n");
		return 2;
	}
	struct bench b = {.k = (int)cf.k, .m = (int)cf.m, .cs = cf.chunk};
	uint64_t sb = (uint64_t)b.k * b.cs;
	b.nstripes = (((uint64_t)cf.data_mb << 20) + sb - 1) / sb;
	if (b.nstripes < 2)
		b.nstripes = 2;
	size_t data_bytes = b.nstripes * sb;

	rc = kvec_codec_create(b.k, b.m, &b.codec);
	if (rc) {
		klog_error("kvec_codec_create(%d, %d): %s", b.k, b.m, strerror(-rc));
		return 1;
	}
	b.file = alloc_touched(data_bytes);
	b.copy = alloc_touched(data_bytes);
	b.parity = alloc_touched(b.nstripes * b.m * b.cs);
	b.rebuilt = alloc_touched(b.nstripes * b.cs);
	b.raw_tbls = malloc((size_t)32 * b.k * b.m);
	uint8_t *mat = malloc((size_t)(b.k + b.m) * b.k);
	if (!b.file || !b.copy || !b.parity || !b.rebuilt || !b.raw_tbls || !mat) {
		klog_error("out of memory for %zu MiB of buffers", 3 * data_bytes >> 20);
		return 1;
	}
	gf_gen_cauchy1_matrix(mat, b.k + b.m, b.k);
	ec_init_tables(b.k, b.m, mat + b.k * b.k, b.raw_tbls);
	uint64_t x = 0x9E3779B97F4A7C15ull;
	for (size_t i = 0; i + 8 <= data_bytes; i += 8) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		memcpy(b.file + i, &x, 8);
	}

	printf("kvfs-ec-bench: k=%d m=%d chunk=%zu KiB stripes=%llu data=%zu MiB "
	       "(x86 avx2=%d avx512f=%d gfni=%d)\n",
	       b.k, b.m, b.cs >> 10, (unsigned long long)b.nstripes, data_bytes >> 20,
	       !!__builtin_cpu_supports("avx2"), !!__builtin_cpu_supports("avx512f"),
	       !!__builtin_cpu_supports("gfni"));

	/* Warm up every operation once (page faults, decode-table cache), then check that
	 * decode really rebuilt the lost chunks. */
	for (int op = 0; op < NOPS; op++)
		if ((rc = pass(&b, op))) {
			klog_error("%s: %s", op_name[op], strerror(-rc));
			return 1;
		}
	for (uint64_t s = 0; s < b.nstripes; s++)
		if (memcmp(b.rebuilt + s * b.cs, data_chunk(&b, s, (int)(s % (uint64_t)b.k)),
			   b.cs)) {
			klog_error("decode produced wrong data in stripe %llu",
				   (unsigned long long)s);
			return 1;
		}

	/* Interleaved rounds, so drift in the machine (other tenants, frequency) hits every
	 * operation alike. */
	const int rounds = 4;
	double t[NOPS] = {0};
	uint64_t passes[NOPS] = {0};
	for (int r = 0; r < rounds; r++)
		for (int op = 0; op < NOPS; op++) {
			double t0 = now(), t1;
			do {
				pass(&b, op);
				passes[op]++;
				t1 = now();
			} while (t1 - t0 < cf.seconds / rounds);
			t[op] += t1 - t0;
		}

	double gbs[NOPS];
	for (int op = 0; op < NOPS; op++)
		gbs[op] = (double)passes[op] * (double)data_bytes / t[op] / 1e9;
	printf("%-9s %9s %9s\n", "op", "GB/s", "x memcpy");
	for (int op = 0; op < NOPS; op++)
		printf("%-9s %9.2f %9.2f\n", op_name[op], gbs[op], gbs[op] / gbs[OP_MEMCPY]);
	printf("encode vs isal-raw: %.2f\n", gbs[OP_ENCODE] / gbs[OP_RAW]);
	if (b.k == 10 && b.m == 1)
		printf("bar (10+1): encode >= 1.20x memcpy: %s; decode-1 >= 0.80x memcpy: %s\n",
		       gbs[OP_ENCODE] >= 1.2 * gbs[OP_MEMCPY] ? "met" : "NOT met",
		       gbs[OP_DECODE] >= 0.8 * gbs[OP_MEMCPY] ? "met" : "NOT met");

	free(mat);
	free(b.raw_tbls);
	free(b.file);
	free(b.copy);
	free(b.parity);
	free(b.rebuilt);
	kvec_codec_destroy(b.codec);
	return 0;
}
