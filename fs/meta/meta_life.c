/* Retention and garbage collection in kvfs-meta: files expire a TTL after their last access
 * by kvfs's own clock (struct mino access_ns: creation and the opens clients report, never a
 * time a client set with utimensat) (per-directory rules override the TTL), least recently
 * accessed files are evicted past the high
 * capacity watermark, and chunks on nodes that no metadata references are found and queued
 * for deletion after a grace period. docs/operations.md, "Retention, eviction, repair". */
#define KVFS_LOG_TAG "meta"
#include "ktime.h"
#include "kvch.h"
#include "log.h"
#include "meta_int.h"
#include "meta_lease.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define VICTIM_BATCH   256  /* files removed per write batch */
#define RETENTION_MAX  64   /* batches per pass, so a pass never holds the thread for long */
#define LIST_PAGE      4096 /* chunk ids per LIST */
#define LIST_TIMEOUT   5000
#define RULE_DEPTH_MAX 256  /* parent-chain walk bound */
#define EVICT_WAIT_MS  3000 /* an ALLOC waits this long for its eviction's deletions */

struct victim {
	uint64_t ino, parent;
	int64_t access; /* the A key it was chosen by (kvfs's own access time) */
	char name[KVP_NAME_MAX + 1];
	int found;
};

static int victim_cmp(const void *a, const void *b)
{
	const struct victim *x = a, *y = b;
	return x->parent < y->parent ? -1 : x->parent > y->parent;
}

/* Finds the names of victims [i, j) (all of one parent) with one scan of its entries. */
static int victims_name(struct meta *m, struct victim *v, size_t i, size_t j)
{
	uint8_t k[MK_MAX];
	size_t plen = mk_dirent(k, v[i].parent, "", 0), left = j - i;
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
	for (rocksdb_iter_seek(it, (const char *)k, plen); rocksdb_iter_valid(it) && left;
	     rocksdb_iter_next(it)) {
		size_t kl, vl;
		const char *key = rocksdb_iter_key(it, &kl);
		if (kl <= plen || memcmp(key, k, plen))
			break;
		const uint8_t *val = (const uint8_t *)rocksdb_iter_value(it, &vl);
		if (vl != 12 || kl - plen > KVP_NAME_MAX)
			continue;
		uint64_t ino = 0;
		for (int b = 7; b >= 0; b--)
			ino = ino << 8 | val[b];
		for (size_t x = i; x < j; x++)
			if (!v[x].found && v[x].ino == ino) {
				memcpy(v[x].name, key + plen, kl - plen);
				v[x].name[kl - plen] = 0;
				v[x].found = 1;
				left--;
				break;
			}
	}
	rocksdb_iter_destroy(it);
	return 0;
}

/* Removes the victims whose access time is still the one they were chosen by (a file read
 * meanwhile is spared): inode, dirent, stripe map, R and A keys deleted and chunks queued for
 * deletion, all in one batch. Returns files removed (and their stored bytes) or -errno. */
static int victims_remove(struct meta *m, struct victim *v, size_t n, uint64_t *stored)
{
	uint32_t nb = mnodes_id_bound(m);
	uint64_t *bytes = calloc(nb ? nb : 1, sizeof(*bytes));
	if (!bytes)
		return -ENOMEM;
	qsort(v, n, sizeof(*v), victim_cmp);
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	int rc = 0, removed = 0;
	int64_t now = meta_now_ns();
	uint8_t k[MK_MAX];
	*stored = 0;
	pthread_mutex_lock(&m->mu);
	for (size_t i = 0; i < n && !rc;) {
		size_t j = i;
		while (j < n && v[j].parent == v[i].parent)
			j++;
		struct mino par;
		int have_par = mdb_inode_get(m, NULL, v[i].parent, &par) == 0;
		victims_name(m, v, i, j);
		int any = 0;
		for (size_t x = i; x < j && !rc; x++) {
			struct mino f;
			if (!v[x].found || mdb_inode_get(m, NULL, v[x].ino, &f) ||
			    !S_ISREG(f.mode) || f.access_ns != v[x].access ||
			    f.parent != v[x].parent)
				continue;
			rc = mdb_file_drop_acct(m, b, &f, bytes, nb);
			if (rc)
				break;
			struct mreq_str nm = {.p = v[x].name, .len = (uint16_t)strlen(v[x].name)};
			rocksdb_writebatch_delete(b, (const char *)k,
						  mk_dirent(k, v[x].parent, nm.p, nm.len));
			struct kvp_attr a;
			mino_to_attr(&f, &a);
			*stored += a.stored;
			removed++;
			any = 1;
		}
		if (any && have_par) { /* the directory changed: caches see a new mtime */
			par.mtime_ns = par.ctime_ns = now;
			rc = mdb_inode_put(b, &par);
			if (rc)
				break;
		}
		i = j;
	}
	if (!rc && removed)
		rc = mns_write(m, b, -removed, 0);
	pthread_mutex_unlock(&m->mu);
	rocksdb_writebatch_destroy(b);
	if (!rc && removed) {
		mnodes_freeing_add(m, bytes, nb);
		mbg_kick(m);
		for (size_t i = 0; i < n; i++) /* names gone, and the directories' times moved */
			if (i == 0 || v[i].parent != v[i - 1].parent) {
				struct mino par;
				mlease_revoke_nowait(m, v[i].parent);
				if (mdb_inode_get(m, NULL, v[i].parent, &par) == 0 && par.parent)
					mlease_revoke_nowait(m, par.parent);
			}
	}
	free(bytes);
	return rc ? rc : removed;
}

/* ---- TTL ---- */

/* Directory inode of an absolute path, or 0 when it does not exist (a rule for a directory
 * not made yet simply matches nothing). */
static uint64_t rule_ino(struct meta *m, const char *path)
{
	uint64_t ino = KVP_ROOT_INO;
	const char *p = path;
	while (*p) {
		while (*p == '/')
			p++;
		if (!*p)
			break;
		const char *e = strchr(p, '/');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		struct mreq_str nm = {.p = p, .len = (uint16_t)len};
		uint32_t mode;
		if (len > KVP_NAME_MAX || mdir_entry_get(m, NULL, ino, &nm, &ino, &mode) ||
		    !S_ISDIR(mode))
			return 0;
		p += len;
	}
	return ino;
}

/* TTL of a file under directory `parent`: the rule of its nearest ruled ancestor, else the
 * default. */
static double file_ttl(struct meta *m, const uint64_t *rules, uint64_t parent)
{
	uint64_t d = parent;
	for (int depth = 0; depth < RULE_DEPTH_MAX; depth++) {
		for (int r = 0; r < m->o.nrules; r++)
			if (rules[r] && rules[r] == d)
				return m->o.rules[r].ttl_s;
		struct mino di;
		if (d == KVP_ROOT_INO || mdb_inode_get(m, NULL, d, &di))
			break;
		d = di.parent;
	}
	return m->o.ttl_s;
}

static int expire_pass(struct meta *m)
{
	double min_ttl = m->o.ttl_s;
	uint64_t rules[16] = {0};
	for (int r = 0; r < m->o.nrules; r++) {
		rules[r] = rule_ino(m, m->o.rules[r].path);
		double t = m->o.rules[r].ttl_s;
		if (rules[r] && t > 0 && (min_ttl <= 0 || t < min_ttl))
			min_ttl = t;
	}
	if (min_ttl <= 0)
		return 0;
	int64_t now = meta_now_ns(), horizon = now - (int64_t)(min_ttl * 1e9);
	struct victim *v = malloc(VICTIM_BATCH * sizeof(*v));
	if (!v)
		return -ENOMEM;
	uint8_t from[MK_MAX];
	size_t fromlen = 1;
	from[0] = MK_ATIME;
	int total = 0, rc = 0;
	for (int round = 0; round < RETENTION_MAX; round++) {
		size_t n = 0;
		int more = 0;
		rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
		for (rocksdb_iter_seek(it, (const char *)from, fromlen); rocksdb_iter_valid(it);
		     rocksdb_iter_next(it)) {
			size_t kl;
			const uint8_t *key = (const uint8_t *)rocksdb_iter_key(it, &kl);
			if (kl != 17 || key[0] != MK_ATIME)
				break;
			if (fromlen == 17 && memcmp(key, from, 17) == 0)
				continue;
			int64_t at = (int64_t)(mk_rd_be64(key + 1) ^ (1ull << 63));
			if (at >= horizon)
				break;
			if (n == VICTIM_BATCH) {
				more = 1;
				break;
			}
			memcpy(from, key, 17);
			fromlen = 17;
			uint64_t ino = mk_rd_be64(key + 9);
			struct mino f;
			if (mdb_inode_get(m, NULL, ino, &f))
				continue;
			double ttl = file_ttl(m, rules, f.parent);
			if (ttl <= 0 || at >= now - (int64_t)(ttl * 1e9))
				continue;
			v[n++] = (struct victim){.ino = ino, .parent = f.parent, .access = at};
		}
		rocksdb_iter_destroy(it);
		if (n) {
			uint64_t stored;
			rc = victims_remove(m, v, n, &stored);
			if (rc < 0)
				break;
			total += rc;
			mst_add(m, KVP_MST_EXPIRED, (uint64_t)rc);
			rc = 0;
		}
		if (!more)
			break;
	}
	free(v);
	if (total)
		klog_info("retention: %d files expired", total);
	return rc < 0 ? rc : total;
}

/* ---- watermark eviction ---- */

static int evict(struct meta *m, uint64_t need);

/* Bytes still queued for deletion on the nodes that are up. Caller holds nodes_mu. */
static uint64_t freeing_left(struct meta *m)
{
	uint64_t left = 0;
	for (size_t i = 0; i < m->nnodes; i++)
		if (m->nodes[i].state == KVP_NODE_UP)
			left += m->nodes[i].freeing;
	return left;
}

int mlife_evict(struct meta *m, uint64_t need)
{
	pthread_mutex_lock(&m->evict_mu);
	int rc = evict(m, need);
	pthread_mutex_unlock(&m->evict_mu);
	/* An ALLOC retrying after eviction must find the space really free on the nodes (they
	 * refuse a PUT past their capacity): wait, up to EVICT_WAIT_MS, for the background thread
	 * to have the deletions done (it broadcasts freed_cv after each node's batch). Each
	 * wake-up kicks it again, so a queue longer than one pass keeps being worked. */
	if (!need)
		return rc;
	struct timespec until;
	kvfs_deadline(&until, CLOCK_MONOTONIC, EVICT_WAIT_MS);
	pthread_mutex_lock(&m->nodes_mu);
	while (freeing_left(m)) {
		pthread_mutex_unlock(&m->nodes_mu);
		mbg_kick(m);
		pthread_mutex_lock(&m->nodes_mu);
		if (freeing_left(m) == 0 ||
		    pthread_cond_timedwait(&m->freed_cv, &m->nodes_mu, &until) == ETIMEDOUT)
			break;
	}
	pthread_mutex_unlock(&m->nodes_mu);
	return rc;
}

static int evict(struct meta *m, uint64_t need)
{
	uint64_t cap, used;
	mnodes_usage(m, &cap, &used);
	uint64_t target = cap / 100 * (uint64_t)m->o.low_wm;
	uint64_t want = (used > target ? used - target : 0) + need;
	if (!cap || !want)
		return 0;
	struct victim *v = malloc(VICTIM_BATCH * sizeof(*v));
	if (!v)
		return -ENOMEM;
	uint64_t freed = 0;
	int total = 0;
	/* Where a round starts: the oldest entry, or past a batch none of which could be
	 * removed (touched or removed meanwhile), which would otherwise end eviction. */
	uint8_t from[17] = {MK_ATIME};
	size_t fromlen = 1;
	for (int round = 0; round < RETENTION_MAX && freed < want; round++) {
		size_t n = 0;
		uint64_t chosen = 0;
		uint8_t last[17];
		rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
		for (rocksdb_iter_seek(it, (const char *)from, fromlen);
		     rocksdb_iter_valid(it) && n < VICTIM_BATCH && freed + chosen < want;
		     rocksdb_iter_next(it)) {
			size_t kl;
			const uint8_t *key = (const uint8_t *)rocksdb_iter_key(it, &kl);
			if (kl != 17 || key[0] != MK_ATIME)
				break;
			memcpy(last, key, sizeof(last));
			struct mino f;
			uint64_t ino = mk_rd_be64(key + 9);
			if (mdb_inode_get(m, NULL, ino, &f))
				continue;
			struct kvp_attr a;
			mino_to_attr(&f, &a);
			chosen += a.stored;
			v[n++] = (struct victim){.ino = ino,
						 .parent = f.parent,
						 .access =
						     (int64_t)(mk_rd_be64(key + 1) ^ (1ull << 63))};
		}
		rocksdb_iter_destroy(it);
		if (!n)
			break;
		uint64_t stored;
		int rc = victims_remove(m, v, n, &stored);
		if (rc < 0)
			break;
		if (rc == 0) { /* the next round starts after this batch */
			memcpy(from, last, sizeof(last));
			for (int i = 16; i > 0 && ++from[i] == 0; i--) /* the next key after it */
				;
			fromlen = sizeof(from);
			continue;
		}
		fromlen = 1;
		total += rc;
		freed += stored;
		mst_add(m, KVP_MST_EVICTED, (uint64_t)rc);
		mst_add(m, KVP_MST_EVICTED_BYTES, stored);
	}
	free(v);
	if (total)
		klog_info("eviction: %d files (%llu bytes) removed, use was %llu of %llu", total,
			  (unsigned long long)freed, (unsigned long long)used,
			  (unsigned long long)cap);
	return total;
}

int mlife_retention(struct meta *m)
{
	int rc = expire_pass(m);
	if (rc < 0)
		return rc;
	int n = rc;
	if (m->o.high_wm > 0) {
		uint64_t cap, used;
		mnodes_usage(m, &cap, &used);
		if (cap && used * 100 > cap * (uint64_t)m->o.high_wm) {
			rc = mlife_evict(m, 0);
			if (rc > 0)
				n += rc;
		}
	}
	return n;
}

/* ---- orphan chunks ---- */

struct range {
	uint64_t lo, hi; /* [lo, hi) */
};

/* Chunk-id ranges of every pending write, and the id limit: ids at or past it were not handed
 * out when the pass began. */
static int pending_ranges(struct meta *m, struct range **out, size_t *n, uint64_t *limit)
{
	size_t cap = 16;
	struct range *r = malloc(cap * sizeof(*r));
	if (!r)
		return -ENOMEM;
	*n = 0;
	uint8_t k = MK_PENDING;
	pthread_mutex_lock(&m->mu);
	*limit = m->next_chunk;
	rocksdb_iterator_t *it = rocksdb_create_iterator(m->db, m->ro);
	for (rocksdb_iter_seek(it, (const char *)&k, 1); rocksdb_iter_valid(it);
	     rocksdb_iter_next(it)) {
		size_t kl, vl;
		const char *key = rocksdb_iter_key(it, &kl);
		if (kl != 9 || key[0] != MK_PENDING)
			break;
		const char *v = rocksdb_iter_value(it, &vl);
		struct kvp_rbuf b;
		kvp_r_init(&b, v, vl);
		kvp_r_u8(&b);
		kvp_r_i64(&b);
		kvp_r_u32(&b);
		uint64_t ns = kvp_r_u32(&b);
		uint64_t w = kvp_r_u8(&b);
		w += kvp_r_u8(&b);
		uint64_t first = kvp_r_u64(&b);
		if (b.err)
			continue;
		if (*n == cap) {
			struct range *p = realloc(r, 2 * cap * sizeof(*r));
			if (!p) { /* a partial list would make pending chunks look orphaned */
				rocksdb_iter_destroy(it);
				pthread_mutex_unlock(&m->mu);
				free(r);
				return -ENOMEM;
			}
			r = p;
			cap *= 2;
		}
		r[(*n)++] = (struct range){first, first + (ns * w != 0 ? ns * w : 1)};
	}
	rocksdb_iter_destroy(it);
	pthread_mutex_unlock(&m->mu);
	*out = r;
	return 0;
}

static int key_exists(struct meta *m, const uint8_t *k, size_t kl)
{
	char *v;
	size_t vl;
	int rc = mdb_get(m, NULL, k, kl, &v, &vl);
	if (rc == 0)
		rocksdb_free(v);
	return rc != -ENOENT; /* an error counts as "exists": never delete on doubt */
}

static int is_orphan(struct meta *m, uint32_t node, uint64_t id, int64_t mtime, int64_t cutoff,
		     const struct range *r, size_t nr, uint64_t limit)
{
	if (id >= limit || mtime > cutoff)
		return 0;
	for (size_t i = 0; i < nr; i++)
		if (id >= r[i].lo && id < r[i].hi)
			return 0;
	/* The repair worker's chunk in flight first, then R: it writes R before clearing it. */
	pthread_mutex_lock(&m->job_mu);
	int busy = 0;
	for (int i = 0; i < MREP_THREADS; i++)
		busy |= m->inflight[i] == id;
	pthread_mutex_unlock(&m->job_mu);
	uint8_t k[MK_MAX];
	if (busy || key_exists(m, k, mk_rev(k, node, id)) || key_exists(m, k, mk_delq(k, node, id)))
		return 0;
	return 1;
}

/* Lists one node's chunks page by page and queues its orphans. Returns orphans or -errno. */
static int orphans_node(struct meta *m, uint32_t node, const char *addr, const struct range *r,
			size_t nr, uint64_t limit, int64_t cutoff)
{
	struct kvch_entry *page = malloc(LIST_PAGE * sizeof(*page));
	if (!page)
		return -ENOMEM;
	uint64_t after = 0;
	int total = 0, rc = 0;
	for (;;) {
		uint32_t n = 0;
		int more = 0;
		rc = kvch_list(m->pool, addr, after, LIST_PAGE, LIST_TIMEOUT, page, &n, &more);
		if (rc)
			break;
		rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
		int64_t now = meta_now_ns();
		int found = 0;
		for (uint32_t i = 0; i < n; i++) {
			uint64_t id = page[i].chunk_id;
			after = id;
			mst_add(m, KVP_MST_GC_SCANNED, 1);
			if (is_orphan(m, node, id, page[i].mtime_ns, cutoff, r, nr, limit)) {
				mdb_delq_put(wb, node, id, now);
				found++;
			}
		}
		if (found)
			rc = mdb_write(m, wb);
		rocksdb_writebatch_destroy(wb);
		if (rc)
			break;
		if (found) {
			klog_info("gc: node %u: %d orphan chunks queued for deletion", node, found);
			mst_add(m, KVP_MST_GC_ORPHANS, (uint64_t)found);
			mbg_kick(m);
		}
		total += found;
		if (!more || n == 0)
			break;
	}
	free(page);
	return rc ? rc : total;
}

int mlife_orphans(struct meta *m)
{
	struct range *r;
	size_t nr;
	uint64_t limit;
	int rc = pending_ranges(m, &r, &nr, &limit);
	if (rc)
		return rc;
	int64_t cutoff = meta_now_ns() - (int64_t)(m->o.gc_grace_s * 1e9);
	mnodes_check(m);
	pthread_mutex_lock(&m->nodes_mu);
	size_t nn = m->nnodes;
	struct mnode *nodes = malloc((nn ? nn : 1) * sizeof(*nodes));
	if (nodes && nn)
		memcpy(nodes, m->nodes, nn * sizeof(*nodes));
	pthread_mutex_unlock(&m->nodes_mu);
	if (!nodes) {
		free(r);
		return -ENOMEM;
	}
	int total = 0;
	for (size_t i = 0; i < nn; i++) {
		if (nodes[i].state != KVP_NODE_UP)
			continue;
		rc = orphans_node(m, nodes[i].id, nodes[i].addr, r, nr, limit, cutoff);
		if (rc < 0)
			klog_warn("gc: node %u (%s): %s", nodes[i].id, nodes[i].addr,
				  kvp_strerror(rc));
		else
			total += rc;
	}
	free(nodes);
	free(r);
	return total;
}

void mlife_tick(struct meta *m)
{
	int64_t now = meta_mono_ns();
	int due = now - m->last_retention_mono >= (int64_t)(m->o.retention_interval_s * 1e9);
	if (!due && m->o.high_wm > 0) {
		uint64_t cap, used;
		mnodes_usage(m, &cap, &used);
		due = cap && used * 100 > cap * (uint64_t)m->o.high_wm;
	}
	if (due) {
		mlife_retention(m);
		m->last_retention_mono = now;
	}
	if (m->o.orphan_interval_s > 0 &&
	    now - m->last_orphan_mono >= (int64_t)(m->o.orphan_interval_s * 1e9)) {
		mlife_orphans(m);
		m->last_orphan_mono = meta_mono_ns();
	}
}

int mlife_maint(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	(void)out;
	int rc;
	char addr[KVP_ADDR_MAX];
	uint8_t state;
	switch (q->action) {
	case KVP_MAINT_REPAIR:
		/* A node meta never knew would start a job with nothing to do, and succeed. */
		if (q->node_id && mnodes_addr(m, q->node_id, addr, &state))
			return -ENOENT;
		return mrep_request(m, q->action, q->node_id);
	case KVP_MAINT_SCRUB:
		return mrep_request(m, q->action, q->node_id);
	case KVP_MAINT_DRAIN:
		rc = mnodes_set_draining(m, q->node_id, 1);
		return rc ? rc : mrep_request(m, q->action, q->node_id);
	case KVP_MAINT_GC:
		rc = mlife_orphans(m);
		return rc < 0 ? rc : 0;
	case KVP_MAINT_RETENTION:
		rc = mlife_retention(m);
		return rc < 0 ? rc : 0;
	case KVP_MAINT_NODE_REMOVE:
		return mnodes_remove(m, q->node_id);
	case KVP_MAINT_COMPACT:
		return mdb_compact_start(m);
	default:
		return -EINVAL;
	}
}

int mlife_status(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	(void)q;
	pthread_mutex_lock(&m->job_mu);
	struct mjob j = m->job;
	pthread_mutex_unlock(&m->job_mu);
	int64_t end = j.running ? meta_mono_ns() : j.end_mono;
	kvp_w_u8(out, j.kind);
	kvp_w_u8(out, j.running);
	kvp_w_u32(out, j.node);
	kvp_w_u64(out, j.total);
	kvp_w_u64(out, j.done);
	kvp_w_u64(out, j.failed);
	kvp_w_u64(out, j.bytes);
	kvp_w_i64(out, j.kind ? end - j.start_mono : 0);
	uint64_t v[KVP_MST_COUNT];
	for (int i = 0; i < KVP_MST_COUNT; i++)
		v[i] = atomic_load_explicit(&m->st[i], memory_order_relaxed);
	/* Gauges, counted now: the G keys are the record of what is degraded. */
	mrep_degraded_count(m, &v[KVP_MST_DEGR_STRIPES], &v[KVP_MST_DEGR_FILES]);
	mdb_compact_state(m, &v[KVP_MST_DB_L0_FILES], &v[KVP_MST_DB_PENDING],
			  &v[KVP_MST_DB_COMPACTING]);
	if (m->lease) {
		struct mlease_stats ls;
		mlease_get_stats(m->lease, &ls);
		v[KVP_MST_LEASE_GRANTED] = ls.granted;
		v[KVP_MST_LEASE_RENEWED] = ls.renewed;
		v[KVP_MST_LEASE_REVOKED] = ls.revoked;
		v[KVP_MST_LEASE_ACKED] = ls.acked;
		v[KVP_MST_LEASE_EXPIRED] = ls.expired_waits;
		v[KVP_MST_LEASE_LIVE] = ls.live;
	}
	kvp_w_u32(out, KVP_MST_COUNT);
	for (int i = 0; i < KVP_MST_COUNT; i++)
		kvp_w_u64(out, v[i]);
	return 0;
}
