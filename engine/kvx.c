/* kvx: creation, presence lookup by binary search, and io_uring loads straight into KV memory.
 * The writer thread lives in kvx_save.c. */

#define KVFS_LOG_TAG "kvx"
#include "kvx.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "kvx_int.h"
#include "log.h"

void kvx_opts_default(struct kvx_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->queue_depth = KVX_QUEUE_DEPTH_DEFAULT;
	o->save_slots = KVX_SAVE_SLOTS_DEFAULT;
	o->load_enable = 1;
	o->save_enable = 1;
	o->known_ttl_ms = KVX_KNOWN_TTL_MS;
}

/* ---- lifecycle ---- */

int kvx_dir_on_kvfs(const char *dir)
{
	char p[PATH_MAX];
	struct stat st, up;
	struct statfs sfs;
	if (!realpath(dir, p) || stat(p, &st) != 0 || statfs(p, &sfs) != 0 ||
	    (uint32_t)sfs.f_type != KVX_FUSE_SUPER_MAGIC)
		return 0;
	/* Up to the root of the file system: the last ancestor on the same device. */
	for (char *slash; (slash = strrchr(p, '/')) && slash != p;) {
		*slash = 0;
		if (stat(p, &up) != 0 || up.st_dev != st.st_dev) {
			*slash = '/';
			break;
		}
	}
	char probe[PATH_MAX + 16];
	snprintf(probe, sizeof(probe), "%s/.kvfs/cluster", strcmp(p, "/") ? p : "");
	return access(probe, F_OK) == 0;
}

int kvx_create(struct kvi_engine *e, const struct kvi_model *m, const struct kvx_opts *o,
	       struct kvx **out)
{
	if (!e)
		return -EINVAL;
	int rc = kvx_create_kv(kvi_engine_kv(e), m, o, out);
	if (!rc)
		(*out)->e = e;
	return rc;
}

int kvx_create_kv(struct kvi_kv *kv, const struct kvi_model *m, const struct kvx_opts *o,
		  struct kvx **out)
{
	if (!kv || !m || !o || !o->dir || !out || o->queue_depth < 1 ||
	    o->queue_depth > KVX_QUEUE_DEPTH_MAX || o->save_slots < 1 ||
	    o->save_slots > KVX_SAVE_SLOTS_MAX)
		return -EINVAL;
	const struct kvi_kv_geom *kg = kvi_kv_geom(kv);
	if (kg->block_tokens > KVB_MAX_TOKENS) {
		klog_error("block size %d > %d tokens: cannot cache", kg->block_tokens,
			   KVB_MAX_TOKENS);
		return -EINVAL;
	}
	struct kvx *x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	int ret = -ENOMEM;
	x->kv = kv;
	x->o = *o;
	x->o.dir = x->dir;
	x->dirfd = -1;
	x->B = kg->block_tokens;
	x->g = (struct kvb_geom){(uint32_t)kg->n_layer, (uint32_t)kg->n_head_kv,
				 (uint32_t)kg->head_dim, KVB_DTYPE_F16, (uint32_t)kg->block_tokens};
	x->payload = kvb_payload_bytes(&x->g);
	if (x->payload != kvi_kv_block_bytes(kv)) {
		klog_error("KV block is %zu bytes, block file payload %llu", kvi_kv_block_bytes(kv),
			   (unsigned long long)x->payload);
		ret = -EINVAL;
		goto fail;
	}
	kvb_fingerprint(m->fingerprint, &x->g, x->fp);
	kvb_hex(x->fp, KVB_HASH, x->fphex);
	if (snprintf(x->dir, sizeof(x->dir), "%s", o->dir) >= (int)sizeof(x->dir) ||
	    snprintf(x->model_dir, sizeof(x->model_dir), "%s/%s", o->dir, x->fphex) >=
		(int)sizeof(x->model_dir)) {
		ret = -ENAMETOOLONG;
		goto fail;
	}
	x->dirfd = open(x->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (x->dirfd < 0) {
		ret = -errno;
		klog_error("kv dir %s: %s", x->dir, strerror(errno));
		goto fail;
	}
	x->is_kvfs = kvx_dir_on_kvfs(x->dir);
	x->known_cap = KVX_KNOWN_CAP;
	x->known = calloc((size_t)x->known_cap, sizeof(*x->known));
	x->nslots = o->save_slots;
	x->slots = calloc((size_t)x->nslots, sizeof(*x->slots));
	x->slot_tokens = malloc((size_t)x->nslots * (size_t)x->B * sizeof(int32_t));
	x->wbatch = calloc((size_t)o->queue_depth, sizeof(*x->wbatch));
	x->wjobs = calloc((size_t)o->queue_depth, kvx_wjob_size());
	x->whdrs = malloc((size_t)o->queue_depth * KVB_HEADER_SIZE);
	if (!x->known || !x->slots || !x->slot_tokens || !x->wbatch || !x->wjobs || !x->whdrs)
		goto fail;
	for (int i = 0; i < x->nslots; i++)
		x->slots[i].tokens = x->slot_tokens + (size_t)i * (size_t)x->B;
	/* room for every open, read and close of queue_depth blocks at once */
	if ((ret = io_uring_queue_init((unsigned)o->queue_depth * 2, &x->ring, 0)) < 0) {
		klog_error("io_uring_queue_init: %s", strerror(-ret));
		goto fail;
	}
	x->ring_ok = 1;
	/* Reads of a FUSE or network file block in io-wq workers; the default bound (4 per CPU)
	 * would cap the reads in flight below queue_depth on small machines. */
	unsigned int workers[2] = {(unsigned)o->queue_depth, 0};
	io_uring_register_iowq_max_workers(&x->ring, workers);
	pthread_mutex_init(&x->mu, NULL);
	pthread_cond_init(&x->cv_work, NULL);
	pthread_cond_init(&x->cv_done, NULL);
	if (o->save_enable) {
		if ((ret = -pthread_create(&x->writer, NULL, kvx_writer_main, x)) < 0) {
			io_uring_queue_exit(&x->ring);
			goto fail_sync;
		}
		x->writer_started = 1;
	}
	klog_info("kv dir %s (%s), cache fingerprint %.16s…, block %llu bytes", x->dir,
		  x->is_kvfs ? "kvfs: publish on close" : "local: publish by rename", x->fphex,
		  (unsigned long long)(KVB_HEADER_SIZE + x->payload));
	*out = x;
	return 0;
fail_sync:
	pthread_mutex_destroy(&x->mu);
	pthread_cond_destroy(&x->cv_work);
	pthread_cond_destroy(&x->cv_done);
fail:
	if (x->dirfd >= 0)
		close(x->dirfd);
	free(x->known);
	free(x->slots);
	free(x->slot_tokens);
	free(x->wbatch);
	free(x->wjobs);
	free(x->whdrs);
	free(x);
	return ret;
}

void kvx_destroy(struct kvx *x)
{
	if (!x)
		return;
	kvx_flush(x);
	if (x->writer_started) {
		pthread_mutex_lock(&x->mu);
		x->stop = 1;
		pthread_cond_broadcast(&x->cv_work);
		pthread_mutex_unlock(&x->mu);
		pthread_join(x->writer, NULL);
	}
	if (x->ring_ok)
		io_uring_queue_exit(&x->ring);
	pthread_mutex_destroy(&x->mu);
	pthread_cond_destroy(&x->cv_work);
	pthread_cond_destroy(&x->cv_done);
	close(x->dirfd);
	free(x->known);
	free(x->slots);
	free(x->slot_tokens);
	free(x->wbatch);
	free(x->wjobs);
	free(x->whdrs);
	free(x);
}

void kvx_stats_get(struct kvx *x, struct kvx_stats *out)
{
	pthread_mutex_lock(&x->mu);
	*out = x->st;
	pthread_mutex_unlock(&x->mu);
}

const char *kvx_model_dir(const struct kvx *x)
{
	return x->model_dir;
}

const char *kvx_dir(const struct kvx *x)
{
	return x->dir;
}

int kvx_is_kvfs(const struct kvx *x)
{
	return x->is_kvfs;
}

/* ---- lookup ---- */

static int present(struct kvx *x, const uint8_t h[KVB_HASH], uint64_t *probes)
{
	if (kvx_known_has(x, h))
		return 1;
	char rel[KVX_PATH_REL];
	if (kvb_path(x->fp, h, rel, sizeof(rel)))
		return 0;
	(*probes)++;
	return faccessat(x->dirfd, rel, F_OK, 0) == 0;
}

/* Longest c in [0, nb] with blocks 0..c-1 present, assuming presence is monotone (a hole made
 * by eviction only shortens the hit later, when that block fails to open). The longest
 * candidate is probed first: a full hit costs one call. */
static int longest_present(struct kvx *x, uint8_t (*h)[KVB_HASH], int nb, uint64_t *probes)
{
	if (nb == 0)
		return 0;
	if (present(x, h[nb - 1], probes))
		return nb;
	int lo = 0, hi = nb; /* blocks [0, lo) assumed present; block hi-1 absent */
	while (hi - lo > 1) {
		int mid = lo + (hi - lo) / 2;
		if (present(x, h[mid - 1], probes))
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

/* ---- loading ---- */

enum { OP_OPEN = 0, OP_READ = 1, OP_CLOSE = 2 };

struct ld {
	char rel[KVX_PATH_REL];
	int id;	  /* KV block */
	int fd;	  /* -1 until opened */
	int err;  /* first failure, 0 = good so far */
	int verr; /* verification result once read (0 = loadable) */
	int done; /* finished reading (or failed) */
	size_t got;
	uint8_t extra; /* one byte past the expected end: a longer file is detected */
	uint8_t *hdr;
	uint8_t *mem;
};

static void prep_read(struct io_uring_sqe *sqe, struct ld *l, struct iovec iov[3], size_t want)
{
	/* iovecs for the bytes still missing: header, payload, one extra byte */
	struct iovec all[3] = {
	    {l->hdr, KVB_HEADER_SIZE}, {l->mem, want - KVB_HEADER_SIZE}, {&l->extra, 1}};
	size_t skip = l->got;
	int n = 0;
	for (int i = 0; i < 3; i++) {
		if (skip >= all[i].iov_len) {
			skip -= all[i].iov_len;
			continue;
		}
		iov[n].iov_base = (uint8_t *)all[i].iov_base + skip;
		iov[n].iov_len = all[i].iov_len - skip;
		skip = 0;
		n++;
	}
	io_uring_prep_readv(sqe, l->fd, iov, (unsigned)n, l->got);
}

static struct io_uring_sqe *sqe_get(struct io_uring *r)
{
	struct io_uring_sqe *s = io_uring_get_sqe(r);
	if (!s) {
		io_uring_submit(r);
		s = io_uring_get_sqe(r);
	}
	return s;
}

static int verify(struct kvx *x, const struct ld *b, uint8_t (*h)[KVB_HASH], int i,
		  const int32_t *tokens);

/* What read_blocks needs to check a block as soon as its read completes (the CRC of one
 * block overlaps the reads of the others). */
struct chain {
	uint8_t (*h)[KVB_HASH];
	const int32_t *tokens;
};

/* Finishes block b: closes its file through the ring (counted in *closing). */
static void finish(struct kvx *x, struct ld *b, int err, int *closing)
{
	b->done = 1;
	if (err && !b->err)
		b->err = err;
	if (b->fd >= 0) {
		struct io_uring_sqe *s = sqe_get(&x->ring);
		if (s) {
			io_uring_prep_close(s, b->fd);
			io_uring_sqe_set_data64(s, OP_CLOSE);
			(*closing)++;
		} else {
			close(b->fd);
		}
		b->fd = -1;
	}
}

/* Opens and reads blocks [0, nb) with up to queue_depth operations in flight. Opening stops
 * past the first failure (later blocks could not be used). Returns 0 or the ring's error (then
 * every block not read whole has err set). */
static int read_blocks(struct kvx *x, struct ld *l, struct iovec (*iov)[3], int nb,
		       const struct chain *ch)
{
	size_t want = KVB_HEADER_SIZE + x->payload;
	int limit = nb, next = 0, inflight = 0, closing = 0;
	while (inflight > 0 || closing > 0 || next < limit) {
		while (next < limit && inflight < x->o.queue_depth) {
			struct io_uring_sqe *s = sqe_get(&x->ring);
			if (!s)
				break;
			io_uring_prep_openat(s, x->dirfd, l[next].rel, O_RDONLY | O_CLOEXEC, 0);
			io_uring_sqe_set_data64(s, ((uint64_t)next << KVX_OP_BITS) | OP_OPEN);
			/* straight to a worker: an inline attempt on a network/FUSE file
			 * would only fail with EAGAIN first */
			io_uring_sqe_set_flags(s, IOSQE_ASYNC);
			next++;
			inflight++;
		}
		int r = io_uring_submit_and_wait(&x->ring, 1);
		if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
			klog_error("io_uring submit: %s", strerror(-r));
			/* operations may still be in flight into our buffers: the caller tears the
			 * ring down (io_uring_queue_exit waits for them) before freeing */
			for (int i = 0; i < nb; i++)
				if (!l[i].done)
					l[i].err = r;
			return r;
		}
		struct io_uring_cqe *c;
		unsigned head, seen = 0;
		io_uring_for_each_cqe(&x->ring, head, c)
		{
			seen++;
			uint64_t ud = io_uring_cqe_get_data64(c);
			int i = (int)(ud >> KVX_OP_BITS), op = (int)(ud & KVX_OP_MASK),
			    res = c->res;
			if (op == OP_CLOSE) {
				closing--;
				continue;
			}
			struct ld *b = &l[i];
			if (op == OP_OPEN && res >= 0) {
				b->fd = res;
			} else if (op == OP_OPEN) {
				inflight--;
				finish(x, b, res, &closing);
			} else if (res == -EINTR || res == -EAGAIN) {
				/* retried below */
			} else if (res < 0) {
				inflight--;
				finish(x, b, res, &closing);
			} else if (res == 0 || b->got + (size_t)res > want) {
				/* end of file, or the extra byte arrived: the size is known */
				b->got += (size_t)res;
				inflight--;
				finish(x, b, 0, &closing);
			} else {
				b->got += (size_t)res;
			}
			if (!b->done) { /* (re)issue the read for the missing bytes (short reads) */
				struct io_uring_sqe *s = sqe_get(&x->ring);
				if (!s) {
					inflight--;
					finish(x, b, -EBUSY, &closing);
				} else {
					prep_read(s, b, iov[i], want);
					io_uring_sqe_set_data64(s, ((uint64_t)i << KVX_OP_BITS) |
								       OP_READ);
					io_uring_sqe_set_flags(s, IOSQE_ASYNC);
				}
			}
			if (b->done) {
				b->verr = verify(x, b, ch->h, i, ch->tokens);
				if (b->verr)
					limit = next; /* open nothing past a failure: unusable */
			}
		}
		io_uring_cq_advance(&x->ring, seen);
	}
	return 0;
}

static const char *reason_name(int r)
{
	switch (r) {
	case -ENOENT:
		return "absent";
	case -EBADMSG:
		return "corrupt";
	case KVB_E_OTHER_MODEL:
		return "wrong model";
	case KVB_E_NOT_THIS:
		return "mismatch";
	case -EIO:
		return "truncated";
	default:
		return "i/o error";
	}
}

static void count_miss(struct kvx_stats *st, int r)
{
	switch (r) {
	case -ENOENT:
		st->miss_absent++;
		break;
	case -EBADMSG:
		st->miss_corrupt++;
		break;
	case KVB_E_OTHER_MODEL:
		st->miss_wrong_model++;
		break;
	case KVB_E_NOT_THIS:
		st->miss_mismatch++;
		break;
	case -EIO:
		st->miss_truncated++;
		break;
	default:
		st->miss_io++;
	}
}

/* Checks block i as read: size, header against what the chain expects, payload CRC. Returns 0
 * or the miss reason: -ENOENT absent, -EBADMSG corrupt, KVB_E_OTHER_MODEL, KVB_E_NOT_THIS
 * (kvb.h), -EIO size. */
static int verify(struct kvx *x, const struct ld *b, uint8_t (*h)[KVB_HASH], int i,
		  const int32_t *tokens)
{
	if (b->err)
		return b->err == -ENOENT ? -ENOENT : b->err;
	struct kvb_header hd;
	if (b->got < KVB_HEADER_SIZE)
		return -EIO;
	int r = kvb_header_check(b->hdr, x->fp, h[i], i ? h[i - 1] : NULL, &x->g,
				 tokens + (size_t)i * (size_t)x->B, (uint32_t)x->B, 0, &hd);
	if (r == -EPROTO)
		r = -EBADMSG;
	if (r)
		return r;
	if (b->got != KVB_HEADER_SIZE + x->payload)
		return -EIO;
	return kvb_payload_check(&hd, b->mem, x->payload);
}

int kvx_load_prefix(struct kvx *x, struct kvi_seq *seq, const int32_t *tokens, int n,
		    const char *salt, int *cached)
{
	return kvx_load_prefix_images(x, seq, tokens, n, salt, NULL, 0, cached);
}

int kvx_load_prefix_images(struct kvx *x, struct kvi_seq *seq, const int32_t *tokens, int n,
			   const char *salt, const struct kvb_image *img, int nimg, int *cached)
{
	if (!x || !seq || !tokens || n < 1 || !cached || kvi_seq_len(seq) != 0 ||
	    kvi_seq_kv(seq) != x->kv)
		return -EINVAL;
	*cached = 0;
	kvx_drain_done(x);
	uint64_t t0 = kvx_now_ns(), probes = 0;
	/* never the block holding the last token: prefill must compute it for logits */
	int nb = (n - 1) / x->B;
	if (!x->o.load_enable || nb == 0) {
		pthread_mutex_lock(&x->mu);
		x->st.lookups++;
		pthread_mutex_unlock(&x->mu);
		return 0;
	}
	uint8_t(*h)[KVB_HASH] = malloc((size_t)nb * KVB_HASH);
	struct ld *l = calloc((size_t)nb, sizeof(*l));
	struct iovec(*iov)[3] = malloc((size_t)nb * sizeof(*iov));
	uint8_t *hdrs = NULL;
	int ret = -ENOMEM, hit = 0, miss = 0, nread = 0;
	if (!h || !l || !iov)
		goto out;
	uint8_t salt_d[KVB_HASH];
	kvb_salt_digest(salt, salt_d);
	if (kvb_chain_images(x->fp, salt_d, tokens, n, x->B, img, nimg, h, nb) != nb) {
		ret = -EINVAL;
		goto out;
	}
	nread = longest_present(x, h, nb, &probes);
	if (nread < nb)
		miss = -ENOENT;
	if (nread > 0 && !(hdrs = malloc((size_t)nread * KVB_HEADER_SIZE)))
		goto out;
	int nalloc = 0;
	for (; nalloc < nread; nalloc++) {
		int id = kvi_kv_block_alloc(x->kv);
		if (id < 0)
			break;
		struct ld *b = &l[nalloc];
		b->id = id;
		b->fd = -1;
		b->hdr = hdrs + (size_t)nalloc * KVB_HEADER_SIZE;
		/* the block's start: its layout is the file payload (kv.h) */
		b->mem = (uint8_t *)kvi_kv_row(x->kv, id, 0, 0, 0);
		kvb_path(x->fp, h[nalloc], b->rel, sizeof(b->rel));
	}
	if (nalloc < nread) {
		klog_warn("KV pool full: loading %d of %d cached blocks", nalloc, nread);
		miss = -ENOSPC;
	}
	struct chain ch = {h, tokens};
	if ((ret = read_blocks(x, l, iov, nalloc, &ch)) < 0) {
		/* reads may still target KV memory: rebuild the ring (waits for them) */
		io_uring_queue_exit(&x->ring);
		if (io_uring_queue_init((unsigned)x->o.queue_depth * 2, &x->ring, 0) < 0) {
			klog_error("io_uring lost: loading disabled");
			x->o.load_enable = 0;
			x->ring_ok = 0;
		}
	}
	for (; hit < nalloc; hit++) {
		int r = l[hit].done ? l[hit].verr : -EIO;
		if (r) {
			miss = r;
			if (r != -ENOENT)
				klog_warn("cached block %s: %s, recomputing from token %d",
					  l[hit].rel, reason_name(r), hit * x->B);
			break;
		}
	}
	int32_t *ids = malloc((size_t)(hit ? hit : 1) * sizeof(int32_t));
	ret = -ENOMEM;
	if (ids) {
		for (int i = 0; i < hit; i++)
			ids[i] = l[i].id;
		ret = hit ? kvi_seq_attach(seq, ids, hit, hit * x->B) : 0;
		free(ids);
	}
	if (ret < 0)
		hit = 0;
	for (int i = 0; i < nalloc; i++)
		kvi_kv_block_unref(x->kv, l[i].id); /* the sequence holds the good ones */
	for (int i = 0; i < hit; i++)
		kvx_known_add(x, h[i]);
	*cached = hit * x->B;
out:
	pthread_mutex_lock(&x->mu);
	x->st.lookups++;
	x->st.probes += probes;
	x->st.hit_blocks += (uint64_t)hit;
	x->st.cached_tokens += (uint64_t)hit * (uint64_t)x->B;
	x->st.loaded_bytes += (uint64_t)hit * (KVB_HEADER_SIZE + x->payload);
	if (miss && (miss != -ENOSPC))
		count_miss(&x->st, miss);
	else if (miss)
		x->st.miss_io++;
	x->st.load_ns += kvx_now_ns() - t0;
	pthread_mutex_unlock(&x->mu);
	free(h);
	free(l);
	free(iov);
	free(hdrs);
	return ret < 0 ? ret : 0;
}
