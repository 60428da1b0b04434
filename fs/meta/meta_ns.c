/* Namespace operations of kvfs-meta. Reads go straight to RocksDB (a snapshot where several
 * keys must agree); every mutation reads, checks and writes under m->mu and lands as one
 * WriteBatch, so a crash leaves either all of it or none. */
#define KVFS_LOG_TAG "meta"
#include "log.h"
#include "meta_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define READDIR_MAX	  4096u
#define READDIR_MAX_BYTES (1u << 20)

int mdir_entry_get(struct meta *m, const rocksdb_readoptions_t *ro, uint64_t parent,
		   const struct mreq_str *name, uint64_t *ino, uint32_t *mode)
{
	uint8_t k[MK_MAX];
	char *v;
	size_t vl;
	int rc = mdb_get(m, ro, k, mk_dirent(k, parent, name->p, name->len), &v, &vl);
	if (rc)
		return rc;
	struct kvp_rbuf r;
	kvp_r_init(&r, v, vl);
	*ino = kvp_r_u64(&r);
	*mode = kvp_r_u32(&r);
	rc = kvp_r_end(&r);
	rocksdb_free(v);
	if (rc) {
		klog_error("corrupt directory entry in %llu", (unsigned long long)parent);
		return -EIO;
	}
	return 0;
}

void mdir_entry_put(rocksdb_writebatch_t *b, uint64_t parent, const struct mreq_str *name,
		    uint64_t ino, uint32_t mode)
{
	uint8_t k[MK_MAX], v[12];
	for (int i = 0; i < 8; i++)
		v[i] = (uint8_t)(ino >> (8 * i));
	for (int i = 0; i < 4; i++)
		v[8 + i] = (uint8_t)(mode >> (8 * i));
	rocksdb_writebatch_put(b, (const char *)k, mk_dirent(k, parent, name->p, name->len),
			       (const char *)v, sizeof(v));
}

static void dirent_del(rocksdb_writebatch_t *b, uint64_t parent, const struct mreq_str *name)
{
	uint8_t k[MK_MAX];
	rocksdb_writebatch_delete(b, (const char *)k, mk_dirent(k, parent, name->p, name->len));
}

int mdir_get(struct meta *m, const rocksdb_readoptions_t *ro, uint64_t ino, struct mino *out)
{
	int rc = mdb_inode_get(m, ro, ino, out);
	if (rc)
		return rc;
	return S_ISDIR(out->mode) ? 0 : -ENOTDIR;
}

static int dir_empty(struct meta *m, uint64_t ino)
{
	uint8_t k[MK_MAX];
	size_t kl = mk_dirent(k, ino, "", 0);
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
	rocksdb_iter_seek(it, (const char *)k, kl);
	int empty = 1;
	if (rocksdb_iter_valid(it)) {
		size_t l;
		const char *key = rocksdb_iter_key(it, &l);
		empty = !(l > kl && memcmp(key, k, kl) == 0);
	}
	char *err = NULL;
	rocksdb_iter_get_error(it, &err);
	rocksdb_iter_destroy(it);
	if (err) {
		klog_error("rocksdb iterator: %s", err);
		rocksdb_free(err);
		return -EIO;
	}
	return empty;
}

static void reply_attr(struct kvp_wbuf *out, const struct mino *in)
{
	struct kvp_attr a;
	mino_to_attr(in, &a);
	kvp_w_attr(out, &a);
}

int mns_lookup(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	int rc = mreq_name_check(&q->name);
	if (rc)
		return rc;
	const rocksdb_snapshot_t *snap = rocksdb_create_snapshot(m->db);
	rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
	rocksdb_readoptions_set_snapshot(ro, snap);
	rocksdb_readoptions_set_verify_checksums(ro, m->o.verify_reads ? 1 : 0);
	uint64_t ino;
	uint32_t mode;
	struct mino p, c;
	/* The entry first: one that exists proves its parent a directory in this snapshot
	 * (entries are only written under a directory, and rmdir needs it empty), so the
	 * parent's inode is read only to say why a name is missing (-ENOENT, -ENOTDIR). That
	 * saves a point read per LOOKUP, and the one that costs most as the tree grows: a
	 * directory's inode is old, so it sits in the last level and the read checks every
	 * level's filter on the way (docs/benchmarks.md, "10 million files"). */
	rc = mdir_entry_get(m, ro, q->parent, &q->name, &ino, &mode);
	if (rc == -ENOENT) {
		int prc = mdir_get(m, ro, q->parent, &p);
		if (prc)
			rc = prc;
	}
	if (!rc)
		rc = mdb_inode_get(m, ro, ino, &c);
	if (rc == -ENOENT || !rc)
		klog_debug("lookup %llu/%.*s: %d", (unsigned long long)q->parent, q->name.len,
			   q->name.p, rc);
	if (!rc)
		reply_attr(out, &c);
	rocksdb_readoptions_destroy(ro);
	rocksdb_release_snapshot(m->db, snap);
	if (!rc && (q->flags & KVP_LOOKUP_LAYOUT) && S_ISREG(c.mode)) {
		/* The layout of what was found. Gone meanwhile (unlinked, replaced): the attr
		 * alone, and the client's open asks LAYOUT as without the flag. */
		struct mreq lq = {.op = KVP_OP_LAYOUT, .ino = ino};
		size_t at = out->len;
		if (mfile_layout(m, &lq, out))
			out->len = at;
	}
	return rc;
}

int mns_getattr(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	struct mino in;
	int rc = mdb_inode_get(m, NULL, q->ino, &in);
	if (!rc)
		reply_attr(out, &in);
	return rc;
}

int mns_readdir(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	if (q->name.len > KVP_NAME_MAX)
		return -ENAMETOOLONG;
	if (q->max == 0)
		return -EINVAL;
	uint32_t max = q->max < READDIR_MAX ? q->max : READDIR_MAX;
	const rocksdb_snapshot_t *snap = rocksdb_create_snapshot(m->db);
	rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
	rocksdb_readoptions_set_snapshot(ro, snap);
	struct mino d;
	int rc = mdir_get(m, ro, q->ino, &d);
	if (rc)
		goto out;
	uint8_t k[MK_MAX];
	size_t plen = mk_dirent(k, q->ino, "", 0);
	size_t kl = mk_dirent(k, q->ino, q->name.p, q->name.len);
	kvp_w_u32(out, 0); /* n, patched below */
	uint32_t n = 0;
	uint8_t eof = 1;
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, ro);
	for (rocksdb_iter_seek(it, (const char *)k, kl); rocksdb_iter_valid(it);
	     rocksdb_iter_next(it)) {
		size_t l, vl;
		const char *key = rocksdb_iter_key(it, &l);
		if (l <= plen || memcmp(key, k, plen))
			break;
		if (q->name.len && l == kl && memcmp(key, k, kl) == 0)
			continue; /* start_after itself */
		if (n == max || out->len >= READDIR_MAX_BYTES) {
			eof = 0;
			break;
		}
		const char *v = rocksdb_iter_value(it, &vl);
		if (vl != 12) {
			rc = -EIO;
			break;
		}
		uint64_t ino = 0;
		for (int i = 7; i >= 0; i--)
			ino = ino << 8 | (uint8_t)v[i];
		struct mino c;
		rc = mdb_inode_get(m, ro, ino, &c);
		if (rc == -ENOENT) { /* cannot happen in one snapshot; skip rather than fail */
			rc = 0;
			continue;
		}
		if (rc)
			break;
		kvp_w_str(out, key + plen, l - plen);
		reply_attr(out, &c);
		n++;
	}
	char *err = NULL;
	rocksdb_iter_get_error(it, &err);
	if (err) {
		klog_error("rocksdb iterator: %s", err);
		rocksdb_free(err);
		rc = -EIO;
	}
	rocksdb_iter_destroy(it);
	kvp_w_u8(out, eof);
	if (!rc && !out->err)
		for (int i = 0; i < 4; i++)
			out->p[i] = (uint8_t)(n >> (8 * i));
out:
	rocksdb_readoptions_destroy(ro);
	rocksdb_release_snapshot(m->db, snap);
	return rc;
}

int mns_write(struct meta *m, rocksdb_writebatch_t *b, int64_t dfiles, int64_t ddirs)
{
	m->files += (uint64_t)dfiles;
	m->dirs += (uint64_t)ddirs;
	if (dfiles)
		mdb_counter_put(b, MC_FILES, m->files);
	if (ddirs)
		mdb_counter_put(b, MC_DIRS, m->dirs);
	int rc = mdb_write(m, b);
	if (rc) {
		m->files -= (uint64_t)dfiles;
		m->dirs -= (uint64_t)ddirs;
	}
	return rc;
}

int mns_mkdir(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	int rc = mreq_name_check(&q->name);
	if (rc)
		return rc;
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	pthread_mutex_lock(&m->mu);
	struct mino p, d;
	uint64_t ino;
	uint32_t mode;
	rc = mdir_get(m, NULL, q->parent, &p);
	if (rc)
		goto out;
	rc = mdir_entry_get(m, NULL, q->parent, &q->name, &ino, &mode);
	if (rc != -ENOENT) {
		rc = rc ? rc : -EEXIST;
		goto out;
	}
	rc = mdb_alloc_ino(m, &ino);
	if (rc)
		goto out;
	int64_t now = meta_now_ns();
	d = (struct mino){.ino = ino,
			  .mode = S_IFDIR | (q->mode & 07777),
			  .nlink = 2,
			  .mtime_ns = now,
			  .atime_ns = now,
			  .ctime_ns = now,
			  .parent = q->parent,
			  .access_ns = now,
			  .uid = q->uid,
			  .gid = q->gid};
	p.nlink++;
	p.mtime_ns = p.ctime_ns = now;
	rc = mdb_inode_put(b, &d);
	if (!rc)
		rc = mdb_inode_put(b, &p);
	if (rc)
		goto out;
	mdir_entry_put(b, q->parent, &q->name, ino, d.mode);
	rc = mns_write(m, b, 0, 1);
	if (!rc)
		reply_attr(out, &d);
out:
	pthread_mutex_unlock(&m->mu);
	rocksdb_writebatch_destroy(b);
	return rc;
}

/* RMDIR's and UNLINK's lookup: q's parent directory into *p and its entry q->name's inode
 * number into *ino; the entry must be a directory when dir, else must not be one (-ENOTDIR,
 * -EISDIR). Caller holds mu. */
static int entry_get(struct meta *m, const struct mreq *q, int dir, struct mino *p, uint64_t *ino)
{
	uint32_t mode;
	int rc = mdir_get(m, NULL, q->parent, p);
	if (!rc)
		rc = mdir_entry_get(m, NULL, q->parent, &q->name, ino, &mode);
	if (!rc && !S_ISDIR(mode) != !dir)
		rc = dir ? -ENOTDIR : -EISDIR;
	return rc;
}

/* RMDIR's and UNLINK's end: q->name's entry out of its parent p (p's times set now, its nlink
 * as the caller left it) and b written, the counters moved by dfiles and ddirs (mns_write).
 * Caller holds mu. */
static int entry_drop(struct meta *m, rocksdb_writebatch_t *b, const struct mreq *q, struct mino *p,
		      int64_t dfiles, int64_t ddirs)
{
	p->mtime_ns = p->ctime_ns = meta_now_ns();
	int rc = mdb_inode_put(b, p);
	if (rc)
		return rc;
	dirent_del(b, q->parent, &q->name);
	return mns_write(m, b, dfiles, ddirs);
}

int mns_rmdir(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	(void)out;
	int rc = mreq_name_check(&q->name);
	if (rc)
		return rc;
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	pthread_mutex_lock(&m->mu);
	struct mino p;
	uint64_t ino;
	rc = entry_get(m, q, 1, &p, &ino);
	if (!rc) {
		rc = dir_empty(m, ino);
		rc = rc < 0 ? rc : rc ? 0 : -ENOTEMPTY;
	}
	if (rc)
		goto out;
	uint8_t k[MK_MAX];
	rocksdb_writebatch_delete(b, (const char *)k, mk_inode(k, ino));
	p.nlink--;
	rc = entry_drop(m, b, q, &p, 0, -1);
out:
	pthread_mutex_unlock(&m->mu);
	rocksdb_writebatch_destroy(b);
	return rc;
}

int mns_unlink(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	(void)out;
	int rc = mreq_name_check(&q->name);
	if (rc)
		return rc;
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	pthread_mutex_lock(&m->mu);
	struct mino p, f;
	uint64_t ino;
	rc = entry_get(m, q, 0, &p, &ino);
	if (!rc)
		rc = mdb_inode_get(m, NULL, ino, &f);
	if (!rc)
		rc = mdb_file_drop(m, b, &f);
	if (!rc)
		rc = entry_drop(m, b, q, &p, -1, 0);
	pthread_mutex_unlock(&m->mu);
	rocksdb_writebatch_destroy(b);
	if (!rc)
		mbg_kick(m);
	return rc;
}

/* 1 if dir `anc` is `ino` or one of its ancestors. Caller holds mu. */
static int is_ancestor(struct meta *m, uint64_t anc, uint64_t ino)
{
	for (int depth = 0; depth < 4096; depth++) {
		if (ino == anc)
			return 1;
		if (ino == KVP_ROOT_INO)
			return 0;
		struct mino d;
		int rc = mdb_inode_get(m, NULL, ino, &d);
		if (rc)
			return rc;
		ino = d.parent;
	}
	return -ELOOP;
}

int mns_rename(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	(void)out;
	int rc = mreq_name_check(&q->name);
	if (!rc)
		rc = mreq_name_check(&q->newname);
	if (!rc && (q->flags & ~1u))
		rc = -EINVAL;
	if (rc)
		return rc;
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	pthread_mutex_lock(&m->mu);
	struct mino sp, dp_buf, *dp = &sp, src, dst;
	uint64_t sino, dino;
	uint32_t smode, dmode;
	int64_t dfiles = 0, ddirs = 0;
	rc = mdir_get(m, NULL, q->parent, &sp);
	if (!rc && q->newparent != q->parent) {
		dp = &dp_buf;
		rc = mdir_get(m, NULL, q->newparent, dp);
	}
	if (!rc)
		rc = mdir_entry_get(m, NULL, q->parent, &q->name, &sino, &smode);
	if (!rc)
		rc = mdb_inode_get(m, NULL, sino, &src);
	if (rc)
		goto out;
	if (q->newparent == q->parent && q->name.len == q->newname.len &&
	    memcmp(q->name.p, q->newname.p, q->name.len) == 0)
		goto out; /* same entry: nothing to do */
	if (S_ISDIR(src.mode) && q->newparent != q->parent) {
		rc = is_ancestor(m, sino, q->newparent);
		rc = rc < 0 ? rc : rc ? -EINVAL : 0;
		if (rc)
			goto out;
	}
	int64_t now = meta_now_ns();
	rc = mdir_entry_get(m, NULL, q->newparent, &q->newname, &dino, &dmode);
	if (rc == 0) {
		if (q->flags & 1u) {
			rc = -EEXIST;
			goto out;
		}
		rc = mdb_inode_get(m, NULL, dino, &dst);
		if (rc)
			goto out;
		if (S_ISDIR(src.mode)) {
			if (!S_ISDIR(dst.mode)) {
				rc = -ENOTDIR;
				goto out;
			}
			rc = dir_empty(m, dino);
			rc = rc < 0 ? rc : rc ? 0 : -ENOTEMPTY;
			if (rc)
				goto out;
			uint8_t k[MK_MAX];
			rocksdb_writebatch_delete(b, (const char *)k, mk_inode(k, dino));
			dp->nlink--;
			ddirs = -1;
		} else {
			if (S_ISDIR(dst.mode)) {
				rc = -EISDIR;
				goto out;
			}
			rc = mdb_file_drop(m, b, &dst);
			if (rc)
				goto out;
			dfiles = -1;
		}
	} else if (rc != -ENOENT) {
		goto out;
	}
	if (q->newparent != q->parent) {
		/* Files too: retention and eviction find a file's name through its parent. */
		src.parent = q->newparent;
		if (S_ISDIR(src.mode)) {
			sp.nlink--;
			dp->nlink++;
		}
	}
	src.ctime_ns = now;
	sp.mtime_ns = sp.ctime_ns = dp->mtime_ns = dp->ctime_ns = now;
	rc = mdb_inode_put(b, &src);
	if (!rc)
		rc = mdb_inode_put(b, &sp);
	if (!rc && dp != &sp)
		rc = mdb_inode_put(b, dp);
	if (rc)
		goto out;
	dirent_del(b, q->parent, &q->name);
	mdir_entry_put(b, q->newparent, &q->newname, sino, src.mode);
	rc = mns_write(m, b, dfiles, ddirs);
out:
	pthread_mutex_unlock(&m->mu);
	rocksdb_writebatch_destroy(b);
	if (!rc && dfiles)
		mbg_kick(m);
	return rc;
}

int mns_setattr(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	if (q->valid & ~(uint32_t)(KVP_SET_MODE | KVP_SET_MTIME | KVP_SET_ATIME))
		return -EINVAL;
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	pthread_mutex_lock(&m->mu);
	struct mino in;
	int rc = mdb_inode_get(m, NULL, q->ino, &in);
	if (rc)
		goto out;
	if (q->valid & KVP_SET_MODE)
		in.mode = (in.mode & (uint32_t)S_IFMT) | (q->mode & 07777);
	if (q->valid & KVP_SET_MTIME)
		in.mtime_ns = q->mtime_ns;
	int64_t now = meta_now_ns();
	if (q->valid & KVP_SET_ATIME) {
		/* Shown as set, but kvfs's own access time only moves forward and never past
		 * now: `touch -a` keeps a file as a read would, while `touch -a -d 2020` or
		 * `cp -a` of an old file cannot make retention or eviction take it. */
		in.atime_ns = q->atime_ns;
		int64_t own = q->atime_ns < now ? q->atime_ns : now;
		if (own > in.access_ns) {
			if (S_ISREG(in.mode))
				mdb_atime_move(b, in.ino, in.access_ns, own);
			in.access_ns = own;
		}
	}
	in.ctime_ns = now;
	rc = mdb_inode_put(b, &in);
	if (!rc)
		rc = mdb_write(m, b);
	if (!rc)
		reply_attr(out, &in);
out:
	pthread_mutex_unlock(&m->mu);
	rocksdb_writebatch_destroy(b);
	return rc;
}

struct touch_ent {
	uint64_t ino;
	int64_t atime;
};

static int touch_cmp(const void *a, const void *b)
{
	const struct touch_ent *x = a, *y = b;
	if (x->ino != y->ino)
		return x->ino < y->ino ? -1 : 1;
	return x->atime < y->atime ? -1 : x->atime > y->atime;
}

int mns_touch(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	(void)out;
	if (q->n > KVP_MAX_IDS)
		return -EINVAL;
	if (q->n == 0)
		return 0;
	/* Sorted, one update per inode (its latest time): the batch cannot see its own writes,
	 * so a repeated inode would otherwise leave a stale atime-index key. */
	struct touch_ent *e = malloc(q->n * sizeof(*e));
	if (!e)
		return -ENOMEM;
	for (uint32_t i = 0; i < q->n; i++)
		mreq_touch_get(q, i, &e[i].ino, &e[i].atime);
	qsort(e, q->n, sizeof(*e), touch_cmp);
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	int rc = 0;
	int64_t now = meta_now_ns(), gran = (int64_t)(m->o.atime_granularity_s * 1e9);
	pthread_mutex_lock(&m->mu);
	for (uint32_t i = 0; i < q->n; i++) {
		if (i + 1 < q->n && e[i + 1].ino == e[i].ino)
			continue;
		struct mino in;
		rc = mdb_inode_get(m, NULL, e[i].ino, &in);
		if (rc == -ENOENT) {
			rc = 0;
			continue;
		}
		if (rc)
			break;
		/* A client's clock ahead of meta's must not keep a file past its TTL. */
		int64_t at = e[i].atime < now ? e[i].atime : now;
		/* Both times only move forward (a late batch must not make a file look older),
		 * and only by the granularity: small moves are not worth a write (the TTL is
		 * hours). The own time and the shown one differ once a client has set atime. */
		int own = at > in.access_ns && at - in.access_ns >= gran;
		int shown = at > in.atime_ns && at - in.atime_ns >= gran;
		if (!own && !shown)
			continue;
		if (own && S_ISREG(in.mode))
			mdb_atime_move(b, in.ino, in.access_ns, at);
		if (own)
			in.access_ns = at;
		if (shown)
			in.atime_ns = at;
		rc = mdb_inode_put(b, &in);
		if (rc)
			break;
	}
	if (!rc)
		rc = mdb_write(m, b);
	pthread_mutex_unlock(&m->mu);
	rocksdb_writebatch_destroy(b);
	free(e);
	return rc;
}
