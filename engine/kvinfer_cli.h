/* Shared helpers of the kvinfer subcommands (kvinfer_main.c, kvinfer_bench.c). Private to the
 * kvinfer binary. */
#ifndef KVFS_KVINFER_CLI_H
#define KVFS_KVINFER_CLI_H

#include <stddef.h>

/* Monotonic seconds. */
double kvinfer_now(void);
/* Online CPUs (>= 1). */
int kvinfer_default_threads(void);
/* Rewrites short flags in place: map = {"-m", "--model", ..., NULL}. */
void kvinfer_short_flags(int argc, char **argv, const char *const *map);
/* Removes `name VALUE` from argv (argc updated) and returns VALUE, or NULL if absent. */
char *kvinfer_take_flag(int *argc, char **argv, const char *name);
/* 0 or -EINVAL. */
int kvinfer_parse_float(const char *s, float *out);
/* enum kvk_isa for "auto", "avx2", "scalar"; -EINVAL otherwise. */
int kvinfer_parse_isa(const char *s);

int kvinfer_cmd_bench(int argc, char **argv);

#endif
