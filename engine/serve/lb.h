/* lb — the disaggregated backend of the gateway: load balancers over `kvinfer prefill` and
 * `kvinfer decode` replicas (kvw.h protocol), as a struct gw_backend.
 *
 * Per request (on one of a fixed pool of worker threads): pick a prefill replica, PREFILL (the
 * prompt's blocks are then in the shared kv dir, the last one comes back in the reply — or, with
 * LB_HANDOFF_DIRECT, the prefill worker handed all of them to the decode replica picked first),
 * DECODE on a connection of its own and relay its token frames to the gateway job. A replica whose
 * call fails at the transport level is marked down and the request retried on another one, as long
 * as no token reached the client; after that the request ends with an error event. Cancelling
 * shuts the decode connection down, which the decode worker sees as a cancel (its KV is freed).
 *
 * Policies: engine/serve/lbp.h decides (rr, least, cache, prefix, chash), from the replicas' STATUS
 * reports and this gateway's own in-flight counts; with prefix the gateway remembers which
 * prefill replica computed each block of rendered prompt (2^LB_INDEX_BITS blocks).
 * Health: a thread polls STATUS on every replica every 200 ms, all concurrently (a slow one
 * does not delay the others' refresh); a replica that fails it is skipped until it answers
 * again, and its reported load reads 0 meanwhile.
 *
 * Requests and the pool: lb_opts.workers threads (started by lb_create) each run one request
 * at a time from start to finish (its PREFILL, then its decode stream); a request that finds
 * every worker busy waits in a FIFO of at most lb_opts.queue requests. When the queue is full,
 * submit refuses at once with -EAGAIN (the gateway answers 503, "overloaded"): the threads and
 * memory this backend uses are bounded whatever the offered load. A request cancelled while
 * queued (the client left) is finished at once and frees its place.
 *
 * Choices (n > 1, lb_group.c): the first choice's request sends one PREFILL with every
 * choice's seed (through the kv dir, whatever lb_opts.handoff); the others wait in their
 * workers for its reply (bounded by that PREFILL), then DECODE with their own first token. The
 * first is queued before them, so it is never waiting behind them for a worker.
 *
 * What blocks, and for how long:
 *   submit, cancel, release, metrics, healthy: never (a mutex held for list updates only).
 *   lb_stop: finishes the queued requests at once (-ECANCELED), cancels the running ones and
 *            breaks their connections (the PREFILL calls and decode streams fail at once), then
 *            waits on a condition variable until every worker is idle: bounded by the
 *            connection being opened at that moment (2 x CONNECT_TIMEOUT_MS, 4 s) and the
 *            time the gateway takes to consume a finish — no RPC timeout is waited out.
 *   lb_destroy: lb_stop, then joins the workers (idle by then) and the health thread, which
 *            ends after its current round of STATUS polls (at most STATUS_TIMEOUT_MS, 1 s,
 *            plus a connect).
 *
 * Threading: the backend callbacks are thread-safe; one mutex guards the replica table, the
 * queue and the list of running requests (lock order: lb, then a group's, then a request's
 * own mutex).
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
/* The pool's defaults: workers + queue = the gateway's HTTP connections, so the queue, not the
 * HTTP server, answers an overload. */
#define LB_WORKERS     64
#define LB_WORKERS_MAX 1024
#define LB_QUEUE       (GW_MAX_CONNECTIONS - LB_WORKERS)
#define LB_QUEUE_MAX   65536

struct lb_opts {
	const char *prefill; /* comma-separated host:port list */
	const char *decode;
	/* comma-separated encode replicas (`kvinfer encode`), or NULL / "": no images. A chat
	 * request's images are each encoded on one (lbp_pick_encode), which leaves their
	 * embeddings in the shared kv dir; the PREFILL and DECODE then name them. */
	const char *encode;
	const struct kvp_secret *secret;
	enum lb_policy policy;
	enum lb_handoff handoff;
	/* prompts of at most this many tokens (estimated as bytes / 4 + 1) skip the prefill
	 * replicas: the decode replica computes them itself (KVW_OP_GENERATE), saving a hop and
	 * a hand-over that cost more than computing a short prompt. 0 = never. */
	int local_prefill;
	/* worker threads: requests run at once (0 = LB_WORKERS, at most LB_WORKERS_MAX) */
	int workers;
	/* requests waiting for a worker before submit refuses (0 = LB_QUEUE, <= LB_QUEUE_MAX) */
	int queue;
};

struct lb;

/* Parses the address lists (1..LB_MAX_REPLICAS each), starts the workers and the health
 * thread. Returns 0, -EINVAL (bad list, workers or queue out of range), -ENOMEM, -EAGAIN (no
 * thread). */
int lb_create(const struct lb_opts *o, struct lb **out);
/* Refuses new requests, finishes the queued ones, cancels the running ones (each is finished)
 * and waits until no worker runs one (see above for how long). Call before gw_stop, so no job
 * is finished while the gateway is freed. Idempotent. */
void lb_stop(struct lb *l);
/* lb_stop, then frees. After gw_stop. */
void lb_destroy(struct lb *l);
void lb_backend(struct lb *l, struct gw_backend *out);
/* "fs", "direct" -> enum lb_handoff, or -EINVAL. */
int lb_handoff_parse(const char *s);

#endif
