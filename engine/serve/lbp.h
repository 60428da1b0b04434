/* lbp — the balancers' placement decisions, as plain functions over a table of what the
 * balancer knows of each replica. The gateway's load balancer (lb.c) and the simulator
 * (tools/lb_sim) both decide through these, so a policy measured in simulation is the policy
 * the gateway runs: nothing here reads a clock, a socket or a lock.
 *
 * Policies (enum lb_policy):
 *   rr      next live replica, both stages.
 *   least   prefill: fewest queued + in-flight prompt tokens; decode: fewest in-flight
 *           sequences, ties to more free KV blocks.
 *   cache   prefill: rendezvous-hash owner of the whole prompt at no compute cost, every other
 *           replica at the whole prompt; plus the load term of least. decode: as least.
 *   prefix  prefill: the balancer remembers which replica last computed each prompt block
 *           (lbp_index); a replica's cost is the prompt tokens it would compute (those after
 *           the longest run of leading blocks it holds) plus its queued + in-flight tokens.
 *           decode: fewest in-flight sequences among replicas whose free KV holds the
 *           request's blocks, else the one with the most free KV.
 *   chash   prefill: bounded-load consistent hashing on the prompt's first LBP_CHASH_BLOCKS
 *           blocks: the rendezvous owner of that prefix unless its load exceeds
 *           (1 + LBP_CHASH_EPS) x the mean load + the prompt, then the next owner in score
 *           order under that bound, else the least loaded. decode: as prefix.
 * docs/serving.md ("Balancing") gives the measured comparison that made `prefix` the default.
 *
 * Threading: none inside; the caller serialises calls on one struct lbp_index / lbp_set.
 * Errors: 0 or a negative errno; picks return an index or -1 when no replica is usable. */
#ifndef KVFS_LBP_H
#define KVFS_LBP_H

#include <stddef.h>
#include <stdint.h>

enum lb_policy { LB_RR = 0, LB_LEAST = 1, LB_CACHE = 2, LB_PREFIX = 3, LB_CHASH = 4, LB_NPOLICY };

/* "rr", "least", "cache", "prefix", "chash" -> policy, or -EINVAL. */
int lb_policy_parse(const char *s);
/* The policy's name (static string); "?" for an unknown value. */
const char *lb_policy_name(int p);

/* A prompt block as the gateway sees it: it does not tokenize, so a block is
 * LBP_BLOCK_BYTES of rendered prompt text (about LB_BLOCK_TOKENS tokens at ~4 bytes each). */
#define LB_BLOCK_TOKENS 64
#define LBP_BLOCK_BYTES (LB_BLOCK_TOKENS * 4)
/* chash: the prefix that picks the owner (16 blocks, ~1 K tokens: past a shared system
 * prompt into what sets a request apart), and the load slack over the mean. */
#define LBP_CHASH_BLOCKS 16
#define LBP_CHASH_EPS	 0.1
/* Weight of one prompt token to compute against one queued token: both are prefill work. */
#define LB_CACHE_W 1

/* What the balancer knows of one replica. */
struct lbp_load {
	uint64_t id;	     /* identity for rendezvous hashing: lbp_id(its address) */
	int up;		     /* usable */
	int queued_tokens;   /* reported by the replica (prefill: uncached prompt tokens queued) */
	int inflight_tokens; /* this balancer's requests there, their estimated prompt tokens */
	int inflight;	     /* this balancer's requests there */
	int kv_free;	     /* reported by the replica (decode): free KV blocks */
};

/* One stage's replicas. */
struct lbp_set {
	struct lbp_load *r;
	int n;
	unsigned rr; /* round-robin cursor, advanced by picks */
};

/* One request as a pick sees it. */
struct lbp_req {
	uint64_t key;	       /* hash of the whole prompt (cache) */
	int est_tokens;	       /* estimated prompt tokens */
	int kv_blocks;	       /* KV blocks it needs on a decode replica (prompt + output) */
	const uint64_t *block; /* chained hashes of its full prompt blocks (prefix); may be NULL */
	int nblocks;
};

/* Which replica last computed each prompt block: a direct-mapped table of 2^bits entries.
 * An entry is overwritten by a later block that maps to the same slot, so the table forgets
 * the oldest blocks first, roughly as the replicas' own caches do. */
struct lbp_index {
	uint64_t *hash;
	int32_t *owner;
	uint64_t mask;
};

/* bits: 10..28. Returns 0, -EINVAL, -ENOMEM. lbp_index_free frees the table (not ix). */
int lbp_index_init(struct lbp_index *ix, int bits);
void lbp_index_free(struct lbp_index *ix);
/* Records that replica i computed (and so holds) the request's blocks. */
void lbp_index_note(struct lbp_index *ix, const struct lbp_req *q, int i);
/* How many leading blocks of q replica *who holds (the longest run); *who = -1 when none. */
int lbp_index_match(const struct lbp_index *ix, const struct lbp_req *q, int *who);
/* Forgets replica i (it restarted with a cold cache, or left). */
void lbp_index_drop(struct lbp_index *ix, int i);

/* FNV-1a of a string, seeded (the rendezvous identity of an address, and a prompt's key). */
uint64_t lbp_hash(const char *s, size_t n, uint64_t seed);
#define LBP_SEED 0xcbf29ce484222325ULL
uint64_t lbp_id(const char *addr);
/* A 64-bit finaliser (splitmix64's): rendezvous scores and table slots need every input bit
 * to move every output bit, which FNV's low bits do not. lb-sim's tables use it too. */
uint64_t lbp_mix64(uint64_t x);
/* The chained block hashes of rendered prompt text: block j's hash covers bytes
 * [0, (j+1) x LBP_BLOCK_BYTES). At most max; returns the count (full blocks only). */
int lbp_text_blocks(const char *text, size_t len, uint64_t *out, int max);

/* skip[i] != 0: not this one (it failed this request already); skip may be NULL.
 * ix: only for LB_PREFIX (NULL there falls back to least). The caller notes the chosen
 * replica with lbp_index_note once the request runs there. */
int lbp_pick_prefill(enum lb_policy p, struct lbp_set *s, const struct lbp_req *q,
		     const struct lbp_index *ix, const unsigned char *skip);
int lbp_pick_decode(enum lb_policy p, struct lbp_set *s, const struct lbp_req *q,
		    const unsigned char *skip);

/* The encoder stage (vision tower workers, issue 26): image-hash affinity under a load bound.
 * The rendezvous owner of img_key, so a repeated image meets the replica that encoded it (and
 * its in-flight twin), unless its queued + in-flight image tokens exceed (1 + LBP_CHASH_EPS) x
 * the mean + cost; then the next owner under that bound, else the least loaded. Distinct
 * images spread as evenly as the hash does. cost: the image's tokens. */
int lbp_pick_encode(struct lbp_set *s, uint64_t img_key, int cost, const unsigned char *skip);

#endif
