/* lbsim — a discrete-event simulation of the disaggregated gateway at scale: the gateway's own
 * placement code (engine/serve/lbp.h, linked unchanged) decides, simulated prefill and decode
 * replicas serve. docs/balancing.md describes the model, the trace and the reports.
 *
 * Model, per request: the balancer picks a prefill replica from what it knows (the replicas'
 * reported loads, refreshed every status_ms as the gateway's health poll does, plus its own
 * in-flight counts); the replica queues it FIFO and computes the prompt tokens that are neither
 * in its local cache (an LRU of blocks) nor in the shared kvfs cache, and loads the kvfs ones
 * at kvfs_tps. Then the balancer picks a decode replica; it admits the request once its KV
 * fits and steps its whole batch at step_base_ms + step_seq_ms x batch per token.
 *
 * Ownership: lbsim_trace owns its arrays (lbsim_trace_free). Errors: 0 or a negative errno. */
#ifndef KVFS_LBSIM_H
#define KVFS_LBSIM_H

#include <stdint.h>
#include <stdio.h>

#include "lbp.h"

struct lbsim_req {
	double t;	/* arrival, seconds */
	int ptok, otok; /* prompt and output tokens */
	uint64_t key;	/* hash of the whole prompt (policy cache) */
	uint32_t blk;	/* its full blocks' chained hashes: trace->blocks[blk .. blk + nblk) */
	int nblk;
};

struct lbsim_trace {
	struct lbsim_req *r;
	size_t n, cap;
	uint64_t *blocks;
	size_t nblocks, bcap;
};

/* The generator's knobs (docs/balancing.md "Trace"); lbsim_gen_defaults fills them. */
struct lbsim_gen {
	uint64_t seed;
	size_t requests;
	double rate;	   /* mean arrivals per second */
	double burst;	   /* rate in a burst / rate in a calm spell (1 = none); mean stays rate */
	double burst_s;	   /* mean length of a burst and of a calm spell, seconds */
	int systems, docs; /* distinct system prompts, documents */
	double zipf;	   /* exponent of their popularity */
	double p_doc, p_chat; /* shares of document questions and chat turns (rest: single) */
	int chats;	      /* conversations open at once */
	int max_turns;
	int out_median, out_max; /* output tokens: log-normal */
};

void lbsim_gen_defaults(struct lbsim_gen *g);
int lbsim_generate(const struct lbsim_gen *g, struct lbsim_trace *t);
/* Trace file, one request a line: "t_ms prompt_tokens output_tokens key hash,hash,...", key
 * and hashes in hex ('-' for none); '#' starts a comment; token counts 1..2^24, at most
 * prompt_tokens / 64 hashes. Errors name the line on stderr. */
int lbsim_trace_read(FILE *f, struct lbsim_trace *t);
int lbsim_trace_write(FILE *f, const struct lbsim_trace *t);
void lbsim_trace_free(struct lbsim_trace *t);
/* Appends one request (hashes copied). */
int lbsim_trace_add(struct lbsim_trace *t, double t_s, int ptok, int otok, uint64_t key,
		    const uint64_t *blk, int nblk);

struct lbsim_cfg {
	int prefill, decode; /* replicas per stage (each <= LBSIM_MAX) */
	enum lb_policy pf_policy, dc_policy;
	int oracle;	       /* 1: not the balancer but an ideal dispatcher (the bound) */
	double pf_tps;	       /* prompt tokens computed per second per prefill replica */
	double kvfs_tps;       /* tokens loaded per second from the shared kvfs cache */
	double pf_overhead_ms; /* per prefill request */
	int local_blocks;      /* each prefill replica's local cache, blocks */
	double status_ms;      /* how often the balancer's view of reported loads refreshes */
	double handoff_ms;     /* prefill -> decode hand-over */
	int kv_blocks;	       /* each decode replica's KV capacity, blocks */
	int max_batch;
	double step_base_ms, step_seq_ms;
	double window_s;	    /* balance is measured per window */
	const char *const *pf_addr; /* optional replica addresses (rendezvous identities) */
	FILE *series;		    /* optional: per-window loads, one line per window */
	FILE *decisions;	    /* optional: "request prefill decode" per request */
};

#define LBSIM_MAX 1024

void lbsim_cfg_defaults(struct lbsim_cfg *c);

struct lbsim_report {
	size_t requests;
	double makespan_s;
	double pf_balance, dc_balance; /* mean over windows of mean load / max load */
	double hit_local, hit_total;   /* shares of input tokens: local cache, local + kvfs */
	double hit_oracle;	       /* share of input tokens seen in any earlier request */
	double ttft_p50, ttft_p99;     /* seconds */
	double decode_tps;	       /* output tokens per second, all replicas */
	double itl_mean_ms;	       /* mean time between a request's tokens */
};

int lbsim_run(const struct lbsim_cfg *c, const struct lbsim_trace *t, struct lbsim_report *out);

#endif
