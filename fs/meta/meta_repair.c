/* The repair worker of kvfs-meta: one thread that rebuilds chunks. Repair rebuilds every chunk
 * of a down node from the survivors of its stripe onto another node; drain moves a live node's
 * chunks off it; scrub has every chunk checked on its node (VERIFY) and rebuilds bad or missing
 * ones.
 * Each rebuilt chunk gets a new id on a node not already in its stripe, and the stripe map
 * slot, the owner index (R) and the old chunk's deletion are one batch. Meta is a client of
 * the nodes through kvch (fs/chunk), whose stripe read also does the decoding.
 * docs/operations.md, "Retention, eviction, repair". */
#define KVFS_LOG_TAG "meta"
#include "kvch.h"
#include "kvec.h"
#include "ktime.h"
#include "log.h"
#include "meta_int.h"
#include "meta_raft.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define IO_TIMEOUT_MS 10000
#define PAGE	      256

enum { MODE_REPAIR, MODE_DRAIN, MODE_SCRUB };

struct rnode {
	uint32_t id;
	char addr[KVP_ADDR_MAX];
	uint8_t state, draining;
	int64_t free;
	char zone[KVP_ZONE_MAX]; /* "" = a zone of its own */
};

static int worker_stopping(struct meta *m)
{
	pthread_mutex_lock(&m->bg_mu);
	int s = m->stopping;
	pthread_mutex_unlock(&m->bg_mu);
	return s;
}

/* Copies the registry (caller frees). */
static struct rnode *nodes_copy(struct meta *m, size_t *n)
{
	mnodes_check(m);
	pthread_mutex_lock(&m->nodes_mu);
	struct rnode *r = calloc(m->nnodes ? m->nnodes : 1, sizeof(*r));
	*n = 0;
	for (size_t i = 0; r && i < m->nnodes; i++) {
		const struct mnode *d = &m->nodes[i];
		uint64_t t = d->used + d->pending, g = mnode_freed(d);
		t = t > g ? t - g : 0;
		r[i] = (struct rnode){.id = d->id,
				      .state = d->state,
				      .draining = d->draining,
				      .free = d->capacity > t ? (int64_t)(d->capacity - t) : 0};
		memcpy(r[i].addr, d->addr, KVP_ADDR_MAX);
		memcpy(r[i].zone, d->zone, KVP_ZONE_MAX);
		(*n)++;
	}
	pthread_mutex_unlock(&m->nodes_mu);
	return r;
}

static const struct rnode *node_find(const struct rnode *r, size_t n, uint32_t id)
{
	for (size_t i = 0; i < n; i++)
		if (r[i].id == id)
			return &r[i];
	return NULL;
}

/* GET of a whole chunk, checked against the stripe map's length and CRC: 0, -EILSEQ (bad CRC
 * on the node, or not the stripe map's chunk), -ENOENT, or a transport error. */
static int chunk_get(struct meta *m, const char *addr, const struct mreq_slot *sl, uint32_t len,
		     uint8_t *buf)
{
	struct kvch_call c;
	int rc = kvch_get_start(m->pool, addr, sl->chunk_id, 0, KVCH_TO_END, &c);
	return rc ? rc : kvch_get_finish(&c, IO_TIMEOUT_MS, buf, len, &sl->crc);
}

/* A stripe as stored: its file's layout and its k+m slots. */
struct rstripe {
	struct mino f;
	struct kvec_layout l;
	uint32_t s, w;
	struct mreq_slot slot[KVEC_MAX_N];
	uint32_t len[KVEC_MAX_N]; /* stored length of each chunk; 0: empty, never stored */
};

static int stripe_load(struct meta *m, uint64_t ino, uint32_t s, struct rstripe *st)
{
	int rc = mdb_inode_get(m, NULL, ino, &st->f);
	if (rc)
		return rc;
	st->s = s;
	st->w = (uint32_t)(st->f.k + st->f.m);
	if (!S_ISREG(st->f.mode) || s >= st->f.nstripes || st->w > KVEC_MAX_N ||
	    kvec_layout_init(&st->l, st->f.size, st->f.chunk_size, st->f.k, st->f.m))
		return -ENOENT;
	uint8_t k[MK_MAX];
	char *v;
	size_t vl;
	rc = mdb_get(m, NULL, k, mk_stripe(k, ino, s), &v, &vl);
	if (rc)
		return rc;
	if (vl != st->w * MREQ_SLOT_SIZE) {
		rocksdb_free(v);
		return -EIO;
	}
	struct mreq q = {.slots = (const uint8_t *)v};
	for (uint32_t i = 0; i < st->w; i++) {
		mreq_slot_get(&q, i, &st->slot[i]);
		st->len[i] = kvec_layout_slot_len(&st->l, s, (int)i);
	}
	rocksdb_free(v);
	return 0;
}

static struct kvec_codec *codec_for(int k, int mm, struct kvec_codec **cache)
{
	int idx = k * (KVEC_MAX_M + 1) + mm;
	if (!cache[idx] && kvec_codec_create(k, mm, &cache[idx]))
		cache[idx] = NULL;
	return cache[idx];
}

struct rctx {
	struct meta *m;
	struct kvec_codec **codecs; /* (KVEC_MAX_K + 1) * (KVEC_MAX_M + 1), created on use */
	struct rnode *nodes;
	size_t nnodes;
	pthread_mutex_t *mu; /* shared by a job's threads: codecs and nodes[].free */
	int slot;	     /* this thread's inflight[] entry */
};

/* Rebuilds chunk `idx` of the stripe from the others into bufs[idx] (st->len[0] bytes each):
 * every other stored chunk on an up node is asked at once, none twice, and decoded by kvch's
 * stripe read (empty chunks are zeros without a read, as in the client's degraded read). */
static int rebuild(struct rctx *x, struct rstripe *st, uint32_t idx, uint8_t **bufs)
{
	struct kvch_stripe ks = {
	    .pool = x->m->pool, .k = st->f.k, .m = st->f.m, .timeout_ms = IO_TIMEOUT_MS};
	for (uint32_t i = 0; i < st->w; i++) {
		/* A node not up is left out as if it stored nothing. */
		const struct rnode *n = node_find(x->nodes, x->nnodes, st->slot[i].node_id);
		int up = n && n->state == KVP_NODE_UP;
		ks.slot[i] = (struct kvch_slot){.addr = up ? n->addr : NULL,
						.node_id = up ? n->id : 0,
						.chunk_id = st->slot[i].chunk_id,
						.crc = st->slot[i].crc,
						.len = st->len[i]};
	}
	pthread_mutex_lock(x->mu);
	ks.codec = codec_for(st->f.k, st->f.m, x->codecs);
	pthread_mutex_unlock(x->mu);
	if (!ks.codec)
		return -ENOMEM;
	uint64_t all = (1ull << st->w) - 1, want = 1ull << idx;
	struct kvch_fetch f = {0};
	kvch_fetch_start(&ks, &f, all & ~want);
	/* Nothing beyond that first round: avoid holds every chunk not asked. */
	int rc = kvch_stripe_read(&ks, &f, bufs, want, all & ~f.started, 0, NULL);
	return rc < 0 ? rc : 0;
}

/* Chunks of the stripe other than idx in n's zone (0 for a node without one). */
static int zone_load(const struct rctx *x, const struct rstripe *st, uint32_t idx,
		     const struct rnode *n)
{
	int c = 0;
	for (uint32_t j = 0; n->zone[0] && j < st->w; j++) {
		const struct rnode *o =
		    j == idx ? NULL : node_find(x->nodes, x->nnodes, st->slot[j].node_id);
		c += o && strcmp(o->zone, n->zone) == 0;
	}
	return c;
}

/* The destination of a rebuilt chunk: an up, non-draining node not holding another chunk of
 * this stripe (the chunk's own node qualifies for scrub: distinctness holds), in the zone
 * holding the fewest of the stripe's other chunks (as placement spreads them), with the most
 * room among those. Its room is taken now, so parallel rebuilds spread out; dest_release
 * gives it back. NULL when none qualifies. */
static struct rnode *dest_take(struct rctx *x, const struct rstripe *st, uint32_t idx,
			       uint32_t node, int mode)
{
	uint32_t len = st->len[idx];
	struct rnode *dst = NULL;
	int dst_load = 0;
	pthread_mutex_lock(x->mu);
	for (size_t i = 0; i < x->nnodes; i++) {
		struct rnode *n = &x->nodes[i];
		int taken = 0;
		for (uint32_t j = 0; j < st->w; j++)
			taken |= j != idx && st->slot[j].node_id == n->id;
		if (n->state != KVP_NODE_UP || n->draining || taken ||
		    (mode != MODE_SCRUB && n->id == node) || n->free < (int64_t)len)
			continue;
		int load = zone_load(x, st, idx, n);
		if (!dst || load < dst_load || (load == dst_load && n->free > dst->free)) {
			dst = n;
			dst_load = load;
		}
	}
	if (dst)
		dst->free -= (int64_t)len;
	pthread_mutex_unlock(x->mu);
	return dst;
}

static void dest_release(struct rctx *x, struct rnode *dst, uint32_t len)
{
	pthread_mutex_lock(x->mu);
	dst->free += (int64_t)len;
	pthread_mutex_unlock(x->mu);
}

/* The bytes of chunk idx into bufs[idx]: a drain reads them from their still-up node, anything
 * else (or a failed read) rebuilds them from the stripe. An empty chunk has nothing to read. */
static int chunk_recover(struct rctx *x, struct rstripe *st, uint32_t idx, int mode, uint8_t **bufs)
{
	uint32_t len = st->len[idx];
	if (!len)
		return 0;
	int rc = -EIO;
	const struct rnode *src = node_find(x->nodes, x->nnodes, st->slot[idx].node_id);
	if (mode == MODE_DRAIN && src && src->state == KVP_NODE_UP)
		rc = chunk_get(x->m, src->addr, &st->slot[idx], len, bufs[idx]);
	return rc ? rebuild(x, st, idx, bufs) : 0;
}

/* Stores buf as a new chunk on dst: a fresh id (in *nid, recorded as this thread's in-flight
 * chunk so the orphan sweep spares it) and its CRC in *crc. An empty chunk stays unstored, as
 * the client wrote it. */
static int chunk_store(struct rctx *x, const struct rnode *dst, const uint8_t *buf, uint32_t len,
		       uint64_t *nid, uint32_t *crc)
{
	struct meta *m = x->m;
	pthread_mutex_lock(&m->mu);
	int rc = mdb_alloc_chunks(m, 1, nid);
	pthread_mutex_unlock(&m->mu);
	if (rc) {
		*nid = 0; /* ids start at 1: 0 says none was taken */
		return rc;
	}
	pthread_mutex_lock(&m->job_mu);
	m->inflight[x->slot] = *nid;
	pthread_mutex_unlock(&m->job_mu);
	*crc = kvec_crc32c(0, buf, len);
	struct kvch_call c;
	rc = len ? kvch_put_start(m->pool, dst->addr, *nid, *crc, buf, len, &c) : 0;
	return !rc && len ? kvch_put_finish(&c, IO_TIMEOUT_MS) : rc;
}

/* Points slot idx of (ino, s) at the new chunk (dst, nid, crc) in one batch with the owner
 * index and the old chunk's deletion, if the slot still holds (node, chunk); otherwise, or when
 * the record cannot be encoded, the new chunk is queued for deletion instead. stored: the PUT
 * succeeded. Returns 1 moved, 0 the slot changed meanwhile, or -errno (nothing moved). */
static int slot_move(struct rctx *x, const struct rstripe *st, uint32_t idx, uint32_t node,
		     uint64_t chunk, const struct mreq_slot *nw, int stored)
{
	struct meta *m = x->m;
	uint64_t ino = st->f.ino;
	uint32_t s = st->s;
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	int64_t now = meta_now_ns();
	uint8_t k[MK_MAX];
	struct kvp_wbuf v;
	kvp_w_init(&v);
	int rc = 0;
	pthread_mutex_lock(&m->mu);
	struct rstripe cur;
	int same = stored && stripe_load(m, ino, s, &cur) == 0 && cur.slot[idx].node_id == node &&
		   cur.slot[idx].chunk_id == chunk;
	if (same) {
		for (uint32_t i = 0; i < st->w; i++) {
			const struct mreq_slot *sl = i == idx ? nw : &cur.slot[i];
			kvp_w_u32(&v, sl->node_id);
			kvp_w_u64(&v, sl->chunk_id);
			kvp_w_u32(&v, sl->crc);
		}
		rc = mdb_rec_end(&v);
		same = !rc;
	}
	if (same) {
		rocksdb_writebatch_put(b, (const char *)k, mk_stripe(k, ino, s), (const char *)v.p,
				       v.len);
		mdb_rev_put(b, nw->node_id, nw->chunk_id, ino, s);
		if (node) { /* node 0: a slot written degraded, nothing stored to forget */
			rocksdb_writebatch_delete(b, (const char *)k, mk_rev(k, node, chunk));
			/* The old chunk goes if its node ever answers again. */
			mdb_delq_put(b, node, chunk, now);
		}
	} else {
		mdb_delq_put(b, nw->node_id, nw->chunk_id, now);
	}
	int wrc = mdb_write(m, b);
	pthread_mutex_unlock(&m->mu);
	rocksdb_writebatch_destroy(b);
	kvp_w_free(&v);
	pthread_mutex_lock(&m->job_mu);
	m->inflight[x->slot] = 0;
	pthread_mutex_unlock(&m->job_mu);
	return rc ? rc : wrc ? wrc : same;
}

/* Rebuilds or moves one chunk (node, chunk) of (ino, stripe): destination first, so that a
 * chunk with nowhere to go costs no reads (10+1 on 11 nodes with one down has none, and
 * automatic repair retries), then its bytes, a new chunk, and the slot moved. Returns the
 * bytes written, 1 for an empty chunk or one whose slot changed while it was rebuilt, 0 when
 * the slot did not hold that chunk to begin with (the file changed or went), or -errno. */
static int64_t repair_slot(struct rctx *x, uint64_t ino, uint32_t s, uint32_t node, uint64_t chunk,
			   int mode)
{
	struct meta *m = x->m;
	struct rstripe st;
	int rc = stripe_load(m, ino, s, &st);
	if (rc)
		return rc == -ENOENT ? 0 : rc;
	uint32_t idx = st.w;
	for (uint32_t i = 0; i < st.w; i++)
		if (st.slot[i].node_id == node && st.slot[i].chunk_id == chunk)
			idx = i;
	if (idx == st.w)
		return 0;
	size_t plen = st.len[0] ? st.len[0] : 1;
	uint8_t *mem = malloc(plen * st.w);
	uint8_t *bufs[KVEC_MAX_N] = {0};
	if (!mem)
		return -ENOMEM;
	for (uint32_t i = 0; i < st.w; i++)
		bufs[i] = mem + i * plen;
	uint32_t len = st.len[idx];
	int moved = 0;
	struct rnode *dst = dest_take(x, &st, idx, node, mode);
	rc = dst ? chunk_recover(x, &st, idx, mode, bufs) : -ENOSPC;
	if (rc && dst)
		dest_release(x, dst, len);
	if (rc)
		goto out;
	struct mreq_slot nw = {.node_id = dst->id};
	rc = chunk_store(x, dst, bufs[idx], len, &nw.chunk_id, &nw.crc);
	if (rc != 0 && nw.chunk_id == 0)
		goto out; /* no id allocated: nothing to record */
	moved = slot_move(x, &st, idx, node, chunk, &nw, rc == 0);
	rc = rc ? rc : moved < 0 ? moved : 0;
	if (!rc && !moved) /* the file changed meanwhile: nothing was repaired */
		len = 0;
	if (!rc && len) {
		mst_add(m, KVP_MST_REPAIRED, 1);
		mst_add(m, KVP_MST_REPAIR_BYTES, len);
	}
	mbg_kick(m);
out:
	free(mem);
	if (rc < 0) {
		mst_add(m, KVP_MST_REPAIR_FAILED, 1);
		klog_warn("repair: ino %llu stripe %u chunk %llu on node %u: %s",
			  (unsigned long long)ino, s, (unsigned long long)chunk, node,
			  kvp_strerror(rc));
		return rc;
	}
	return len ? len : 1; /* 1: done, counted even for an empty chunk */
}

static void job_progress(struct meta *m, uint64_t bytes, int failed)
{
	pthread_mutex_lock(&m->job_mu);
	m->job.done += (uint64_t)(failed == 0); /* a failed chunk is not done */
	m->job.bytes += bytes;
	m->job.failed += (uint64_t)(failed != 0);
	pthread_mutex_unlock(&m->job_mu);
}

/* Sleeps as needed so that `bytes` since `start` stay under rate bytes/s. */
static void throttle(uint64_t rate, uint64_t bytes, int64_t start)
{
	if (!rate)
		return;
	int64_t due = start + (int64_t)((double)bytes / (double)rate * 1e9);
	int64_t now = meta_mono_ns();
	if (due > now) {
		int64_t d = due - now > 500000000 ? 500000000 : due - now;
		struct timespec ts = {d / 1000000000, d % 1000000000};
		nanosleep(&ts, NULL);
	}
}

static uint64_t rev_count(struct meta *m, uint32_t node)
{
	uint8_t k[MK_MAX];
	size_t plen = mk_rev(k, node, 0) - 8;
	uint64_t n = 0;
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
	for (rocksdb_iter_seek(it, (const char *)k, plen + 8); rocksdb_iter_valid(it);
	     rocksdb_iter_next(it)) {
		size_t kl;
		const char *key = rocksdb_iter_key(it, &kl);
		if (kl != plen + 8 || memcmp(key, k, plen))
			break;
		n++;
	}
	rocksdb_iter_destroy(it);
	return n;
}

struct rent {
	uint64_t chunk, ino;
	uint32_t stripe;
};

/* One page of a node's chunks, shared by MREP_THREADS threads taking entries in turn. */
struct page_run {
	struct rctx *x;
	const struct rent *page;
	size_t n;
	atomic_size_t next;
	uint32_t node;
	int mode;
	uint64_t rate;
	int64_t start;
};

struct page_thread {
	struct page_run *run;
	struct rctx x; /* a copy with this thread's inflight slot */
};

static void *page_thread_main(void *arg)
{
	struct page_thread *t = arg;
	struct page_run *r = t->run;
	struct meta *m = r->x->m;
	for (;;) {
		size_t i = atomic_fetch_add(&r->next, 1);
		if (i >= r->n || worker_stopping(m))
			break;
		const struct rent *e = &r->page[i];
		int64_t rc = repair_slot(&t->x, e->ino, e->stripe, r->node, e->chunk, r->mode);
		job_progress(m, rc > 1 ? (uint64_t)rc : 0, rc < 0);
		pthread_mutex_lock(&m->job_mu);
		uint64_t bytes = m->job.bytes;
		pthread_mutex_unlock(&m->job_mu);
		throttle(r->rate, bytes, r->start);
	}
	return NULL;
}

/* Every chunk owned by `node`, page by page, through repair_slot on MREP_THREADS threads. */
static void node_job(struct rctx *x, uint32_t node, int mode, uint64_t rate, int64_t start)
{
	struct meta *m = x->m;
	struct rent page[PAGE];
	uint64_t after = 0;
	int first = 1;
	while (!worker_stopping(m)) {
		uint8_t k[MK_MAX];
		size_t plen = mk_rev(k, node, 0) - 8, n = 0;
		size_t kl0 = mk_rev(k, node, after);
		rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
		for (rocksdb_iter_seek(it, (const char *)k, kl0);
		     rocksdb_iter_valid(it) && n < PAGE; rocksdb_iter_next(it)) {
			size_t kl, vl;
			const uint8_t *key = (const uint8_t *)rocksdb_iter_key(it, &kl);
			if (kl != plen + 8 || memcmp(key, k, plen))
				break;
			uint64_t id = mk_rd_be64(key + plen);
			if (!first && id <= after)
				continue;
			const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vl);
			if (vl != 12)
				continue;
			struct rent e = {.chunk = id};
			for (int i = 7; i >= 0; i--)
				e.ino = e.ino << 8 | v[i];
			for (int i = 11; i >= 8; i--)
				e.stripe = e.stripe << 8 | v[i];
			page[n++] = e;
		}
		rocksdb_iter_destroy(it);
		if (!n)
			break;
		struct page_run pr = {.x = x,
				      .page = page,
				      .n = n,
				      .node = node,
				      .mode = mode,
				      .rate = rate,
				      .start = start};
		pthread_t t[MREP_THREADS];
		struct page_thread pt[MREP_THREADS];
		int nt = 0;
		for (int i = 0; i < MREP_THREADS && (size_t)i < n; i++) {
			pt[i] = (struct page_thread){.run = &pr, .x = *x};
			pt[i].x.slot = i;
			if (pthread_create(&t[nt], NULL, page_thread_main, &pt[i]) == 0)
				nt++;
		}
		if (nt == 0) { /* no thread: do it here */
			pt[0] = (struct page_thread){.run = &pr, .x = *x};
			page_thread_main(&pt[0]);
		}
		for (int i = 0; i < nt; i++)
			pthread_join(t[i], NULL);
		after = page[n - 1].chunk;
		first = 0;
	}
}

/* Scrub: every stripe's chunks on live nodes are read and checked; a bad or missing one is
 * rebuilt from the others. */
/* One page of a family keyed (u8 family, be64 ino, be32 stripe): the keys after k (kl bytes;
 * a 13-byte k that exists is the previous page's last key and is skipped), at most PAGE. */
struct spage {
	uint64_t ino;
	uint32_t s;
};

static size_t stripe_page(struct meta *m, const uint8_t *k, size_t kl, uint8_t family,
			  struct spage *page)
{
	size_t n = 0;
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
	for (rocksdb_iter_seek(it, (const char *)k, kl); rocksdb_iter_valid(it) && n < PAGE;
	     rocksdb_iter_next(it)) {
		size_t len;
		const uint8_t *key = (const uint8_t *)rocksdb_iter_key(it, &len);
		if (len != 13 || key[0] != family)
			break;
		if (memcmp(key, k, 13) == 0)
			continue; /* the last key of the previous page */
		page[n].ino = mk_rd_be64(key + 1);
		page[n].s = mk_rd_be32(key + 9);
		n++;
	}
	rocksdb_iter_destroy(it);
	return n;
}

static void scrub_job(struct rctx *x, uint64_t rate, int64_t start)
{
	struct meta *m = x->m;
	uint8_t k[MK_MAX];
	size_t kl0 = mk_stripe(k, 0, 0); /* no stripe has inode 0: the family's start */
	uint8_t *buf = NULL;
	size_t bufcap = 0;
	while (!worker_stopping(m)) {
		struct spage page[PAGE];
		size_t n = stripe_page(m, k, kl0, MK_STRIPE, page);
		if (!n)
			break;
		kl0 = mk_stripe(k, page[n - 1].ino, page[n - 1].s);
		for (size_t p = 0; p < n && !worker_stopping(m); p++) {
			struct rstripe st;
			if (stripe_load(m, page[p].ino, page[p].s, &st))
				continue;
			struct kvch_call call[KVEC_MAX_N] = {0};
			size_t need = (size_t)st.len[0] + 1;
			if (need > bufcap) {
				uint8_t *nb = realloc(buf, need);
				if (!nb)
					break;
				buf = nb;
				bufcap = need;
			}
			const struct rnode *nd[KVEC_MAX_N] = {0};
			for (uint32_t i = 0; i < st.w; i++) {
				if (st.len[i] == 0) { /* empty, never stored: nothing to check */
					job_progress(m, 0, 0);
					continue;
				}
				nd[i] = node_find(x->nodes, x->nnodes, st.slot[i].node_id);
				if (!nd[i] || nd[i]->state != KVP_NODE_UP)
					continue;
				kvch_verify_start(m->pool, nd[i]->addr, st.slot[i].chunk_id,
						  &call[i]);
			}
			for (uint32_t i = 0; i < st.w; i++) {
				if (!call[i].call)
					continue;
				int rc = kvch_verify_finish(&call[i], IO_TIMEOUT_MS, st.len[i],
							    st.slot[i].crc);
				if (rc == -EOPNOTSUPP) /* an older node: read the chunk over */
					rc = chunk_get(m, nd[i]->addr, &st.slot[i], st.len[i], buf);
				mst_add(m, KVP_MST_SCRUB_CHECKED, 1);
				int bad = rc == -ENOENT || rc == -EILSEQ;
				if (!bad) {
					job_progress(m, st.len[i], 0);
					continue;
				}
				mst_add(m,
					rc == -ENOENT ? KVP_MST_SCRUB_MISSING
						      : KVP_MST_SCRUB_CORRUPT,
					1);
				klog_warn("scrub: ino %llu stripe %u chunk %llu on node %u: %s",
					  (unsigned long long)st.f.ino, st.s,
					  (unsigned long long)st.slot[i].chunk_id,
					  st.slot[i].node_id, kvp_strerror(rc));
				int64_t r = repair_slot(x, st.f.ino, st.s, st.slot[i].node_id,
							st.slot[i].chunk_id, MODE_SCRUB);
				if (r > 0)
					mst_add(m, KVP_MST_SCRUB_REPAIRED, 1);
				job_progress(m, st.len[i], r < 0);
			}
			pthread_mutex_lock(&m->job_mu);
			uint64_t done = m->job.bytes;
			pthread_mutex_unlock(&m->job_mu);
			throttle(rate, done, start);
		}
	}
	free(buf);
}

static uint64_t family_count(struct meta *m, uint8_t family)
{
	uint64_t n = 0;
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
	for (rocksdb_iter_seek(it, (const char *)&family, 1); rocksdb_iter_valid(it);
	     rocksdb_iter_next(it)) {
		size_t kl;
		const char *key = rocksdb_iter_key(it, &kl);
		if (kl < 1 || (uint8_t)key[0] != family)
			break;
		n++;
	}
	rocksdb_iter_destroy(it);
	return n;
}

/* 1 when an up, non-draining node holds no chunk of the stripe: a missing slot can go there. */
static int has_dest(const struct rctx *x, const struct rstripe *st)
{
	for (size_t i = 0; i < x->nnodes; i++) {
		const struct rnode *n = &x->nodes[i];
		int taken = 0;
		for (uint32_t j = 0; j < st->w; j++)
			taken |= st->slot[j].node_id == n->id;
		if (n->state == KVP_NODE_UP && !n->draining && !taken)
			return 1;
	}
	return 0;
}

/* Stripes written degraded (`G` keys): each slot not stored (node 0) is rebuilt onto a node
 * the stripe does not use, and each second chunk on a node (older metas' --allow-degraded) is
 * moved to one; the mark goes once none is left. A missing slot with no node to go to is left
 * for later, not counted failed. Returns the stripes still degraded. */
static size_t degraded_job(struct rctx *x)
{
	struct meta *m = x->m;
	uint8_t k[MK_MAX];
	size_t kl0 = mk_degraded(k, 0, 0), still = 0;
	while (!worker_stopping(m)) {
		struct spage page[PAGE];
		size_t n = stripe_page(m, k, kl0, MK_DEGRADED, page);
		if (!n)
			break;
		kl0 = mk_degraded(k, page[n - 1].ino, page[n - 1].s);
		for (size_t p = 0; p < n && !worker_stopping(m); p++) {
			struct rstripe st;
			int left = 0, failed = 0;
			if (stripe_load(m, page[p].ino, page[p].s, &st) == 0)
				for (uint32_t j = 0; j < st.w; j++) {
					int dup = 0;
					for (uint32_t i = 0; i < j; i++)
						dup |= st.slot[i].node_id == st.slot[j].node_id;
					if (st.slot[j].node_id && !dup)
						continue;
					if (!st.slot[j].node_id && !has_dest(x, &st)) {
						left = 1;
						continue;
					}
					int64_t r = repair_slot(
					    x, st.f.ino, st.s, st.slot[j].node_id,
					    st.slot[j].chunk_id,
					    st.slot[j].node_id ? MODE_DRAIN : MODE_REPAIR);
					job_progress(m, r > 1 ? (uint64_t)r : 0, r < 0);
					failed |= r < 0;
					if (r > 0) /* later slots see where this one went */
						stripe_load(m, page[p].ino, page[p].s, &st);
				}
			if (!failed && !left && stripe_load(m, page[p].ino, page[p].s, &st) == 0)
				for (uint32_t j = 0; j < st.w; j++)
					for (uint32_t i = 0; i <= j; i++)
						left |= !st.slot[j].node_id ||
							(i < j &&
							 st.slot[i].node_id == st.slot[j].node_id);
			if (!failed && !left) { /* whole again, or the file is gone */
				uint8_t dk[MK_MAX];
				rocksdb_writebatch_t *b = rocksdb_writebatch_create();
				rocksdb_writebatch_delete(b, (const char *)dk,
							  mk_degraded(dk, page[p].ino, page[p].s));
				mdb_write(m, b);
				rocksdb_writebatch_destroy(b);
			} else {
				still++;
			}
		}
	}
	return still;
}

int mrep_degraded_count(struct meta *m, uint64_t *stripes, uint64_t *files)
{
	uint8_t k = MK_DEGRADED;
	uint64_t last = 0;
	*stripes = *files = 0;
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
	for (rocksdb_iter_seek(it, (const char *)&k, 1); rocksdb_iter_valid(it);
	     rocksdb_iter_next(it)) {
		size_t kl;
		const uint8_t *key = (const uint8_t *)rocksdb_iter_key(it, &kl);
		if (kl != 13 || key[0] != MK_DEGRADED)
			break;
		uint64_t ino = mk_rd_be64(key + 1);
		(*stripes)++;
		*files += ino != last; /* keys are in inode order */
		last = ino;
	}
	rocksdb_iter_destroy(it);
	return 0;
}

/* Runs one job; returns the degraded stripes a repair left (0 for other jobs). */
static size_t run_job(struct meta *m, struct kvec_codec **codecs, uint8_t kind, uint32_t node,
		      uint64_t rate)
{
	pthread_mutex_t mu;
	pthread_mutex_init(&mu, NULL);
	struct rctx x = {.m = m, .codecs = codecs, .mu = &mu};
	x.nodes = nodes_copy(m, &x.nnodes);
	if (!x.nodes) {
		pthread_mutex_destroy(&mu);
		return 0;
	}
	uint32_t targets[256];
	size_t nt = 0;
	if (kind == KVP_MAINT_SCRUB || node == UINT32_MAX)
		; /* UINT32_MAX: degraded stripes only (automatic) */
	else if (node)
		targets[nt++] = node;
	else
		for (size_t i = 0; i < x.nnodes && nt < 256; i++)
			if (x.nodes[i].state == KVP_NODE_DOWN)
				targets[nt++] = x.nodes[i].id;
	uint64_t total = 0;
	if (kind == KVP_MAINT_SCRUB)
		total = family_count(m, MK_REV); /* every stored chunk */
	for (size_t i = 0; i < nt; i++)
		total += rev_count(m, targets[i]);
	int fix = kind == KVP_MAINT_REPAIR && (node == 0 || node == UINT32_MAX);
	if (fix) /* at least one chunk to move per degraded stripe */
		total += family_count(m, MK_DEGRADED);
	int64_t start = meta_mono_ns();
	pthread_mutex_lock(&m->job_mu);
	m->job = (struct mjob){
	    .kind = kind, .running = 1, .node = node, .total = total, .start_mono = start};
	pthread_mutex_unlock(&m->job_mu);
	const char *what = kind == KVP_MAINT_SCRUB   ? "scrub"
			   : kind == KVP_MAINT_DRAIN ? "drain"
						     : "repair";
	klog_info("%s started: %llu chunks", what, (unsigned long long)total);
	/* Degraded stripes first: each is one failure away from loss with m = 1, and their
	 * missing slots are the cheapest redundancy to restore. */
	size_t left = fix ? degraded_job(&x) : 0;
	if (kind == KVP_MAINT_SCRUB)
		scrub_job(&x, rate, start);
	else
		for (size_t i = 0; i < nt; i++)
			node_job(&x, targets[i], kind == KVP_MAINT_DRAIN ? MODE_DRAIN : MODE_REPAIR,
				 rate, start);
	pthread_mutex_lock(&m->job_mu);
	m->job.running = 0;
	m->job.end_mono = meta_mono_ns();
	if (kind == KVP_MAINT_SCRUB)
		m->last_scrub_mono = m->job.end_mono;
	struct mjob j = m->job;
	/* A job that found nothing to do (`kvfs repair` with every node up, a scrub of an
	 * empty cluster) leaves the last one that did on show (kvfs jobs, metrics). */
	if (j.total || j.done || j.failed)
		m->last_job = j;
	else
		m->job = m->last_job;
	pthread_mutex_unlock(&m->job_mu);
	double secs = (double)(j.end_mono - j.start_mono) / 1e9;
	klog_info("%s done: %llu of %llu chunks, %llu failed, %.1f MiB in %.2f s", what,
		  (unsigned long long)j.done, (unsigned long long)j.total,
		  (unsigned long long)j.failed, (double)j.bytes / 1048576.0, secs);
	free(x.nodes);
	pthread_mutex_destroy(&mu);
	return left;
}

/* Automatic work when idle: repair nodes down longer than the repair delay, and a background
 * scrub every scrub interval. Returns 1 when it ran something. */
/* Nodes up and not draining. Caller holds m->nodes_mu. */
/* How long an automatic repair that could not finish waits before it is tried again with
 * no more nodes up than before. */
#define REPAIR_RETRY_NS (600 * 1000000000LL)

static size_t nodes_up(const struct meta *m)
{
	size_t up = 0;
	for (size_t i = 0; i < m->nnodes; i++)
		up += m->nodes[i].state == KVP_NODE_UP && !m->nodes[i].draining;
	return up;
}

/* Degraded stripes, before any other work: at once when more nodes are up than at the last
 * look (a node came back or was added); else every 10 s, but after an attempt that left some
 * only with more nodes up than then, or after REPAIR_RETRY_NS. Returns 1 when it ran. */
static int auto_degraded(struct meta *m, struct kvec_codec **codecs, int64_t now)
{
	pthread_mutex_lock(&m->nodes_mu);
	size_t up = nodes_up(m);
	uint64_t arrivals = m->node_arrivals;
	pthread_mutex_unlock(&m->nodes_mu);
	int rise = up > m->degraded_seen_up || arrivals != m->degraded_seen_arrivals;
	m->degraded_seen_up = up;
	m->degraded_seen_arrivals = arrivals;
	int64_t since = now - m->last_degraded_mono;
	int due = since >= 10000000000LL && (up > m->degraded_fail_up || since >= REPAIR_RETRY_NS);
	if (!rise && !due)
		return 0;
	m->last_degraded_mono = now;
	if (!family_count(m, MK_DEGRADED))
		return 0;
	size_t left = run_job(m, codecs, KVP_MAINT_REPAIR, UINT32_MAX, m->o.repair_rate);
	m->degraded_fail_up = left ? up : 0;
	return 1;
}

static int auto_job(struct meta *m, struct kvec_codec **codecs)
{
	if (m->raft && !mraft_serving(m->raft))
		return 0; /* a follower repairs nothing: the leader does */
	int64_t now = meta_mono_ns();
	if (auto_degraded(m, codecs, now))
		return 1;
	if (m->o.repair_delay_s > 0) {
		uint32_t due = 0;
		pthread_mutex_lock(&m->nodes_mu);
		size_t up = nodes_up(m);
		for (size_t i = 0; i < m->nnodes && !due; i++) {
			const struct mnode *d = &m->nodes[i];
			/* A repair of this down spell that left chunks behind (no node to put
			 * them on: 10+1 on 11 nodes) waits for more nodes or REPAIR_RETRY_NS,
			 * instead of starting over every pass. */
			int backoff = d->repair_fail_mono > d->down_mono &&
				      up <= d->repair_fail_up &&
				      now - d->repair_fail_mono < REPAIR_RETRY_NS;
			if (d->state == KVP_NODE_DOWN && d->down_mono && !backoff &&
			    now - d->down_mono >= (int64_t)(m->o.repair_delay_s * 1e9))
				due = d->id;
		}
		pthread_mutex_unlock(&m->nodes_mu);
		if (due && rev_count(m, due)) {
			klog_info("node %u down for over %.0f s: repairing its chunks", due,
				  m->o.repair_delay_s);
			run_job(m, codecs, KVP_MAINT_REPAIR, due, m->o.repair_rate);
			int left = rev_count(m, due) > 0;
			pthread_mutex_lock(&m->nodes_mu);
			for (size_t i = 0; i < m->nnodes; i++)
				if (m->nodes[i].id == due && left) {
					m->nodes[i].repair_fail_mono = meta_mono_ns();
					m->nodes[i].repair_fail_up = up;
				}
			pthread_mutex_unlock(&m->nodes_mu);
			if (left)
				klog_warn(
				    "node %u: chunks left unrepaired; retried when more nodes "
				    "are up or in %d s",
				    due, (int)(REPAIR_RETRY_NS / 1000000000LL));
			return 1;
		}
	}
	if (m->o.scrub_interval_s > 0) {
		pthread_mutex_lock(&m->job_mu);
		int64_t last = m->last_scrub_mono;
		pthread_mutex_unlock(&m->job_mu);
		if (now - last >= (int64_t)(m->o.scrub_interval_s * 1e9)) {
			run_job(m, codecs, KVP_MAINT_SCRUB, 0, m->o.scrub_rate);
			return 1;
		}
	}
	return 0;
}

static void *worker_main(void *arg)
{
	struct meta *m = arg;
	struct kvec_codec **codecs = calloc((KVEC_MAX_K + 1) * (KVEC_MAX_M + 1), sizeof(*codecs));
	if (!codecs)
		return NULL;
	pthread_mutex_lock(&m->job_mu);
	m->last_scrub_mono = meta_mono_ns(); /* the first background scrub waits an interval */
	pthread_mutex_unlock(&m->job_mu);
	while (!worker_stopping(m)) {
		pthread_mutex_lock(&m->job_mu);
		if (!m->req_kind) {
			struct timespec t;
			kvfs_deadline(&t, CLOCK_MONOTONIC, 200);
			pthread_cond_timedwait(&m->job_cv, &m->job_mu, &t);
		}
		uint8_t kind = m->req_kind;
		uint32_t node = m->req_node;
		pthread_mutex_unlock(&m->job_mu);
		if (kind) {
			run_job(m, codecs, kind, node, 0);
			pthread_mutex_lock(&m->job_mu);
			m->req_kind = 0;
			pthread_mutex_unlock(&m->job_mu);
		} else {
			auto_job(m, codecs);
		}
	}
	for (int i = 0; i < (KVEC_MAX_K + 1) * (KVEC_MAX_M + 1); i++)
		kvec_codec_destroy(codecs[i]);
	free(codecs);
	return NULL;
}

int mrep_request(struct meta *m, uint8_t kind, uint32_t node)
{
	pthread_mutex_lock(&m->job_mu);
	int rc = 0;
	if (m->req_kind || m->job.running)
		rc = -EBUSY;
	else {
		m->req_kind = kind;
		m->req_node = node;
		/* Visible as running at once, so a poller never sees the previous job's end. */
		m->job = (struct mjob){
		    .kind = kind, .running = 1, .node = node, .start_mono = meta_mono_ns()};
		pthread_cond_signal(&m->job_cv);
	}
	pthread_mutex_unlock(&m->job_mu);
	return rc;
}

int mrep_start(struct meta *m)
{
	int rc = pthread_create(&m->worker, NULL, worker_main, m);
	if (rc)
		return -rc;
	m->worker_started = 1;
	return 0;
}

void mrep_stop(struct meta *m)
{
	if (!m->worker_started)
		return;
	pthread_mutex_lock(&m->bg_mu);
	m->stopping = 1;
	pthread_mutex_unlock(&m->bg_mu);
	pthread_mutex_lock(&m->job_mu);
	pthread_cond_signal(&m->job_cv);
	pthread_mutex_unlock(&m->job_mu);
	pthread_join(m->worker, NULL);
	m->worker_started = 0;
}
