/* wk internals shared by wk.c (the worker processes) and wk_handoff.c (the direct hand-over
 * between them: KVW_OP_KV_PUT, HELLO, NCCL_ID). */
#ifndef KVFS_WK_INT_H
#define KVFS_WK_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "kvp_frame.h"
#include "kvw.h"
#include "sch.h"

#define PUT_TIMEOUT_MS	   30000 /* a decode worker parks a hand-over at its next step */
#define CONNECT_TIMEOUT_MS 2000
#define WK_MAX_COMMS	   64
/* Room for a KVW_OP_KV_PUT's fields on top of the KV bytes it carries (a decode worker's
 * frame limit) */
#define WK_KV_PUT_HDR_ROOM 4096

/* Decode side: an NCCL communicator a prefill worker set up (KVW_OP_NCCL_ID). */
struct wk_comm {
	uint32_t session;
	struct kvk_nccl *c;
};

/* Prefill side: what the first contact with a decode worker told (KVW_OP_HELLO). */
struct wk_peer {
	char addr[KVP_ADDR_MAX];
	int shared;	    /* same kv dir and cache: blocks loaded from it are not sent */
	struct kvk_nccl *c; /* NCCL with it (--nccl, both able), or NULL: bytes */
	uint32_t session;
};

struct wk {
	struct sch *s;
	enum sch_mode mode;
	struct kvp_pool *pool; /* prefill: connections to decode workers */
	int nccl;	       /* prefill: try NCCL for hand-overs */
	pthread_mutex_t mu;    /* guards peers, comms, puts */
	pthread_cond_t cv;     /* puts dropped */
	struct wk_comm comms[WK_MAX_COMMS];
	int ncomms;
	struct wk_peer peers[WK_MAX_COMMS];
	int npeers;
	struct kvk_nccl *dead[WK_MAX_COMMS]; /* aborted, destroyed at exit */
	int ndead;
	uint32_t next_session; /* starts random: ids do not repeat across restarts */
	int puts;	       /* hand-over threads running */
	struct wreq *live;     /* decode side: DECODE / GENERATE choices, for KVW_OP_CANCEL */
};

/* What a PREFILL reply tells of its choices beyond the prompt: the further choices' first
 * tokens and, when the request asked, every choice's first-token logprob (lps[0] the first
 * choice's, lps[1 + i] xfirst[i]'s; NULL for none). */
struct wk_firsts {
	int nx;
	int32_t xfirst[KVW_MAX_CHOICES - 1];
	struct kvw_lp *lps; /* KVW_MAX_CHOICES records, malloc'd */
	int nlp;	    /* records filled */
	int nimg;	    /* where the prompt's images' tokens start (sch_req_images) */
	uint32_t img_pos[KVW_MAX_IMAGES];
};

/* One request from the gateway; freed by its finish callback (the scheduler's last touch). */
struct wreq {
	struct wk *k;
	struct kvp_conn *c;
	struct kvp_hdr h;
	struct sch_req *r;
	int replied;
	uint8_t choice; /* DECODE: 0, or the further choice (1..nx) its frames name */
	int listed;	/* on k->live (under k->mu) */
	struct wreq *lnext;
	/* logprobs asked: PREFILL: the first tokens'; DECODE / GENERATE: lps[0] is the next
	 * token's (present until its TOKEN frame carries it) */
	struct wk_firsts f;
	/* PREFILL with a direct hand-over */
	char peer[KVP_ADDR_MAX];
	uint64_t ticket;
	struct wk_peer pi; /* what is known of peer */
};

/* Layering: wk.c (the worker process, request dispatch) calls wk_handoff.c (hand-overs and
 * the PREFILL reply), never the reverse.
 *
 * wk_handoff.c. The PREFILL reply (kvw.h). 0, or the encoding's error (nothing sent). */
int wk_pf_reply(struct kvp_conn *c, const struct kvp_hdr *h, const int32_t *toks, int n, int cached,
		int32_t first, const struct wk_firsts *f, int handed, const void *blk, size_t blen);

/* wk_handoff.c. Prefill side: the sink's handoff callback (scheduler thread): sends the KV to
 * w->peer and answers the PREFILL (the thread of a bytes hand-over, or here for NCCL). */
void wk_pf_handoff(void *u, struct sch *s, const struct sch_handoff *h);
/* Prefill side: *out = what is known of decode worker peer (HELLO on first contact, NCCL set
 * up with --nccl). 0, or the transport error (out: bytes, every block). */
int wk_peer_get(struct wk *k, const char *peer, struct wk_peer *out);
/* Decode side: a KVW_OP_KV_PUT body; the reply's status (-EBADMSG: malformed). */
int wk_dc_put(struct wk *k, const uint8_t *body, size_t len);
/* Decode side: KVW_OP_NCCL_ID, answered here. */
void wk_dc_nccl_id(struct wk *k, struct kvp_conn *conn, const struct kvp_hdr *h);

#endif
