/* kvc: connection handling, metadata calls with failover, the namespace and path helpers. */
#define KVFS_LOG_TAG "kvc"
#include "ktime.h"
#include "kvc_int.h"
#include "kvp_conn_metrics.h"
#include "log.h"
#include "metrics.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int64_t kvc__now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

uint64_t kvc__now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void kvc__stage(struct kvc *c, enum kvc_stage st, uint64_t t0)
{
	if (c->stage[st])
		met_hist_observe_ns(c->stage[st], kvc__now_ns() - t0);
}

/* Metadata ops by op - KVP_OP_LOOKUP, for kvfs_client_meta_*{op}. */
static const char *const meta_op_names[] = {
    "lookup", "getattr", "readdir", "mkdir", "rmdir",	"unlink", "rename", "alloc",  "commit",
    "abort",  "layout",	 "statfs",  "nodes", "setattr", "touch",  "maint",  "mstatus"};
#define META_NOPS ((int)(sizeof(meta_op_names) / sizeof(meta_op_names[0])))

static void conn_collect(void *ctx, struct met_out *o)
{
	(void)ctx;
	kvp_client_conn_stats_collect(o, "kvfs_client");
}

int kvc_set_metrics(struct kvc *c, struct met_reg *r)
{
	static const char *const stages[KVC_ST_N] = {"open",   "pread", "stripe_get", "commit",
						     "encode", "crc",	"put_send",   "put_wait"};
	c->meta_ops = NULL;
	memset(c->stage, 0, sizeof(c->stage));
	if (!r)
		return 0;
	int rc = met_ops_new(r, "kvfs_client_meta", meta_op_names, META_NOPS, &c->meta_ops);
	if (rc == 0)
		rc = met_collector_add(r, conn_collect, NULL);
	for (int i = 0; rc == 0 && i < KVC_ST_N; i++) {
		const char *lab[] = {"stage", stages[i], NULL};
		c->stage[i] = met_hist_new(r, "kvfs_client_stage_duration_seconds",
					   "Time of one step of the client's read and write paths",
					   lab, NULL, 0);
		if (!c->stage[i])
			rc = -ENOMEM;
	}
	if (rc)
		kvc_set_metrics(c, NULL);
	return rc;
}

static int meta_call_retrying(struct kvc *c, uint16_t op, const struct kvp_wbuf *req, int attempts,
			      uint8_t **rb, uint32_t *rl, int *retried);

int kvc__meta_call(struct kvc *c, uint16_t op, const struct kvp_wbuf *req, int attempts,
		   uint8_t **rb, uint32_t *rl, int *retried)
{
	uint64_t t0 = c->meta_ops ? kvc__now_ns() : 0;
	int rc = meta_call_retrying(c, op, req, attempts, rb, rl, retried);
	if (c->meta_ops)
		met_ops_observe(c->meta_ops, (int)op - KVP_OP_LOOKUP, rc, kvc__now_ns() - t0);
	return rc;
}

/* The address of meta i (copied: a learned slot may be replaced meanwhile) and how many
 * there are. */
static int meta_addr(struct kvc *c, int i, char addr[KVP_ADDR_MAX])
{
	pthread_mutex_lock(&c->meta_mu);
	int n = c->nmetas;
	memcpy(addr, c->metas[i < n ? i : 0], KVP_ADDR_MAX);
	pthread_mutex_unlock(&c->meta_mu);
	return n;
}

/* The index of addr in the list of metas, added when absent: the configured addresses stay,
 * learned ones fill the slots left and then replace each other in turn (bounded). */
static int meta_learn(struct kvc *c, const char *addr)
{
	pthread_mutex_lock(&c->meta_mu);
	int i = 0, max = KVC_MAX_METAS + KVC_LEARNED_METAS;
	while (i < c->nmetas && strcmp(c->metas[i], addr))
		i++;
	if (i == c->nmetas) {
		if (c->nmetas < max)
			c->nmetas++;
		else
			i = c->nconf + c->learn_next++ % (max - c->nconf);
		snprintf(c->metas[i], KVP_ADDR_MAX, "%s", addr);
		klog_debug("meta %s leads (a replica's redirect)", addr);
	}
	pthread_mutex_unlock(&c->meta_mu);
	return i;
}

/* One request to the meta at addr. -EREMCHG: *leader gets the leader's address when the
 * replica named one (else ""). */
static int meta_call_one(struct kvc *c, const char *addr, uint16_t op, const struct kvp_wbuf *req,
			 uint8_t **rb, uint32_t *rl, int *sent, char leader[KVP_ADDR_MAX])
{
	struct kvp_client *cl;
	leader[0] = 0;
	int rc = kvp_pool_get(c->pool, addr, &cl);
	*sent = rc == 0;
	if (rc)
		return rc;
	uint8_t *b = NULL;
	uint32_t l = 0;
	rc = kvp_call_detail(cl, op, req ? req->p : NULL, req ? req->len : 0, NULL, 0,
			     c->timeout_ms, &b, &l);
	kvp_pool_put(c->pool, cl);
	if (rc == -EREMCHG)
		kvp_redirect_parse(b, l, leader); /* a malformed one is no redirect */
	if (rc == 0 && rb) {
		*rb = b;
		b = NULL;
	}
	if (rc == 0 && rl)
		*rl = l;
	free(b);
	return rc;
}

/* kvc__meta_call unmeasured: the attempts of one request. */
static int meta_call_retrying(struct kvc *c, uint16_t op, const struct kvp_wbuf *req, int attempts,
			      uint8_t **rb, uint32_t *rl, int *retried)
{
	if (req && req->err)
		return req->err;
	if (retried)
		*retried = 0;
	struct kvch_retry r, lr;
	struct kvch_retry_policy pol = KVCH_RETRY_META;
	pol.attempts = attempts > 0 ? attempts : 1;
	kvch_retry_start(&r, &pol);
	/* Replicated meta: a replica that does not lead answers -EREMCHG having done nothing,
	 * naming the leader when it knows it (then the request goes there, the address learned
	 * if new) or not (then to the next replica), at once; once as many refusals as replicas
	 * came (an election is on) it waits by KVCH_RETRY_LEADER, whatever the op's own
	 * attempts. */
	struct kvch_retry_policy lpol = KVCH_RETRY_LEADER;
	kvch_retry_start(&lr, &lpol);
	/* The replica whose redirect was followed last: if the one it named fails too (not
	 * reachable from here, or no longer leading), the request goes on to the replica after
	 * it, so two replicas never pass it back and forth past the rest of the list. */
	int refused = 0, named_by = -1;
	for (;;) {
		char addr[KVP_ADDR_MAX], leader[KVP_ADDR_MAX];
		int cur = atomic_load(&c->meta_cur), sent;
		int n = meta_addr(c, cur, addr);
		int rc = meta_call_one(c, addr, op, req, rb, rl, &sent, leader);
		if (rc == -EREMCHG && leader[0]) {
			int to = meta_learn(c, leader);
			n = meta_addr(c, to, leader); /* the count, now that it may have grown */
			named_by = cur;
			atomic_compare_exchange_strong(&c->meta_cur, &cur, to);
		} else if (rc == -EREMCHG || (kvch_is_transport(rc) && n > 1)) {
			/* the next replica; another thread may have moved already */
			int next = ((named_by >= 0 ? named_by : cur) + 1) % n;
			named_by = -1;
			atomic_compare_exchange_strong(&c->meta_cur, &cur, next);
		}
		/* A replica that cannot be reached got nothing: as good as a refusal. */
		if (rc == -EREMCHG || (!sent && kvch_is_transport(rc) && n > 1)) {
			if (++refused < n)
				continue;
			refused = 0;
			if (!kvch_retry_wait(&lr, rc))
				return rc;
			continue;
		}
		if (!kvch_is_transport(rc))
			return rc;
		klog_debug("meta %s: %s (attempt %d)", addr, kvp_strerror(rc), r.retries + 1);
		if (!kvch_retry_again(&r, rc))
			return rc;
		if (retried)
			*retried = 1;
	}
}

int kvc_meta_list(const char *list, char out[][KVP_ADDR_MAX], int max)
{
	int n = 0;
	const char *p = list;
	if (!list || !*list)
		return -EINVAL;
	for (;;) {
		size_t len = strcspn(p, ",");
		if (len == 0 || len >= KVP_ADDR_MAX || n == max)
			return -EINVAL;
		memcpy(out[n], p, len);
		out[n++][len] = 0;
		if (!p[len])
			return n;
		p += len + 1;
	}
}

int kvc__codec(struct kvc *c, int k, int m, struct kvec_codec **out)
{
	if (k < 1 || k > KVEC_MAX_K || m < 0 || m > KVEC_MAX_M)
		return -EINVAL;
	pthread_mutex_lock(&c->mu);
	struct kvec_codec **slot = &c->codecs[k - 1][m];
	int rc = *slot ? 0 : kvec_codec_create(k, m, slot);
	if (!rc)
		*out = *slot;
	pthread_mutex_unlock(&c->mu);
	return rc;
}

void kvc__node_mark_bad(struct kvc *c, uint32_t id)
{
	int64_t now = kvc__now_ms(), until = now + KVC_BAD_NODE_MS;
	pthread_mutex_lock(&c->mu);
	int i, expired = -1;
	for (i = 0; i < c->nbad && c->bad[i].id != id; i++)
		if (c->bad[i].until_ms <= now)
			expired = i;
	if (i == c->nbad && expired >= 0)
		i = expired; /* reuse a slot whose node has served its time */
	else if (i == c->nbad && c->nbad < (int)(sizeof(c->bad) / sizeof(c->bad[0])))
		c->nbad++;
	if (i < c->nbad) {
		c->bad[i].id = id;
		c->bad[i].until_ms = until;
	}
	pthread_mutex_unlock(&c->mu);
}

int kvc__node_is_bad(struct kvc *c, uint32_t id)
{
	int64_t now = kvc__now_ms();
	int bad = 0;
	pthread_mutex_lock(&c->mu);
	for (int i = 0; i < c->nbad; i++)
		if (c->bad[i].id == id && c->bad[i].until_ms > now)
			bad = 1;
	pthread_mutex_unlock(&c->mu);
	return bad;
}

static int parse_statfs(const uint8_t *b, uint32_t len, struct kvc_statfs *o)
{
	struct kvp_rbuf r;
	kvp_r_init(&r, b, len);
	o->raw_capacity = kvp_r_u64(&r);
	o->raw_used = kvp_r_u64(&r);
	o->files = kvp_r_u64(&r);
	o->dirs = kvp_r_u64(&r);
	o->k = kvp_r_u8(&r);
	o->m = kvp_r_u8(&r);
	o->chunk_size = kvp_r_u32(&r);
	o->nodes_up = kvp_r_u32(&r);
	o->nodes = kvp_r_u32(&r);
	return kvp_r_end(&r);
}

int kvc_statfs(struct kvc *c, struct kvc_statfs *out)
{
	uint8_t *b = NULL;
	uint32_t len = 0;
	int rc = kvc__meta_call(c, KVP_OP_STATFS, NULL, KVC_META_ATTEMPTS, &b, &len, NULL);
	if (rc == 0)
		rc = parse_statfs(b, len, out);
	free(b);
	return rc;
}

int kvc_open(const struct kvc_opts *o, struct kvc **out)
{
	if (!o || !o->meta_addr || !o->secret)
		return -EINVAL;
	struct kvc *c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->nmetas = kvc_meta_list(o->meta_addr, c->metas, KVC_MAX_METAS);
	if (c->nmetas < 0) {
		free(c);
		return -EINVAL;
	}
	c->nconf = c->nmetas;
	pthread_mutex_init(&c->meta_mu, NULL);
	c->secret = *o->secret;
	c->timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 5000;
	c->read_timeout_ms = c->timeout_ms < 2000 ? c->timeout_ms : 2000;
	c->max_file = o->max_file ? o->max_file : (1ull << 30);
	c->max_buffered = o->max_buffered ? o->max_buffered : (4ull << 30);
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->buf_mu, NULL);
	kvfs_cond_init_mono(&c->buf_cond);
	int rc = kvp_pool_create(&c->secret, c->read_timeout_ms, &c->pool);
	if (rc) {
		pthread_cond_destroy(&c->buf_cond);
		pthread_mutex_destroy(&c->buf_mu);
		pthread_mutex_destroy(&c->mu);
		pthread_mutex_destroy(&c->meta_mu);
		free(c);
		return rc;
	}
	/* One STATFS proves the address and the secret and gives the cluster's defaults. */
	struct kvc_statfs st;
	uint8_t *b = NULL;
	uint32_t len = 0;
	rc = kvc__meta_call(c, KVP_OP_STATFS, NULL, 2, &b, &len, NULL);
	if (rc == 0)
		rc = parse_statfs(b, len, &st);
	free(b);
	if (rc == 0) {
		c->k = o->k > 0 ? o->k : st.k;
		c->m = o->m > 0 ? o->m : st.m;
		uint32_t cs = st.chunk_size ? st.chunk_size : (1u << 20);
		c->chunk_size = o->max_chunk && o->max_chunk < cs ? o->max_chunk : cs;
		if (c->k < 1 || c->k > KVEC_MAX_K || c->m < 0 || c->m > KVEC_MAX_M ||
		    c->chunk_size < KVEC_CHUNK_MIN)
			rc = -EPROTO;
	}
	if (rc) {
		kvc_close(c);
		return rc;
	}
	*out = c;
	return 0;
}

void kvc_close(struct kvc *c)
{
	if (!c)
		return;
	kvp_pool_destroy(c->pool);
	for (int i = 0; i < KVC_PREFETCH; i++)
		free(c->pre[i].b);
	for (int k = 0; k < KVEC_MAX_K; k++)
		for (int m = 0; m <= KVEC_MAX_M; m++)
			kvec_codec_destroy(c->codecs[k][m]);
	pthread_cond_destroy(&c->buf_cond);
	pthread_mutex_destroy(&c->buf_mu);
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&c->meta_mu);
	free(c);
}

void kvc_set_read_timeout(struct kvc *c, int ms)
{
	c->read_timeout_ms = ms > 0 ? ms : 2000;
}

void kvc_get_stats(struct kvc *c, struct kvc_stats *out)
{
	out->bytes_written = atomic_load(&c->st_written);
	out->bytes_read = atomic_load(&c->st_read);
	out->files_committed = atomic_load(&c->st_files);
	out->degraded_reads = atomic_load(&c->st_degraded);
	out->crc_errors = atomic_load(&c->st_crc);
	out->chunks_written_around = atomic_load(&c->st_around);
	out->stripes_prefetched = atomic_load(&c->st_prefetched);
}

/* ---- namespace ---- */

static int attr_call(struct kvc *c, uint16_t op, struct kvp_wbuf *w, int attempts,
		     struct kvp_attr *out, int *retried)
{
	uint8_t *b = NULL;
	uint32_t len = 0;
	int rc = kvc__meta_call(c, op, w, attempts, &b, &len, retried);
	kvp_w_free(w);
	if (rc == 0) {
		struct kvp_attr a;
		struct kvp_rbuf r;
		kvp_r_init(&r, b, len);
		kvp_r_attr(&r, &a);
		rc = kvp_r_end(&r);
		if (rc == 0 && out)
			*out = a;
	}
	free(b);
	return rc;
}

static int name_ok(const char *name)
{
	size_t n = name ? strlen(name) : 0;
	if (n == 0 || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, ".."))
		return -EINVAL;
	return n > KVP_NAME_MAX ? -ENAMETOOLONG : 0;
}

int kvc_lookup(struct kvc *c, uint64_t parent, const char *name, struct kvp_attr *out)
{
	int rc = name_ok(name);
	if (rc)
		return rc == -EINVAL ? -ENOENT : rc;
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, parent);
	kvp_w_cstr(&w, name);
	return attr_call(c, KVP_OP_LOOKUP, &w, KVC_META_ATTEMPTS, out, NULL);
}

/* Keeps b (ownership moves to c) as ino's layout, replacing the oldest kept. */
static void prefetched_put(struct kvc *c, uint64_t ino, uint8_t *b, uint32_t len)
{
	pthread_mutex_lock(&c->mu);
	uint32_t i = c->pre_next++ % KVC_PREFETCH;
	free(c->pre[i].b);
	c->pre[i].ino = ino;
	c->pre[i].at_ms = kvc__now_ms();
	c->pre[i].b = b;
	c->pre[i].len = len;
	pthread_mutex_unlock(&c->mu);
}

int kvc__prefetched_take(struct kvc *c, uint64_t ino, uint8_t **b, uint32_t *len)
{
	int rc = -ENOENT;
	int64_t now = kvc__now_ms();
	pthread_mutex_lock(&c->mu);
	for (int i = 0; i < KVC_PREFETCH && rc; i++) {
		if (c->pre[i].ino != ino || !c->pre[i].b)
			continue;
		if (now - c->pre[i].at_ms <= KVC_PREFETCH_MS) {
			*b = c->pre[i].b;
			*len = c->pre[i].len;
			rc = 0;
		} else {
			free(c->pre[i].b);
		}
		c->pre[i].b = NULL;
		c->pre[i].ino = 0;
	}
	pthread_mutex_unlock(&c->mu);
	return rc;
}

int kvc_lookup_layout(struct kvc *c, uint64_t parent, const char *name, struct kvp_attr *out)
{
	if (atomic_load_explicit(&c->lookup_flag_refused, memory_order_relaxed))
		return kvc_lookup(c, parent, name, out);
	int rc = name_ok(name);
	if (rc)
		return rc == -EINVAL ? -ENOENT : rc;
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, parent);
	kvp_w_cstr(&w, name);
	kvp_w_u8(&w, KVP_LOOKUP_LAYOUT);
	uint8_t *b = NULL;
	uint32_t len = 0;
	rc = kvc__meta_call(c, KVP_OP_LOOKUP, &w, KVC_META_ATTEMPTS, &b, &len, NULL);
	kvp_w_free(&w);
	if (rc == -EBADMSG) { /* an older meta: no flag byte */
		free(b);
		atomic_store_explicit(&c->lookup_flag_refused, 1, memory_order_relaxed);
		return kvc_lookup(c, parent, name, out);
	}
	struct kvp_attr a;
	struct kvp_rbuf r;
	if (rc == 0) {
		kvp_r_init(&r, b, len);
		kvp_r_attr(&r, &a);
		rc = r.err ? -EBADMSG : 0;
	}
	if (rc == 0 && S_ISREG(a.mode) && r.off < len) {
		/* the rest is a LAYOUT body; kvc_file_open parses (and checks) it */
		uint32_t rest = len - (uint32_t)r.off;
		uint8_t *lb = malloc(rest);
		if (lb) {
			memcpy(lb, b + r.off, rest);
			prefetched_put(c, a.ino, lb, rest);
		}
	} else if (rc == 0 && r.off != len) {
		rc = -EBADMSG;
	}
	free(b);
	if (rc == 0 && out)
		*out = a;
	return rc;
}

int kvc_getattr(struct kvc *c, uint64_t ino, struct kvp_attr *out)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, ino);
	return attr_call(c, KVP_OP_GETATTR, &w, KVC_META_ATTEMPTS, out, NULL);
}

int kvc_setattr(struct kvc *c, uint64_t ino, uint32_t valid, uint32_t mode, int64_t mtime_ns,
		int64_t atime_ns, struct kvp_attr *out)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, ino);
	kvp_w_u32(&w, valid);
	kvp_w_u32(&w, mode);
	kvp_w_i64(&w, mtime_ns);
	kvp_w_i64(&w, atime_ns);
	/* Setting absolute values twice gives the same result: safe to retry. */
	return attr_call(c, KVP_OP_SETATTR, &w, KVC_META_ATTEMPTS, out, NULL);
}

/* Non-idempotent calls are retried across a meta restart too. If the first try was applied
 * but its answer lost, the retry sees its effect: MKDIR -> -EEXIST (a directory is there: taken
 * as success), RMDIR/UNLINK -> -ENOENT (taken as success), RENAME -> -ENOENT (success when the
 * new name now exists). A concurrent client doing the same thing in that window is
 * indistinguishable; for a cache filesystem that is acceptable. */
int kvc_mkdir(struct kvc *c, uint64_t parent, const char *name, uint32_t mode, struct kvp_attr *out)
{
	return kvc_mkdir_owned(c, parent, name, mode, KVP_OWNER_NONE, KVP_OWNER_NONE, out);
}

int kvc_mkdir_owned(struct kvc *c, uint64_t parent, const char *name, uint32_t mode, uint32_t uid,
		    uint32_t gid, struct kvp_attr *out)
{
	int rc = name_ok(name);
	if (rc)
		return rc;
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, parent);
	kvp_w_cstr(&w, name);
	kvp_w_u32(&w, mode);
	if (uid != KVP_OWNER_NONE) { /* optional: an older meta parses none */
		kvp_w_u32(&w, uid);
		kvp_w_u32(&w, gid);
	}
	int retried;
	rc = attr_call(c, KVP_OP_MKDIR, &w, KVC_META_ATTEMPTS, out, &retried);
	if (rc == -EEXIST && retried) {
		struct kvp_attr a;
		if (kvc_lookup(c, parent, name, &a) == 0 && S_ISDIR(a.mode)) {
			if (out)
				*out = a;
			rc = 0;
		}
	}
	return rc;
}

static int name_call(struct kvc *c, uint16_t op, uint64_t parent, const char *name)
{
	int rc = name_ok(name);
	if (rc)
		return rc == -EINVAL ? -ENOENT : rc;
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, parent);
	kvp_w_cstr(&w, name);
	int retried;
	rc = kvc__meta_call(c, op, &w, KVC_META_ATTEMPTS, NULL, NULL, &retried);
	kvp_w_free(&w);
	return rc == -ENOENT && retried ? 0 : rc;
}

int kvc_rmdir(struct kvc *c, uint64_t parent, const char *name)
{
	return name_call(c, KVP_OP_RMDIR, parent, name);
}

int kvc_unlink(struct kvc *c, uint64_t parent, const char *name)
{
	return name_call(c, KVP_OP_UNLINK, parent, name);
}

int kvc_rename(struct kvc *c, uint64_t parent, const char *name, uint64_t newparent,
	       const char *newname, uint32_t flags)
{
	int rc = name_ok(name);
	if (rc || (rc = name_ok(newname)))
		return rc;
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, parent);
	kvp_w_cstr(&w, name);
	kvp_w_u64(&w, newparent);
	kvp_w_cstr(&w, newname);
	kvp_w_u32(&w, flags);
	int retried;
	rc = kvc__meta_call(c, KVP_OP_RENAME, &w, KVC_META_ATTEMPTS, NULL, NULL, &retried);
	kvp_w_free(&w);
	if (retried && (rc == -ENOENT || rc == -EEXIST)) {
		struct kvp_attr a;
		if (kvc_lookup(c, parent, name, &a) == -ENOENT &&
		    kvc_lookup(c, newparent, newname, &a) == 0)
			rc = 0;
	}
	return rc;
}

int kvc_readdir(struct kvc *c, uint64_t ino, struct kvc_dirent **out, size_t *n)
{
	struct kvc_dirent *v = NULL;
	size_t cnt = 0, cap = 0;
	char after[KVP_NAME_MAX + 1] = "";
	int rc;
	for (;;) {
		struct kvp_wbuf w;
		kvp_w_init(&w);
		kvp_w_u64(&w, ino);
		kvp_w_cstr(&w, after);
		kvp_w_u32(&w, 1024);
		uint8_t *b = NULL;
		uint32_t len = 0;
		rc = kvc__meta_call(c, KVP_OP_READDIR, &w, KVC_META_ATTEMPTS, &b, &len, NULL);
		kvp_w_free(&w);
		if (rc)
			break;
		struct kvp_rbuf r;
		kvp_r_init(&r, b, len);
		uint32_t nr = kvp_r_u32(&r);
		if (nr > len / 2) /* each entry needs more than 2 bytes: refuse absurd counts */
			r.err = -EBADMSG;
		if (!r.err && cnt + nr > cap) {
			size_t ncap = (cnt + nr) * 2 + 16;
			struct kvc_dirent *nv = realloc(v, ncap * sizeof(*nv));
			if (!nv) {
				free(b);
				rc = -ENOMEM;
				break;
			}
			v = nv;
			cap = ncap;
		}
		for (uint32_t i = 0; i < nr && !r.err; i++) {
			kvp_r_str(&r, v[cnt].name, sizeof(v[cnt].name));
			kvp_r_attr(&r, &v[cnt].attr);
			if (!r.err)
				cnt++;
		}
		uint8_t eof = kvp_r_u8(&r);
		rc = kvp_r_end(&r);
		free(b);
		if (rc)
			break;
		if (eof || nr == 0)
			break;
		snprintf(after, sizeof(after), "%s", v[cnt - 1].name);
	}
	if (rc) {
		free(v);
		return rc;
	}
	*out = v;
	*n = cnt;
	return 0;
}

int kvc_nodes(struct kvc *c, struct kvc_node **out, size_t *n)
{
	uint8_t *b = NULL;
	uint32_t len = 0;
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u8(&w, KVP_NODES_ZONES);
	int rc =
	    w.err ? w.err : kvc__meta_call(c, KVP_OP_NODES, &w, KVC_META_ATTEMPTS, &b, &len, NULL);
	kvp_w_free(&w);
	if (rc)
		return rc;
	struct kvp_rbuf r;
	kvp_r_init(&r, b, len);
	uint32_t nr = kvp_r_u32(&r);
	struct kvc_node *v = NULL;
	if (nr > len / 16)
		r.err = -EBADMSG;
	else if (!(v = calloc(nr ? nr : 1, sizeof(*v))))
		r.err = -ENOMEM;
	for (uint32_t i = 0; i < nr && !r.err; i++) {
		v[i].id = kvp_r_u32(&r);
		v[i].uuid = kvp_r_u64(&r);
		kvp_r_str(&r, v[i].addr, sizeof(v[i].addr));
		v[i].state = kvp_r_u8(&r);
		v[i].capacity = kvp_r_u64(&r);
		v[i].used = kvp_r_u64(&r);
		v[i].chunks = kvp_r_u64(&r);
		v[i].heartbeat_ns = kvp_r_i64(&r);
	}
	for (uint32_t i = 0; i < nr && !r.err; i++)
		kvp_r_str(&r, v[i].zone, sizeof(v[i].zone));
	rc = r.err ? r.err : kvp_r_end(&r);
	free(b);
	if (rc) {
		free(v);
		return rc;
	}
	*out = v;
	*n = nr;
	return 0;
}

/* ---- paths ---- */

/* Next component of *p (skipping slashes) into name; 0 at the end, 1 found, <0 error. */
static int next_comp(const char **p, char *name)
{
	const char *s = *p;
	while (*s == '/')
		s++;
	if (!*s)
		return 0;
	size_t n = strcspn(s, "/");
	if (n > KVP_NAME_MAX)
		return -ENAMETOOLONG;
	memcpy(name, s, n);
	name[n] = 0;
	*p = s + n;
	return 1;
}

/* Walks the absolute path from the root: 0 with its last component's attributes in *a. With
 * make, a component that does not exist is made a directory (mode) on the way, as mkdir -p;
 * one made by someone else meanwhile is taken as found. */
static int walk(struct kvc *c, const char *path, int make, uint32_t mode, struct kvp_attr *a)
{
	if (!path || path[0] != '/')
		return -EINVAL;
	int rc = kvc_getattr(c, KVP_ROOT_INO, a);
	char name[KVP_NAME_MAX + 1];
	const char *p = path;
	while (rc == 0 && (rc = next_comp(&p, name)) == 1) {
		if (!S_ISDIR(a->mode))
			return -ENOTDIR;
		uint64_t parent = a->ino;
		rc = kvc_lookup(c, parent, name, a);
		if (make && rc == -ENOENT) {
			rc = kvc_mkdir(c, parent, name, mode, a);
			if (rc == -EEXIST)
				rc = kvc_lookup(c, parent, name, a);
		}
	}
	return rc;
}

int kvc_resolve(struct kvc *c, const char *path, struct kvp_attr *out)
{
	struct kvp_attr a;
	int rc = walk(c, path, 0, 0, &a);
	if (rc == 0 && out)
		*out = a;
	return rc;
}

int kvc_resolve_parent(struct kvc *c, const char *path, uint64_t *parent, const char **name)
{
	if (!path || path[0] != '/')
		return -EINVAL;
	size_t n = strlen(path);
	while (n > 1 && path[n - 1] == '/')
		n--;
	const char *last = path + n;
	while (last > path && last[-1] != '/')
		last--;
	if (last == path + n || path[n] == '/')
		return -EINVAL; /* "/" has no parent; a trailing slash names a directory */
	char *dir = strndup(path, (size_t)(last - path));
	if (!dir)
		return -ENOMEM;
	struct kvp_attr a;
	int rc = kvc_resolve(c, dir, &a);
	free(dir);
	if (rc)
		return rc;
	if (!S_ISDIR(a.mode))
		return -ENOTDIR;
	*parent = a.ino;
	*name = last;
	return 0;
}

int kvc_mkdir_p(struct kvc *c, const char *path, uint32_t mode)
{
	struct kvp_attr a;
	int rc = walk(c, path, 1, mode, &a);
	if (rc == 0 && !S_ISDIR(a.mode))
		rc = -ENOTDIR;
	return rc;
}
