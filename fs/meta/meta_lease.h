/* mlease — directory leases with meta-side revocation (docs/meta.md, "Directory leases").
 *
 * A mount that looks up many names in one directory asks for a lease on it (KVP_OP_LEASE) and
 * then reads its listing; while the lease lasts it answers lookups in that directory from the
 * listing. Every change to the directory's entries or to its entries' attributes is answered
 * to whoever made it only after each lease on the directory was revoked: the revocation is
 * sent to the holder as the answer to its parked KVP_OP_WATCH and acknowledged by its next
 * WATCH, or the lease ran out (at most KVP_LEASE_MAX_MS after it was granted; the holder
 * stops using it earlier, counting from when it sent the request).
 *
 * Threading: every function is thread-safe (one mutex of its own, never held across a network
 * send or a wait; taken after meta's mu when both are held). Acknowledgements are waited for
 * with no other lock held.
 */
#ifndef KVFS_META_LEASE_H
#define KVFS_META_LEASE_H

#include <stdint.h>

#include "kvp.h"
#include "meta_req.h"

struct meta;
struct mlease;

/* 0 or -ENOMEM. */
int mlease_create(struct mlease **out);
/* Answers every parked WATCH (-ECANCELED) and frees. NULL is a no-op. */
void mlease_destroy(struct mlease *l);

/* LEASE (kvp.h): registers the lease before the reply, or renews one. 0, -ESRCH (no WATCH
 * of this holder's session on this replica yet), -ESTALE (the lease renewed was revoked or
 * is over), -ENOMEM. */
int mlease_grant(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
/* WATCH (kvp.h): takes the acknowledgement, then answers at once (revocations pending) or
 * keeps the request to answer later from a revoking thread. Owns nothing of q's body after it
 * returns (q is read here only). Returns 0 (the request is answered or parked). */
int mlease_watch(struct meta *m, struct kvp_conn *c, const struct kvp_hdr *h, const struct mreq *q);

/* After request q (op) was applied, before its reply: revokes the leases on every directory
 * whose entries or entries' attributes it changed (its parent directories, and theirs, whose
 * own times moved) and waits for the holders' acknowledgements or the leases' ends. Also,
 * right after this replica became the Raft leader, holds a namespace change back until a
 * lease the previous leader may have granted has ended (mlease_lead). No lock held on entry. */
void mlease_after(struct meta *m, uint16_t op, const struct mreq *q);
/* Meta's own removal of names in dir (retention, eviction): revokes without waiting. */
void mlease_revoke_nowait(struct meta *m, uint64_t dir);
/* This replica starts to lead: namespace changes wait hold_ns from now (mlease_after). */
void mlease_lead(struct mlease *l, int64_t hold_ns);

/* Counters since start, for logs and tests. */
struct mlease_stats {
	uint64_t granted, renewed, revoked, acked, expired_waits, live;
};
void mlease_get_stats(struct mlease *l, struct mlease_stats *out);

#endif
