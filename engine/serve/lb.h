/* lb — the disaggregated backend of the gateway: load balancers over `kvinfer prefill` and
 * `kvinfer decode` replicas (kvw.h protocol), as a struct gw_backend.
 *
 * Per request (one thread each): pick a prefill replica, PREFILL (the prompt's blocks are then
 * in the shared kv dir, the last one comes back in the reply — or, with LB_HANDOFF_DIRECT, the
 * prefill worker handed all of them to the decode replica picked first), DECODE on
 * a connection of its own and relay its token frames to the gateway job. A replica whose call
 * fails at the transport level is marked down and the request retried on another one, as long
 * as no token reached the client; after that the request ends with an error event. Cancelling
 * shuts the decode connection down, which the decode worker sees as a cancel (its KV is freed).
 *
 * Policies: engine/serve/lbp.h decides (rr, least, cache, prefix), from the replicas' STATUS
 * reports and this gateway's own in-flight counts; with prefix the gateway remembers which
 * prefill replica computed each block of rendered prompt (2^LB_INDEX_BITS blocks).
 * Health: a thread polls STATUS on every replica every 200 ms, all concurrently (a slow one
 * does not delay the others' refresh); a replica that fails it is skipped until it answers
 * again, and its reported load reads 0 meanwhile.
 *
 * Threading: the backend callbacks are thread-safe; one mutex guards the replica table.
 */
#ifndef KVFS_LB_H
#define KVFS_LB_H

#include "gw.h"
#include "kvp_frame.h"
#include "lbp.h"

/* How the prompt's KV goes from the prefill to the decode worker:
 *   LB_HANDOFF_FS      full blocks through the shared kv dir (the prefill worker waits until
 *                      they are written), the last one in the PREFILL reply;
 *   LB_HANDOFF_DIRECT  the decode replica is picked first and named in the PREFILL; the prefill
 *                      worker sends it the whole prompt's KV (KVW_OP_KV_PUT: bytes over the
 *                      connection, or NCCL between GPUs with --nccl workers), where it is
 *                      parked under a ticket the DECODE then names. The full blocks still go
 *                      to the kv dir for later prompts, unwaited. When the hand-over fails
 *                      (decode replica gone, geometry differs) the request goes on as with
 *                      fs, on the blocks the kv dir has (the decode worker computes the rest). */
enum lb_handoff { LB_HANDOFF_FS = 0, LB_HANDOFF_DIRECT = 1 };

#define LB_MAX_REPLICAS 16

struct lb_opts {
	const char *prefill; /* comma-separated host:port list */
	const char *decode;
	const struct kvp_secret *secret;
	enum lb_policy policy;
	enum lb_handoff handoff;
	/* prompts of at most this many tokens (estimated as bytes / 4 + 1) skip the prefill
	 * replicas: the decode replica computes them itself (KVW_OP_GENERATE), saving a hop and
	 * a hand-over that cost more than computing a short prompt. 0 = never. */
	int local_prefill;
};

struct lb;

/* Parses the address lists (1..LB_MAX_REPLICAS each) and starts the health thread. Returns 0,
 * -EINVAL (bad list), -ENOMEM. */
int lb_create(const struct lb_opts *o, struct lb **out);
/* Refuses new requests, cancels the running ones (each is finished) and waits for their
 * threads. Call before gw_stop, so no job is finished while the gateway is freed. */
void lb_stop(struct lb *l);
/* lb_stop, then frees. After gw_stop. */
void lb_destroy(struct lb *l);
void lb_backend(struct lb *l, struct gw_backend *out);
/* "fs", "direct" -> enum lb_handoff, or -EINVAL. */
int lb_handoff_parse(const char *s);

#endif
