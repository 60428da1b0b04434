/* kvx: queueing saves (caller thread) and the writer thread that publishes block files with
 * its own io_uring: create -> write -> close (+ rename on a local directory). */

#define KVFS_LOG_TAG "kvx"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kvx_int.h"
#include "log.h"

/* ---- caller side ---- */

void kvx_drain_done(struct kvx *x)
{
	pthread_mutex_lock(&x->mu);
	for (int i = 0; i < x->nslots && x->n_busy > 0; i++) {
		struct kvx_slot *s = &x->slots[i];
		if (s->state != SLOT_DONE)
			continue;
		kvi_kv_block_unref(x->kv, s->block_id);
		if (s->result >= 0)
			kvx_known_add(x, s->hash);
		s->state = SLOT_FREE;
		x->n_busy--;
	}
	pthread_mutex_unlock(&x->mu);
}

int kvx_save(struct kvx *x, struct kvi_seq *seq, const int32_t *tokens, int n, const char *salt)
{
	return kvx_save_images(x, seq, tokens, n, salt, NULL, 0);
}

int kvx_save_images(struct kvx *x, struct kvi_seq *seq, const int32_t *tokens, int n,
		    const char *salt, const struct kvb_image *img, int nimg)
{
	if (!x || !seq || !tokens || n < 0 || n > kvi_seq_len(seq) || kvi_seq_kv(seq) != x->kv)
		return -EINVAL;
	kvx_drain_done(x);
	int nb = n / x->B;
	if (!x->o.save_enable || nb == 0)
		return 0;
	uint8_t(*h)[KVB_HASH] = malloc((size_t)nb * KVB_HASH);
	if (!h)
		return -ENOMEM;
	uint8_t salt_d[KVB_HASH];
	kvb_salt_digest(salt, salt_d);
	if (kvb_chain_images(x->fp, salt_d, tokens, n, x->B, img, nimg, h, nb) != nb) {
		free(h);
		return -EINVAL;
	}
	const int32_t *blocks = kvi_seq_blocks(seq);
	/* A device engine's blocks live in device memory: make the host copy of those about to
	 * be queued current first (kv.h; nothing to do for the CPU engine). */
	int32_t *want = malloc((size_t)nb * sizeof(int32_t));
	int nwant = 0;
	if (!want) {
		free(h);
		return -ENOMEM;
	}
	for (int i = 0; i < nb; i++)
		if (!kvx_known_has(x, h[i]))
			want[nwant++] = blocks[i];
	int rc = kvi_kv_host_sync(x->kv, want, nwant);
	free(want);
	if (rc) {
		pthread_mutex_lock(&x->mu);
		x->st.save_errors += (uint64_t)nwant;
		pthread_mutex_unlock(&x->mu);
		free(h);
		return rc;
	}
	int queued = 0, slot = 0;
	pthread_mutex_lock(&x->mu);
	for (int i = 0; i < nb; i++) {
		if (kvx_known_has(x, h[i]))
			continue;
		while (slot < x->nslots && x->slots[slot].state != SLOT_FREE)
			slot++;
		if (slot == x->nslots) { /* every slot busy: drop the rest, never wait */
			for (int j = i; j < nb; j++)
				x->st.dropped_saves += !kvx_known_has(x, h[j]);
			break;
		}
		struct kvx_slot *s = &x->slots[slot];
		memcpy(s->hash, h[i], KVB_HASH);
		if (i)
			memcpy(s->parent, h[i - 1], KVB_HASH);
		else
			memset(s->parent, 0, KVB_HASH);
		s->first = i == 0;
		s->block_id = blocks[i];
		kvi_kv_block_ref(x->kv, blocks[i]);
		s->mem = kvi_kv_row(x->kv, blocks[i], 0, 0, 0);
		memcpy(s->tokens, tokens + (size_t)i * (size_t)x->B,
		       (size_t)x->B * sizeof(int32_t));
		s->seq = x->next_seq++;
		s->result = 0;
		s->state = SLOT_QUEUED;
		x->n_busy++;
		queued++;
	}
	if (queued)
		pthread_cond_signal(&x->cv_work);
	pthread_mutex_unlock(&x->mu);
	free(h);
	return queued;
}

static int pending(const struct kvx *x)
{
	for (int i = 0; i < x->nslots; i++)
		if (x->slots[i].state == SLOT_QUEUED || x->slots[i].state == SLOT_WRITING)
			return 1;
	return 0;
}

void kvx_flush(struct kvx *x)
{
	if (!x)
		return;
	pthread_mutex_lock(&x->mu);
	while (x->writer_started && pending(x))
		pthread_cond_wait(&x->cv_done, &x->mu);
	pthread_mutex_unlock(&x->mu);
	kvx_drain_done(x);
}

/* ---- writer thread ---- */

enum { W_OPEN = 0, W_WRITE = 1, W_CLOSE = 2 };

struct wjob {
	struct kvx_slot *s;
	char rel[KVX_PATH_REL], tmp[KVX_PATH_REL + 48];
	uint8_t *hdr;
	int fd;
	size_t got;
	int err;
	int result; /* 1 saved, 0 existed, < 0 error */
	int active; /* in the io_uring pipeline */
	int opened; /* we created the file */
	struct iovec iov[2];
};

size_t kvx_wjob_size(void)
{
	return sizeof(struct wjob);
}

struct writer {
	struct kvx *x;
	struct io_uring ring;
	int ring_ok;
	uint8_t fp_dir_ok;
	uint8_t sub_ok[256];
	uint64_t tmp_ctr;
	struct wjob *jobs;
	uint8_t *hdrs;
	struct kvb_header hd;
};

static int mkdir_ok(int dirfd, const char *rel)
{
	if (mkdirat(dirfd, rel, 0755) == 0 || errno == EEXIST)
		return 0;
	return -errno;
}

/* Directories <fp>/ and <fp>/<2 hex>/, created once per writer (eviction never removes them
 * from under a writer for long: a failed create below recreates them next time). */
static int ensure_dirs(struct writer *w, const uint8_t h[KVB_HASH])
{
	struct kvx *x = w->x;
	int r;
	if (!w->fp_dir_ok) {
		if ((r = mkdir_ok(x->dirfd, x->fphex)))
			return r;
		w->fp_dir_ok = 1;
	}
	if (!w->sub_ok[h[0]]) {
		char rel[KVX_PATH_REL];
		snprintf(rel, sizeof(rel), "%s/%02x", x->fphex, h[0]);
		if ((r = mkdir_ok(x->dirfd, rel)))
			return r;
		w->sub_ok[h[0]] = 1;
	}
	return 0;
}

/* Sync part before the pipeline: directories, existence probe, header. Returns 1 to write. */
static int job_prepare(struct writer *w, struct wjob *j)
{
	struct kvx *x = w->x;
	struct kvx_slot *s = j->s;
	kvb_path(x->fp, s->hash, j->rel, sizeof(j->rel));
	if (faccessat(x->dirfd, j->rel, F_OK, 0) == 0) {
		j->result = 0;
		return 0;
	}
	int r = ensure_dirs(w, s->hash);
	if (r) {
		j->result = r;
		return 0;
	}
	struct kvb_header *h = &w->hd; /* 3.6 KB: not on the stack */
	memset(h, 0, sizeof(*h));
	memcpy(h->fingerprint, x->fp, KVB_HASH);
	memcpy(h->hash, s->hash, KVB_HASH);
	memcpy(h->parent, s->parent, KVB_HASH);
	h->geom = x->g;
	h->ntokens = (uint32_t)x->B;
	h->payload_bytes = x->payload;
	h->payload_crc = kvb_payload_crc(s->mem, x->payload);
	memcpy(h->tokens, s->tokens, (size_t)x->B * sizeof(int32_t));
	r = kvb_header_write(h, j->hdr);
	if (r) {
		j->result = r;
		return 0;
	}
	if (x->is_kvfs)
		snprintf(j->tmp, sizeof(j->tmp), "%s", j->rel);
	else
		/* unique per writer thread (several connectors may share a process) */
		snprintf(j->tmp, sizeof(j->tmp), "%s.tmp.%d.%d.%llu", j->rel, (int)getpid(),
			 (int)gettid(), (unsigned long long)w->tmp_ctr++);
	j->fd = -1;
	j->got = 0;
	j->err = 0;
	j->active = 1;
	return 1;
}

static struct io_uring_sqe *wsqe(struct io_uring *r)
{
	struct io_uring_sqe *s = io_uring_get_sqe(r);
	if (!s) {
		io_uring_submit(r);
		s = io_uring_get_sqe(r);
	}
	return s;
}

static void prep_write(struct kvx *x, struct io_uring_sqe *sqe, struct wjob *j)
{
	struct iovec all[2] = {{j->hdr, KVB_HEADER_SIZE}, {(void *)j->s->mem, x->payload}};
	size_t skip = j->got;
	int n = 0;
	for (int i = 0; i < 2; i++) {
		if (skip >= all[i].iov_len) {
			skip -= all[i].iov_len;
			continue;
		}
		j->iov[n].iov_base = (uint8_t *)all[i].iov_base + skip;
		j->iov[n].iov_len = all[i].iov_len - skip;
		skip = 0;
		n++;
	}
	io_uring_prep_writev(sqe, j->fd, j->iov, (unsigned)n, j->got);
}

/* create -> write -> close for every active job, all in flight together. */
static void run_pipeline(struct writer *w, int nj)
{
	struct kvx *x = w->x;
	size_t want = KVB_HEADER_SIZE + x->payload;
	int live = 0;
	for (int i = 0; i < nj; i++) {
		struct wjob *j = &w->jobs[i];
		if (!j->active)
			continue;
		struct io_uring_sqe *s = wsqe(&w->ring);
		if (!s) {
			j->active = 0;
			j->result = -EBUSY;
			continue;
		}
		io_uring_prep_openat(s, x->dirfd, j->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
				     0644);
		io_uring_sqe_set_data64(s, ((uint64_t)i << KVX_OP_BITS) | W_OPEN);
		live++;
	}
	while (live > 0) {
		int r = io_uring_submit_and_wait(&w->ring, 1);
		if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
			klog_error("writer io_uring: %s", strerror(-r));
			break; /* jobs left active are failed by the caller of this function */
		}
		struct io_uring_cqe *c;
		unsigned head, seen = 0;
		io_uring_for_each_cqe(&w->ring, head, c)
		{
			seen++;
			uint64_t ud = io_uring_cqe_get_data64(c);
			int i = (int)(ud >> KVX_OP_BITS), op = (int)(ud & KVX_OP_MASK),
			    res = c->res;
			struct wjob *j = &w->jobs[i];
			int next = -1; /* W_WRITE or W_CLOSE to issue */
			if (op == W_OPEN) {
				if (res < 0) {
					j->err = res;
					j->active = 0;
					live--;
				} else {
					j->fd = res;
					j->opened = 1;
					next = W_WRITE;
				}
			} else if (op == W_WRITE) {
				if (res == -EINTR || res == -EAGAIN) {
					next = W_WRITE;
				} else if (res <= 0) {
					j->err = res ? res : -EIO;
					next = W_CLOSE;
				} else {
					j->got += (size_t)res;
					next = j->got < want ? W_WRITE : W_CLOSE;
				}
			} else {
				/* on kvfs the file is committed here: close reports its errors */
				if (res < 0 && !j->err)
					j->err = res;
				j->fd = -1;
				j->active = 0;
				live--;
			}
			if (next < 0)
				continue;
			struct io_uring_sqe *s = wsqe(&w->ring);
			if (!s) {
				j->err = j->err ? j->err : -EBUSY;
				if (j->fd >= 0)
					close(j->fd);
				j->fd = -1;
				j->active = 0;
				live--;
				continue;
			}
			if (next == W_WRITE)
				prep_write(x, s, j);
			else
				io_uring_prep_close(s, j->fd);
			io_uring_sqe_set_data64(s, ((uint64_t)i << KVX_OP_BITS) | (uint64_t)next);
		}
		io_uring_cq_advance(&w->ring, seen);
	}
}

/* After the pipeline: publish (local rename) or clean up, set each job's result. */
static void job_finish(struct writer *w, struct wjob *j)
{
	struct kvx *x = w->x;
	if (j->result != 1)
		return;		 /* decided in job_prepare */
	if (j->err == -EEXIST) { /* another writer created it first */
		j->result = 0;
		return;
	}
	if (j->err) {
		j->result = j->err;
		if (j->opened) /* ours (O_EXCL): never another writer's file */
			unlinkat(x->dirfd, j->tmp, 0);
		return;
	}
	if (x->is_kvfs)
		return;
	/* local directory: atomic publication under the final name, never replacing one */
	if (renameat2(x->dirfd, j->tmp, x->dirfd, j->rel, RENAME_NOREPLACE) == 0)
		return;
	int e = errno;
	if (e == EINVAL || e == ENOSYS) { /* no RENAME_NOREPLACE here: link is no-replace too */
		e = linkat(x->dirfd, j->tmp, x->dirfd, j->rel, 0) == 0 ? 0 : errno;
	}
	unlinkat(x->dirfd, j->tmp, 0);
	j->result = e == 0 ? 1 : e == EEXIST ? 0 : -e;
}

static void process_batch(struct writer *w, struct kvx_slot **batch, int nb)
{
	struct kvx *x = w->x;
	for (int i = 0; i < nb; i++) {
		struct wjob *j = &w->jobs[i];
		memset(j, 0, sizeof(*j));
		j->s = batch[i];
		j->fd = -1;
		j->hdr = w->hdrs + (size_t)i * KVB_HEADER_SIZE;
		j->result = w->ring_ok ? 1 : -EIO;
		if (w->ring_ok)
			job_prepare(w, j);
	}
	if (w->ring_ok)
		run_pipeline(w, nb);
	for (int i = 0; i < nb; i++) {
		struct wjob *j = &w->jobs[i];
		if (j->active) { /* the ring failed under it */
			if (j->fd >= 0)
				close(j->fd);
			j->err = -EIO;
		}
		job_finish(w, j);
		if (j->result < 0)
			klog_warn("saving %s: %s", j->rel, strerror(-j->result));
	}
	pthread_mutex_lock(&x->mu);
	for (int i = 0; i < nb; i++) {
		struct wjob *j = &w->jobs[i];
		if (j->result == 1)
			x->st.saved_blocks++;
		else if (j->result == 0)
			x->st.skipped_existing++;
		else
			x->st.save_errors++;
		j->s->result = j->result;
		j->s->state = SLOT_DONE;
	}
	pthread_cond_broadcast(&x->cv_done);
	pthread_mutex_unlock(&x->mu);
}

void *kvx_writer_main(void *arg)
{
	struct kvx *x = arg;
	struct writer w;
	memset(&w, 0, sizeof(w));
	w.x = x;
	int qd = x->o.queue_depth;
	w.jobs = x->wjobs;
	w.hdrs = x->whdrs;
	struct kvx_slot **batch = x->wbatch;
	int r = io_uring_queue_init((unsigned)qd * 2, &w.ring, 0);
	w.ring_ok = r == 0;
	if (r)
		klog_error("writer: %s: every save will fail", strerror(-r));
	for (;;) {
		pthread_mutex_lock(&x->mu);
		int nb = 0;
		for (;;) {
			for (int i = 0; i < x->nslots && nb < qd; i++)
				if (x->slots[i].state == SLOT_QUEUED)
					batch[nb++] = &x->slots[i];
			if (nb || x->stop)
				break;
			pthread_cond_wait(&x->cv_work, &x->mu);
		}
		/* oldest first: a parent is published before its children */
		for (int i = 1; i < nb; i++)
			for (int k = i; k > 0 && batch[k - 1]->seq > batch[k]->seq; k--) {
				struct kvx_slot *t = batch[k];
				batch[k] = batch[k - 1];
				batch[k - 1] = t;
			}
		for (int i = 0; i < nb; i++)
			batch[i]->state = SLOT_WRITING;
		pthread_mutex_unlock(&x->mu);
		if (!nb)
			break; /* stop, nothing queued */
		process_batch(&w, batch, nb);
	}
	if (w.ring_ok)
		io_uring_queue_exit(&w.ring);
	return NULL;
}
