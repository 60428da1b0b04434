/* kvc: the write path. A new file lives in a growable buffer until commit; commit encodes it
 * stripe by stripe straight from that buffer, sends every chunk to its node with a bounded
 * window of stripes in flight, and publishes the file with one COMMIT only after every chunk
 * is acknowledged or written around. Writing around: a chunk whose node meta placed none (node
 * 0: fewer than k+m up), whose node is on the bad list, or whose PUT fails for the transport
 * (refused, reset, timed out) is left out, its slot sent as node 0, as long as its stripe keeps
 * the minimum meta gave (ALLOC's min_stored); meta marks such stripes for repair. So a node
 * that dies stops no write, also in the seconds before meta notices. */
#define KVFS_LOG_TAG "kvc"
#include "ktime.h"
#include "kvc_int.h"
#include "log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct kvc_writer {
	struct kvc *c;
	uint64_t parent;
	char name[KVP_NAME_MAX + 1];
	uint32_t mode;
	int replace;
	uint32_t uid, gid; /* owner to record; KVP_OWNER_NONE = none */
	uint8_t *buf;
	uint64_t size;
	uint64_t cap; /* bytes allocated, all charged to c->buffered */
};

struct wslot {
	const char *addr; /* into the ALLOC reply's node table */
	uint32_t node_id;
	uint64_t chunk_id;
	uint32_t crc;
};

int kvc_create(struct kvc *c, uint64_t parent, const char *name, uint32_t mode, int replace,
	       struct kvc_writer **out)
{
	size_t n = name ? strlen(name) : 0;
	if (n == 0 || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
		return -EINVAL;
	if (n > KVP_NAME_MAX)
		return -ENAMETOOLONG;
	struct kvc_writer *w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->c = c;
	w->parent = parent;
	memcpy(w->name, name, n + 1);
	w->mode = (mode & 07777) | S_IFREG;
	w->replace = replace;
	w->uid = w->gid = KVP_OWNER_NONE;
	*out = w;
	return 0;
}

void kvc_writer_set_owner(struct kvc_writer *w, uint32_t uid, uint32_t gid)
{
	w->uid = uid;
	w->gid = gid;
}

/* Takes bytes of the buffer budget, or none (-ENOMEM): a failed attempt holds nothing even for
 * a moment, so it cannot make a concurrent writer fail. */
static int budget_take(struct kvc *c, uint64_t bytes)
{
	uint_fast64_t cur = atomic_load(&c->buffered);
	do
		if (cur + bytes > c->max_buffered)
			return -ENOMEM;
	while (!atomic_compare_exchange_weak(&c->buffered, &cur, cur + bytes));
	return 0;
}

/* Gives bytes back; wake: tell kvc_buffer_wait (not for a writer's own failed realloc, which
 * would only wake that writer to fail again). */
static void budget_release(struct kvc *c, uint64_t bytes, int wake)
{
	atomic_fetch_sub(&c->buffered, bytes);
	if (!wake)
		return;
	pthread_mutex_lock(&c->buf_mu);
	c->buf_freed++;
	pthread_cond_broadcast(&c->buf_cond);
	pthread_mutex_unlock(&c->buf_mu);
}

static int grow(struct kvc_writer *w, uint64_t need)
{
	struct kvc *c = w->c;
	if (need <= w->cap)
		return 0;
	if (need > c->max_file)
		return -EFBIG;
	uint64_t ncap = w->cap * 2 > need ? w->cap * 2 : need;
	if (ncap < 65536)
		ncap = 65536;
	/* Whole MiB past 512 KiB: a 2 MiB file in 1020 KiB FUSE writes (a spliced mount's
	 * max_write) takes 1, then 2 MiB; doubling took 4 MiB for its last 8 KiB. */
	if (ncap > (512u << 10))
		ncap = (ncap + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
	if (ncap > c->max_file)
		ncap = c->max_file;
	/* Where the generous size passes the budget, the exact one may still fit. */
	if (budget_take(c, ncap - w->cap)) {
		if (ncap == need || budget_take(c, need - w->cap))
			return -ENOMEM;
		ncap = need;
	}
	uint64_t add = ncap - w->cap;
	uint8_t *nb = realloc(w->buf, ncap);
	if (!nb) {
		budget_release(c, add, 0);
		return -ENOMEM;
	}
	w->buf = nb;
	w->cap = ncap;
	return 0;
}

ssize_t kvc_write_fill(struct kvc_writer *w, uint64_t off, size_t len, kvc_fill_fn fill, void *arg)
{
	if (len == 0)
		return 0;
	if (off > UINT64_MAX - len)
		return -EFBIG;
	int rc = grow(w, off + len);
	if (rc)
		return rc;
	if (off > w->size)
		memset(w->buf + w->size, 0, off - w->size);
	ssize_t n = fill(arg, w->buf + off, len);
	if (n < 0)
		return n;
	if ((size_t)n > len)
		return -EIO;
	/* A hole before a short or failed fill stays a hole: the size grows only past data. */
	if (n > 0 && off + (uint64_t)n > w->size)
		w->size = off + (uint64_t)n;
	return n;
}

static ssize_t fill_copy(void *arg, void *dst, size_t len)
{
	memcpy(dst, arg, len);
	return (ssize_t)len;
}

ssize_t kvc_write(struct kvc_writer *w, const void *buf, size_t len, uint64_t off)
{
	return kvc_write_fill(w, off, len, fill_copy, (void *)buf);
}

int kvc_writer_truncate(struct kvc_writer *w, uint64_t size)
{
	int rc = grow(w, size);
	if (rc)
		return rc;
	if (size > w->size)
		memset(w->buf + w->size, 0, size - w->size);
	w->size = size;
	return 0;
}

uint64_t kvc_writer_size(const struct kvc_writer *w)
{
	return w->size;
}

static void writer_free(struct kvc_writer *w)
{
	struct kvc *c = w->c;
	uint64_t cap = w->cap;
	free(w->buf);
	free(w);
	budget_release(c, cap, 1);
}

uint64_t kvc_buffer_epoch(struct kvc *c)
{
	pthread_mutex_lock(&c->buf_mu);
	uint64_t e = c->buf_freed;
	pthread_mutex_unlock(&c->buf_mu);
	return e;
}

int kvc_buffer_wait(struct kvc *c, uint64_t epoch, int timeout_ms)
{
	struct timespec until;
	kvfs_deadline(&until, CLOCK_MONOTONIC, timeout_ms > 0 ? timeout_ms : 0);
	int rc = 0;
	pthread_mutex_lock(&c->buf_mu);
	while (c->buf_freed == epoch && rc == 0)
		rc = pthread_cond_timedwait(&c->buf_cond, &c->buf_mu, &until);
	int freed = c->buf_freed != epoch;
	pthread_mutex_unlock(&c->buf_mu);
	return freed ? 0 : -ETIMEDOUT;
}

void kvc_abort(struct kvc_writer *w)
{
	if (w)
		writer_free(w);
}

/* ALLOC reply (KVP_ALLOC_WRITE_AROUND) -> write_id, node table (kept in *tbl, freed by
 * caller), slots (node 0: none placed), chunks each stripe must store. */
static int parse_alloc(const uint8_t *b, uint32_t len, int k, int n, uint32_t nstripes,
		       uint64_t *write_id, char (**tbl)[KVP_ADDR_MAX], struct wslot *slots,
		       int *min_stored)
{
	struct kvp_rbuf r;
	kvp_r_init(&r, b, len);
	*write_id = kvp_r_u64(&r);
	uint32_t nn = kvp_r_u32(&r);
	if (nn > len / 6 || (nn == 0 && nstripes))
		return -EBADMSG;
	uint32_t *ids = malloc((nn + 1) * sizeof(*ids));
	char(*addrs)[KVP_ADDR_MAX] = malloc((nn + 1) * sizeof(*addrs));
	if (!ids || !addrs) {
		free(ids);
		free(addrs);
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < nn; i++) {
		ids[i] = kvp_r_u32(&r);
		kvp_r_str(&r, addrs[i], KVP_ADDR_MAX);
	}
	for (size_t i = 0; i < (size_t)nstripes * n && !r.err; i++) {
		slots[i].node_id = kvp_r_u32(&r);
		slots[i].chunk_id = kvp_r_u64(&r);
		slots[i].crc = 0;
		slots[i].addr = NULL;
		for (uint32_t j = 0; j < nn; j++)
			if (ids[j] == slots[i].node_id)
				slots[i].addr = addrs[j];
		if (!slots[i].addr && slots[i].node_id)
			r.err = -EBADMSG;
	}
	*min_stored = kvp_r_u8(&r);
	if (!r.err && (*min_stored < k || *min_stored > n))
		r.err = -EBADMSG;
	int rc = r.err ? r.err : kvp_r_end(&r);
	free(ids);
	if (rc) {
		free(addrs);
		return rc;
	}
	*tbl = addrs;
	return 0;
}

/* Leaves slot i of a stripe (n slots) out if the stripe still stores min chunks without it:
 * 1 when it did, 0 when the stripe cannot spare it. */
static int write_around(struct wslot *ss, int n, int i, int min)
{
	int stored = 0;
	for (int j = 0; j < n; j++)
		stored += ss[j].node_id != 0;
	if (stored <= min)
		return 0;
	klog_debug("chunk %llu: node %u unreachable, written around",
		   (unsigned long long)ss[i].chunk_id, ss[i].node_id);
	ss[i].node_id = 0;
	ss[i].addr = NULL;
	return 1;
}

/* Waits for the PUTs of one stripe; a chunk whose node failed is written around if the
 * stripe can spare it, else its error is kept in *err (the most telling: ENOSPC first). */
static void wait_stripe(struct kvc *c, struct kvch_call *rpc, struct wslot *slots, int n, int min,
			int *err)
{
	for (int i = 0; i < n; i++) {
		if (!rpc[i].call)
			continue;
		int rc = kvch_put_finish(&rpc[i], c->timeout_ms);
		if (rc) {
			klog_debug("put chunk %llu to %s: %s",
				   (unsigned long long)slots[i].chunk_id, slots[i].addr,
				   kvp_strerror(rc));
			if (kvch_is_transport(rc)) {
				kvc__node_mark_bad(c, slots[i].node_id);
				if (write_around(slots, n, i, min))
					continue;
			}
			if (*err == 0 || rc == -ENOSPC)
				*err = rc;
		}
	}
}

/* Encodes and sends every stripe; returns 0 when every chunk is acknowledged or written
 * around (its slot's node_id set to 0), each stripe keeping min chunks. */
static int put_all(struct kvc *c, const struct kvc_writer *w, const struct kvec_layout *l,
		   struct kvec_codec *codec, struct wslot *slots, int min)
{
	int k = l->k, m = l->m, n = k + m;
	uint32_t cs = l->chunk_size;
	uint64_t ns = l->nstripes;
	/* Window: about 64 MiB of chunks in flight, at least 2 stripes. */
	uint64_t win = (64ull << 20) / ((uint64_t)n * cs);
	win = win < 2 ? 2 : win > 16 ? 16 : win;
	if (win > ns)
		win = ns;
	size_t scratch_len = kvec_layout_scratch_size(l);
	uint8_t *par = m ? malloc(win * m * (size_t)cs) : NULL;
	uint8_t *scratch = malloc(scratch_len);
	struct kvch_call *rpc = calloc(win * n, sizeof(*rpc));
	struct wslot *inflight[16] = {0}; /* slots of the stripe in each window place */
	int err = 0;
	if ((m && !par) || !scratch || !rpc)
		err = -ENOMEM;
	for (uint64_t s = 0; s < ns && !err; s++) {
		uint64_t wi = s % win;
		struct kvch_call *r = rpc + wi * n;
		uint64_t t0 = kvc__now_ns();
		if (inflight[wi]) {
			wait_stripe(c, r, inflight[wi], n, min, &err);
			kvc__stage(c, KVC_ST_PUT_WAIT, t0);
			t0 = kvc__now_ns();
		}
		inflight[wi] = NULL;
		if (err)
			break;
		const uint8_t *data[KVEC_MAX_K];
		uint8_t *parity[KVEC_MAX_M];
		int rc = kvec_layout_stripe_data(l, s, w->buf, scratch, scratch_len, data);
		for (int i = 0; i < m; i++)
			parity[i] = par + (wi * m + i) * (size_t)cs;
		if (rc >= 0) /* chunk 0 is the stripe's longest: parity's length */
			rc = kvec_encode(codec, data, parity, kvec_layout_slot_len(l, s, 0));
		if (rc < 0) {
			err = rc;
			break;
		}
		kvc__stage(c, KVC_ST_ENCODE, t0);
		t0 = kvc__now_ns();
		struct wslot *ss = slots + s * n;
		inflight[wi] = ss;
		for (int i = 0; i < n; i++)
			ss[i].crc = kvec_crc32c(0, i < k ? data[i] : parity[i - k],
						kvec_layout_slot_len(l, s, i));
		kvc__stage(c, KVC_ST_CRC, t0);
		t0 = kvc__now_ns();
		for (int i = 0; i < n && !err; i++) {
			const uint8_t *p = i < k ? data[i] : parity[i - k];
			uint32_t len = kvec_layout_slot_len(l, s, i);
			if (len == 0 || !ss[i].node_id)
				continue; /* empty: known zeros; node 0: meta placed none */
			/* A node that failed us moments ago: around it at once, no new connect */
			if (kvc__node_is_bad(c, ss[i].node_id) && write_around(ss, n, i, min))
				continue;
			rc = kvch_put_start(c->pool, ss[i].addr, ss[i].chunk_id, ss[i].crc, p, len,
					    &r[i]);
			if (rc && kvch_is_transport(rc)) {
				kvc__node_mark_bad(c, ss[i].node_id);
				if (write_around(ss, n, i, min))
					rc = 0;
			}
			if (rc)
				err = rc;
		}
		kvc__stage(c, KVC_ST_PUT_SEND, t0);
	}
	/* Drain everything still in flight, also after an error. */
	for (uint64_t i = 0; rpc && i < win; i++) {
		if (!inflight[i])
			continue;
		int e2 = 0;
		uint64_t t0 = kvc__now_ns();
		wait_stripe(c, rpc + i * n, inflight[i], n, min, &e2);
		kvc__stage(c, KVC_ST_PUT_WAIT, t0);
		if (!err || e2 == -ENOSPC)
			err = e2 ? e2 : err;
	}
	free(rpc);
	free(scratch);
	free(par);
	return err;
}

int kvc__file_first_chunk(struct kvc *c, uint64_t ino, uint64_t *chunk_id);

/* After a lost COMMIT answer: is the file at (parent, name) the one we sent? */
static int committed_check(struct kvc *c, const struct kvc_writer *w, const struct wslot *slots,
			   uint64_t nstripes, struct kvp_attr *a)
{
	int rc = kvc_lookup(c, w->parent, w->name, a);
	if (rc)
		return rc;
	if (!S_ISREG(a->mode) || a->size != w->size)
		return -EEXIST;
	if (nstripes == 0)
		return 0; /* an empty file has nothing to tell it apart */
	uint64_t first;
	rc = kvc__file_first_chunk(c, a->ino, &first);
	if (rc)
		return rc;
	return first == slots[0].chunk_id ? 0 : -EEXIST;
}

static int send_commit(struct kvc *c, const struct kvc_writer *w, const struct kvec_layout *l,
		       uint64_t write_id, const struct wslot *slots, struct kvp_attr *out,
		       int *redo)
{
	int n = l->k + l->m;
	struct kvp_wbuf b;
	kvp_w_init(&b);
	kvp_w_u64(&b, w->parent);
	kvp_w_cstr(&b, w->name);
	kvp_w_u32(&b, w->mode);
	kvp_w_u64(&b, write_id);
	kvp_w_u64(&b, w->size);
	kvp_w_u32(&b, l->chunk_size);
	kvp_w_u8(&b, (uint8_t)l->k);
	kvp_w_u8(&b, (uint8_t)l->m);
	kvp_w_u8(&b, w->replace ? 1 : 0);
	kvp_w_u32(&b, (uint32_t)l->nstripes);
	for (uint64_t i = 0; i < l->nstripes * n; i++) {
		kvp_w_u32(&b, slots[i].node_id);
		kvp_w_u64(&b, slots[i].chunk_id);
		kvp_w_u32(&b, slots[i].crc);
	}
	if (w->uid != KVP_OWNER_NONE) { /* optional: an older meta parses none */
		kvp_w_u32(&b, w->uid);
		kvp_w_u32(&b, w->gid);
	}
	/* No blind retry: a replace COMMIT applied twice would replace our own file and free
	 * the chunks both versions share. After a lost answer, look before resending. */
	int rc = -ECONNRESET, failover = 0;
	for (int a = 0; a < 4; a++) {
		uint8_t *rb = NULL;
		uint32_t rl = 0;
		rc = kvc__meta_call(c, KVP_OP_COMMIT, &b, 1, &rb, &rl, NULL);
		if (rc == 0) {
			struct kvp_rbuf r;
			struct kvp_attr at;
			kvp_r_init(&r, rb, rl);
			kvp_r_attr(&r, &at);
			rc = kvp_r_end(&r);
			if (rc == 0 && out)
				*out = at;
		}
		free(rb);
		if (!kvch_is_transport(rc))
			break;
		failover = 1;
		struct kvp_attr at;
		int crc = committed_check(c, w, slots, l->nstripes, &at);
		if (crc == 0) {
			if (out)
				*out = at;
			rc = 0;
			break;
		}
		if (crc == -EEXIST && !w->replace) {
			rc = -EEXIST;
			break;
		}
		if (crc != -ENOENT && crc != -EEXIST) {
			rc = crc; /* meta still unreachable */
			break;
		}
	}
	kvp_w_free(&b);
	if (failover && rc && !kvch_is_transport(rc)) {
		/* The first COMMIT may have been applied before its answer was lost; then a
		 * resend is refused (-EEXIST, or -ESTALE: meta knows each write id once). */
		struct kvp_attr at;
		if (committed_check(c, w, slots, l->nstripes, &at) == 0) {
			if (out)
				*out = at;
			return 0;
		}
	}
	/* A write id meta no longer knows (expired, or aborted): store the file again. */
	if (rc == -ESTALE)
		*redo = 1;
	return rc;
}

static int write_once(struct kvc_writer *w, struct kvp_attr *out, int *redo)
{
	struct kvc *c = w->c;
	int k = c->k, m = c->m, n = k + m;
	*redo = 0;
	int64_t cs = kvec_chunk_size_fit(w->size, k, c->chunk_size);
	if (cs < 0)
		return (int)cs;
	struct kvec_layout l;
	int rc = kvec_layout_init(&l, w->size, (uint32_t)cs, k, m);
	if (rc)
		return rc;
	if (l.nstripes > KVP_MAX_STRIPES)
		return -EFBIG;
	struct kvec_codec *codec;
	if ((rc = kvc__codec(c, k, m, &codec)))
		return rc;

	struct kvp_wbuf b;
	kvp_w_init(&b);
	kvp_w_u8(&b, (uint8_t)k);
	kvp_w_u8(&b, (uint8_t)m);
	kvp_w_u32(&b, (uint32_t)cs);
	kvp_w_u32(&b, (uint32_t)l.nstripes);
	kvp_w_u8(&b, KVP_ALLOC_WRITE_AROUND);
	uint8_t *rb = NULL;
	uint32_t rl = 0;
	/* A lost ALLOC answer only leaves an unused write_id, which meta expires: retry. */
	rc = kvc__meta_call(c, KVP_OP_ALLOC, &b, KVC_META_ATTEMPTS, &rb, &rl, NULL);
	kvp_w_free(&b);
	if (rc) {
		free(rb);
		return rc;
	}
	struct wslot *slots = calloc(l.nstripes * n + 1, sizeof(*slots));
	char(*tbl)[KVP_ADDR_MAX] = NULL;
	uint64_t write_id = 0;
	int min = n;
	rc = slots ? parse_alloc(rb, rl, k, n, (uint32_t)l.nstripes, &write_id, &tbl, slots, &min)
		   : -ENOMEM;
	free(rb);
	if (rc == 0) {
		rc = put_all(c, w, &l, codec, slots, min);
		if (rc) {
			struct kvp_wbuf a;
			kvp_w_init(&a);
			kvp_w_u64(&a, write_id);
			kvc__meta_call(c, KVP_OP_ABORT, &a, 3, NULL, NULL, NULL);
			kvp_w_free(&a);
			/* A node that died since meta last heard from it: try a fresh placement. */
			if (kvch_is_transport(rc))
				*redo = 1;
		} else {
			rc = send_commit(c, w, &l, write_id, slots, out, redo);
			for (size_t i = 0; rc == 0 && i < l.nstripes * n; i++)
				if (!slots[i].node_id)
					atomic_fetch_add(&c->st_around, 1);
		}
	}
	free(tbl);
	free(slots);
	return rc;
}

int kvc_commit(struct kvc_writer *w, struct kvp_attr *out)
{
	struct kvc *c = w->c;
	uint64_t t0 = kvc__now_ns();
	int rc, redo = 0;
	struct kvch_retry r;
	kvch_retry_start(&r, &KVCH_RETRY_STORE);
	for (;;) {
		rc = write_once(w, out, &redo);
		if (!redo || !kvch_retry_wait(&r, rc))
			break;
		klog_info("commit of %s: %s, storing it again", w->name, kvp_strerror(rc));
	}
	/* Every placement still had a node that could not be reached (meta has not noticed it
	 * is down yet): the same answer as when meta knows too few nodes are up, not a
	 * connection error that would read as "meta is away". */
	if (redo && kvch_is_transport(rc))
		rc = -EHOSTDOWN;
	if (rc == 0) {
		atomic_fetch_add(&c->st_written, w->size);
		atomic_fetch_add(&c->st_files, 1);
	}
	writer_free(w);
	kvc__stage(c, KVC_ST_COMMIT, t0);
	return rc;
}

int kvc_put(struct kvc *c, const char *path, const void *buf, size_t len, int replace)
{
	uint64_t parent;
	const char *name;
	int rc = kvc_resolve_parent(c, path, &parent, &name);
	if (rc)
		return rc;
	struct kvc_writer *w;
	if ((rc = kvc_create(c, parent, name, 0644, replace, &w)))
		return rc;
	ssize_t n = kvc_write(w, buf, len, 0);
	if (n < 0) {
		kvc_abort(w);
		return (int)n;
	}
	return kvc_commit(w, NULL);
}
