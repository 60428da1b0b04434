/* --device for the kvinfer subcommands: the CPU engine (fwd.h) or the device engine (fwd_dev.h)
 * behind one small interface (kvinfer_cli.h). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fwd.h"
#include "fwd_dev.h"
#include "kvinfer_cli.h"
#include "kvk.h"
#include "kvk_cuda.h"
#include "kvk_dev.h"

int kvinfer_eng_parse(const char *s, int *gpu)
{
	*gpu = 0;
	if (!s || !*s || !strcmp(s, "cpu"))
		return 0;
	if (!strcmp(s, "host"))
		return KVK_DEV_HOST;
	if (!strncmp(s, "cuda", 4)) {
		if (!s[4])
			return KVK_DEV_CUDA;
		char *end;
		long n = s[4] == ':' ? strtol(s + 5, &end, 10) : -1;
		if (n >= 0 && n < 1024 && s[5] && !*end) {
			*gpu = (int)n;
			return KVK_DEV_CUDA;
		}
	}
	return -EINVAL;
}

int kvinfer_eng_check(const char *device, const char *who)
{
	int gpu, kind = kvinfer_eng_parse(device, &gpu);
	if (kind < 0) {
		fprintf(stderr, "%s: --device %s: want cpu, cuda, cuda:N or host\n", who, device);
		return -EINVAL;
	}
	if (kind == KVK_DEV_CUDA && kvk_cuda_device_count() <= gpu) {
		int n = kvk_cuda_device_count();
		if (n == 0)
			fprintf(stderr,
				"%s: --device %s: no GPU found (or this build has no CUDA)\n", who,
				device);
		else
			fprintf(stderr, "%s: --device %s: only %d GPU%s\n", who, device, n,
				n == 1 ? "" : "s");
		return -ENODEV;
	}
	return 0;
}

int kvinfer_eng_create(const struct kvi_model *m, const struct kvi_engine_opts *o,
		       const char *device, const char *who, struct kvinfer_eng *out)
{
	memset(out, 0, sizeof(*out));
	int gpu, kind = kvinfer_eng_parse(device, &gpu), rc;
	if ((rc = kvinfer_eng_check(device, who)))
		return rc;
	if (kind == 0) {
		rc = kvi_engine_create(m, o, &out->cpu);
		if (rc)
			fprintf(stderr, "%s: engine: %s\n", who, strerror(-rc));
		else
			snprintf(out->name, sizeof(out->name), "cpu (%s)",
				 kvi_engine_isa(out->cpu));
		return rc;
	}
	rc = kvi_dev_engine_create(m, o, kind, gpu, &out->dev);
	if (rc) {
		fprintf(stderr, "%s: device engine (%s): %s\n", who, device, strerror(-rc));
		return rc;
	}
	if (kind == KVK_DEV_CUDA)
		snprintf(out->name, sizeof(out->name), "cuda:%d", gpu);
	else
		snprintf(out->name, sizeof(out->name), "host");
	return 0;
}

void kvinfer_eng_destroy(struct kvinfer_eng *e)
{
	kvi_engine_destroy(e->cpu);
	kvi_dev_engine_destroy(e->dev);
	e->cpu = NULL;
	e->dev = NULL;
}

struct kvi_kv *kvinfer_eng_kv(struct kvinfer_eng *e)
{
	return e->dev ? kvi_dev_engine_kv(e->dev) : kvi_engine_kv(e->cpu);
}

int kvinfer_eng_prefill(struct kvinfer_eng *e, struct kvi_seq *seq, const int32_t *tokens, int n,
			float *logits_last)
{
	return e->dev ? kvi_dev_engine_prefill(e->dev, seq, tokens, n, logits_last)
		      : kvi_engine_prefill(e->cpu, seq, tokens, n, logits_last);
}

int kvinfer_eng_prefill_inject(struct kvinfer_eng *e, struct kvi_seq *seq, const int32_t *tokens,
			       int n, const struct kvi_inject *inject, int ninject,
			       float *logits_last)
{
	return e->dev ? kvi_dev_engine_prefill_inject(e->dev, seq, tokens, n, inject, ninject,
						      logits_last)
		      : kvi_engine_prefill_inject(e->cpu, seq, tokens, n, inject, ninject,
						  logits_last);
}

int kvinfer_eng_decode(struct kvinfer_eng *e, struct kvi_seq *const *seqs, const int32_t *tokens,
		       int nseq, float *logits)
{
	return e->dev ? kvi_dev_engine_decode(e->dev, seqs, tokens, nseq, logits)
		      : kvi_engine_decode(e->cpu, seqs, tokens, nseq, logits);
}
