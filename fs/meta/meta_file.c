/* The write path of kvfs-meta: ALLOC (placement + a pending-write record), COMMIT (one batch:
 * inode, dirent, stripe map, pending removal, deletions for a replaced file), ABORT, LAYOUT,
 * and expiry of writes that were never committed. */
#define KVFS_LOG_TAG "meta"
#include "log.h"
#include "meta_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CHUNK_MIN (4096u)
#define CHUNK_MAX (16u << 20)
/* Headroom for the fixed fields and the node list of an ALLOC reply / COMMIT request. */
#define BODY_SLACK (64u << 10)

/* A pending write: what ALLOC handed out, so COMMIT can be checked against it and ABORT or
 * expiry can queue its chunks for deletion. Chunk id of slot i = first + i; write_id = first. */
static int check_geometry(uint8_t k, uint8_t m, uint32_t chunk_size, uint32_t nstripes)
{
	if (k < 1 || chunk_size < CHUNK_MIN || chunk_size > CHUNK_MAX || chunk_size % 4096)
		return -EINVAL;
	if (nstripes > KVP_MAX_STRIPES)
		return -EFBIG;
	/* The ALLOC reply (12 bytes a slot) and COMMIT request (16) must fit in one frame. */
	if ((uint64_t)nstripes * (uint64_t)(k + m) * MREQ_SLOT_SIZE > KVP_MAX_BODY - BODY_SLACK)
		return -EFBIG;
	return 0;
}

/* -ESTALE for an unknown (aborted, expired or committed) write id. */
static int pend_get(struct meta *m, uint64_t write_id, struct mpend *p)
{
	uint8_t k[MK_MAX];
	char *v;
	size_t vl;
	int rc = mdb_get(m, NULL, k, mk_pending(k, write_id), &v, &vl);
	if (rc)
		return rc == -ENOENT ? -ESTALE : rc;
	rc = mdb_pend_decode(v, vl, p);
	rocksdb_free(v);
	if (rc == -EIO)
		klog_error("pending write %llu: corrupt record", (unsigned long long)write_id);
	if (rc) {
		free(p->node);
		p->node = NULL;
	}
	return rc;
}

/* ---- placement ---- */

struct cand {
	uint32_t id;
	int64_t free;  /* bytes, after what this request already placed on it */
	uint32_t tie;  /* random: equal nodes are taken in a random order */
	uint32_t zone; /* 0..n-1, equal for nodes of one zone; a node with none has its own */
	char addr[KVP_ADDR_MAX];
	uint32_t used_here;
	uint64_t placed; /* bytes this request put on it */
};

static int cand_before(const struct cand *a, const struct cand *b)
{
	return a->free > b->free || (a->free == b->free && a->tie < b->tie);
}

static void cand_sort(struct cand *c, size_t n)
{
	for (size_t i = 1; i < n; i++) { /* insertion sort: nearly sorted after each stripe */
		struct cand t = c[i];
		size_t j = i;
		for (; j > 0 && cand_before(&t, &c[j - 1]); j--)
			c[j] = c[j - 1];
		c[j] = t;
	}
}

/* Up nodes into *out (malloc'd). Returns the count or a negative errno. */
static int up_nodes(struct meta *m, struct cand **out)
{
	mnodes_check(m);
	pthread_mutex_lock(&m->nodes_mu);
	struct cand *c = calloc(m->nnodes ? m->nnodes : 1, sizeof(*c));
	const char **zname = calloc(m->nnodes ? m->nnodes : 1, sizeof(*zname));
	size_t n = 0;
	if (!zname) {
		free(c);
		c = NULL;
	}
	if (c) {
		for (size_t i = 0; i < m->nnodes; i++) {
			const struct mnode *nd = &m->nodes[i];
			if (nd->state != KVP_NODE_UP || nd->draining)
				continue;
			/* Chunks deleted since its last report are free; ones only queued for
			 * deletion are not yet (the node would refuse the PUT), though the
			 * watermark already counts them as gone (mnodes_usage). */
			uint64_t gone = mnode_freed(nd), taken = nd->used + nd->pending;
			taken = taken > gone ? taken - gone : 0;
			c[n].id = nd->id;
			c[n].free = nd->capacity > taken ? (int64_t)(nd->capacity - taken) : 0;
			c[n].tie = (uint32_t)random();
			c[n].zone = (uint32_t)n;
			for (size_t j = 0; nd->zone[0] && j < n; j++)
				if (strcmp(zname[j], nd->zone) == 0) {
					c[n].zone = c[j].zone;
					break;
				}
			zname[n] = nd->zone;
			memcpy(c[n].addr, nd->addr, KVP_ADDR_MAX);
			n++;
		}
	}
	free(zname);
	pthread_mutex_unlock(&m->nodes_mu);
	*out = c;
	return c ? (int)n : -ENOMEM;
}

/* Picks nsel distinct candidates of c (sorted, n of them) into sel (indices), fewest chunks
 * per zone first: round r admits a zone's r-th node, so with at least nsel zones no zone gets
 * two, and otherwise the zones' shares differ by at most one where their nodes allow. Within
 * a round the emptiest nodes go first. zcount (n entries) is scratch. Returns the count
 * picked, less than nsel only when fewer nodes have chunk_size bytes free. */
static size_t pick(const struct cand *c, size_t n, size_t nsel, uint32_t chunk_size,
		   uint32_t *zcount, uint8_t *taken, size_t *sel)
{
	size_t got = 0;
	memset(zcount, 0, n * sizeof(*zcount));
	memset(taken, 0, n);
	for (uint32_t round = 1; got < nsel && round <= n; round++) {
		size_t before = got;
		for (size_t j = 0; j < n && got < nsel; j++) {
			if (taken[j] || zcount[c[j].zone] >= round ||
			    c[j].free < (int64_t)chunk_size)
				continue;
			taken[j] = 1;
			zcount[c[j].zone]++;
			sel[got++] = j;
		}
		if (got == before && round > 1)
			break; /* every node that fits is taken */
	}
	return got;
}

/* Each stripe goes to k+m nodes in as many zones as there are (pick): among nodes of equal
 * standing the ones with the most free space left, counting what earlier stripes of this
 * request put there, so the emptiest nodes fill first and equal ones rotate. Which of the
 * chosen nodes gets which slot is shuffled per stripe: healthy reads touch only data slots,
 * so a fixed order would leave the same nodes holding parity, never read.
 * With only n < k+m nodes (a degraded write, n >= k) the last k+m-n slots, parity, get node
 * 0 (not written, repaired later): a stripe never holds two chunks on one node, and reads
 * still need no decoding. Returns 0, -ENOSPC or -ENOMEM. */
static int place(struct cand *c, size_t n, const struct mpend *p)
{
	size_t w = (size_t)(p->k + p->m), nsel = n < w ? n : w;
	uint64_t rng = ((uint64_t)random() << 32 | (uint64_t)random()) | 1;
	uint32_t *zcount = calloc(n ? n : 1, sizeof(*zcount));
	uint8_t *taken = calloc(n ? n : 1, 1);
	size_t *sel = calloc(w, sizeof(*sel));
	int rc = zcount && taken && sel ? 0 : -ENOMEM;
	cand_sort(c, n);
	for (uint32_t s = 0; !rc && s < p->nstripes; s++) {
		if (nsel == 0 || pick(c, n, nsel, p->chunk_size, zcount, taken, sel) < nsel) {
			rc = -ENOSPC;
			break;
		}
		uint32_t *slot = p->node + (size_t)s * w;
		for (size_t j = 0; j < w; j++)
			slot[j] = 0;
		for (size_t j = 0; j < nsel; j++) {
			struct cand *x = &c[sel[j]];
			slot[j] = x->id;
			x->free -= p->chunk_size;
			x->placed += p->chunk_size;
			x->used_here = 1;
		}
		for (size_t j = nsel - 1; j > 0; j--) { /* Fisher-Yates, xorshift64 */
			rng ^= rng << 13;
			rng ^= rng >> 7;
			rng ^= rng << 17;
			size_t r = (size_t)(rng % (j + 1));
			uint32_t t = slot[j];
			slot[j] = slot[r];
			slot[r] = t;
		}
		cand_sort(c, n);
	}
	free(zcount);
	free(taken);
	free(sel);
	return rc;
}

/* Chunks each stripe of a (k, m) file must store: k + min(--write-redundancy, m). */
static size_t min_stored(const struct meta *m, uint8_t k, uint8_t mm)
{
	int r = m->o.write_redundancy < mm ? m->o.write_redundancy : mm;
	return (size_t)k + (size_t)(r > 0 ? r : 0);
}

int mfile_alloc(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	int rc = check_geometry(q->k, q->m, q->chunk_size, q->nstripes);
	if (rc)
		return rc;
	struct cand *c;
	int n = up_nodes(m, &c);
	if (n < 0)
		return n;
	struct mpend p = {.created_ns = meta_now_ns(),
			  .chunk_size = q->chunk_size,
			  .nstripes = q->nstripes,
			  .k = q->k,
			  .m = q->m};
	size_t w = (size_t)(q->k + q->m), slots = mpend_slots(&p);
	rocksdb_writebatch_t *b = NULL;
	/* A client that writes around missing nodes can take fewer than k+m; an older one
	 * cannot (it knows no node 0). */
	int around = (q->flags & KVP_ALLOC_WRITE_AROUND) != 0;
	size_t need = around ? min_stored(m, q->k, q->m) : w;
	if (q->flags & ~(uint32_t)KVP_ALLOC_WRITE_AROUND) {
		rc = -EINVAL;
		goto out;
	}
	if ((size_t)n < need) {
		rc = -EHOSTDOWN;
		goto out;
	}
	p.node = malloc(slots ? slots * sizeof(uint32_t) : 1);
	if (!p.node) {
		rc = -ENOMEM;
		goto out;
	}
	rc = place(c, (size_t)n, &p);
	if (rc == -ENOSPC && m->o.high_wm > 0) {
		/* Full: evict least recently used files, then try once more. */
		free(c);
		c = NULL;
		mlife_evict(m, (uint64_t)slots * q->chunk_size);
		n = up_nodes(m, &c);
		rc = n < 0 ? n : (size_t)n < need ? -EHOSTDOWN : place(c, (size_t)n, &p);
	}
	if (rc == -ENOSPC)
		mst_add(m, KVP_MST_ENOSPC, 1);
	if (rc)
		goto out;
	b = rocksdb_writebatch_create();
	pthread_mutex_lock(&m->mu);
	rc = mdb_alloc_chunks(m, slots ? slots : 1, &p.first);
	if (!rc)
		rc = mdb_pend_put(b, p.first, &p);
	if (!rc)
		rc = mdb_write(m, b);
	pthread_mutex_unlock(&m->mu);
	if (rc)
		goto out;

	if (m->o.high_wm > 0) { /* past the high watermark: wake the eviction pass now */
		uint64_t cap, used;
		mnodes_usage(m, &cap, &used);
		if (cap && used * 100 > cap * (uint64_t)m->o.high_wm)
			mbg_kick(m);
	}
	/* Count the placed bytes against each node until its next heartbeat reports them. */
	pthread_mutex_lock(&m->nodes_mu);
	for (int j = 0; j < n; j++)
		for (size_t i = 0; c[j].placed && i < m->nnodes; i++)
			if (m->nodes[i].id == c[j].id) {
				m->nodes[i].pending += c[j].placed;
				break;
			}
	pthread_mutex_unlock(&m->nodes_mu);

	kvp_w_u64(out, p.first);
	uint32_t nn = 0;
	for (int j = 0; j < n; j++)
		nn += c[j].used_here;
	kvp_w_u32(out, nn);
	for (int j = 0; j < n; j++)
		if (c[j].used_here) {
			kvp_w_u32(out, c[j].id);
			kvp_w_cstr(out, c[j].addr);
		}
	for (size_t i = 0; i < slots; i++) {
		kvp_w_u32(out, p.node[i]);
		kvp_w_u64(out, p.first + i);
	}
	if (around)
		kvp_w_u8(out, (uint8_t)need);
	klog_debug("alloc write %llu: %u stripes of %zu on %u nodes", (unsigned long long)p.first,
		   p.nstripes, w, nn);
out:
	if (b)
		rocksdb_writebatch_destroy(b);
	free(p.node);
	free(c);
	return rc;
}

/* Every slot must be a chunk this write was given, on the node it was placed on, each used
 * once, and a stripe's slots on distinct nodes; unused ones are left 0 in *seen for the caller
 * to queue for deletion. A slot with node 0 was not stored (written around a failed or absent
 * node): seen 2, and every stripe must still store `need` chunks (-EHOSTDOWN). The
 * distinctness check is quadratic in k+m, which ALLOC bounded by the number of nodes up, so it
 * runs only after the slots matched an allocation. */
static int commit_match(const struct mreq *q, const struct mpend *p, size_t need, uint8_t *seen)
{
	size_t slots = (size_t)q->nstripes * (size_t)(q->k + q->m), n = mpend_slots(p);
	if (p->k != q->k || p->m != q->m || p->chunk_size != q->chunk_size ||
	    q->nstripes > p->nstripes)
		return -EINVAL;
	for (size_t i = 0; i < slots; i++) {
		struct mreq_slot s;
		mreq_slot_get(q, i, &s);
		if (s.chunk_id < p->first || s.chunk_id - p->first >= n)
			return -EINVAL;
		size_t idx = (size_t)(s.chunk_id - p->first);
		if (seen[idx] || (s.node_id && p->node[idx] != s.node_id))
			return -EINVAL;
		seen[idx] = s.node_id ? 1 : 2;
	}
	size_t w = (size_t)(q->k + q->m);
	for (uint32_t st = 0; st < q->nstripes; st++) {
		size_t stored = 0;
		for (size_t a = 0; a < w; a++) {
			struct mreq_slot x;
			mreq_slot_get(q, (size_t)st * w + a, &x);
			stored += x.node_id != 0;
		}
		if (stored < need)
			return -EHOSTDOWN;
	}
	/* An ALLOC of an older meta (--allow-degraded) placed some stripes with a node twice on
	 * purpose; the binding of every chunk to the node meta chose (above) is then what is
	 * checked. */
	for (size_t i = 0; i < p->nstripes; i++)
		for (size_t a = 1; a < w; a++)
			for (size_t b = 0; b < a; b++)
				if (p->node[i * w + a] && p->node[i * w + a] == p->node[i * w + b])
					return 0;
	for (uint32_t st = 0; st < q->nstripes; st++)
		for (size_t a = 1; a < w; a++)
			for (size_t b = 0; b < a; b++) {
				struct mreq_slot x, y;
				mreq_slot_get(q, (size_t)st * w + a, &x);
				mreq_slot_get(q, (size_t)st * w + b, &y);
				if (x.node_id && x.node_id == y.node_id)
					return -EINVAL;
			}
	return 0;
}

/* size must need exactly nstripes stripes. */
static int commit_shape(const struct mreq *q)
{
	uint64_t stripe = (uint64_t)q->k * q->chunk_size;
	if (q->nstripes == 0 ? q->size != 0
			     : q->size <= (uint64_t)(q->nstripes - 1) * stripe ||
				   q->size > (uint64_t)q->nstripes * stripe)
		return -EINVAL;
	return 0;
}

/* The inode of a new regular file ino as COMMIT q describes it (q->mode's permission bits,
 * q->uid/gid, size, geometry and parent), every time set to now. */
static struct mino file_inode(const struct mreq *q, uint64_t ino, int64_t now)
{
	return (struct mino){.ino = ino,
			     .mode = S_IFREG | (q->mode & 07777),
			     .nlink = 1,
			     .size = q->size,
			     .mtime_ns = now,
			     .atime_ns = now,
			     .ctime_ns = now,
			     .chunk_size = q->chunk_size,
			     .k = q->k,
			     .m = q->m,
			     .nstripes = q->nstripes,
			     .parent = q->parent,
			     .access_ns = now,
			     .uid = q->uid,
			     .gid = q->gid};
}

/* The records of a new file f named q->name in q->parent with q's stripe map (q->slots, k,
 * m, nstripes): inode, directory entry, stripe keys, chunk owners (R), degraded marks (G) and
 * the access-time index; what COMMIT and BFILL both write. *degraded gets the stripes marked.
 * 0 or -ENOMEM (see mdb_inode_put). */
static int file_records(rocksdb_writebatch_t *b, const struct mino *f, const struct mreq *q,
			uint32_t *degraded)
{
	uint8_t k[MK_MAX];
	size_t w = (size_t)(q->k + q->m);
	uint64_t ino = f->ino;
	int rc = mdb_inode_put(b, f);
	if (rc)
		return rc;
	mdir_entry_put(b, q->parent, &q->name, ino, f->mode);
	for (uint32_t s = 0; s < q->nstripes; s++) {
		rocksdb_writebatch_put(b, (const char *)k, mk_stripe(k, ino, s),
				       (const char *)q->slots + (size_t)s * w * MREQ_SLOT_SIZE,
				       w * MREQ_SLOT_SIZE);
		int dup = 0;
		for (size_t j = 0; j < w; j++) {
			struct mreq_slot sl, o;
			mreq_slot_get(q, (size_t)s * w + j, &sl);
			if (!sl.node_id) { /* not stored: nothing owned, to rebuild */
				dup = 1;
				continue;
			}
			mdb_rev_put(b, sl.node_id, sl.chunk_id, ino, s);
			for (size_t i = 0; i < j; i++) {
				mreq_slot_get(q, (size_t)s * w + i, &o);
				dup |= o.node_id == sl.node_id;
			}
		}
		if (dup) { /* written degraded: the repair worker completes it first */
			rocksdb_writebatch_put(b, (const char *)k, mk_degraded(k, ino, s), "", 0);
			(*degraded)++;
		}
	}
	rocksdb_writebatch_put(b, (const char *)k, mk_atime(k, f->access_ns, ino), "", 0);
	return 0;
}

int mfile_commit(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	int rc = mreq_name_check(&q->name);
	if (!rc && (q->flags & ~1u))
		rc = -EINVAL;
	if (!rc)
		rc = check_geometry(q->k, q->m, q->chunk_size, q->nstripes);
	if (!rc)
		rc = commit_shape(q);
	if (rc)
		return rc;
	struct mpend p = {0};
	uint8_t *seen = NULL;
	struct mino par, old, f = {0};
	uint64_t oino, ino;
	uint32_t omode;
	int replaced = 0, leftovers = 0;
	uint32_t degraded = 0;
	int64_t now = meta_now_ns();
	uint8_t k[MK_MAX];
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	pthread_mutex_lock(&m->mu);
	if (q->write_id == 0) {
		if (q->nstripes) /* only an empty file needs no ALLOC */
			rc = -EINVAL;
	} else {
		rc = pend_get(m, q->write_id, &p);
		if (!rc) {
			seen = calloc(mpend_slots(&p) + 1, 1);
			rc = seen ? commit_match(q, &p, min_stored(m, q->k, q->m), seen) : -ENOMEM;
		}
	}
	if (!rc)
		rc = mdir_get(m, NULL, q->parent, &par);
	if (rc)
		goto out;
	rc = mdir_entry_get(m, NULL, q->parent, &q->name, &oino, &omode);
	if (rc == 0) {
		if (!(q->flags & 1u))
			rc = -EEXIST;
		else if (S_ISDIR(omode))
			rc = -EISDIR;
		else
			rc = mdb_inode_get(m, NULL, oino, &old);
		if (!rc)
			rc = mdb_file_drop(m, b, &old);
		if (rc)
			goto out;
		replaced = 1;
	} else if (rc != -ENOENT) {
		goto out;
	}
	rc = mdb_alloc_ino(m, &ino);
	if (rc)
		goto out;
	f = file_inode(q, ino, now);
	/* A file written over keeps its owner (as open(O_TRUNC) would): the writer was allowed
	 * to write it, not to take it. */
	if (replaced && old.uid != KVP_OWNER_NONE) {
		f.uid = old.uid;
		f.gid = old.gid;
	}
	rc = file_records(b, &f, q, &degraded);
	if (rc)
		goto out;
	if (q->write_id) {
		/* Unused chunks, and ones written around: a PUT that timed out may yet land. */
		for (size_t i = 0; i < mpend_slots(&p); i++)
			if (seen[i] != 1 && p.node[i]) {
				mdb_delq_put(b, p.node[i], p.first + i, now);
				leftovers = 1;
			}
		rocksdb_writebatch_delete(b, (const char *)k, mk_pending(k, q->write_id));
	}
	par.mtime_ns = par.ctime_ns = now;
	rc = mdb_inode_put(b, &par);
	if (rc)
		goto out;
	rc = mns_write(m, b, replaced ? 0 : 1, 0);
	if (!rc)
		klog_debug("commit %llu/%.*s -> ino %llu, %u stripes%s",
			   (unsigned long long)q->parent, q->name.len, q->name.p,
			   (unsigned long long)ino, q->nstripes, replaced ? " (replaced)" : "");
out:
	pthread_mutex_unlock(&m->mu);
	rocksdb_writebatch_destroy(b);
	free(seen);
	free(p.node);
	if (!rc) {
		struct kvp_attr a;
		mino_to_attr(&f, &a);
		if (degraded)
			mst_add(m, KVP_MST_DEGR_WRITES, degraded);
		kvp_w_attr(out, &a);
		if (replaced || leftovers)
			mbg_kick(m);
	}
	return rc;
}

struct bfent {
	uint64_t parent;
	struct mreq_str name;
};

static int bfent_cmp(const void *a, const void *b)
{
	const struct bfent *x = a, *y = b;
	if (x->parent != y->parent)
		return x->parent < y->parent ? -1 : 1;
	int c = memcmp(x->name.p, y->name.p, x->name.len < y->name.len ? x->name.len : y->name.len);
	return c ? c : (int)x->name.len - (int)y->name.len;
}

/* BFILL (kvp.h, benchmarks only): n files as ALLOC + COMMIT would leave them, in one batch
 * through mdb_write (so replicated like any write), without the round trips, the pending
 * record or chunk data. Placement is place()'s, the records file_records()', the parent's
 * times and the file counter as COMMIT sets them; skipped is only what a real write also
 * removes again (the P record) or keeps in memory (a node's pending bytes). */
int mfile_bfill(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	if (!m->o.bench_fill)
		return -EPERM;
	uint64_t stripe = (uint64_t)q->k * q->chunk_size;
	if (q->k < 1 || q->size == 0 || q->chunk_size == 0)
		return -EINVAL;
	uint64_t ns = (q->size + stripe - 1) / stripe;
	int rc =
	    ns > KVP_MAX_STRIPES ? -EFBIG : check_geometry(q->k, q->m, q->chunk_size, (uint32_t)ns);
	if (rc)
		return rc;
	struct mreq f = *q; /* per file: parent, name and slots */
	f.nstripes = (uint32_t)ns;
	f.mode = 0644; /* BFILL sends neither mode nor owner */
	f.uid = f.gid = KVP_OWNER_NONE;
	struct bfent *e = calloc(q->n, sizeof(*e)), *sorted = calloc(q->n, sizeof(*e));
	uint64_t *inos = calloc(q->n, sizeof(*inos));
	struct mpend p = {
	    .chunk_size = q->chunk_size, .nstripes = f.nstripes, .k = q->k, .m = q->m};
	size_t slots = mpend_slots(&p), w = (size_t)(q->k + q->m);
	p.node = malloc(slots * sizeof(uint32_t) + 1);
	struct kvp_wbuf sl;
	kvp_w_init(&sl);
	struct cand *c = NULL;
	rocksdb_writebatch_t *b = NULL;
	rc = e && sorted && inos && p.node ? 0 : -ENOMEM;
	size_t off = 0;
	for (uint32_t i = 0; !rc && i < q->n; i++)
		rc = mreq_bfill_next(q, &off, &e[i].parent, &e[i].name)
			 ? -EINVAL
			 : mreq_name_check(&e[i].name);
	if (!rc) { /* distinct: a second entry of a name would orphan the first's inode */
		memcpy(sorted, e, q->n * sizeof(*e));
		qsort(sorted, q->n, sizeof(*e), bfent_cmp);
		for (uint32_t i = 1; i < q->n && !rc; i++)
			if (!bfent_cmp(&sorted[i - 1], &sorted[i]))
				rc = -EINVAL;
	}
	int n = rc ? 0 : up_nodes(m, &c);
	if (!rc && n < 0)
		rc = n;
	if (!rc && (size_t)n < w)
		rc = -EHOSTDOWN;
	if (rc)
		goto done;
	b = rocksdb_writebatch_create();
	int64_t now = meta_now_ns();
	pthread_mutex_lock(&m->mu);
	for (uint32_t i = 0; !rc && i < q->n; i++) {
		uint64_t oino;
		uint32_t omode;
		struct mino par;
		f.parent = e[i].parent;
		f.name = e[i].name;
		rc = mdir_get(m, NULL, f.parent, &par);
		if (!rc)
			rc = mdir_entry_get(m, NULL, f.parent, &f.name, &oino, &omode);
		if (rc != -ENOENT) {
			rc = rc ? rc : -EEXIST;
			break;
		}
		rc = place(c, (size_t)n, &p);
		if (!rc)
			rc = mdb_alloc_chunks(m, slots, &p.first);
		if (!rc)
			rc = mdb_alloc_ino(m, &inos[i]);
		if (rc)
			break;
		sl.len = 0;
		for (size_t j = 0; j < slots; j++) {
			kvp_w_u32(&sl, p.node[j]);
			kvp_w_u64(&sl, p.first + j);
			kvp_w_u32(&sl, 0);
		}
		if (sl.err) {
			rc = sl.err;
			break;
		}
		f.slots = sl.p;
		struct mino in = file_inode(&f, inos[i], now);
		uint32_t degraded = 0;
		rc = file_records(b, &in, &f, &degraded);
		/* Each parent once (sorted by parent): its times, as COMMIT sets them. */
		if (!rc && (i == 0 || sorted[i].parent != sorted[i - 1].parent)) {
			rc = mdir_get(m, NULL, sorted[i].parent, &par);
			par.mtime_ns = par.ctime_ns = now;
			if (!rc)
				rc = mdb_inode_put(b, &par);
		}
	}
	if (!rc)
		rc = mns_write(m, b, q->n, 0);
	pthread_mutex_unlock(&m->mu);
	for (uint32_t i = 0; !rc && i < q->n; i++)
		kvp_w_u64(out, inos[i]);
done:
	if (b)
		rocksdb_writebatch_destroy(b);
	kvp_w_free(&sl);
	free(c);
	free(p.node);
	free(inos);
	free(sorted);
	free(e);
	return rc;
}

/* Queues every chunk of a pending write for deletion and drops the record. Caller holds mu. */
static void pend_drop(rocksdb_writebatch_t *b, uint64_t write_id, const struct mpend *p)
{
	uint8_t k[MK_MAX];
	int64_t now = meta_now_ns();
	for (size_t i = 0; i < mpend_slots(p); i++)
		if (p->node[i]) /* node 0: placed nowhere */
			mdb_delq_put(b, p->node[i], p->first + i, now);
	rocksdb_writebatch_delete(b, (const char *)k, mk_pending(k, write_id));
}

int mfile_abort(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	(void)out;
	struct mpend p = {0};
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	pthread_mutex_lock(&m->mu);
	int rc = pend_get(m, q->write_id, &p);
	if (rc == -ESTALE)
		rc = -ENOENT;
	if (!rc) {
		pend_drop(b, q->write_id, &p);
		rc = mdb_write(m, b);
	}
	pthread_mutex_unlock(&m->mu);
	rocksdb_writebatch_destroy(b);
	free(p.node);
	if (!rc)
		mbg_kick(m);
	return rc;
}

void mfile_expire(struct meta *m)
{
	uint8_t k[MK_MAX];
	int64_t cutoff = meta_now_ns() - (int64_t)(m->o.write_timeout_s * 1e9);
	int n = 0;
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	pthread_mutex_lock(&m->mu);
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
	k[0] = MK_PENDING;
	for (rocksdb_iter_seek(it, (const char *)k, 1); rocksdb_iter_valid(it) && n < 1024;
	     rocksdb_iter_next(it)) {
		size_t kl, vl;
		const char *key = rocksdb_iter_key(it, &kl);
		if (kl != 9 || key[0] != MK_PENDING)
			break;
		const char *v = rocksdb_iter_value(it, &vl);
		struct mpend p = {0};
		uint64_t id = mk_rd_be64((const uint8_t *)key + 1);
		if (mdb_pend_decode(v, vl, &p) == 0 && p.created_ns < cutoff) {
			klog_info("write %llu not committed in time: aborting it",
				  (unsigned long long)id);
			pend_drop(b, id, &p);
			n++;
		}
		free(p.node);
	}
	rocksdb_iter_destroy(it);
	if (n && mdb_write(m, b) == 0)
		mbg_kick(m);
	pthread_mutex_unlock(&m->mu);
	rocksdb_writebatch_destroy(b);
}

int mfile_layout(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	const rocksdb_snapshot_t *snap = rocksdb_create_snapshot(m->db);
	rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
	rocksdb_readoptions_set_snapshot(ro, snap);
	struct mino f;
	uint8_t *map = NULL;
	uint32_t *ids = NULL;
	int rc = mdb_inode_get(m, ro, q->ino, &f);
	if (!rc && S_ISDIR(f.mode))
		rc = -EISDIR;
	if (rc)
		goto out;
	size_t w = (size_t)(f.k + f.m), rec = w * MREQ_SLOT_SIZE, slots = (size_t)f.nstripes * w;
	map = malloc(f.nstripes * rec + 1);
	ids = malloc((slots + 1) * sizeof(*ids));
	if (!map || !ids) {
		rc = -ENOMEM;
		goto out;
	}
	uint8_t k[MK_MAX];
	size_t plen = mk_stripe(k, f.ino, 0) - 4;
	uint32_t got = 0;
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, ro);
	for (rocksdb_iter_seek(it, (const char *)k, plen + 4); rocksdb_iter_valid(it);
	     rocksdb_iter_next(it)) {
		size_t kl, vl;
		const char *key = rocksdb_iter_key(it, &kl);
		if (kl != plen + 4 || memcmp(key, k, plen))
			break;
		const char *v = rocksdb_iter_value(it, &vl);
		if (got >= f.nstripes || vl != rec ||
		    mk_rd_be32((const uint8_t *)key + plen) != got) {
			rc = -EIO;
			break;
		}
		memcpy(map + (size_t)got * rec, v, rec);
		got++;
	}
	rocksdb_iter_destroy(it);
	if (!rc && got != f.nstripes)
		rc = -EIO;
	if (rc) {
		klog_error("inode %llu: stripe map inconsistent", (unsigned long long)f.ino);
		goto out;
	}
	/* The distinct nodes, so the client learns each address once. */
	size_t nn = 0;
	struct mreq view = {.slots = map};
	for (size_t i = 0; i < slots; i++) {
		struct mreq_slot s;
		mreq_slot_get(&view, i, &s);
		size_t j = 0;
		while (j < nn && ids[j] != s.node_id)
			j++;
		if (j == nn)
			ids[nn++] = s.node_id;
	}
	kvp_w_u64(out, f.size);
	kvp_w_u32(out, f.chunk_size);
	kvp_w_u8(out, f.k);
	kvp_w_u8(out, f.m);
	kvp_w_u32(out, f.nstripes);
	kvp_w_u32(out, (uint32_t)nn);
	for (size_t j = 0; j < nn; j++) {
		/* Node 0 (a slot not stored) is no node: no address, down, never asked. */
		char addr[KVP_ADDR_MAX] = "";
		uint8_t state = KVP_NODE_DOWN;
		if (ids[j])
			mnodes_addr(m, ids[j], addr, &state);
		kvp_w_u32(out, ids[j]);
		kvp_w_cstr(out, addr);
		kvp_w_u8(out, state);
	}
	kvp_w_bytes(out, map, slots * MREQ_SLOT_SIZE);
out:
	free(map);
	free(ids);
	rocksdb_readoptions_destroy(ro);
	rocksdb_release_snapshot(m->db, snap);
	return rc;
}
