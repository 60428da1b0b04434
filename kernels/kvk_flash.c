/* Flash-style causal attention over the paged f16 KV cache (kvk.h states the contract). The
 * old engine loop streamed a row's whole prefix of K and V once per query row into a
 * max_ctx-long score buffer; here a key tile (<= 64 positions of one block, 8 KB of K and
 * 8 KB of V at head_dim 64) is converted to f32 once and then used by up to KVK_FLASH_QT
 * tokens x G heads, so a long prompt reads its K/V from memory about QT * G times less and
 * the exp/sum/rescale work runs on tiles the size of L1. The per-ISA tile kernels are
 * kvk_flash_tile_scalar below and the x86 template (kvk_matmul_x86.inc). */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "kvk_matmul_impl.h"
#include "kvk_ops.h"

/* floats of kf / vf: KT keys rounded up to the QK register tile (8 keys), 16-float aligned */
static size_t kvbuf_floats(int hd)
{
	return ((size_t)(KVK_FLASH_KT + 7) * (size_t)hd + 15) & ~(size_t)15;
}

size_t kvk_flash_scratch_floats(int hd, int G)
{
	size_t rows = (size_t)KVK_FLASH_QT * (size_t)(G > 0 ? G : 1);
	return 2 * kvbuf_floats(hd) + 4 * KVK_FLASH_KT + 2 * ((rows + 15) & ~(size_t)15) + 16;
}

/* Portable tile: the same steps as the x86 one with a sequential dot and sum (other bits). */
void kvk_flash_tile_scalar(const struct kvk_flash_args *a)
{
	int hd = a->hd, np = a->np;
	for (int p = 0; p < np; p++)
		for (int d = 0; d < hd; d++) {
			a->kf[(size_t)p * hd + d] = kvk_f16_to_f32(a->k[(size_t)p * a->ks + d]);
			a->vf[(size_t)p * hd + d] = kvk_f16_to_f32(a->v[(size_t)p * a->ks + d]);
		}
	for (int r = 0; r < a->nt * a->G; r++) {
		int i = r / a->G, g = r % a->G, n = a->lim[i];
		if (n <= 0)
			continue;
		const float *q = a->q + (size_t)i * a->ldq + (size_t)g * hd;
		float *o = a->o + (size_t)i * a->ldo + (size_t)g * hd, *s = a->sc;
		float mt = -INFINITY;
		for (int p = 0; p < n; p++) {
			const float *k = a->kf + (size_t)p * hd;
			float acc = 0;
			for (int d = 0; d < hd; d++)
				acc += q[d] * k[d];
			s[p] = acc * a->scale;
			mt = s[p] > mt ? s[p] : mt;
		}
		float mn = a->m[r] > mt ? a->m[r] : mt, alpha = kvk_exp(a->m[r] - mn), sum = 0;
		for (int p = 0; p < n; p++) {
			s[p] = kvk_exp(s[p] - mn);
			sum += s[p];
		}
		a->m[r] = mn;
		a->l[r] = a->l[r] * alpha + sum;
		if (alpha != 1.0f) /* x * 1 == x: skipping it changes no bit */
			for (int d = 0; d < hd; d++)
				o[d] *= alpha;
		for (int p = 0; p < n; p++)
			for (int d = 0; d < hd; d++)
				o[d] += s[p] * a->vf[(size_t)p * hd + d];
	}
}

int kvk_flash_attn_f16(enum kvk_isa isa, float *o, size_t ldo, const float *q, size_t ldq, int nt,
		       int pos0, int G, int kvh, const struct kvk_kv_pages *kv,
		       const int32_t *table, float scale, float *scratch)
{
	int hd = kv->head_dim, B = kv->block_tokens;
	if (hd < 1 || hd > 256 || G < 1 || nt < 0 || pos0 < 0 || B < 1 || kvh < 0 ||
	    kvh >= kv->n_kv_heads)
		return -EINVAL;
	kvk_flash_tile_fn tile = kvk_flash_tile_get(isa);
	size_t kb = kvbuf_floats(hd), rows = (size_t)KVK_FLASH_QT * (size_t)G;
	rows = (rows + 15) & ~(size_t)15;
	struct kvk_flash_args a = {0};
	a.ldq = ldq;
	a.ldo = ldo;
	a.G = G;
	a.hd = hd;
	a.ks = (size_t)kv->n_kv_heads * (size_t)hd;
	a.scale = scale;
	a.kf = scratch;
	a.vf = scratch + kb;
	a.sc = scratch + 2 * kb;
	a.m = a.sc + 4 * KVK_FLASH_KT;
	a.l = a.m + rows;
	int lim[KVK_FLASH_QT];
	a.lim = lim;
	for (int t0 = 0; t0 < nt; t0 += KVK_FLASH_QT) {
		int n = nt - t0 < KVK_FLASH_QT ? nt - t0 : KVK_FLASH_QT;
		int last = pos0 + t0 + n - 1; /* the tile's last position: the keys it needs */
		a.q = q + (size_t)t0 * ldq;
		a.o = o + (size_t)t0 * ldo;
		a.nt = n;
		for (int r = 0; r < n * G; r++) {
			a.m[r] = -INFINITY;
			a.l[r] = 0;
		}
		for (int i = 0; i < n; i++)
			memset(a.o + (size_t)i * ldo, 0, (size_t)G * hd * sizeof(float));
		/* key tiles start at absolute positions: multiples of KT and block starts (a row's
		 * tiles are the same whatever tile of queries it is in; ending the last one at
		 * `last` only drops keys no row of this query tile sees) */
		for (int p0 = 0; p0 <= last;) {
			int pe = (p0 / KVK_FLASH_KT + 1) * KVK_FLASH_KT, be = (p0 / B + 1) * B;
			pe = pe < be ? pe : be;
			pe = pe < last + 1 ? pe : last + 1;
			size_t off = (size_t)table[p0 / B] * kv->block_stride +
				     ((size_t)(p0 % B) * kv->n_kv_heads + kvh) * hd;
			a.k = kv->k + off;
			a.v = kv->v + off;
			a.np = pe - p0;
			for (int i = 0; i < n; i++) {
				int v = pos0 + t0 + i + 1 - p0;
				lim[i] = v < 0 ? 0 : v > a.np ? a.np : v;
			}
			tile(&a);
			p0 = pe;
		}
		for (int r = 0; r < n * G; r++) {
			float inv = 1.0f / a.l[r];
			float *orow = a.o + (size_t)(r / G) * ldo + (size_t)(r % G) * hd;
			for (int d = 0; d < hd; d++)
				orow[d] *= inv;
		}
	}
	return 0;
}
