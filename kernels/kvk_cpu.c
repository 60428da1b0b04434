#include "kvk.h"

#include <math.h>

void kvk_rmsnorm_f32(float *out, const float *x, const float *w, size_t n, size_t nrows, float eps)
{
	for (size_t r = 0; r < nrows; r++) {
		const float *xr = x + r * n;
		float *o = out + r * n;
		/* Accumulate in double: the reference is the accurate side of comparisons. */
		double ss = 0;
		for (size_t i = 0; i < n; i++)
			ss += (double)xr[i] * xr[i];
		float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
		for (size_t i = 0; i < n; i++)
			o[i] = xr[i] * scale * w[i];
	}
}
