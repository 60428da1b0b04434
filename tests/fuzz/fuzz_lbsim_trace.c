/* libFuzzer: lb-sim's trace file reader (tools/lbsim) on arbitrary bytes, and a simulation of
 * whatever parsed (a few requests: every one must finish). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "lbsim.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	FILE *f = fmemopen((void *)data, size, "r");
	if (!f)
		return 0;
	FILE *devnull = fopen("/dev/null", "w");
	FILE *err = stderr;
	stderr = devnull ? devnull : stderr; /* the reader names bad lines */
	struct lbsim_trace t;
	int rc = lbsim_trace_read(f, &t);
	stderr = err;
	if (devnull)
		fclose(devnull);
	fclose(f);
	if (rc)
		return 0;
	long out = 0;
	for (size_t i = 0; i < t.n; i++)
		out += t.r[i].otok;
	if (t.n && t.n <= 64 && out <= 100000) { /* decode steps: one per output token */
		struct lbsim_cfg c;
		lbsim_cfg_defaults(&c);
		c.prefill = c.decode = 2;
		c.local_blocks = 64;
		struct lbsim_report r;
		if (lbsim_run(&c, &t, &r))
			abort(); /* a parsed trace always simulates to the end */
	}
	lbsim_trace_free(&t);
	return 0;
}
