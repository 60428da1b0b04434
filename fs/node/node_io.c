/* I/O threads: one io_uring per thread. Connection threads queue ops and ring an eventfd whose
 * read is always armed on the ring, so one io_uring_submit_and_wait both submits a batch and
 * sleeps until any completion or new work. Each op is a small state machine that keeps one
 * SQE in flight (a DEL keeps a window of unlinks); the ring thread caps SQEs in flight to the
 * CQ size so completions never overflow. Finished ops go to completion workers, which verify
 * CRCs and send replies, so a slow socket or a 16 MiB CRC never stalls a ring. */
#define KVFS_LOG_TAG "node-io"
#include "node_int.h"
#include "log.h"
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define DEL_WINDOW	 32
#define IOWQ_UNBOUND_MAX 32

enum {
	ST_OPEN = 1,
	ST_WRITE,
	ST_FSYNC,
	ST_CLOSE,
	ST_RENAME,
	ST_DIRSYNC,
	ST_READ,
	ST_UNLINK,
};

struct node_ring {
	struct node_store *s;
	struct io_uring ring;
	int efd;
	uint64_t efd_val;
	int efd_armed;
	unsigned inflight, max_inflight;    /* SQEs of ops in flight (ring thread only) */
	unsigned active;		    /* ops taken and not finished (ring thread only) */
	struct node_op *ready, *ready_tail; /* waiting for SQE room (ring thread only) */
	pthread_mutex_t mu;		    /* protects in, in_tail, stopping */
	struct node_op *in, *in_tail;
	int stopping;
	pthread_t th;
	int started;
};

struct node_workq {
	pthread_mutex_t mu; /* protects head, tail, stopping */
	pthread_cond_t cv;
	struct node_op *head, *tail;
	int stopping;
	int nth;
	pthread_t th[];
};

/* ---- completion workers ---- */

static void wq_push(struct node_workq *q, struct node_op *op)
{
	op->next = NULL;
	pthread_mutex_lock(&q->mu);
	if (q->tail)
		q->tail->next = op;
	else
		q->head = op;
	q->tail = op;
	pthread_cond_signal(&q->cv);
	pthread_mutex_unlock(&q->mu);
}

static void *worker_main(void *arg)
{
	struct node_workq *q = arg;
	for (;;) {
		pthread_mutex_lock(&q->mu);
		while (!q->head && !q->stopping)
			pthread_cond_wait(&q->cv, &q->mu);
		struct node_op *op = q->head;
		if (!op) { /* stopping and drained */
			pthread_mutex_unlock(&q->mu);
			return NULL;
		}
		q->head = op->next;
		if (!q->head)
			q->tail = NULL;
		pthread_mutex_unlock(&q->mu);
		node_op_finish(op);
	}
}

/* ---- ring thread ---- */

static struct io_uring_sqe *sqe_get(struct node_ring *r, struct node_op *op)
{
	struct io_uring_sqe *q = io_uring_get_sqe(&r->ring);
	if (!q) {
		/* The SQ is full of prepared entries: hand them to the kernel to make room. The
		 * in-flight cap keeps the SQ at least as large as what may be outstanding. */
		io_uring_submit(&r->ring);
		q = io_uring_get_sqe(&r->ring);
	}
	if (q) {
		io_uring_sqe_set_data(q, op);
		op->inflight++;
		r->inflight++;
	}
	return q;
}

static uint64_t mono_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void op_done(struct node_ring *r, struct node_op *op)
{
	if (op->type >= NODE_OP_PUT && op->type <= NODE_OP_DEL)
		met_hist_observe_ns(r->s->disk_hist[op->type], mono_ns() - op->t_submit);
	r->active--;
	wq_push(r->s->wq, op);
}

static int put_write(struct node_ring *r, struct node_op *op)
{
	struct io_uring_sqe *q = sqe_get(r, op);
	if (!q)
		return -EAGAIN;
	/* wiov describes what is left: skip what earlier (possibly short) writes covered. */
	size_t skip = op->done;
	op->wiov[0].iov_base = op->hbuf;
	op->wiov[0].iov_len = NODE_HDR_SIZE;
	op->wiov[1].iov_base = (void *)op->req.data;
	op->wiov[1].iov_len = op->req.len;
	struct iovec *v = op->wiov;
	unsigned n = op->req.len ? 2 : 1;
	while (skip && skip >= v->iov_len) {
		skip -= v->iov_len;
		v++;
		n--;
	}
	v->iov_base = (uint8_t *)v->iov_base + skip;
	v->iov_len -= skip;
	io_uring_prep_writev(q, op->fd, v, n, op->done);
	return 0;
}

static int get_read(struct node_ring *r, struct node_op *op)
{
	struct io_uring_sqe *q = sqe_get(r, op);
	if (!q)
		return -EAGAIN;
	/* Ask for the whole buffer: with O_DIRECT the length must stay aligned and the read
	 * simply ends short at the end of the file. */
	io_uring_prep_read(q, op->fd, op->buf + op->done, (unsigned)(op->room - op->done),
			   op->done);
	return 0;
}

static int issue_close(struct node_ring *r, struct node_op *op)
{
	struct io_uring_sqe *q = sqe_get(r, op);
	if (!q)
		return -EAGAIN;
	op->stage = ST_CLOSE;
	io_uring_prep_close(q, op->fd);
	op->fd = -1; /* the kernel owns it now, whatever the result */
	return 0;
}

/* Issues unlinks while the window and the ring allow; finishes the op when all are done. */
static void del_pump(struct node_ring *r, struct node_op *op)
{
	struct node_store *s = r->s;
	while (op->dnext < op->dn && op->inflight < DEL_WINDOW && r->inflight < r->max_inflight) {
		uint32_t i = op->dnext;
		struct io_uring_sqe *q = sqe_get(r, op);
		if (!q)
			break;
		op->dnext++;
		io_uring_prep_unlinkat(q, s->shard_fd[op->dids[i] & (NODE_SHARDS - 1)],
				       op->dnames[i], 0);
	}
	if (op->dfin == op->dn && op->inflight == 0)
		op_done(r, op);
}

/* Tears an op down after an error: the fd and a PUT's temp file are released with plain
 * syscalls (error path only), then the op is finished with err. */
static void op_fail(struct node_ring *r, struct node_op *op, int err)
{
	if (!op->err)
		op->err = err;
	if (op->fd >= 0) {
		close(op->fd);
		op->fd = -1;
	}
	if (op->type == NODE_OP_PUT && op->stage <= ST_RENAME)
		unlinkat(r->s->tmp_fd, op->tmp, 0);
	op_done(r, op);
}

/* The steps below issue the op's next SQE, or finish it with op_done; they return 0, or a
 * negative errno that the caller turns into op_fail. */
static int op_start(struct node_ring *r, struct node_op *op)
{
	struct node_store *s = r->s;
	struct io_uring_sqe *q;
	switch (op->type) {
	case NODE_OP_PUT:
		if (!(q = sqe_get(r, op)))
			return -EAGAIN;
		op->stage = ST_OPEN;
		io_uring_prep_openat(q, s->tmp_fd, op->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
				     0644);
		return 0;
	case NODE_OP_GET:
		if (!(q = sqe_get(r, op)))
			return -EAGAIN;
		op->stage = ST_OPEN;
		io_uring_prep_openat(q, s->shard_fd[op->shard], op->name,
				     O_RDONLY | O_CLOEXEC | (op->direct ? O_DIRECT : 0), 0);
		return 0;
	case NODE_OP_DEL:
		op->stage = ST_UNLINK;
		del_pump(r, op);
		return 0;
	}
	return -EINVAL;
}

static int put_step(struct node_ring *r, struct node_op *op, int res)
{
	struct node_store *s = r->s;
	struct io_uring_sqe *q;
	if (res < 0 && op->stage != ST_DIRSYNC)
		return res;
	switch (op->stage) {
	case ST_OPEN:
		op->fd = res;
		op->stage = ST_WRITE;
		return put_write(r, op);
	case ST_WRITE:
		if (res == 0)
			return -EIO;
		op->done += (size_t)res;
		if (op->done < op->total)
			return put_write(r, op); /* a short write: resume where it stopped */
		if (!s->o.sync)
			return issue_close(r, op);
		if (!(q = sqe_get(r, op)))
			return -EAGAIN;
		op->stage = ST_FSYNC;
		io_uring_prep_fsync(q, op->fd, IORING_FSYNC_DATASYNC);
		return 0;
	case ST_FSYNC:
		return issue_close(r, op);
	case ST_CLOSE:
		if (!(q = sqe_get(r, op)))
			return -EAGAIN;
		op->stage = ST_RENAME;
		io_uring_prep_renameat(q, s->tmp_fd, op->tmp, s->shard_fd[op->shard], op->name, 0);
		return 0;
	case ST_RENAME:
		if (s->o.sync && (q = sqe_get(r, op))) {
			op->stage = ST_DIRSYNC;
			io_uring_prep_fsync(q, s->shard_fd[op->shard], 0);
			return 0;
		}
		op_done(r, op);
		return 0;
	case ST_DIRSYNC:
		/* The chunk is in place; a failed directory sync only weakens durability. */
		if (res < 0)
			klog_warn("fsync of shard %02x: %s", op->shard, strerror(-res));
		op_done(r, op);
		return 0;
	}
	return -EINVAL;
}

/* cachestat(2) (Linux 6.5): how much of a file's range the page cache holds, without starting
 * any I/O (a RWF_NOWAIT read would start readahead on a miss). Not in every libc's headers:
 * the number is the same on every architecture. */
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
struct node_cachestat_range {
	uint64_t off, len;
};
struct node_cachestat {
	uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

/* 1 when the page cache holds all of [0, len) of fd, or when that cannot be known. */
static int all_cached(int fd, size_t len)
{
	struct node_cachestat_range rg = {0, len};
	struct node_cachestat cs;
	if (syscall(__NR_cachestat, fd, &rg, &cs, 0) != 0)
		return 1; /* ENOSYS (older kernel) and the like: read as before */
	long pg = sysconf(_SC_PAGESIZE);
	return cs.nr_cache >= (len + (size_t)pg - 1) / (size_t)pg;
}

/* A cold chunk read through the page cache goes to the disk in readahead-sized requests and
 * is copied once more; with O_DIRECT it is one request straight into op->buf (aligned, room
 * rounded up). A chunk the cache holds (just written, or read again) stays a memory copy. */
static void get_pick_direct(struct node_op *op)
{
	if (!op->cold_check || all_cached(op->fd, op->total))
		return;
	int fl = fcntl(op->fd, F_GETFL);
	if (fl >= 0 && fcntl(op->fd, F_SETFL, fl | O_DIRECT) == 0)
		op->direct = 1; /* a filesystem without O_DIRECT refuses: read through the cache */
}

static int get_step(struct node_ring *r, struct node_op *op, int res)
{
	if (res == -EINVAL && op->stage == ST_READ && op->direct && op->cold_check &&
	    op->done == 0) {
		/* O_DIRECT taken by fcntl but refused by the read: through the cache after all. */
		int fl = fcntl(op->fd, F_GETFL);
		if (fl >= 0 && fcntl(op->fd, F_SETFL, fl & ~O_DIRECT) == 0) {
			op->direct = 0;
			op->cold_check = 0;
			return get_read(r, op);
		}
	}
	if (res == -EINVAL && op->stage == ST_OPEN && op->direct) {
		/* This filesystem has no O_DIRECT: read through the page cache instead. */
		op->direct = 0;
		return op_start(r, op);
	}
	if (res < 0)
		return res;
	switch (op->stage) {
	case ST_OPEN:
		op->fd = res;
		op->stage = ST_READ;
		get_pick_direct(op);
		return get_read(r, op);
	case ST_READ:
		if (res == 0) {
			/* Shorter than the index says: treated as a corrupt chunk. */
			op->err = -EILSEQ;
			return issue_close(r, op);
		}
		op->done += (size_t)res;
		if (op->done >= op->total)
			return issue_close(r, op);
		if (op->direct && op->done % NODE_DIRECT_ALIGN) {
			/* An O_DIRECT read ends off a block only at the end of the file. */
			op->err = -EILSEQ;
			return issue_close(r, op);
		}
		return get_read(r, op);
	case ST_CLOSE:
		op_done(r, op);
		return 0;
	}
	return -EINVAL;
}

static void on_cqe(struct node_ring *r, struct node_op *op, int res)
{
	int err = 0;
	op->inflight--;
	r->inflight--;
	switch (op->type) {
	case NODE_OP_PUT:
		err = put_step(r, op, res);
		break;
	case NODE_OP_GET:
		err = get_step(r, op, res);
		break;
	case NODE_OP_DEL:
		/* The index already dropped these ids; a failed unlink leaves a stray file that
		 * the next startup scan finds again, so it is only logged. */
		op->dfin++;
		if (res < 0 && res != -ENOENT)
			klog_warn("unlink of a deleted chunk: %s", strerror(-res));
		del_pump(r, op);
		break;
	}
	if (err)
		op_fail(r, op, err);
}

static void *ring_main(void *arg)
{
	struct node_ring *r = arg;
	for (;;) {
		if (!r->efd_armed) {
			struct io_uring_sqe *q = io_uring_get_sqe(&r->ring);
			if (!q) {
				io_uring_submit(&r->ring);
				q = io_uring_get_sqe(&r->ring);
			}
			if (q) {
				io_uring_prep_read(q, r->efd, &r->efd_val, sizeof(r->efd_val), 0);
				io_uring_sqe_set_data(q, NULL);
				r->efd_armed = 1;
			}
		}
		pthread_mutex_lock(&r->mu);
		struct node_op *in = r->in;
		r->in = r->in_tail = NULL;
		int stop = r->stopping;
		pthread_mutex_unlock(&r->mu);
		while (in) {
			struct node_op *n = in->next;
			in->next = NULL;
			r->active++;
			if (r->ready_tail)
				r->ready_tail->next = in;
			else
				r->ready = in;
			r->ready_tail = in;
			in = n;
		}
		while (r->ready && r->inflight < r->max_inflight) {
			struct node_op *op = r->ready;
			r->ready = op->next;
			if (!r->ready)
				r->ready_tail = NULL;
			op->next = NULL;
			int err = op_start(r, op);
			if (err)
				op_fail(r, op, err);
		}
		if (stop && r->active == 0)
			break;
		int rc = io_uring_submit_and_wait(&r->ring, 1);
		if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
			klog_error("io_uring_submit_and_wait: %s", strerror(-rc));
			usleep(1000);
		}
		struct io_uring_cqe *cqe;
		unsigned head, seen = 0;
		io_uring_for_each_cqe(&r->ring, head, cqe)
		{
			struct node_op *op = io_uring_cqe_get_data(cqe);
			int res = cqe->res;
			seen++;
			if (!op)
				r->efd_armed = 0;
			else
				on_cqe(r, op, res);
		}
		io_uring_cq_advance(&r->ring, seen);
	}
	return NULL;
}

void node_io_submit(struct node_store *s, struct node_op *op)
{
	unsigned i = atomic_fetch_add(&s->rr, 1) % (unsigned)s->o.io_threads;
	struct node_ring *r = &s->rings[i];
	op->next = NULL;
	op->t_submit = mono_ns();
	pthread_mutex_lock(&r->mu);
	if (r->in_tail)
		r->in_tail->next = op;
	else
		r->in = op;
	r->in_tail = op;
	pthread_mutex_unlock(&r->mu);
	uint64_t one = 1;
	if (write(r->efd, &one, sizeof(one)) < 0)
		klog_warn("eventfd write: %s", strerror(errno));
}

int node_io_start(struct node_store *s)
{
	int nw = s->o.workers;
	s->wq = calloc(1, sizeof(*s->wq) + (size_t)nw * sizeof(pthread_t));
	s->rings = calloc((size_t)s->o.io_threads, sizeof(*s->rings));
	if (!s->wq || !s->rings)
		return -ENOMEM;
	pthread_mutex_init(&s->wq->mu, NULL);
	pthread_cond_init(&s->wq->cv, NULL);
	for (int i = 0; i < nw; i++) {
		if (pthread_create(&s->wq->th[i], NULL, worker_main, s->wq))
			return -EAGAIN;
		s->wq->nth++;
	}
	for (int i = 0; i < s->o.io_threads; i++) {
		struct node_ring *r = &s->rings[i];
		r->s = s;
		r->efd = -1;
		pthread_mutex_init(&r->mu, NULL);
		struct io_uring_params p = {0};
		int rc = io_uring_queue_init_params(s->o.ring_depth, &r->ring, &p);
		if (rc < 0) {
			klog_error("io_uring_queue_init(%u): %s", s->o.ring_depth, strerror(-rc));
			return rc;
		}
		/* Opens, renames and unlinks that cannot finish at once run on io-wq's unbound
		 * workers, whose default limit is the process limit: with a full ring that could
		 * be hundreds of kernel threads per ring. Cap them (bounded file I/O keeps the
		 * kernel's default of a few per CPU). Older kernels lack this; not fatal. */
		unsigned int lim[2] = {0, IOWQ_UNBOUND_MAX};
		rc = io_uring_register_iowq_max_workers(&r->ring, lim);
		if (rc < 0)
			klog_debug("io-wq worker limit not set: %s", strerror(-rc));
		/* One slot stays for the eventfd read; the rest bounds SQEs in flight so the CQ
		 * (twice the SQ) can never overflow. */
		r->max_inflight = p.sq_entries - 1;
		r->efd = eventfd(0, EFD_CLOEXEC);
		if (r->efd < 0) {
			rc = -errno;
			io_uring_queue_exit(&r->ring);
			return rc;
		}
		if (pthread_create(&r->th, NULL, ring_main, r)) {
			close(r->efd);
			r->efd = -1;
			io_uring_queue_exit(&r->ring);
			return -EAGAIN;
		}
		r->started = 1;
	}
	return 0;
}

void node_io_stop(struct node_store *s)
{
	if (s->rings) {
		for (int i = 0; i < s->o.io_threads; i++) {
			struct node_ring *r = &s->rings[i];
			if (!r->started)
				continue;
			pthread_mutex_lock(&r->mu);
			r->stopping = 1;
			pthread_mutex_unlock(&r->mu);
			uint64_t one = 1;
			if (write(r->efd, &one, sizeof(one)) < 0)
				klog_warn("eventfd write: %s", strerror(errno));
			pthread_join(r->th, NULL);
			io_uring_queue_exit(&r->ring);
			close(r->efd);
			pthread_mutex_destroy(&r->mu);
		}
		free(s->rings);
		s->rings = NULL;
	}
	if (s->wq) {
		pthread_mutex_lock(&s->wq->mu);
		s->wq->stopping = 1;
		pthread_cond_broadcast(&s->wq->cv);
		pthread_mutex_unlock(&s->wq->mu);
		for (int i = 0; i < s->wq->nth; i++)
			pthread_join(s->wq->th[i], NULL);
		pthread_mutex_destroy(&s->wq->mu);
		pthread_cond_destroy(&s->wq->cv);
		free(s->wq);
		s->wq = NULL;
	}
}
