/* kvw — the gateway <-> worker protocol: kvp frames (common/frame/kvp_frame.h: header,
 * authentication, little-endian bodies) with engine ops in their own range (0x100+), served by
 * kvp_server in `kvinfer prefill` / `kvinfer decode` workers. docs/serving.md describes the flow.
 * Every body below is built and parsed by this module's codec (kvw_*_enc / kvw_*_dec), nowhere
 * else.
 *
 *   KVW_OP_STATUS  -> (empty)
 *                  <- u32 waiting, u32 running, u32 queued_tokens, u32 kv_free, u32 kv_total,
 *                     u32 prompt tokens computed since start (mod 2^32)
 *   KVW_OP_PREFILL -> prompt, str peer, u64 ticket, u32 nx, nx x u64 seed, images: peer "" = hand
 *                     over through the kv dir; else a decode worker's host:port to send the
 *                     whole prompt's KV to (KV_PUT, ticket != 0). nx (< KVW_MAX_CHOICES): the
 *                     further choices of an n > 1 request, each sampling its own first token
 *                     from the same logits with its own seed (the prompt is computed once)
 *                  <- u32 n, n x u32 token ids, u32 cached, u32 first token, lp, u32 nx, nx x
 *                     (u32 first token, lp) (one per seed asked), u32 nimg, nimg x u32 pos
 *                     (where each image's placeholder tokens start), u8 handed, u32 blen, blen
 *                     bytes: the KV block holding the last prompt token (kv.h layout); every
 *                     full block before it is published in the shared kv dir. handed 1: the
 *                     whole KV is parked at peer under ticket (blen 0).
 *                     errors: -E2BIG (too long), -EINVAL, -EAGAIN
 *   KVW_OP_DECODE  -> str salt, params, u8 logprobs, u32 n, n x u32 token ids, u32 first, u32
 *                     blen, blen bytes, u64 ticket (0 = none: the prompt's KV from the kv dir +
 *                     the block), u32 nx, nx x (u64 seed, u32 first): the further choices of an
 *                     n > 1 request (< KVW_MAX_CHOICES), decoded here as forks of the first's
 *                     sequence (its prompt's KV blocks loaded once, shared); then images (off
 *                     = the token position of each image's placeholders, from the PREFILL
 *                     reply). The first token's lp came with the PREFILL reply: not sent
 *                  <- a stream of frames with the request's id, status 0, each one event:
 *                     u8 KVW_EV_TOKEN, u8 choice, u32 id, lp, u32 len, len bytes of text
 *                     u8 KVW_EV_FINISH, u8 choice, i32 err, str reason, str message (each
 *                     choice's last frame; choice 0 is the DECODE's own, 1..nx the further
 *                     ones; the stream ends with the last choice's FINISH)
 *                     A decode request owns its connection: closing it cancels the request.
 *   KVW_OP_CANCEL  (gateway -> decode worker, on a DECODE's connection, the DECODE's id)
 *                  -> u8 choice: stop generating that choice (a stop string ended it, or its
 *                     client left) while the others go on; its FINISH still comes. No reply;
 *                     an id or choice not running there is ignored
 *   KVW_OP_GENERATE (gateway -> decode worker) a short prompt computed by the decode worker
 *                  itself (no prefill hop, gateway --local-prefill):
 *                  -> prompt
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
 *   KVW_OP_ENCODE  (gateway -> encode worker, `kvinfer encode`) one decoded image's embeddings
 *                  -> str salt, 32 bytes image hash (img_hash of the pixels), u32 w, u32 h,
 *                     u32 len (= w x h x 3), len bytes of RGB8 pixels, row-major
 *                  <- u32 n_tokens, u32 dim, 32 bytes tower fingerprint (the kve.h key's
 *                     tower_fp), u8 cached (1: found in the kv dir, not encoded). The
 *                     embeddings themselves are in the shared kv dir (kve_save) when this
 *                     reply comes. errors: -EINVAL (the hash is not the pixels', an image the
 *                     tower cannot take), -E2BIG (past KVW_ENC_MAX_SIDE / _PIXELS), -EIO
 *   images = u32 nimg (<= KVW_MAX_IMAGES), nimg x (u32 off, u32 n_tokens, 32 bytes image hash,
 *            32 bytes tower fingerprint): PREFILL: each image's placeholder tokens go where off
 *            bytes of the text prompt end (not decreasing); DECODE: they are toks[off, off +
 *            n_tokens) (in order, apart). The worker loads their embeddings from the kv dir
 *            (kve_load: the encode worker put them there); a miss is an error (-ENOENT)
 *   prompt = str salt, params, u8 logprobs, u8 parse_special, u32 len, len bytes of prompt
 *            text, u32 nt, nt x u32 token ids: a prompt of token ids (nt > 0, then len = 0),
 *            taken as they are, or of text (nt = 0)
 *   logprobs = 0 (none), or 1 + the alternatives wanted per token (<= 1 + KVW_MAX_TOP)
 *   lp = u8 present (0: nothing follows), u32 logprob (f32 bits), str token (< KVW_LP_TEXT),
 *        u8 n_top (<= KVW_MAX_TOP), n_top x (str token, u32 logprob (f32 bits)): a token's
 *        log-probability and its most likely alternatives, sent when the request asked
 *   params = u32 temp (f32 bits), u32 top_p (f32 bits), u32 top_k, u64 seed, u32 max_tokens,
 *            u32 presence_penalty (f32 bits), u32 frequency_penalty (f32 bits), u32 n_bias
 *            (<= KVI_SAMPLE_MAX_BIAS), n_bias x (u32 token id, u32 bias (f32 bits))
 */
#ifndef KVFS_KVW_H
#define KVFS_KVW_H

#include <stddef.h>
#include <stdint.h>

#include "sample.h"

enum kvw_op {
	KVW_OP_STATUS = 0x100,
	KVW_OP_PREFILL = 0x101,
	KVW_OP_DECODE = 0x102,
	KVW_OP_KV_PUT = 0x103,
	KVW_OP_NCCL_ID = 0x104,
	KVW_OP_HELLO = 0x105,
	KVW_OP_GENERATE = 0x106,
	KVW_OP_CANCEL = 0x107,
	KVW_OP_ENCODE = 0x108,
};

enum kvw_event {
	KVW_EV_TOKEN = 1,
	KVW_EV_FINISH = 2,
	KVW_EV_PROMPT = 3,
};

#define KVW_SALT_MAX	  256
#define KVW_ADDR_MAX	  64 /* a peer's "host:port" (KVP_ADDR_MAX) */
#define KVW_NCCL_ID_BYTES 128
#define KVW_REASON_MAX	  32
#define KVW_MSG_MAX	  256
#define KVW_MAX_CHOICES	  16  /* choices of one prompt (OAI_MAX_CHOICES) */
#define KVW_MAX_TOP	  20  /* alternatives per token (OAI_MAX_TOP_LOGPROBS) */
#define KVW_LP_TEXT	  128 /* bytes of a token's text in an lp, with its NUL */
#define KVW_IMG_HASH	  32  /* an image's hash (img_hash) and a tower fingerprint */
#define KVW_MAX_IMAGES	  64  /* in one prompt (SCH_MAX_IMAGES) */
/* ENCODE's image bounds: img.h's defaults (what the gateway's decoder lets through), so an
 * ENCODE body is at most KVW_ENC_MAX_PIXELS x 3 bytes + KVW_ENC_HDR_ROOM. */
#define KVW_ENC_MAX_SIDE   8192u
#define KVW_ENC_MAX_PIXELS ((uint64_t)4096 * 4096)
#define KVW_ENC_HDR_ROOM   4096u

struct kvp_wbuf;
struct kvp_rbuf;
struct gw_logprob;

/* One token's log-probability (the lp field); decoded texts are NUL-terminated. */
struct kvw_lp {
	uint8_t present;
	uint8_t n_top;
	float logprob;
	char token[KVW_LP_TEXT];
	char top_token[KVW_MAX_TOP][KVW_LP_TEXT];
	float top_logprob[KVW_MAX_TOP];
};
/* Copies a gateway record into d (texts cut at KVW_LP_TEXT - 1 bytes, n_top at KVW_MAX_TOP),
 * present = 1; and back (pointers into s). */
void kvw_lp_from(struct kvw_lp *d, const struct gw_logprob *lp);
void kvw_lp_to(const struct kvw_lp *s, struct gw_logprob *lp);

/* The codec: every op's request and reply body has an encoder (kvw_<msg>_enc) and a decoder
 * (kvw_<msg>_dec); the gateway, the balancers and the workers build and parse worker frames
 * only through them. Encoders append to a caller-owned kvp_wbuf and return its sticky error
 * (0, -ENOMEM, -ENAMETOOLONG). Decoders read a whole body of len untrusted bytes: every length
 * is checked against the body before use and the body must be consumed exactly. They return
 * 0, -EBADMSG (the body does not parse: the receiver closes the connection), -ENAMETOOLONG (a
 * string longer than its field), -EINVAL (well formed, but a field's value is impossible),
 * -ENOMEM. Pointers a decoder leaves in its struct point into the body (valid while it is) or
 * into the struct's own storage; *_free releases what a decoder allocated (also after an
 * error, and on a zeroed struct). Plain functions on caller-owned state: thread-safe. */

/* Requests with an empty body (STATUS, HELLO, NCCL_ID): 0 or -EBADMSG. */
int kvw_empty_dec(const uint8_t *body, size_t len);

/* STATUS reply. */
struct kvw_status {
	uint32_t waiting, running, queued_tokens, kv_free, kv_total;
	uint32_t prompt_computed; /* prompt tokens computed since start, mod 2^32 */
};
int kvw_status_enc(struct kvp_wbuf *w, const struct kvw_status *s);
int kvw_status_dec(const uint8_t *body, size_t len, struct kvw_status *s);

/* An image of a PREFILL or DECODE (and, off only, of a PREFILL reply). */
struct kvw_image {
	uint32_t off; /* PREFILL: byte offset in the text; DECODE, reply: token position */
	uint32_t n_tokens;
	uint8_t hash[KVW_IMG_HASH];
	uint8_t tower_fp[KVW_IMG_HASH];
};

/* PREFILL and GENERATE requests: a prompt's text or token ids. The decoder copies the text
 * into text_buf (NUL-terminated; a NUL inside is -EBADMSG), the ids into toks_buf, and checks
 * that ids come with no text (-EBADMSG), logprobs <= 1 + KVW_MAX_TOP (-EINVAL), nx <
 * KVW_MAX_CHOICES (-EBADMSG) and, for PREFILL, that a non-empty peer is a host:port with a
 * ticket (-EINVAL). */
struct kvw_prompt {
	const char *salt; /* NULL or "" = none (decoded: NULL) */
	struct kvi_sample_params sp;
	uint8_t logprobs;
	uint8_t parse_special;
	const char *text;
	uint32_t len;
	uint32_t nt;	     /* > 0: the prompt is these token ids (text "") */
	const int32_t *toks; /* nt ids */
	const char *peer;    /* PREFILL: NULL or "" = hand over through the kv dir (decoded: "") */
	uint64_t ticket;     /* PREFILL, with a peer */
	uint32_t nx;	     /* PREFILL: further choices, their seeds */
	uint64_t seeds[KVW_MAX_CHOICES - 1];
	/* PREFILL: images of a text prompt (the decoder: -EINVAL for images with token ids, an
	 * offset past the text or decreasing, n_tokens 0 or past KVE_MAX_TOKENS) */
	uint32_t nimg;
	struct kvw_image images[KVW_MAX_IMAGES];
	/* decoder storage */
	char salt_buf[KVW_SALT_MAX], peer_buf[KVW_ADDR_MAX];
	char *text_buf;
	int32_t *toks_buf;
};
int kvw_prefill_enc(struct kvp_wbuf *w, const struct kvw_prompt *q);
int kvw_prefill_dec(const uint8_t *body, size_t len, struct kvw_prompt *q);
int kvw_generate_enc(struct kvp_wbuf *w, const struct kvw_prompt *q);
int kvw_generate_dec(const uint8_t *body, size_t len, struct kvw_prompt *q);
void kvw_prompt_free(struct kvw_prompt *q);

/* PREFILL reply. The encoder writes everything up to blen: the blen bytes of blk follow as
 * the frame's bulk (kvp_reply's bulk, no copy). The decoder checks n > 0, handed <= 1, nx <
 * KVW_MAX_CHOICES. lp and xlp are NULL for none (the decoder's point into lp_buf, malloc'd
 * with 1 + nx records, every one absent or present). */
struct kvw_prefilled {
	uint32_t n;
	const int32_t *toks;
	uint32_t cached;
	int32_t first;
	const struct kvw_lp *lp; /* first's */
	uint32_t nx;		 /* the further choices' first tokens, and theirs */
	int32_t xfirst[KVW_MAX_CHOICES - 1];
	const struct kvw_lp *xlp; /* nx records, or NULL */
	struct kvw_lp *lp_buf;
	uint32_t nimg; /* images[i].off: where image i's tokens start (< n, not decreasing) */
	struct kvw_image images[KVW_MAX_IMAGES];
	uint8_t handed;
	uint32_t blen;
	const uint8_t *blk;
	int32_t *toks_buf; /* decoder storage, malloc'd */
};
int kvw_prefilled_enc(struct kvp_wbuf *w, const struct kvw_prefilled *p);
int kvw_prefilled_dec(const uint8_t *body, size_t len, struct kvw_prefilled *p);
void kvw_prefilled_free(struct kvw_prefilled *p);

/* DECODE request. The decoder checks n > 0 and nx < KVW_MAX_CHOICES (-EBADMSG). */
struct kvw_decode {
	const char *salt; /* as kvw_prompt */
	struct kvi_sample_params sp;
	uint8_t logprobs; /* as kvw_prompt (-EINVAL past it) */
	uint32_t n;
	const int32_t *toks;
	int32_t first;
	uint32_t blen;
	const uint8_t *blk;
	uint64_t ticket;
	/* further choices of an n > 1 request (< KVW_MAX_CHOICES), forks of this one sharing its
	 * prompt's KV: each its seed and the first token its PREFILL drew */
	uint32_t nx;
	uint64_t xseeds[KVW_MAX_CHOICES - 1];
	int32_t xfirst[KVW_MAX_CHOICES - 1];
	/* images in toks (off: position; -EINVAL unless inside, in order, apart) */
	uint32_t nimg;
	struct kvw_image images[KVW_MAX_IMAGES];
	char salt_buf[KVW_SALT_MAX];
	int32_t *toks_buf;
};
int kvw_decode_enc(struct kvp_wbuf *w, const struct kvw_decode *d);
int kvw_decode_dec(const uint8_t *body, size_t len, struct kvw_decode *d);
void kvw_decode_free(struct kvw_decode *d);

/* One frame of a DECODE / GENERATE reply stream. TOKEN's encoder writes everything up to len:
 * the len bytes of text follow as the frame's bulk. The decoder sets kind from the first
 * byte even when it fails (-EBADMSG for an unknown kind, PROMPT with cached > n or n past
 * INT32_MAX, a reason, message or lp text longer than its field). */
struct kvw_ev {
	uint8_t kind;			/* enum kvw_event */
	uint8_t choice;			/* TOKEN, FINISH: 0, or a DECODE's further choice 1..nx */
	uint32_t prompt_tokens, cached; /* PROMPT */
	int32_t id;			/* TOKEN */
	struct kvw_lp lp;		/* TOKEN: lp.present 0 for none */
	uint32_t len;
	const uint8_t *text;
	int32_t err; /* FINISH: 0 or a negative errno */
	char reason[KVW_REASON_MAX], msg[KVW_MSG_MAX];
};
int kvw_ev_prompt_enc(struct kvp_wbuf *w, uint32_t prompt_tokens, uint32_t cached);
/* lp: NULL or not present for none. */
int kvw_ev_token_enc(struct kvp_wbuf *w, uint8_t choice, int32_t id, const struct kvw_lp *lp,
		     uint32_t len);
int kvw_ev_finish_enc(struct kvp_wbuf *w, uint8_t choice, int32_t err, const char *reason,
		      const char *msg);
int kvw_ev_dec(const uint8_t *body, size_t len, struct kvw_ev *e);

/* CANCEL (a request, no reply). */
int kvw_cancel_enc(struct kvp_wbuf *w, uint8_t choice);
int kvw_cancel_dec(const uint8_t *body, size_t len, uint8_t *choice);

/* HELLO reply: the decode worker's cache id, into id (cap bytes, NUL-terminated). */
int kvw_hello_enc(struct kvp_wbuf *w, const char *cache_id);
int kvw_hello_dec(const uint8_t *body, size_t len, char *id, size_t cap);

/* NCCL_ID reply; *id points into the body. */
int kvw_nccl_id_enc(struct kvp_wbuf *w, uint32_t session, const uint8_t id[KVW_NCCL_ID_BYTES]);
int kvw_nccl_id_dec(const uint8_t *body, size_t len, uint32_t *session, const uint8_t **id);

/* A KVW_OP_KV_PUT request. */
struct kvw_put {
	uint64_t ticket;
	uint32_t n;
	const int32_t *toks; /* n token ids */
	uint32_t first_block, block_bytes, n_blocks;
	uint8_t via;
	uint32_t session;
	const uint8_t *kv; /* via 0: the n_blocks x block_bytes bytes, inside the body; else NULL */
	size_t kv_len;
	int32_t *toks_buf; /* decoder storage, malloc'd */
};

/* Writes everything but the KV bytes (they follow as the frame's bulk); session is written
 * as 0 for via 0. */
int kvw_put_enc(struct kvp_wbuf *w, const struct kvw_put *p);
/* Parses a KV_PUT body of len bytes: every length is checked against the body, nothing else
 * (geometry, ids, via > 1 without bytes are the worker's to judge). 0, -EBADMSG,
 * -ENOMEM. */
int kvw_put_dec(const uint8_t *body, size_t len, struct kvw_put *p);
void kvw_put_free(struct kvw_put *p);

/* ENCODE request. The decoder checks 0 < w, h <= KVW_ENC_MAX_SIDE, w x h <=
 * KVW_ENC_MAX_PIXELS (-E2BIG past them, -EINVAL for 0) and len == w x h x 3 (-EBADMSG).
 * Whether hash is the pixels' is the worker's to check. pix points into the body. */
struct kvw_encode {
	const char *salt; /* as kvw_prompt */
	uint8_t hash[KVW_IMG_HASH];
	uint32_t w, h;
	const uint8_t *pix; /* w x h x 3 bytes */
	char salt_buf[KVW_SALT_MAX];
};
/* Writes everything but the pixels (they follow as the frame's bulk, w x h x 3 bytes). */
int kvw_encode_enc(struct kvp_wbuf *w, const struct kvw_encode *e);
int kvw_encode_dec(const uint8_t *body, size_t len, struct kvw_encode *e);

/* ENCODE reply. The decoder checks 0 < n_tokens <= KVE_MAX_TOKENS, 0 < dim <= KVE_MAX_DIM
 * and cached <= 1 (-EBADMSG). */
struct kvw_encoded {
	uint32_t n_tokens, dim;
	uint8_t tower_fp[KVW_IMG_HASH];
	uint8_t cached;
};
int kvw_encoded_enc(struct kvp_wbuf *w, const struct kvw_encoded *e);
int kvw_encoded_dec(const uint8_t *body, size_t len, struct kvw_encoded *e);

/* The params field of PREFILL, GENERATE and DECODE. The reader leaves stop tokens empty and
 * checks nothing beyond the encoding (the sampler accepts any values; max_tokens < 0 reads 0). */
void kvw_w_params(struct kvp_wbuf *w, const struct kvi_sample_params *p);
void kvw_r_params(struct kvp_rbuf *r, struct kvi_sample_params *p);

#endif
