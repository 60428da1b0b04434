/* Node registry (HEARTBEAT, NODES, STATFS) and the background thread of kvfs-meta: marks
 * silent nodes down, sends queued chunk deletions to nodes, expires abandoned writes. */
#define KVFS_LOG_TAG "meta"
#include "kvch.h"
#include "log.h"
#include "meta_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEL_BATCH      4096u
#define DEL_TIMEOUT_MS 3000

static int node_decode(uint32_t id, const char *v, size_t vl, struct mnode *n)
{
	struct kvp_rbuf r;
	memset(n, 0, sizeof(*n));
	kvp_r_init(&r, v, vl);
	uint8_t ver = kvp_r_u8(&r);
	n->id = id;
	n->uuid = kvp_r_u64(&r);
	kvp_r_str(&r, n->addr, sizeof(n->addr));
	n->capacity = kvp_r_u64(&r);
	n->used = kvp_r_u64(&r);
	n->chunks = kvp_r_u64(&r);
	n->hb_ns = kvp_r_i64(&r);
	n->state = kvp_r_u8(&r);
	if (ver >= 2)
		n->draining = kvp_r_u8(&r);
	if (ver >= 3)
		kvp_r_str(&r, n->zone, sizeof(n->zone));
	return ver >= 1 && ver <= 3 && kvp_r_end(&r) == 0 ? 0 : -EIO;
}

/* 0 or -ENOMEM (nothing added: see mdb_inode_put). */
static int node_put(rocksdb_writebatch_t *b, const struct mnode *n)
{
	uint8_t k[MK_MAX];
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u8(&w, 3); /* version 2 adds the draining flag, 3 the zone */
	kvp_w_u64(&w, n->uuid);
	kvp_w_cstr(&w, n->addr);
	kvp_w_u64(&w, n->capacity);
	kvp_w_u64(&w, n->used);
	kvp_w_u64(&w, n->chunks);
	kvp_w_i64(&w, n->hb_ns);
	kvp_w_u8(&w, n->state);
	kvp_w_u8(&w, n->draining);
	kvp_w_cstr(&w, n->zone);
	int rc = mdb_rec_end(&w);
	if (rc)
		return rc;
	rocksdb_writebatch_put(b, (const char *)k, mk_node(k, n->id), (const char *)w.p, w.len);
	kvp_w_free(&w);
	return 0;
}

static int node_write(struct meta *m, const struct mnode *n)
{
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	int rc = node_put(b, n);
	if (!rc)
		rc = mdb_write(m, b);
	rocksdb_writebatch_destroy(b);
	return rc;
}

/* Appends to the registry. Caller holds nodes_mu (or is single-threaded at load). */
static int node_add(struct meta *m, const struct mnode *n)
{
	if (m->nnodes == m->nodes_cap) {
		size_t cap = m->nodes_cap ? 2 * m->nodes_cap : 16;
		struct mnode *p = realloc(m->nodes, cap * sizeof(*p));
		if (!p)
			return -ENOMEM;
		m->nodes = p;
		m->nodes_cap = cap;
	}
	m->nodes[m->nnodes++] = *n;
	return 0;
}

int mnodes_load(struct meta *m)
{
	uint8_t k = MK_NODE;
	int rc = 0;
	int64_t now = meta_mono_ns();
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
	for (rocksdb_iter_seek(it, (const char *)&k, 1); rocksdb_iter_valid(it);
	     rocksdb_iter_next(it)) {
		size_t kl, vl;
		const char *key = rocksdb_iter_key(it, &kl);
		if (kl != 5 || key[0] != MK_NODE)
			break;
		const char *v = rocksdb_iter_value(it, &vl);
		struct mnode n;
		if (node_decode(mk_rd_be32((const uint8_t *)key + 1), v, vl, &n)) {
			klog_error("corrupt node record");
			rc = -EIO;
			break;
		}
		/* A restarted meta gives every node one timeout to heartbeat again before it is
		 * marked down, so reads right after a restart still see it as it was. */
		n.hb_mono = now;
		if (n.state == KVP_NODE_DOWN) /* the repair delay counts from this start */
			n.down_mono = now;
		rc = node_add(m, &n);
		if (rc)
			break;
	}
	rocksdb_iter_destroy(it);
	if (!rc && m->nnodes)
		klog_info("%zu nodes in the registry", m->nnodes);
	return rc;
}

int mnodes_heartbeat(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	char addr[KVP_ADDR_MAX], host[KVP_ADDR_MAX];
	uint16_t port;
	if (q->uuid == 0 || q->addr.len == 0 || q->addr.len >= KVP_ADDR_MAX ||
	    memchr(q->addr.p, 0, q->addr.len))
		return -EINVAL;
	memcpy(addr, q->addr.p, q->addr.len);
	addr[q->addr.len] = 0;
	if (kvp_addr_parse(addr, host, sizeof(host), &port) || port == 0)
		return -EINVAL;
	char zone[KVP_ZONE_MAX] = "";
	if (q->zone.len) {
		if (kvp_zone_check(q->zone.p, q->zone.len))
			return -EINVAL;
		memcpy(zone, q->zone.p, q->zone.len);
		zone[q->zone.len] = 0;
	}
	int rc = 0;
	pthread_mutex_lock(&m->nodes_mu);
	struct mnode *n = NULL;
	for (size_t i = 0; i < m->nnodes; i++)
		if (m->nodes[i].uuid == q->uuid)
			n = &m->nodes[i];
	struct mnode nn = {0};
	if (n)
		nn = *n;
	else {
		nn.id = m->next_node;
		nn.uuid = q->uuid;
	}
	memcpy(nn.addr, addr, sizeof(addr));
	int rezoned = n && strcmp(nn.zone, zone) != 0;
	memcpy(nn.zone, zone, sizeof(zone));
	nn.capacity = q->capacity;
	nn.used = q->used;
	nn.chunks = q->chunks;
	nn.hb_ns = meta_now_ns();
	nn.hb_mono = meta_mono_ns();
	nn.pending = 0; /* its `used` now includes what was placed on it */
	/* ... and no longer what it deleted, unless the deletion was acknowledged so recently
	 * that this report may have been taken before it. */
	for (int i = 0; i < MFREED_BUCKETS; i++)
		if (nn.freed_ep[i] < (nn.hb_mono - MFREED_SETTLE_NS) / MFREED_STEP_NS)
			nn.freed_b[i] = 0;
	uint8_t was = nn.state;
	nn.state = KVP_NODE_UP;
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	rc = node_put(b, &nn);
	if (!rc && !n) {
		uint8_t k[MK_MAX], v[4];
		for (int i = 0; i < 4; i++)
			v[i] = (uint8_t)(nn.id >> (8 * i));
		rocksdb_writebatch_put(b, (const char *)k, mk_uuid(k, nn.uuid), (const char *)v, 4);
		mdb_counter_put(b, MC_NEXT_NODE, (uint64_t)nn.id + 1);
	}
	if (!rc)
		rc = mdb_write(m, b);
	rocksdb_writebatch_destroy(b);
	if (!rc && !n) {
		rc = node_add(m, &nn);
		if (!rc) {
			m->next_node++;
			m->node_arrivals++;
			klog_info("node %u registered: %s uuid %016llx capacity %llu zone %s",
				  nn.id, nn.addr, (unsigned long long)nn.uuid,
				  (unsigned long long)nn.capacity, nn.zone[0] ? nn.zone : "(none)");
		}
	} else if (!rc) {
		if (was != KVP_NODE_UP) {
			m->node_arrivals++;
			klog_info("node %u (%s) is up", nn.id, nn.addr);
		}
		if (rezoned) /* placements from now on; chunks already placed stay */
			klog_info("node %u (%s) is now in zone %s", nn.id, nn.addr,
				  nn.zone[0] ? nn.zone : "(none)");
		*n = nn;
	}
	pthread_mutex_unlock(&m->nodes_mu);
	if (!rc)
		kvp_w_u32(out, nn.id);
	return rc;
}

void mnodes_check(struct meta *m)
{
	int64_t now = meta_mono_ns(), limit = (int64_t)(m->o.node_timeout_s * 1e9);
	pthread_mutex_lock(&m->nodes_mu);
	for (size_t i = 0; i < m->nnodes; i++) {
		struct mnode *n = &m->nodes[i];
		if (n->state == KVP_NODE_UP && now - n->hb_mono > limit) {
			n->state = KVP_NODE_DOWN;
			n->down_mono = now;
			klog_warn("node %u (%s): no heartbeat for %.1f s: down", n->id, n->addr,
				  (double)(now - n->hb_mono) / 1e9);
			node_write(m, n);
			pthread_cond_broadcast(&m->freed_cv); /* its deletions no longer count */
		}
	}
	pthread_mutex_unlock(&m->nodes_mu);
}

int mnodes_addr(struct meta *m, uint32_t id, char *addr, uint8_t *state)
{
	int rc = -ENOENT;
	pthread_mutex_lock(&m->nodes_mu);
	for (size_t i = 0; i < m->nnodes; i++)
		if (m->nodes[i].id == id) {
			memcpy(addr, m->nodes[i].addr, KVP_ADDR_MAX);
			*state = m->nodes[i].state;
			if (*state == KVP_NODE_UP && m->nodes[i].draining)
				*state = KVP_NODE_DRAINING;
			rc = 0;
			break;
		}
	pthread_mutex_unlock(&m->nodes_mu);
	return rc;
}

int mnodes_list(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	if (q->flags & ~(uint32_t)KVP_NODES_ZONES)
		return -EINVAL;
	mnodes_check(m);
	pthread_mutex_lock(&m->nodes_mu);
	kvp_w_u32(out, (uint32_t)m->nnodes);
	for (size_t i = 0; i < m->nnodes; i++) {
		const struct mnode *n = &m->nodes[i];
		kvp_w_u32(out, n->id);
		kvp_w_u64(out, n->uuid);
		kvp_w_cstr(out, n->addr);
		kvp_w_u8(out,
			 n->state == KVP_NODE_UP && n->draining ? KVP_NODE_DRAINING : n->state);
		kvp_w_u64(out, n->capacity);
		kvp_w_u64(out, n->used);
		kvp_w_u64(out, n->chunks);
		kvp_w_i64(out, n->hb_ns);
	}
	for (size_t i = 0; (q->flags & KVP_NODES_ZONES) && i < m->nnodes; i++)
		kvp_w_cstr(out, m->nodes[i].zone);
	pthread_mutex_unlock(&m->nodes_mu);
	return 0;
}

int mnodes_statfs(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	(void)q;
	mnodes_check(m);
	pthread_mutex_lock(&m->mu);
	uint64_t files = m->files, dirs = m->dirs;
	pthread_mutex_unlock(&m->mu);
	/* Capacity and use of every registered node, up or down: a node briefly down still
	 * holds its chunks, and df should not jump when it restarts. */
	uint64_t cap = 0, used = 0;
	uint32_t up = 0;
	pthread_mutex_lock(&m->nodes_mu);
	for (size_t i = 0; i < m->nnodes; i++) {
		cap += m->nodes[i].capacity;
		used += m->nodes[i].used;
		up += m->nodes[i].state == KVP_NODE_UP;
	}
	uint32_t total = (uint32_t)m->nnodes;
	pthread_mutex_unlock(&m->nodes_mu);
	kvp_w_u64(out, cap);
	kvp_w_u64(out, used);
	kvp_w_u64(out, files);
	kvp_w_u64(out, dirs);
	kvp_w_u8(out, (uint8_t)m->o.k);
	kvp_w_u8(out, (uint8_t)m->o.m);
	kvp_w_u32(out, m->o.chunk_size);
	kvp_w_u32(out, up);
	kvp_w_u32(out, total);
	return 0;
}

uint32_t mnodes_id_bound(struct meta *m)
{
	pthread_mutex_lock(&m->nodes_mu);
	uint32_t b = m->next_node;
	pthread_mutex_unlock(&m->nodes_mu);
	return b;
}

void mnodes_freeing_add(struct meta *m, const uint64_t *bytes, uint32_t nbytes)
{
	pthread_mutex_lock(&m->nodes_mu);
	for (size_t i = 0; i < m->nnodes; i++)
		if (m->nodes[i].id < nbytes)
			m->nodes[i].freeing += bytes[m->nodes[i].id];
	pthread_mutex_unlock(&m->nodes_mu);
}

/* A DEL of chunks that were accounted `bytes` was acknowledged: they are freed (until a
 * heartbeat that reflects it). */
static void freeing_done(struct meta *m, uint32_t id, uint64_t bytes)
{
	pthread_mutex_lock(&m->nodes_mu);
	for (size_t i = 0; i < m->nnodes; i++)
		if (m->nodes[i].id == id) {
			struct mnode *n = &m->nodes[i];
			n->freeing -= bytes < n->freeing ? bytes : n->freeing;
			int64_t ep = meta_mono_ns() / MFREED_STEP_NS;
			int b = (int)(ep % MFREED_BUCKETS);
			if (n->freed_ep[b] != ep) {
				n->freed_ep[b] = ep;
				n->freed_b[b] = 0;
			}
			n->freed_b[b] += bytes;
		}
	pthread_cond_broadcast(&m->freed_cv);
	pthread_mutex_unlock(&m->nodes_mu);
}

void mnodes_usage(struct meta *m, uint64_t *cap, uint64_t *used)
{
	*cap = *used = 0;
	pthread_mutex_lock(&m->nodes_mu);
	for (size_t i = 0; i < m->nnodes; i++) {
		const struct mnode *n = &m->nodes[i];
		if (n->state != KVP_NODE_UP)
			continue;
		uint64_t t = n->used + n->pending, gone = n->freeing + mnode_freed(n);
		*cap += n->capacity;
		*used += t > gone ? t - gone : 0;
	}
	pthread_mutex_unlock(&m->nodes_mu);
}

int mnodes_set_draining(struct meta *m, uint32_t id, int on)
{
	int rc = -ENOENT;
	pthread_mutex_lock(&m->nodes_mu);
	for (size_t i = 0; i < m->nnodes; i++)
		if (m->nodes[i].id == id) {
			m->nodes[i].draining = (uint8_t)(on != 0);
			rc = node_write(m, &m->nodes[i]);
			break;
		}
	pthread_mutex_unlock(&m->nodes_mu);
	return rc;
}

/* 1 when node id owns at least one chunk in the R index. */
static int owns_chunks(struct meta *m, uint32_t id)
{
	uint8_t k[MK_MAX];
	size_t kl, plen = mk_rev(k, id, 0) - 8;
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
	rocksdb_iter_seek(it, (const char *)k, plen + 8);
	int owns = 0;
	if (rocksdb_iter_valid(it)) {
		const char *key = rocksdb_iter_key(it, &kl);
		owns = kl == plen + 8 && memcmp(key, k, plen) == 0;
	}
	rocksdb_iter_destroy(it);
	return owns;
}

int mnodes_remove(struct meta *m, uint32_t id)
{
	mnodes_check(m);
	/* m->mu for the whole check and removal: no ALLOC places a chunk on the node and no
	 * COMMIT references one meanwhile (a write allocated before the removal and committed
	 * after it named a node no longer registered: that chunk was never repaired). */
	pthread_mutex_lock(&m->mu);
	pthread_mutex_lock(&m->nodes_mu);
	size_t i = 0;
	while (i < m->nnodes && m->nodes[i].id != id)
		i++;
	if (i == m->nnodes) {
		pthread_mutex_unlock(&m->nodes_mu);
		pthread_mutex_unlock(&m->mu);
		return -ENOENT;
	}
	struct mnode n = m->nodes[i];
	pthread_mutex_unlock(&m->nodes_mu);
	int pend = 0;
	if ((n.state == KVP_NODE_UP && !n.draining) || owns_chunks(m, id) ||
	    (pend = mdb_pending_on(m, id)) != 0) {
		pthread_mutex_unlock(&m->mu);
		return pend < 0 ? pend : -EBUSY;
	}
	uint8_t k[MK_MAX], hi[MK_MAX];
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	rocksdb_writebatch_delete(b, (const char *)k, mk_node(k, id));
	rocksdb_writebatch_delete(b, (const char *)k, mk_uuid(k, n.uuid));
	/* Its deletion queue: the chunks went with the node. */
	rocksdb_writebatch_delete_range(b, (const char *)k, mk_delq(k, id, 0), (const char *)hi,
					mk_delq(hi, id, UINT64_MAX));
	rocksdb_writebatch_delete(b, (const char *)hi, mk_delq(hi, id, UINT64_MAX));
	pthread_mutex_lock(&m->nodes_mu);
	int rc = mdb_write(m, b);
	if (!rc) {
		for (i = 0; i < m->nnodes; i++)
			if (m->nodes[i].id == id) {
				m->nodes[i] = m->nodes[--m->nnodes];
				break;
			}
		klog_info("node %u (%s) removed from the registry", id, n.addr);
	}
	pthread_mutex_unlock(&m->nodes_mu);
	pthread_mutex_unlock(&m->mu);
	rocksdb_writebatch_destroy(b);
	return rc;
}

/* ---- deletion queue ---- */

/* One round: the first queued node at or after *from, up to DEL_BATCH of its chunks, sent as
 * one DEL. Removed from the queue once the node acknowledges. Returns 1 to go on, 0 when the
 * queue has nothing more at or after *from. */
int mnodes_delq_round(struct meta *m, uint32_t *from)
{
	uint8_t k[MK_MAX];
	uint64_t *ids = malloc(DEL_BATCH * sizeof(*ids));
	if (!ids)
		return 0;
	uint32_t node = 0, n = 0;
	uint64_t acct = 0;
	int64_t now = meta_now_ns();
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
	for (rocksdb_iter_seek(it, (const char *)k, mk_delq(k, *from, 0));
	     rocksdb_iter_valid(it) && n < DEL_BATCH; rocksdb_iter_next(it)) {
		size_t kl;
		const uint8_t *key = (const uint8_t *)rocksdb_iter_key(it, &kl);
		if (kl != 13 || key[0] != MK_DELQ)
			break;
		uint32_t nd = mk_rd_be32(key + 1);
		if (n && nd != node)
			break;
		size_t vl;
		const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vl);
		int64_t not_before = 0;
		for (int b = 7; vl >= 8 && b >= 0; b--)
			not_before = (int64_t)((uint64_t)not_before << 8 | v[b]);
		if (not_before > now)
			continue; /* an unlinked file's chunks, kept a while for open readers */
		node = nd;
		ids[n++] = mk_rd_be64(key + 5);
		uint64_t one = 0;
		if (vl == 16) /* an accounted drop: the bytes it frees */
			for (int b = 7; b >= 0; b--)
				one = one << 8 | v[8 + b];
		acct += one;
	}
	rocksdb_iter_destroy(it);
	/* A queue entry a speculative write made (Raft) is deleted only once it is committed:
	 * a rolled-back unlink must find its chunks. */
	if (n == 0 || mdb_settle(m)) {
		free(ids);
		return 0;
	}
	char addr[KVP_ADDR_MAX];
	uint8_t state;
	int rc = mnodes_addr(m, node, addr, &state);
	int drop = 0;
	if (rc == -ENOENT) {
		klog_warn("deletion queue: unknown node %u: dropping %u entries", node, n);
		drop = 1;
	} else if (state != KVP_NODE_DOWN) { /* up or draining */
		rc = kvch_del(m->pool, addr, ids, n, DEL_TIMEOUT_MS, NULL);
		if (rc)
			klog_warn("deletion queue: node %u (%s): %s; will retry", node, addr,
				  kvp_strerror(rc));
		else
			klog_debug("deleted %u chunks on node %u", n, node);
		drop = rc == 0;
		if (drop && acct)
			freeing_done(m, node, acct);
	}
	if (drop) {
		rocksdb_writebatch_t *b = rocksdb_writebatch_create();
		for (uint32_t i = 0; i < n; i++)
			rocksdb_writebatch_delete(b, (const char *)k, mk_delq(k, node, ids[i]));
		mdb_write(m, b);
		rocksdb_writebatch_destroy(b);
	} else {
		if (node == UINT32_MAX) {
			free(ids);
			return 0;
		}
		*from = node + 1; /* skip this node until the next pass */
	}
	free(ids);
	return 1;
}

void mbg_kick(struct meta *m)
{
	pthread_mutex_lock(&m->bg_mu);
	m->kicked = 1;
	pthread_cond_signal(&m->bg_cv);
	pthread_mutex_unlock(&m->bg_mu);
}
