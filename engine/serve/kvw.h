/* kvw — the gateway <-> worker protocol: kvp frames (fs/proto/kvp.h: header, authentication,
 * little-endian bodies) with engine ops in their own range (0x100+), served by kvp_server in
 * `kvinfer prefill` / `kvinfer decode` workers. docs/serving.md describes the flow.
 *
 *   KVW_OP_STATUS  -> (empty)
 *                  <- u32 waiting, u32 running, u32 queued_tokens, u32 kv_free, u32 kv_total,
 *                     u32 prompt tokens computed since start (mod 2^32)
 *   KVW_OP_PREFILL -> str salt, params, u8 parse_special, u32 len, len bytes of prompt text,
 *                     str peer, u64 ticket: peer "" = hand over through the kv dir; else a
 *                     decode worker's host:port to send the whole prompt's KV to (KV_PUT,
 *                     ticket != 0)
 *                  <- u32 n, n x u32 token ids, u32 cached, u32 first token, u8 handed,
 *                     u32 blen, blen bytes: the KV block holding the last prompt token (kv.h
 *                     layout); every full block before it is published in the shared kv dir.
 *                     handed 1: the whole KV is parked at peer under ticket (blen 0).
 *                     errors: -E2BIG (too long), -EINVAL, -EAGAIN
 *   KVW_OP_DECODE  -> str salt, params, u32 n, n x u32 token ids, u32 first, u32 blen, blen bytes,
 *                     u64 ticket (0 = none: the prompt's KV from the kv dir + the block)
 *                  <- a stream of frames with the request's id, status 0, each one event:
 *                     u8 KVW_EV_TOKEN, u32 id, u32 len, len bytes of text
 *                     u8 KVW_EV_FINISH, i32 err, str reason, str message (the last frame)
 *                     A decode request owns its connection: closing it cancels the request.
 *   KVW_OP_GENERATE (gateway -> decode worker) a short prompt computed by the decode worker
 *                  itself (no prefill hop, gateway --local-prefill):
 *                  -> str salt, params, u8 parse_special, u32 len, len bytes of prompt text
 *                  <- as DECODE, the first frame being u8 KVW_EV_PROMPT, u32 prompt tokens,
 *                     u32 cached tokens
 *   KVW_OP_KV_PUT  (prefill worker -> decode worker) a prompt's KV to park under a ticket until
 *                  the DECODE naming it (sch.h sch_park):
 *                  -> u64 ticket, u32 n, n x u32 token ids, u32 first_block, u32 block_bytes,
 *                     u32 n_blocks (= ceil(n / block_tokens) - first_block), u8 via, u32
 *                     session, then for via 0 the n_blocks blocks from first_block on (kv.h
 *                     export layout) as n_blocks x block_bytes bytes; via 1: none, the blocks
 *                     come over the NCCL communicator of session (rank 1 sends to rank 0)
 *                     while this request is handled. The blocks before first_block the decode
 *                     worker loads from the kv dir (the prefill worker sends first_block > 0
 *                     only to a decode worker whose HELLO named its own cache)
 *                  <- (empty). errors: -EINVAL (another geometry or vocabulary, ticket 0),
 *                     -EEXIST (ticket parked), -ENOSPC (no free KV blocks), -ENOENT (no such
 *                     session), -EIO (NCCL)
 *   KVW_OP_HELLO   (prefill worker -> decode worker, first contact)
 *                  -> (empty)
 *                  <- str cache id (sch.h sch_cache_id: "<kv dir>/<cache fingerprint>", or "")
 *   KVW_OP_NCCL_ID (prefill worker -> decode worker, once per pair)
 *                  -> (empty)
 *                  <- u32 session, 128 bytes: an NCCL unique id; the decode worker then joins
 *                     it as rank 0, the caller as rank 1. -EOPNOTSUPP without a cuda engine
 *                     and NCCL.
 *   params = u32 temp (f32 bits), u32 top_p (f32 bits), u32 top_k, u64 seed, u32 max_tokens
 */
#ifndef KVFS_KVW_H
#define KVFS_KVW_H

#include <stddef.h>
#include <stdint.h>

enum kvw_op {
	KVW_OP_STATUS = 0x100,
	KVW_OP_PREFILL = 0x101,
	KVW_OP_DECODE = 0x102,
	KVW_OP_KV_PUT = 0x103,
	KVW_OP_NCCL_ID = 0x104,
	KVW_OP_HELLO = 0x105,
	KVW_OP_GENERATE = 0x106,
};

enum kvw_event {
	KVW_EV_TOKEN = 1,
	KVW_EV_FINISH = 2,
	KVW_EV_PROMPT = 3,
};

#define KVW_SALT_MAX 256

struct kvp_wbuf;
struct kvp_rbuf;
struct kvi_sample_params;

/* A KVW_OP_KV_PUT request, parsed. */
struct kvw_put {
	uint64_t ticket;
	uint32_t n;
	int32_t *toks; /* n token ids, malloc'd: the caller frees */
	uint32_t first_block, block_bytes, n_blocks;
	uint8_t via;
	uint32_t session;
	const uint8_t *kv; /* via 0: the n_blocks x block_bytes bytes, inside the body; else NULL */
	size_t kv_len;
};

/* Parses a KV_PUT body of len bytes: every length is checked against the body, nothing else
 * (geometry, ids, via > 1 without bytes are the worker's to judge). 0 (free p->toks), -EBADMSG,
 * -ENOMEM. */
int kvw_put_parse(const uint8_t *body, size_t len, struct kvw_put *p);

/* The params field of PREFILL and DECODE. The reader leaves stop tokens empty and checks
 * nothing beyond the encoding (the sampler accepts any values). */
void kvw_w_params(struct kvp_wbuf *w, const struct kvi_sample_params *p);
void kvw_r_params(struct kvp_rbuf *r, struct kvi_sample_params *p);

#endif
