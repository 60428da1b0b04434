/* CPU reference kernels of kvk_ops.h: written to be read and trusted, not to be fast. */
#include "kvk_ops.h"
#include "kvk_quant_impl.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Private conversions so this file depends on nothing else in kernels/ (kvk.h has the engine's
 * own; both are exact on every half). */
float kvk_ops_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu;
	uint32_t bits;
	if (exp == 0x1f) {
		bits = sign | 0x7f800000u | (man << 13);
	} else if (exp != 0) {
		bits = sign | ((exp + 112) << 23) | (man << 13);
	} else if (man == 0) {
		bits = sign;
	} else {
		float f = ldexpf((float)man, -24); /* subnormal: exact in f32 */
		return sign ? -f : f;
	}
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

uint16_t kvk_ops_f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
	uint32_t ax = x & 0x7fffffffu;
	if (ax > 0x7f800000u)
		return sign | 0x7e00u; /* NaN */
	if (ax >= 0x477ff000u)
		return sign | 0x7c00u; /* rounds to inf */
	if (ax < 0x38800000u) {
		/* Subnormal half (or zero): value / 2^-24 rounded to nearest even, done in f32
		 * where it is exact enough: rintf rounds half to even. */
		float a;
		memcpy(&a, &ax, 4);
		return sign | (uint16_t)rintf(a * 16777216.0f);
	}
	uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u); /* round to nearest even at bit 13 */
	return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

float kvk_ops_bf16_to_f32(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;
	memcpy(&f, &bits, 4);
	return f;
}

uint16_t kvk_ops_f32_to_bf16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	if ((x & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((x >> 16) | 0x40u);
	return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

size_t kvk_kv_payload_bytes(const struct kvk_kv_layers *kv)
{
	if (!kv || kv->n_layer < 1 || kv->block_tokens < 1 || kv->n_kv_heads < 1 ||
	    kv->head_dim < 1)
		return 0;
	return (size_t)kv->n_layer * 2 * kv->block_tokens * kv->n_kv_heads * kv->head_dim * 2;
}

static float elem_f32(const void *row, enum kvk_dtype dt, size_t i)
{
	switch (dt) {
	case KVK_DT_F32:
		return ((const float *)row)[i];
	case KVK_DT_F16:
		return kvk_ops_f16_to_f32(((const uint16_t *)row)[i]);
	case KVK_DT_BF16:
		return kvk_ops_bf16_to_f32(((const uint16_t *)row)[i]);
	case KVK_DT_Q8_0: {
		const uint8_t *blk = (const uint8_t *)row + (i / KVK_Q8_0_BLOCK) * KVK_Q8_0_BYTES;
		uint16_t d;
		memcpy(&d, blk, 2);
		return kvk_ops_f16_to_f32(d) * (float)(int8_t)blk[2 + i % KVK_Q8_0_BLOCK];
	}
	default:
		return kvk_kq_value((enum kvk_wtype)dt, row, i);
	}
}

static size_t row_bytes(enum kvk_dtype dt, size_t n)
{
	switch (dt) {
	case KVK_DT_F32:
		return n * 4;
	case KVK_DT_F16:
	case KVK_DT_BF16:
		return n * 2;
	case KVK_DT_Q8_0:
		return n % KVK_Q8_0_BLOCK ? 0 : n / KVK_Q8_0_BLOCK * KVK_Q8_0_BYTES;
	case KVK_DT_Q4_0:
	case KVK_DT_Q5_0:
	case KVK_DT_Q5_1:
	case KVK_DT_Q4_K:
	case KVK_DT_Q5_K:
	case KVK_DT_Q6_K:
		return kvk_kq_row_bytes((enum kvk_wtype)dt, n);
	}
	return 0;
}

int kvk_ref_embed(float *out, const void *table, enum kvk_dtype dt, size_t n_rows, size_t dim,
		  const int32_t *ids, size_t n_tok)
{
	size_t rb = row_bytes(dt, dim);
	if (!rb || dim == 0)
		return -EINVAL;
	for (size_t t = 0; t < n_tok; t++) {
		float *o = out + t * dim;
		if (ids[t] < 0 || (size_t)ids[t] >= n_rows) {
			memset(o, 0, dim * sizeof(float));
			continue;
		}
		const void *row = (const uint8_t *)table + (size_t)ids[t] * rb;
		for (size_t i = 0; i < dim; i++)
			o[i] = elem_f32(row, dt, i);
	}
	return 0;
}

int kvk_ref_rope(float *x, size_t n_tok, size_t n_heads, size_t head_dim, size_t rope_dim,
		 const int32_t *pos, float base, int style)
{
	if (rope_dim < 2 || rope_dim % 2 || rope_dim > head_dim || (style != 0 && style != 1) ||
	    !(base > 0))
		return -EINVAL;
	size_t half = rope_dim / 2;
	for (size_t t = 0; t < n_tok; t++) {
		for (size_t h = 0; h < n_heads; h++) {
			float *v = x + (t * n_heads + h) * head_dim;
			for (size_t i = 0; i < half; i++) {
				float theta = (float)pow((double)base, -2.0 * (double)i / rope_dim);
				float ang = (float)pos[t] * theta;
				float c = cosf(ang), s = sinf(ang);
				size_t a = style == 0 ? 2 * i : i,
				       b = style == 0 ? 2 * i + 1 : i + half;
				float va = v[a], vb = v[b];
				v[a] = va * c - vb * s;
				v[b] = va * s + vb * c;
			}
		}
	}
	return 0;
}

int kvk_ref_swiglu(float *out, const float *gate, const float *up, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		float g = gate[i];
		out[i] = g / (1.0f + expf(-g)) * up[i];
	}
	return 0;
}

static int pages_ok(const struct kvk_kv_pages *kv, int n_heads)
{
	return kv && kv->k && kv->v && kv->num_blocks >= 1 && kv->block_tokens >= 1 &&
	       kv->n_kv_heads >= 1 && kv->head_dim >= 2 && kv->head_dim <= 256 &&
	       kv->head_dim % 2 == 0 &&
	       kv->block_stride >= (size_t)kv->block_tokens * kv->n_kv_heads * kv->head_dim &&
	       n_heads >= 1 && n_heads % kv->n_kv_heads == 0;
}

/* One query row against keys 0 .. n_keys-1 of one sequence: plain two-pass softmax. Returns
 * -EINVAL when the table names a block outside the pool. */
static int attend_row(float *o, const float *q, const struct kvk_kv_pages *kv, const int32_t *table,
		      int n_keys, int kvh, float scale, float *scores)
{
	int hd = kv->head_dim, B = kv->block_tokens;
	float mx = -INFINITY;
	for (int t = 0; t < n_keys; t++) {
		int32_t b = table[t / B];
		if (b < 0 || b >= kv->num_blocks)
			return -EINVAL;
		const uint16_t *k = kv->k + (size_t)b * kv->block_stride +
				    ((size_t)(t % B) * kv->n_kv_heads + kvh) * hd;
		float s = 0.f;
		for (int d = 0; d < hd; d++)
			s += q[d] * kvk_ops_f16_to_f32(k[d]);
		scores[t] = s * scale;
		if (scores[t] > mx)
			mx = scores[t];
	}
	float sum = 0.f;
	for (int t = 0; t < n_keys; t++) {
		scores[t] = expf(scores[t] - mx);
		sum += scores[t];
	}
	for (int d = 0; d < hd; d++)
		o[d] = 0.f;
	for (int t = 0; t < n_keys; t++) {
		const uint16_t *v = kv->v + (size_t)table[t / B] * kv->block_stride +
				    ((size_t)(t % B) * kv->n_kv_heads + kvh) * hd;
		float p = scores[t] / sum;
		for (int d = 0; d < hd; d++)
			o[d] += p * kvk_ops_f16_to_f32(v[d]);
	}
	return 0;
}

int kvk_ref_attn_prefill(float *out, const float *q, const struct kvk_kv_pages *kv,
			 const int32_t *table, int n_q, int q_start, int n_heads, float scale)
{
	if (!pages_ok(kv, n_heads) || n_q < 0 || q_start < 0 || q_start > INT32_MAX - n_q)
		return -EINVAL;
	float *scores = malloc(((size_t)q_start + n_q + 1) * sizeof(float));
	if (!scores)
		return -ENOMEM;
	int hd = kv->head_dim, group = n_heads / kv->n_kv_heads, rc = 0;
	for (int i = 0; i < n_q && !rc; i++)
		for (int h = 0; h < n_heads && !rc; h++) {
			size_t off = ((size_t)i * n_heads + h) * hd;
			rc = attend_row(out + off, q + off, kv, table, q_start + i + 1, h / group,
					scale, scores);
		}
	free(scores);
	return rc;
}

int kvk_ref_attn_decode(float *out, const float *q, const struct kvk_kv_pages *kv,
			const int32_t *tables, int max_blocks, const int32_t *seq_lens, int n_seqs,
			int n_heads, float scale)
{
	if (!pages_ok(kv, n_heads) || max_blocks < 1 || n_seqs < 0 ||
	    (size_t)max_blocks * kv->block_tokens > INT32_MAX)
		return -EINVAL;
	float *scores = malloc((size_t)max_blocks * kv->block_tokens * sizeof(float));
	if (!scores)
		return -ENOMEM;
	int hd = kv->head_dim, group = n_heads / kv->n_kv_heads, rc = 0;
	for (int s = 0; s < n_seqs && !rc; s++) {
		int len = seq_lens[s];
		if (len > max_blocks * kv->block_tokens)
			rc = -EINVAL;
		for (int h = 0; h < n_heads && !rc; h++) {
			size_t off = ((size_t)s * n_heads + h) * hd;
			if (len <= 0)
				memset(out + off, 0, (size_t)hd * sizeof(float));
			else
				rc = attend_row(out + off, q + off, kv,
						tables + (size_t)s * max_blocks, len, h / group,
						scale, scores);
		}
	}
	free(scores);
	return rc;
}

int kvk_ref_gemm(float *c, const void *a, const void *b, enum kvk_dtype dt, int m, int n, int k)
{
	if ((dt != KVK_DT_F16 && dt != KVK_DT_BF16 && dt != KVK_DT_F32) || m < 0 || n < 0 || k < 1)
		return -EINVAL;
	if (dt == KVK_DT_F32) {
		const float *A = a, *B = b;
		for (int i = 0; i < m; i++)
			for (int j = 0; j < n; j++) {
				float s = 0.f;
				for (int p = 0; p < k; p++)
					s += A[(size_t)i * k + p] * B[(size_t)j * k + p];
				c[(size_t)i * n + j] = s;
			}
		return 0;
	}
	const uint16_t *A = a, *B = b;
	float (*cvt)(uint16_t) = dt == KVK_DT_F16 ? kvk_ops_f16_to_f32 : kvk_ops_bf16_to_f32;
	for (int i = 0; i < m; i++)
		for (int j = 0; j < n; j++) {
			float s = 0.f;
			for (int p = 0; p < k; p++)
				s += cvt(A[(size_t)i * k + p]) * cvt(B[(size_t)j * k + p]);
			c[(size_t)i * n + j] = s;
		}
	return 0;
}

int kvk_ref_kq_gemv(float *y, const void *w, enum kvk_dtype dt, const float *x, int rows, int n,
		    int n_tok)
{
	enum kvk_wtype wt = (enum kvk_wtype)dt;
	size_t rb =
	    rows < 0 || n < 1 || n_tok < 0 || !kvk_wtype_kq(wt) ? 0 : row_bytes(dt, (size_t)n);
	if (!rb)
		return -EINVAL;
	float *v = malloc((size_t)n * sizeof(float));
	if (!v)
		return -ENOMEM;
	for (int r = 0; r < rows; r++) {
		kvk_kq_row_to_f32(wt, (const uint8_t *)w + (size_t)r * rb, (size_t)n, v);
		for (int t = 0; t < n_tok; t++) {
			const float *xt = x + (size_t)t * n;
			float acc = 0.f;
			for (int b = 0; b < n / 32; b++) {
				float s = 0.f;
				for (int i = 0; i < 32; i++)
					s += v[32 * b + i] * xt[32 * b + i];
				acc += s;
			}
			y[(size_t)t * rows + r] = acc;
		}
	}
	free(v);
	return 0;
}

int kvk_ref_q8_0_gemv(float *y, const void *w, const float *x, int rows, int n, int n_tok)
{
	if (rows < 0 || n < KVK_Q8_0_BLOCK || n % KVK_Q8_0_BLOCK || n_tok < 0)
		return -EINVAL;
	int nb = n / KVK_Q8_0_BLOCK;
	for (int t = 0; t < n_tok; t++)
		for (int r = 0; r < rows; r++) {
			const uint8_t *row = (const uint8_t *)w + (size_t)r * nb * KVK_Q8_0_BYTES;
			const float *xt = x + (size_t)t * n;
			float acc = 0.f;
			for (int bi = 0; bi < nb; bi++) {
				const uint8_t *blk = row + (size_t)bi * KVK_Q8_0_BYTES;
				uint16_t d;
				memcpy(&d, blk, 2);
				float s = 0.f;
				for (int i = 0; i < KVK_Q8_0_BLOCK; i++)
					s +=
					    (float)(int8_t)blk[2 + i] * xt[bi * KVK_Q8_0_BLOCK + i];
				acc += s * kvk_ops_f16_to_f32(d);
			}
			y[(size_t)t * rows + r] = acc;
		}
	return 0;
}

/* The sampling order: a before b when a's logit is larger, or equal with a lower index. */
static int ranks_before(float va, int ia, float vb, int ib)
{
	if (isnan(va))
		va = -INFINITY;
	if (isnan(vb))
		vb = -INFINITY;
	return va > vb || (va == vb && ia < ib);
}

int kvk_ref_argmax(int32_t *out, const float *logits, int n_rows, int vocab)
{
	if (n_rows < 0 || vocab < 1)
		return -EINVAL;
	for (int r = 0; r < n_rows; r++) {
		const float *l = logits + (size_t)r * vocab;
		int best = 0;
		for (int i = 1; i < vocab; i++)
			if (ranks_before(l[i], i, l[best], best))
				best = i;
		out[r] = best;
	}
	return 0;
}

int kvk_ref_sample_topk(int32_t *out, const float *logits, int n_rows, int vocab, int k,
			float temperature, const float *u)
{
	if (n_rows < 0 || vocab < 1 || k < 1 || k > KVK_TOPK_MAX || k > vocab)
		return -EINVAL;
	for (int r = 0; r < n_rows; r++) {
		const float *l = logits + (size_t)r * vocab;
		int idx[KVK_TOPK_MAX];
		int n = 0;
		/* Insertion into a sorted list of at most k. */
		for (int i = 0; i < vocab; i++) {
			if (n == k && !ranks_before(l[i], i, l[idx[k - 1]], idx[k - 1]))
				continue;
			int j = n < k ? n++ : k - 1;
			while (j > 0 && ranks_before(l[i], i, l[idx[j - 1]], idx[j - 1])) {
				idx[j] = idx[j - 1];
				j--;
			}
			idx[j] = i;
		}
		if (k == 1 || !(temperature > 0)) {
			out[r] = idx[0];
			continue;
		}
		float p[KVK_TOPK_MAX], sum = 0.f;
		float top = isnan(l[idx[0]]) ? -INFINITY : l[idx[0]];
		for (int i = 0; i < k; i++) {
			float v = isnan(l[idx[i]]) ? -INFINITY : l[idx[i]];
			/* v == top also covers infinite tops (inf - inf is NaN): a fully masked
			 * row samples uniformly over its top k, +inf logits share the mass. */
			p[i] = v == top ? 1.f : expf((v - top) / temperature);
			sum += p[i];
		}
		float target = u[r] * sum, run = 0.f;
		int pick = idx[k - 1];
		for (int i = 0; i < k; i++) {
			run += p[i];
			if (run > target) {
				pick = idx[i];
				break;
			}
		}
		out[r] = pick;
	}
	return 0;
}

static int layers_ok(const struct kvk_kv_layers *kv, const int32_t *blocks, int n_blocks)
{
	if (!kvk_kv_payload_bytes(kv) || n_blocks < 0 || !kv->k || !kv->v || kv->num_blocks < 1 ||
	    kv->block_stride < (size_t)kv->block_tokens * kv->n_kv_heads * kv->head_dim)
		return 0;
	for (int i = 0; i < n_blocks; i++)
		if (blocks[i] < 0 || blocks[i] >= kv->num_blocks)
			return 0;
	return 1;
}

int kvk_ref_kv_pack(void *dst, const struct kvk_kv_layers *kv, const int32_t *blocks, int n_blocks)
{
	if (!layers_ok(kv, blocks, n_blocks))
		return -EINVAL;
	size_t slab = (size_t)kv->block_tokens * kv->n_kv_heads * kv->head_dim; /* halves */
	uint16_t *o = dst;
	for (int i = 0; i < n_blocks; i++)
		for (int l = 0; l < kv->n_layer; l++)
			for (int s = 0; s < 2; s++) {
				const uint16_t *src = (s ? kv->v[l] : kv->k[l]) +
						      (size_t)blocks[i] * kv->block_stride;
				memcpy(o, src, slab * 2);
				o += slab;
			}
	return 0;
}

int kvk_ref_kv_unpack(const struct kvk_kv_layers *kv, const void *src, const int32_t *blocks,
		      int n_blocks)
{
	if (!layers_ok(kv, blocks, n_blocks))
		return -EINVAL;
	size_t slab = (size_t)kv->block_tokens * kv->n_kv_heads * kv->head_dim;
	const uint16_t *in = src;
	for (int i = 0; i < n_blocks; i++)
		for (int l = 0; l < kv->n_layer; l++)
			for (int s = 0; s < 2; s++) {
				uint16_t *d = (s ? kv->v[l] : kv->k[l]) +
					      (size_t)blocks[i] * kv->block_stride;
				memcpy(d, in, slab * 2);
				in += slab;
			}
	return 0;
}

int kvk_ref_add(float *y, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		y[i] += x[i];
	return 0;
}

int kvk_ref_add_bias(float *y, const float *b, size_t n, size_t nrows)
{
	for (size_t r = 0; r < nrows; r++)
		for (size_t i = 0; i < n; i++)
			y[r * n + i] += b[i];
	return 0;
}

int kvk_ref_kv_store(const struct kvk_kv_layers *kv, int layer, const float *k, const float *v,
		     const int32_t *slots, int n_tok)
{
	if (!layers_ok(kv, NULL, 0) || layer < 0 || layer >= kv->n_layer || n_tok < 0)
		return -EINVAL;
	long total = (long)kv->num_blocks * kv->block_tokens;
	for (int t = 0; t < n_tok; t++)
		if (slots[t] < 0 || slots[t] >= total)
			return -EINVAL;
	size_t row = (size_t)kv->n_kv_heads * kv->head_dim;
	for (int t = 0; t < n_tok; t++) {
		size_t off = (size_t)(slots[t] / kv->block_tokens) * kv->block_stride +
			     (size_t)(slots[t] % kv->block_tokens) * row;
		uint16_t *kd = kv->k[layer] + off, *vd = kv->v[layer] + off;
		for (size_t i = 0; i < row; i++) {
			kd[i] = kvk_ops_f32_to_f16(k[(size_t)t * row + i]);
			vd[i] = kvk_ops_f32_to_f16(v[(size_t)t * row + i]);
		}
	}
	return 0;
}

/* ---- vision tower ------------------------------------------------------------------------ */

int kvk_ref_layernorm(float *out, const float *x, const float *w, const float *b, size_t n,
		      size_t nrows, float eps)
{
	if (!n || !w)
		return -EINVAL;
	for (size_t r = 0; r < nrows; r++) {
		const float *xr = x + r * n;
		float *o = out + r * n;
		float mean = 0, var = 0;
		for (size_t i = 0; i < n; i++)
			mean += xr[i];
		mean /= (float)n;
		for (size_t i = 0; i < n; i++)
			var += (xr[i] - mean) * (xr[i] - mean);
		float rs = 1.0f / sqrtf(var / (float)n + eps);
		for (size_t i = 0; i < n; i++)
			o[i] = (xr[i] - mean) * rs * w[i] + (b ? b[i] : 0.0f);
	}
	return 0;
}

int kvk_ref_gelu(float *y, const float *x, size_t n, int quick)
{
	for (size_t i = 0; i < n; i++) {
		float v = x[i];
		y[i] = quick
			   ? v / (1.0f + expf(-1.702f * v))
			   : 0.5f * v *
				 (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
	}
	return 0;
}

int kvk_ref_attn_dense(float *out, const float *q, const float *k, const float *v, int n_tok,
		       int n_heads, int head_dim, float scale)
{
	if (n_tok < 0 || n_heads < 1 || head_dim < 1 || head_dim > 256)
		return -EINVAL;
	if (!n_tok)
		return 0;
	float *s = malloc((size_t)n_tok * sizeof(float));
	if (!s)
		return -ENOMEM;
	size_t row = (size_t)n_heads * head_dim;
	for (int h = 0; h < n_heads; h++)
		for (int t = 0; t < n_tok; t++) {
			const float *qr = q + (size_t)t * row + (size_t)h * head_dim;
			float mx = -INFINITY, sum = 0;
			for (int j = 0; j < n_tok; j++) {
				const float *kr = k + (size_t)j * row + (size_t)h * head_dim;
				float d = 0;
				for (int c = 0; c < head_dim; c++)
					d += qr[c] * kr[c];
				s[j] = d * scale;
				mx = s[j] > mx ? s[j] : mx;
			}
			for (int j = 0; j < n_tok; j++)
				sum += (s[j] = expf(s[j] - mx));
			float *o = out + (size_t)t * row + (size_t)h * head_dim;
			for (int c = 0; c < head_dim; c++)
				o[c] = 0;
			for (int j = 0; j < n_tok; j++) {
				const float *vr = v + (size_t)j * row + (size_t)h * head_dim;
				for (int c = 0; c < head_dim; c++)
					o[c] += s[j] * vr[c];
			}
			for (int c = 0; c < head_dim; c++)
				o[c] /= sum;
		}
	free(s);
	return 0;
}
