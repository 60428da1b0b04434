/* Shared helpers of the kvinfer subcommands (kvinfer_cli.h). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kvinfer_cli.h"
#include "kvk.h"

double kvinfer_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int kvinfer_default_threads(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

void kvinfer_short_flags(int argc, char **argv, const char *const *map)
{
	for (int i = 1; i < argc; i++)
		for (int k = 0; map[k]; k += 2)
			if (!strcmp(argv[i], map[k]))
				argv[i] = (char *)map[k + 1];
}

char *kvinfer_take_flag(int *argc, char **argv, const char *name)
{
	for (int i = 1; i + 1 < *argc; i++)
		if (!strcmp(argv[i], name)) {
			char *v = argv[i + 1];
			memmove(&argv[i], &argv[i + 2], (size_t)(*argc - i - 2) * sizeof(char *));
			*argc -= 2;
			argv[*argc] = NULL;
			return v;
		}
	return NULL;
}

int kvinfer_parse_float(const char *s, float *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end)
		return -EINVAL;
	*out = (float)v;
	return 0;
}

int kvinfer_parse_isa(const char *s)
{
	if (!*s || !strcmp(s, "auto"))
		return KVK_ISA_AUTO;
	if (!strcmp(s, "scalar"))
		return KVK_ISA_SCALAR;
	if (!strcmp(s, "avx2"))
		return KVK_ISA_AVX2;
	if (!strcmp(s, "avx512"))
		return KVK_ISA_AVX512;
	return -EINVAL;
}

void kvinfer_block_signals(sigset_t *sigs, int hup)
{
	sigemptyset(sigs);
	sigaddset(sigs, SIGINT);
	sigaddset(sigs, SIGTERM);
	if (hup)
		sigaddset(sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
}

void kvinfer_port_file(const char *path, unsigned port)
{
	if (!path[0])
		return;
	FILE *f = fopen(path, "w");
	if (f) {
		fprintf(f, "%u\n", port);
		fclose(f);
	}
}
