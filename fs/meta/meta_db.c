/* RocksDB access for kvfs-meta: open/create, key builders, inode records, counters.
 * RocksDB's errptr strings are converted to -EIO here, once, with a log line. */
#define KVFS_LOG_TAG "meta"
#include "log.h"
#include "meta_int.h"
#include "meta_raft.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DB_VERSION    "kvfs-meta 1"
#define INO_RESERVE   4096u
#define CHUNK_RESERVE (1u << 20)

int64_t meta_now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

int64_t meta_mono_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

void mk_be64(uint8_t *p, uint64_t v)
{
	for (int i = 7; i >= 0; i--, v >>= 8)
		p[i] = (uint8_t)v;
}

static void be32(uint8_t *p, uint32_t v)
{
	for (int i = 3; i >= 0; i--, v >>= 8)
		p[i] = (uint8_t)v;
}

uint64_t mk_rd_be64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

uint32_t mk_rd_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

size_t mk_counter(uint8_t *k, uint8_t id)
{
	k[0] = MK_COUNTER;
	k[1] = id;
	return 2;
}

size_t mk_inode(uint8_t *k, uint64_t ino)
{
	k[0] = MK_INODE;
	mk_be64(k + 1, ino);
	return 9;
}

size_t mk_dirent(uint8_t *k, uint64_t parent, const char *name, size_t len)
{
	k[0] = MK_DIRENT;
	mk_be64(k + 1, parent);
	memcpy(k + 9, name, len);
	return 9 + len;
}

size_t mk_stripe(uint8_t *k, uint64_t ino, uint32_t stripe)
{
	k[0] = MK_STRIPE;
	mk_be64(k + 1, ino);
	be32(k + 9, stripe);
	return 13;
}

size_t mk_node(uint8_t *k, uint32_t id)
{
	k[0] = MK_NODE;
	be32(k + 1, id);
	return 5;
}

size_t mk_uuid(uint8_t *k, uint64_t uuid)
{
	k[0] = MK_UUID;
	mk_be64(k + 1, uuid);
	return 9;
}

size_t mk_pending(uint8_t *k, uint64_t write_id)
{
	k[0] = MK_PENDING;
	mk_be64(k + 1, write_id);
	return 9;
}

size_t mk_delq(uint8_t *k, uint32_t node, uint64_t chunk)
{
	k[0] = MK_DELQ;
	be32(k + 1, node);
	mk_be64(k + 5, chunk);
	return 13;
}

size_t mk_atime(uint8_t *k, int64_t atime_ns, uint64_t ino)
{
	k[0] = MK_ATIME;
	/* Flipping the sign bit orders negative times before positive ones. */
	mk_be64(k + 1, (uint64_t)atime_ns ^ (1ull << 63));
	mk_be64(k + 9, ino);
	return 17;
}

size_t mk_rev(uint8_t *k, uint32_t node, uint64_t chunk)
{
	k[0] = MK_REV;
	be32(k + 1, node);
	mk_be64(k + 5, chunk);
	return 13;
}

size_t mk_degraded(uint8_t *k, uint64_t ino, uint32_t stripe)
{
	size_t n = mk_stripe(k, ino, stripe);
	k[0] = MK_DEGRADED;
	return n;
}

void mdb_delq_put(rocksdb_writebatch_t *b, uint32_t node, uint64_t chunk, int64_t now)
{
	uint8_t k[MK_MAX], v[8];
	for (int i = 0; i < 8; i++)
		v[i] = (uint8_t)((uint64_t)now >> (8 * i));
	rocksdb_writebatch_put(b, (const char *)k, mk_delq(k, node, chunk), (const char *)v, 8);
}

void mdb_rev_put(rocksdb_writebatch_t *b, uint32_t node, uint64_t chunk, uint64_t ino,
		 uint32_t stripe)
{
	uint8_t k[MK_MAX], v[12];
	for (int i = 0; i < 8; i++)
		v[i] = (uint8_t)(ino >> (8 * i));
	for (int i = 0; i < 4; i++)
		v[8 + i] = (uint8_t)(stripe >> (8 * i));
	rocksdb_writebatch_put(b, (const char *)k, mk_rev(k, node, chunk), (const char *)v, 12);
}

int mdb_get(struct meta *m, const rocksdb_readoptions_t *ro, const uint8_t *key, size_t klen,
	    char **val, size_t *vlen)
{
	char *err = NULL;
	*val = rocksdb_get(m->db, ro ? ro : m->ro, (const char *)key, klen, vlen, &err);
	if (err) {
		klog_error("rocksdb get: %s", err);
		rocksdb_free(err);
		return -EIO;
	}
	return *val ? 0 : -ENOENT;
}

_Thread_local int mdb_defer;

int mdb_write(struct meta *m, rocksdb_writebatch_t *b)
{
	if (m->raft) {
		size_t len;
		uint64_t seq;
		const char *data = rocksdb_writebatch_data(b, &len);
		int rc = mraft_propose_async(m->raft, data, len, &seq);
		return rc || mdb_defer ? rc : mraft_wait(m->raft, seq);
	}
	char *err = NULL;
	rocksdb_write(m->db, m->wo, b, &err);
	if (err) {
		klog_error("rocksdb write: %s", err);
		rocksdb_free(err);
		return -EIO;
	}
	return 0;
}

int mdb_settle(struct meta *m)
{
	return m->raft ? mraft_settle(m->raft) : 0;
}

int mdb_sync(struct meta *m)
{
	char *err = NULL;
	rocksdb_flush_wal(m->db, 1, &err);
	if (err) {
		klog_error("rocksdb WAL sync: %s", err);
		rocksdb_free(err);
		return -EIO;
	}
	return 0;
}

int mdb_rec_end(struct kvp_wbuf *w)
{
#ifdef KVFS_FAULT_INJECT
	/* Test-only (docs/operations.md, "Fault injection"): while the named file exists every
	 * record encoding fails as if its allocation had. Compiled out of Release builds. */
	const char *f = getenv("KVFS_META_FAULT_ENOMEM");
	if (f && *f && !w->err && access(f, F_OK) == 0)
		w->err = -ENOMEM;
#endif
	int rc = w->err;
	if (rc)
		kvp_w_free(w);
	return rc;
}

int mdb_inode_put(rocksdb_writebatch_t *b, const struct mino *in)
{
	uint8_t k[MK_MAX];
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u8(&w, 3); /* record version: 1 had no access_ns, 2 no owner */
	kvp_w_u32(&w, in->mode);
	kvp_w_u32(&w, in->nlink);
	kvp_w_u64(&w, in->size);
	kvp_w_i64(&w, in->mtime_ns);
	kvp_w_i64(&w, in->atime_ns);
	kvp_w_i64(&w, in->ctime_ns);
	kvp_w_u32(&w, in->chunk_size);
	kvp_w_u8(&w, in->k);
	kvp_w_u8(&w, in->m);
	kvp_w_u32(&w, in->nstripes);
	kvp_w_u64(&w, in->parent);
	kvp_w_i64(&w, in->access_ns);
	kvp_w_u32(&w, in->uid);
	kvp_w_u32(&w, in->gid);
	int rc = mdb_rec_end(&w);
	if (rc)
		return rc;
	rocksdb_writebatch_put(b, (const char *)k, mk_inode(k, in->ino), (const char *)w.p, w.len);
	kvp_w_free(&w);
	return 0;
}

/* Decodes an inode record of version 1 (access_ns = atime_ns: A was keyed by it), 2 (no owner)
 * or 3. */
static int inode_decode(uint64_t ino, const char *v, size_t vl, struct mino *out, uint8_t *ver)
{
	struct kvp_rbuf r;
	kvp_r_init(&r, v, vl);
	*ver = kvp_r_u8(&r);
	out->ino = ino;
	out->mode = kvp_r_u32(&r);
	out->nlink = kvp_r_u32(&r);
	out->size = kvp_r_u64(&r);
	out->mtime_ns = kvp_r_i64(&r);
	out->atime_ns = kvp_r_i64(&r);
	out->ctime_ns = kvp_r_i64(&r);
	out->chunk_size = kvp_r_u32(&r);
	out->k = kvp_r_u8(&r);
	out->m = kvp_r_u8(&r);
	out->nstripes = kvp_r_u32(&r);
	out->parent = kvp_r_u64(&r);
	out->access_ns = *ver >= 2 ? kvp_r_i64(&r) : out->atime_ns;
	out->uid = *ver >= 3 ? kvp_r_u32(&r) : KVP_OWNER_NONE;
	out->gid = *ver >= 3 ? kvp_r_u32(&r) : KVP_OWNER_NONE;
	int rc = kvp_r_end(&r);
	if (rc || *ver < 1 || *ver > 3) {
		klog_error("inode %llu: corrupt record", (unsigned long long)ino);
		return -EIO;
	}
	return 0;
}

int mdb_inode_get(struct meta *m, const rocksdb_readoptions_t *ro, uint64_t ino, struct mino *out)
{
	uint8_t k[MK_MAX], ver;
	char *v;
	size_t vl;
	int rc = mdb_get(m, ro, k, mk_inode(k, ino), &v, &vl);
	if (rc)
		return rc;
	rc = inode_decode(ino, v, vl, out, &ver);
	rocksdb_free(v);
	return rc;
}

void mdb_counter_put(rocksdb_writebatch_t *b, uint8_t id, uint64_t v)
{
	uint8_t k[2], val[8];
	for (int i = 0; i < 8; i++)
		val[i] = (uint8_t)(v >> (8 * i));
	rocksdb_writebatch_put(b, (const char *)k, mk_counter(k, id), (const char *)val, 8);
}

static int counter_get(struct meta *m, uint8_t id, uint64_t *v)
{
	uint8_t k[2];
	char *val;
	size_t vl;
	int rc = mdb_get(m, NULL, k, mk_counter(k, id), &val, &vl);
	if (rc)
		return rc;
	if (vl != 8) {
		rocksdb_free(val);
		return -EIO;
	}
	*v = 0;
	for (int i = 7; i >= 0; i--)
		*v = *v << 8 | (uint8_t)val[i];
	rocksdb_free(val);
	return 0;
}

/* A reservation is written on its own, before any id under it is used: an id can then never
 * be durable in a record while the reservation that covers it is not. */
static int reserve(struct meta *m, uint8_t id, uint64_t limit)
{
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	mdb_counter_put(b, id, limit);
	int rc = mdb_write(m, b);
	rocksdb_writebatch_destroy(b);
	return rc;
}

int mdb_alloc_ino(struct meta *m, uint64_t *ino)
{
	if (m->next_ino >= m->ino_limit) {
		int rc = reserve(m, MC_INO_LIMIT, m->next_ino + INO_RESERVE);
		if (rc)
			return rc;
		m->ino_limit = m->next_ino + INO_RESERVE;
	}
	*ino = m->next_ino++;
	return 0;
}

int mdb_alloc_chunks(struct meta *m, uint64_t n, uint64_t *first)
{
	if (m->next_chunk + n > m->chunk_limit) {
		uint64_t lim = m->next_chunk + n + CHUNK_RESERVE;
		int rc = reserve(m, MC_CHUNK_LIMIT, lim);
		if (rc)
			return rc;
		m->chunk_limit = lim;
	}
	*first = m->next_chunk;
	m->next_chunk += n;
	return 0;
}

void mdb_atime_move(rocksdb_writebatch_t *b, uint64_t ino, int64_t old_ns, int64_t new_ns)
{
	uint8_t k[MK_MAX];
	if (old_ns == new_ns)
		return;
	rocksdb_writebatch_delete(b, (const char *)k, mk_atime(k, old_ns, ino));
	rocksdb_writebatch_put(b, (const char *)k, mk_atime(k, new_ns, ino), "", 0);
}

int mdb_file_drop(struct meta *m, rocksdb_writebatch_t *b, const struct mino *f)
{
	return mdb_file_drop_acct(m, b, f, NULL, 0);
}

int mdb_file_drop_acct(struct meta *m, rocksdb_writebatch_t *b, const struct mino *f,
		       uint64_t *bytes, uint32_t nbytes)
{
	uint8_t k[MK_MAX], lo[MK_MAX];
	size_t plen = mk_stripe(lo, f->ino, 0) - 4; /* prefix: family + ino */
	int64_t now = meta_now_ns();
	/* Queue value: i64 time the deletion may be sent, and when the drop is accounted
	 * (eviction, expiry) u64 bytes the chunk frees, so the deletion can credit exactly that
	 * to its node. An unaccounted drop (unlink, replace) waits unlink_delay_s first: a reader
	 * that opened the old file before the change holds its layout and may still read. */
	if (!bytes)
		now += (int64_t)(m->o.unlink_delay_s * 1e9);
	uint8_t tv[16];
	for (int i = 0; i < 8; i++) {
		tv[i] = (uint8_t)((uint64_t)now >> (8 * i));
		tv[8 + i] = (uint8_t)((uint64_t)f->chunk_size >> (8 * i));
	}
	size_t width = (size_t)(f->k + f->m);
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
	int rc = 0;
	for (rocksdb_iter_seek(it, (const char *)lo, plen + 4); rocksdb_iter_valid(it);
	     rocksdb_iter_next(it)) {
		size_t kl, vl;
		const char *key = rocksdb_iter_key(it, &kl);
		if (kl != plen + 4 || memcmp(key, lo, plen))
			break;
		const uint8_t *v = (const uint8_t *)rocksdb_iter_value(it, &vl);
		if (vl != width * MREQ_SLOT_SIZE) {
			klog_error("inode %llu: corrupt stripe record", (unsigned long long)f->ino);
			rc = -EIO;
			break;
		}
		int degraded = 0;
		for (size_t s = 0; s < width; s++) {
			struct mreq q = {.slots = v};
			struct mreq_slot sl, o;
			mreq_slot_get(&q, s, &sl);
			for (size_t i = 0; i < s && sl.node_id; i++) {
				mreq_slot_get(&q, i, &o);
				degraded |= o.node_id == sl.node_id;
			}
			if (!sl.node_id) { /* written degraded: no chunk stored for this slot */
				degraded = 1;
				continue;
			}
			rocksdb_writebatch_put(b, (const char *)k,
					       mk_delq(k, sl.node_id, sl.chunk_id),
					       (const char *)tv, bytes ? 16 : 8);
			rocksdb_writebatch_delete(b, (const char *)k,
						  mk_rev(k, sl.node_id, sl.chunk_id));
			if (sl.node_id < nbytes)
				bytes[sl.node_id] += f->chunk_size;
		}
		if (degraded) /* its repair mark goes with it */
			rocksdb_writebatch_delete(
			    b, (const char *)k,
			    mk_degraded(k, f->ino, mk_rd_be32((const uint8_t *)key + plen)));
		rocksdb_writebatch_delete(b, key, kl);
	}
	char *err = NULL;
	rocksdb_iter_get_error(it, &err);
	if (err) {
		klog_error("rocksdb iterator: %s", err);
		rocksdb_free(err);
		rc = -EIO;
	}
	rocksdb_iter_destroy(it);
	if (rc)
		return rc;
	rocksdb_writebatch_delete(b, (const char *)k, mk_inode(k, f->ino));
	rocksdb_writebatch_delete(b, (const char *)k, mk_atime(k, f->access_ns, f->ino));
	return 0;
}

/* One step of a one-time pass over a key family: adds what it changes to b and counts it.
 * 0, or -ENOMEM: then b holds part of the step and must not be written. */
typedef int (*migrate_fn)(struct meta *m, rocksdb_writebatch_t *b, const uint8_t *key, size_t kl,
			  const char *val, size_t vl, uint64_t *n);

/* Runs fn over every key of family (keys shorter than minlen end it) unless counter `done` is
 * set, writing in batches of 64 Ki changes, then sets it in the last batch. */
static int migrate_once(struct meta *m, uint8_t done, uint8_t family, size_t minlen, migrate_fn fn,
			const char *what)
{
	uint8_t k[MK_MAX];
	char *v;
	size_t vl;
	if (mdb_get(m, NULL, k, mk_counter(k, done), &v, &vl) == 0) {
		rocksdb_free(v);
		return 0;
	}
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
	uint64_t n = 0;
	int rc = 0;
	k[0] = family;
	for (rocksdb_iter_seek(it, (const char *)k, 1); rocksdb_iter_valid(it);
	     rocksdb_iter_next(it)) {
		size_t kl;
		const uint8_t *key = (const uint8_t *)rocksdb_iter_key(it, &kl);
		if (kl < minlen || key[0] != family)
			break;
		const char *val = rocksdb_iter_value(it, &vl);
		rc = fn(m, b, key, kl, val, vl, &n);
		if (rc)
			break;
		if (rocksdb_writebatch_count(b) >= 65536) {
			rc = mdb_write(m, b);
			rocksdb_writebatch_clear(b);
			if (rc)
				break;
		}
	}
	rocksdb_iter_destroy(it);
	if (!rc) {
		mdb_counter_put(b, done, 1);
		rc = mdb_write(m, b);
	}
	rocksdb_writebatch_destroy(b);
	if (!rc && n)
		klog_info("%s: %llu", what, (unsigned long long)n);
	return rc;
}

/* A stripe map's chunks into the R index. */
static int rev_step(struct meta *m, rocksdb_writebatch_t *b, const uint8_t *key, size_t kl,
		    const char *val, size_t vl, uint64_t *n)
{
	(void)m;
	if (kl != 13)
		return 0;
	struct mreq q = {.slots = (const uint8_t *)val};
	for (size_t i = 0; i < vl / MREQ_SLOT_SIZE; i++) {
		struct mreq_slot sl;
		mreq_slot_get(&q, i, &sl);
		if (!sl.node_id)
			continue; /* not stored */
		mdb_rev_put(b, sl.node_id, sl.chunk_id, mk_rd_be64(key + 1), mk_rd_be32(key + 9));
		(*n)++;
	}
	return 0;
}

int mdb_rev_build(struct meta *m)
{
	return migrate_once(m, MC_REV_BUILT, MK_STRIPE, 13, rev_step,
			    "built the chunk owner index, chunks");
}

/* A file's parent from its directory entry. */
static int parent_step(struct meta *m, rocksdb_writebatch_t *b, const uint8_t *key, size_t kl,
		       const char *val, size_t vl, uint64_t *n)
{
	(void)kl;
	struct kvp_rbuf r;
	kvp_r_init(&r, val, vl);
	uint64_t ino = kvp_r_u64(&r), parent = mk_rd_be64(key + 1);
	uint32_t mode = kvp_r_u32(&r);
	struct mino f;
	if (kvp_r_end(&r) || !S_ISREG(mode) || mdb_inode_get(m, NULL, ino, &f) ||
	    f.parent == parent)
		return 0;
	f.parent = parent;
	int rc = mdb_inode_put(b, &f);
	if (!rc)
		(*n)++;
	return rc;
}

int mdb_parents_fix(struct meta *m)
{
	return migrate_once(m, MC_PARENTS_OK, MK_DIRENT, 9, parent_step,
			    "fixed the parent of files renamed across directories");
}

/* A file's own access time from its old record: A was keyed by the atime a client could set,
 * so the latest time meta itself stamped (ctime: creation, rename, setattr) counts too, and a
 * settable time never counts past now. */
static int access_step(struct meta *m, rocksdb_writebatch_t *b, const uint8_t *key, size_t kl,
		       const char *val, size_t vl, uint64_t *n)
{
	(void)m;
	struct mino f;
	uint8_t ver;
	if (kl != 9 || inode_decode(mk_rd_be64(key + 1), val, vl, &f, &ver) || ver >= 2 ||
	    !S_ISREG(f.mode))
		return 0;
	int64_t now = meta_now_ns(), at = f.atime_ns < now ? f.atime_ns : now;
	int64_t own = at > f.ctime_ns ? at : f.ctime_ns;
	mdb_atime_move(b, f.ino, f.access_ns, own);
	f.access_ns = own;
	int rc = mdb_inode_put(b, &f);
	if (!rc)
		(*n)++;
	return rc;
}

int mdb_access_fix(struct meta *m)
{
	return migrate_once(m, MC_ACCESS_OK, MK_INODE, 9, access_step,
			    "gave files their own access time (retention no longer uses atime)");
}

void mino_to_attr(const struct mino *in, struct kvp_attr *a)
{
	memset(a, 0, sizeof(*a));
	a->ino = in->ino;
	a->mode = in->mode;
	a->nlink = in->nlink;
	a->size = in->size;
	a->mtime_ns = in->mtime_ns;
	a->atime_ns = in->atime_ns;
	a->ctime_ns = in->ctime_ns;
	a->access_ns = in->access_ns;
	a->uid = in->uid;
	a->gid = in->gid;
	a->chunk_size = in->chunk_size;
	a->k = in->k;
	a->m = in->m;
	if (S_ISREG(in->mode) && in->nstripes) {
		/* Data chunks are stored at their exact length, parity at the length of the
		 * stripe's data chunk 0 (fs/client/kvc.h). */
		uint64_t stripe = (uint64_t)in->k * in->chunk_size;
		uint64_t last = in->size - (uint64_t)(in->nstripes - 1) * stripe;
		uint64_t c0 = last < in->chunk_size ? last : in->chunk_size;
		a->stored = in->size +
			    (uint64_t)in->m * ((uint64_t)(in->nstripes - 1) * in->chunk_size + c0);
	}
}

static int db_init(struct meta *m)
{
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	uint8_t k[2];
	int64_t now = meta_now_ns();
	struct mino root = {.ino = KVP_ROOT_INO,
			    .mode = S_IFDIR | 0755,
			    .nlink = 2,
			    .mtime_ns = now,
			    .atime_ns = now,
			    .ctime_ns = now,
			    .parent = KVP_ROOT_INO,
			    .access_ns = now,
			    .uid = KVP_OWNER_NONE,
			    .gid = KVP_OWNER_NONE};
	int rc = mdb_inode_put(b, &root);
	if (rc) {
		rocksdb_writebatch_destroy(b);
		return rc;
	}
	mdb_counter_put(b, MC_INO_LIMIT, KVP_ROOT_INO + 1);
	mdb_counter_put(b, MC_CHUNK_LIMIT, 1);
	mdb_counter_put(b, MC_NEXT_NODE, 1);
	mdb_counter_put(b, MC_FILES, 0);
	mdb_counter_put(b, MC_DIRS, 1);
	mdb_counter_put(b, MC_REV_BUILT, 1);
	mdb_counter_put(b, MC_PARENTS_OK, 1);
	mdb_counter_put(b, MC_ACCESS_OK, 1);
	k[0] = MK_VERSION;
	rocksdb_writebatch_put(b, (const char *)k, 1, DB_VERSION, strlen(DB_VERSION));
	rc = mdb_write(m, b);
	rocksdb_writebatch_destroy(b);
	if (!rc)
		klog_info("created a new metadata database in %s", m->o.db_path);
	return rc;
}

/* LOOKUP and GETATTR are point reads (a directory entry, then an inode). Without a filter
 * every level whose key range covers the key costs an index search and a data block read
 * (from the page cache, decompressed each time); a whole-key bloom filter answers "not here"
 * for all levels but the one holding the key, and the block cache keeps the hot blocks
 * decompressed. The hash index inside data blocks turns the in-block binary search into one
 * probe. Iterators (readdir, scans) ignore whole-key filters, so they are unaffected. The
 * table factory copies the options and shares the cache and filter, so the wrappers go. */
static void set_read_path(rocksdb_options_t *o, const struct meta_opts *mo)
{
	uint64_t cache_bytes = mo->block_cache;
	int64_t bloom_bits = mo->bloom_bits;
	rocksdb_block_based_table_options_t *t = rocksdb_block_based_options_create();
	rocksdb_options_set_allow_mmap_reads(o, mo->mmap_reads ? 1 : 0);
	if (bloom_bits > 0)
		rocksdb_block_based_options_set_filter_policy(
		    t, rocksdb_filterpolicy_create_bloom_full((double)bloom_bits));
	rocksdb_block_based_options_set_data_block_index_type(
	    t, rocksdb_block_based_table_data_block_index_type_binary_search_and_hash);
	if (cache_bytes) {
		rocksdb_cache_t *c = rocksdb_cache_create_lru((size_t)cache_bytes);
		rocksdb_block_based_options_set_block_cache(t, c);
		rocksdb_cache_destroy(c);
	} else {
		rocksdb_block_based_options_set_no_block_cache(t, 1);
	}
	rocksdb_options_set_block_based_table_factory(o, t);
	rocksdb_block_based_options_destroy(t);
	/* Recent writes are read back at once (COMMIT after ALLOC, LOOKUP after create): a
	 * small whole-key filter on the memtable saves its skip-list walk on a miss. */
	if (bloom_bits > 0) {
		rocksdb_options_set_memtable_whole_key_filtering(o, 1);
		rocksdb_options_set_memtable_prefix_bloom_size_ratio(o, 0.02);
	}
}

int mdb_open(struct meta *m)
{
	char *err = NULL;
	m->dbo = rocksdb_options_create();
	rocksdb_options_set_create_if_missing(m->dbo, 1);
	rocksdb_options_set_max_open_files(m->dbo, 256);
	set_read_path(m->dbo, &m->o);
	m->db = rocksdb_open(m->dbo, m->o.db_path, &err);
	if (err) {
		klog_error("cannot open database %s: %s", m->o.db_path, err);
		rocksdb_free(err);
		rocksdb_options_destroy(m->dbo);
		m->dbo = NULL;
		return -EIO;
	}
	/* Batches are written without sync even with --sync: meta_handle syncs the WAL once
	 * the mutex is released, so concurrent commits share one fsync (mdb_sync). */
	m->wo = rocksdb_writeoptions_create();
	m->ro = rocksdb_readoptions_create();
	rocksdb_readoptions_set_verify_checksums(m->ro, m->o.verify_reads ? 1 : 0);

	uint8_t k = MK_VERSION;
	char *v;
	size_t vl;
	int rc = mdb_get(m, NULL, &k, 1, &v, &vl);
	if (rc == -ENOENT)
		rc = db_init(m);
	else if (!rc) {
		if (vl != strlen(DB_VERSION) || memcmp(v, DB_VERSION, vl)) {
			klog_error("%s: not a kvfs-meta version 1 database", m->o.db_path);
			rc = -EINVAL;
		}
		rocksdb_free(v);
	}
	if (!rc)
		rc = mdb_load_counters(m);
	if (rc)
		mdb_close(m);
	return rc;
}

int mdb_load_counters(struct meta *m)
{
	uint64_t next_node = 1;
	int rc = counter_get(m, MC_INO_LIMIT, &m->ino_limit);
	if (!rc)
		rc = counter_get(m, MC_CHUNK_LIMIT, &m->chunk_limit);
	if (!rc)
		rc = counter_get(m, MC_NEXT_NODE, &next_node);
	if (!rc)
		rc = counter_get(m, MC_FILES, &m->files);
	if (!rc)
		rc = counter_get(m, MC_DIRS, &m->dirs);
	if (rc) {
		if (rc == -ENOENT) {
			klog_error("%s: counters missing", m->o.db_path);
			rc = -EIO;
		}
		return rc;
	}
	/* Everything under a reservation may have been handed out before a crash. */
	m->next_ino = m->ino_limit;
	m->next_chunk = m->chunk_limit;
	m->next_node = (uint32_t)next_node;
	return 0;
}

/* A bulk load leaves RocksDB behind: level-0 files pile up faster than its one compaction
 * thread merges them, and a point read checks every level-0 file (hash-ordered directory
 * entries overlap them all) and every level. A full compaction merges every level into the
 * bottommost one (RocksDB's default leaves that level's own files as they are, no compaction
 * filter here), so a read then checks one file per level. Not exclusive: RocksDB's own
 * compactions and every write go on meanwhile. */
static void *compact_main(void *arg)
{
	struct meta *m = arg;
	int64_t t0 = meta_mono_ns();
	rocksdb_compactoptions_t *co = rocksdb_compactoptions_create();
	rocksdb_compactoptions_set_exclusive_manual_compaction(co, 0);
	rocksdb_compact_range_opt(m->db, co, NULL, 0, NULL, 0);
	rocksdb_compactoptions_destroy(co);
	atomic_fetch_add(&m->st[KVP_MST_DB_COMPACTS], 1);
	atomic_store(&m->compacting, 0);
	klog_info("database compacted in %.1f s", (double)(meta_mono_ns() - t0) / 1e9);
	return NULL;
}

int mdb_compact_start(struct meta *m)
{
	int idle = 0;
	if (!atomic_compare_exchange_strong(&m->compacting, &idle, 1))
		return -EBUSY;
	if (m->compact_started)
		pthread_join(m->compact_thr, NULL); /* the last one, finished */
	m->compact_started = 0;
	int rc = pthread_create(&m->compact_thr, NULL, compact_main, m);
	if (rc) {
		atomic_store(&m->compacting, 0);
		return -rc;
	}
	m->compact_started = 1;
	klog_info("full database compaction started");
	return 0;
}

void mdb_compact_state(struct meta *m, uint64_t *l0, uint64_t *pending, uint64_t *running)
{
	*l0 = *pending = *running = 0;
	char *v = rocksdb_property_value(m->db, "rocksdb.num-files-at-level0"); /* a string one */
	if (v)
		*l0 = strtoull(v, NULL, 10);
	rocksdb_free(v);
	rocksdb_property_int(m->db, "rocksdb.estimate-pending-compaction-bytes", pending);
	rocksdb_property_int(m->db, "rocksdb.num-running-compactions", running);
	if (atomic_load(&m->compacting) && !*running)
		*running = 1;
}

void mdb_close(struct meta *m)
{
	if (m->compact_started) {
		/* A full compaction of GBs would hold the stop for minutes: cut it short. */
		if (atomic_load(&m->compacting))
			rocksdb_disable_manual_compaction(m->db);
		pthread_join(m->compact_thr, NULL);
		m->compact_started = 0;
	}
	if (m->db)
		rocksdb_close(m->db);
	if (m->ro)
		rocksdb_readoptions_destroy(m->ro);
	if (m->wo)
		rocksdb_writeoptions_destroy(m->wo);
	if (m->dbo)
		rocksdb_options_destroy(m->dbo);
	m->db = NULL;
	m->ro = NULL;
	m->wo = NULL;
	m->dbo = NULL;
}

/* ---- pending writes (P): an ALLOC not yet committed or aborted ---- */

int mdb_pend_put(rocksdb_writebatch_t *b, uint64_t write_id, const struct mpend *p)
{
	uint8_t k[MK_MAX];
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u8(&w, 1);
	kvp_w_i64(&w, p->created_ns);
	kvp_w_u32(&w, p->chunk_size);
	kvp_w_u32(&w, p->nstripes);
	kvp_w_u8(&w, p->k);
	kvp_w_u8(&w, p->m);
	kvp_w_u64(&w, p->first);
	for (size_t i = 0; i < mpend_slots(p); i++)
		kvp_w_u32(&w, p->node[i]);
	int rc = mdb_rec_end(&w);
	if (rc)
		return rc;
	rocksdb_writebatch_put(b, (const char *)k, mk_pending(k, write_id), (const char *)w.p,
			       w.len);
	kvp_w_free(&w);
	return 0;
}

int mdb_pend_decode(const char *v, size_t vl, struct mpend *p)
{
	struct kvp_rbuf r;
	kvp_r_init(&r, v, vl);
	uint8_t ver = kvp_r_u8(&r);
	p->created_ns = kvp_r_i64(&r);
	p->chunk_size = kvp_r_u32(&r);
	p->nstripes = kvp_r_u32(&r);
	p->k = kvp_r_u8(&r);
	p->m = kvp_r_u8(&r);
	p->first = kvp_r_u64(&r);
	size_t n = mpend_slots(p);
	if (ver != 1 || r.err || (vl - r.off) != n * 4)
		return -EIO;
	p->node = malloc(n ? n * sizeof(uint32_t) : 1);
	if (!p->node)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		p->node[i] = kvp_r_u32(&r);
	return kvp_r_end(&r) ? -EIO : 0;
}

int mdb_pending_on(struct meta *m, uint32_t node)
{
	uint8_t k = MK_PENDING;
	int rc = 0;
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
	for (rocksdb_iter_seek(it, (const char *)&k, 1); rocksdb_iter_valid(it) && !rc;
	     rocksdb_iter_next(it)) {
		size_t kl, vl;
		const char *key = rocksdb_iter_key(it, &kl);
		if (kl < 1 || key[0] != MK_PENDING)
			break;
		const char *v = rocksdb_iter_value(it, &vl);
		struct mpend p = {0};
		rc = mdb_pend_decode(v, vl, &p);
		for (size_t i = 0; !rc && i < mpend_slots(&p); i++)
			rc = p.node[i] == node;
		free(p.node);
	}
	rocksdb_iter_destroy(it);
	return rc;
}
