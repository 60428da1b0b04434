/* Shared helpers of the kvinfer subcommands (kvinfer_main.c, kvinfer_bench.c). Private to the
 * kvinfer binary. */
#ifndef KVFS_KVINFER_CLI_H
#define KVFS_KVINFER_CLI_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

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
/* enum kvk_isa for "auto", "avx512", "avx2", "scalar"; -EINVAL otherwise. */
int kvinfer_parse_isa(const char *s);
/* cfg_opt entries (cfg.h) of a kvw worker's server (wk.c, wk_enc.c): its listen address,
 * port file and secret; and of its /metrics. OFF(field): the offset of a field of the
 * command's config struct, whose fields listen, port_file, secret_file, metrics_listen and
 * metrics_addr_file are char[CFG_STR_MAX]. */
#define KVINFER_OPTS_KVW(OFF)                                                                      \
	{"listen", CFG_STR, OFF(listen), 0, 0, "127.0.0.1:0", "host:port to serve kvw on"},        \
	    {"port-file", CFG_STR, OFF(port_file), 0, 0, NULL, "write the bound port here"},       \
	{                                                                                          \
		"secret-file", CFG_STR, OFF(secret_file), 0, 0, NULL,                              \
		    "shared secret (16..64 bytes)"                                                 \
	}
#define KVINFER_OPTS_METRICS(OFF)                                                                  \
	{"metrics-listen",                                                                         \
	 CFG_STR,                                                                                  \
	 OFF(metrics_listen),                                                                      \
	 0,                                                                                        \
	 0,                                                                                        \
	 NULL,                                                                                     \
	 "host:port to serve GET /metrics on (Prometheus); empty = off"},                          \
	{                                                                                          \
		"metrics-addr-file", CFG_STR, OFF(metrics_addr_file), 0, 0, NULL,                  \
		    "write the metrics HOST:PORT here"                                             \
	}

/* A daemon's signals, before it starts any thread: blocks SIGINT and SIGTERM, and SIGHUP too
 * when hup (the API keys' reload), into *sigs for its sigwait; ignores SIGPIPE. */
void kvinfer_block_signals(sigset_t *sigs, int hup);
/* --port-file: writes port and a newline to path, unless path is empty. A file that cannot be
 * written is passed over (whoever waits for it times out). */
void kvinfer_port_file(const char *path, unsigned port);

int kvinfer_cmd_bench(int argc, char **argv);

/* ---- --device cpu|cuda[:N]|host: one engine of either kind (kvinfer_eng.c) ---------------- */

struct kvi_model;
struct kvi_engine_opts;
struct kvi_kv;
struct kvi_seq;

struct kvinfer_eng {
	struct kvi_engine *cpu;	    /* --device cpu: the CPU engine (fwd.h) */
	struct kvi_dev_engine *dev; /* cuda / host: the device engine (fwd_dev.h) */
	char name[64];		    /* "cpu (avx2)", "cuda:0", "host" */
};

/* The --device flag's help line. */
#define KVINFER_DEVICE_HELP                                                                        \
	"cpu (default), cuda or cuda:N (GPU N), host (the device engine on the CPU references: "   \
	"slow, for checks)"

/* "cpu" (or empty) -> 0, "host" -> KVK_DEV_HOST, "cuda" / "cuda:N" -> KVK_DEV_CUDA with
 * *gpu = N (enum kvk_dev_kind); -EINVAL for anything else. */
int kvinfer_eng_parse(const char *device, int *gpu);
/* Checks --device before anything is loaded: 0, or prints why and returns -EINVAL (not a
 * device name) or -ENODEV (cuda: no such GPU, or no CUDA in this build). */
int kvinfer_eng_check(const char *device, const char *who);
/* Creates the engine `device` names. On failure prints why on stderr (prefixed by who) and
 * returns a negative errno: -EINVAL (bad --device or model), -ENODEV (cuda without a GPU). */
int kvinfer_eng_create(const struct kvi_model *m, const struct kvi_engine_opts *o,
		       const char *device, const char *who, struct kvinfer_eng *out);
void kvinfer_eng_destroy(struct kvinfer_eng *e);
struct kvi_kv *kvinfer_eng_kv(struct kvinfer_eng *e);
int kvinfer_eng_prefill(struct kvinfer_eng *e, struct kvi_seq *seq, const int32_t *tokens, int n,
			float *logits_last);
struct kvi_inject;
/* With image embeddings at their placeholder positions (fwd.h, kvi_engine_prefill_inject). */
int kvinfer_eng_prefill_inject(struct kvinfer_eng *e, struct kvi_seq *seq, const int32_t *tokens,
			       int n, const struct kvi_inject *inject, int ninject,
			       float *logits_last);
int kvinfer_eng_decode(struct kvinfer_eng *e, struct kvi_seq *const *seqs, const int32_t *tokens,
		       int nseq, float *logits);

#endif
