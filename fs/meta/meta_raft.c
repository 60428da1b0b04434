/* mraft: meta's Raft replication on libraft + libuv (meta_raft.h). */
#define KVFS_LOG_TAG "meta-raft"
#include "meta_raft.h"

#include "ktime.h"
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <raft.h>
#include <raft/uv.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#define SNAP_MAGIC "KVMSNAP1"
#define TICK_MS	   20

/* One proposal, on the proposing thread's stack until done. */
struct mprop {
	struct raft_apply req;
	struct mraft *r;
	struct raft_buffer buf;
	struct mprop *next;
	int done, rc;
};

/* One configuration change, on the caller's stack until done. */
struct mchange {
	struct raft_change req;
	struct mraft *r;
	int add;
	uint64_t id;
	char addr[MRAFT_ADDR_MAX];
	struct mchange *next;
	int done, rc;
};

struct mraft {
	struct mraft_opts o;
	uint64_t ids[MRAFT_MAX_PEERS];
	char addrs[MRAFT_MAX_PEERS][MRAFT_ADDR_MAX];
	unsigned n;
	char self[MRAFT_ADDR_MAX];

	/* Owned by the loop thread once started. */
	uv_loop_t loop;
	uv_async_t async;
	uv_timer_t timer;
	struct raft raft;
	struct raft_io io;
	struct raft_uv_transport tr;
	struct raft_fsm fsm;
	struct raft_barrier barrier;
	rocksdb_writeoptions_t *wo;
	pthread_t loop_thr, watch_thr;
	int loop_started, watch_started;

	/* mu protects everything below; cv wakes proposers (done) and the watcher (stop). */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct mprop *queue, *queue_tail;
	struct mchange *changes;
	int stop, closing;
	struct mraft_status st;	 /* copied from libraft every tick */
	uint64_t barrier_term;	 /* a barrier of this term has been applied */
	uint64_t barrier_issued; /* term of the barrier in flight, 0 = none */
	uint64_t serving_term;	 /* on_lead succeeded in this term */
};

/* ---- the state machine: runs on the loop thread ---- */

static uint32_t get32(const uint8_t *p);

/* An entry: u32 batch length, u32 format (1), the WriteBatch bytes, zeros up to a multiple of
 * 8 bytes: libraft's segment loader misreads entries whose length is not one. */
static int fsm_apply(struct raft_fsm *fsm, const struct raft_buffer *buf, void **result)
{
	struct mraft *r = fsm->data;
	const uint8_t *d = buf->base;
	char *err = NULL;
	rocksdb_writebatch_t *b = NULL;
	if (buf->len >= 8 && get32(d + 4) == 1 && get32(d) <= buf->len - 8)
		b = rocksdb_writebatch_create_from((const char *)d + 8, get32(d));
	if (b) {
		rocksdb_write(r->o.db, r->wo, b, &err);
		rocksdb_writebatch_destroy(b);
	}
	if (!b || err) {
		/* A replica that cannot apply a committed entry has diverged: it must not go on
		 * answering. A restart replays the log from the last snapshot. */
		klog_error("cannot apply a committed entry of %zu bytes: %s", buf->len,
			   err ? err : "not a kvfs-meta entry");
		abort();
	}
	*result = NULL;
	return 0;
}

static void put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The whole key space: magic, then (u32 klen, u32 vlen, key, value) in key order. It runs on
 * the loop thread, which alone applies entries, so the database holds exactly the applied
 * state meanwhile. */
static int fsm_snapshot(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
	struct mraft *r = fsm->data;
	size_t cap = 1 << 20, len = 8;
	uint8_t *p = raft_malloc(cap);
	if (!p)
		return RAFT_NOMEM;
	memcpy(p, SNAP_MAGIC, 8);
	rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
	rocksdb_iterator_t *it = rocksdb_create_iterator(r->o.db, ro);
	int rc = 0;
	for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
		size_t kl, vl;
		const char *k = rocksdb_iter_key(it, &kl);
		const char *v = rocksdb_iter_value(it, &vl);
		if (kl > UINT32_MAX || vl > UINT32_MAX) {
			rc = RAFT_TOOBIG;
			break;
		}
		while (len + 8 + kl + vl > cap) {
			uint8_t *q = raft_realloc(p, cap * 2);
			if (!q) {
				rc = RAFT_NOMEM;
				break;
			}
			p = q;
			cap *= 2;
		}
		if (rc)
			break;
		put32(p + len, (uint32_t)kl);
		put32(p + len + 4, (uint32_t)vl);
		memcpy(p + len + 8, k, kl);
		memcpy(p + len + 8 + kl, v, vl);
		len += 8 + kl + vl;
	}
	char *err = NULL;
	rocksdb_iter_get_error(it, &err);
	rocksdb_iter_destroy(it);
	rocksdb_readoptions_destroy(ro);
	if (err) {
		klog_error("snapshot: %s", err);
		rocksdb_free(err);
		rc = RAFT_IOERR;
	}
	if (!rc && !(*bufs = raft_malloc(sizeof(**bufs))))
		rc = RAFT_NOMEM;
	if (rc) {
		raft_free(p);
		return rc;
	}
	(*bufs)[0].base = p;
	(*bufs)[0].len = len;
	*n_bufs = 1;
	klog_info("snapshot: %zu bytes", len);
	return 0;
}

/* Replaces the database's whole content with the snapshot's, in one batch. Every length is
 * checked against the buffer before it is used. On success the buffer is ours to free. */
static int fsm_restore(struct raft_fsm *fsm, struct raft_buffer *buf)
{
	struct mraft *r = fsm->data;
	const uint8_t *p = buf->base;
	size_t len = buf->len, off = 8;
	if (len < 8 || memcmp(p, SNAP_MAGIC, 8)) {
		klog_error("restore: not a kvfs-meta snapshot");
		return RAFT_MALFORMED;
	}
	rocksdb_writebatch_t *b = rocksdb_writebatch_create();
	/* Every key family is one ASCII byte, so [ "", "\xff" ) is the whole key space. */
	rocksdb_writebatch_delete_range(b, "", 0, "\xff", 1);
	size_t nkeys = 0;
	while (off < len) {
		if (len - off < 8)
			break;
		size_t kl = get32(p + off), vl = get32(p + off + 4);
		if (kl + vl > len - off - 8)
			break;
		rocksdb_writebatch_put(b, (const char *)p + off + 8, kl,
				       (const char *)p + off + 8 + kl, vl);
		off += 8 + kl + vl;
		nkeys++;
	}
	if (off != len) {
		rocksdb_writebatch_destroy(b);
		klog_error("restore: truncated snapshot at byte %zu of %zu", off, len);
		return RAFT_MALFORMED;
	}
	char *err = NULL;
	rocksdb_write(r->o.db, r->wo, b, &err);
	rocksdb_writebatch_destroy(b);
	if (err) {
		klog_error("restore: %s", err);
		rocksdb_free(err);
		return RAFT_IOERR;
	}
	klog_info("restored a snapshot: %zu keys", nkeys);
	raft_free(buf->base);
	return 0;
}

/* ---- the loop thread ---- */

static void prop_done(struct mraft *r, struct mprop *p, int rc)
{
	pthread_mutex_lock(&r->mu);
	p->rc = rc;
	p->done = 1;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

static void apply_cb(struct raft_apply *req, int status, void *result)
{
	(void)result;
	struct mprop *p = req->data;
	int rc = status == 0						    ? 0
		 : status == RAFT_NOTLEADER				    ? -EREMCHG
		 : status == RAFT_LEADERSHIPLOST || status == RAFT_SHUTDOWN ? -ECONNABORTED
									    : -EIO;
	if (rc && rc != -EREMCHG)
		klog_debug("entry not applied: %s", raft_strerror(status));
	prop_done(p->r, p, rc);
}

static void barrier_cb(struct raft_barrier *req, int status)
{
	struct mraft *r = req->data;
	pthread_mutex_lock(&r->mu);
	if (status == 0)
		r->barrier_term = r->barrier_issued;
	r->barrier_issued = 0;
	pthread_mutex_unlock(&r->mu);
}

static void raft_closed(struct raft *raft)
{
	struct mraft *r = raft->data;
	uv_close((uv_handle_t *)&r->async, NULL);
	uv_close((uv_handle_t *)&r->timer, NULL);
}

/* Copies libraft's state for other threads; as leader, asks for the barrier that proves the
 * log up to this term applied (then the watcher lets meta serve). */
static void tick(uv_timer_t *t)
{
	struct mraft *r = t->data;
	struct raft *rf = &r->raft;
	raft_id lid = 0;
	const char *laddr = NULL;
	raft_leader(rf, &lid, &laddr);
	int state = raft_state(rf);
	pthread_mutex_lock(&r->mu);
	struct mraft_status *s = &r->st;
	s->state = (uint8_t)state;
	s->term = rf->current_term;
	s->leader_id = lid;
	snprintf(s->leader_addr, sizeof(s->leader_addr), "%s", laddr ? laddr : "");
	s->last_index = raft_last_index(rf);
	s->applied = raft_last_applied(rf);
	s->commit = rf->commit_index;
	s->npeers = 0;
	for (unsigned i = 0; i < rf->configuration.n && i < MRAFT_MAX_PEERS; i++) {
		struct mraft_peer *pe = &s->peers[s->npeers++];
		pe->id = rf->configuration.servers[i].id;
		snprintf(pe->addr, sizeof(pe->addr), "%s", rf->configuration.servers[i].address);
		pe->match = state == RAFT_LEADER && rf->leader_state.progress
				? rf->leader_state.progress[i].match_index
				: 0;
	}
	int want =
	    state == RAFT_LEADER && r->barrier_term != s->term && !r->barrier_issued && !r->closing;
	if (want)
		r->barrier_issued = s->term;
	pthread_mutex_unlock(&r->mu);
	if (want) {
		r->barrier.data = r;
		if (raft_barrier(rf, &r->barrier, barrier_cb)) {
			pthread_mutex_lock(&r->mu);
			r->barrier_issued = 0;
			pthread_mutex_unlock(&r->mu);
		}
	}
}

static int change_rc(int status)
{
	return status == 0		   ? 0
	       : status == RAFT_NOTLEADER  ? -EREMCHG
	       : status == RAFT_CANTCHANGE ? -EBUSY
	       : status == RAFT_DUPLICATEID || status == RAFT_DUPLICATEADDRESS ||
		       status == RAFT_BADID || status == RAFT_NOTFOUND
		   ? -EINVAL
	       : status == RAFT_LEADERSHIPLOST || status == RAFT_SHUTDOWN ? -ECONNABORTED
									  : -EIO;
}

static void change_done(struct mchange *c, int status)
{
	if (status)
		klog_warn("configuration change (%s %llu): %s", c->add ? "add" : "remove",
			  (unsigned long long)c->id, raft_strerror(status));
	else
		klog_info("configuration change done: %s replica %llu %s",
			  c->add ? "added" : "removed", (unsigned long long)c->id, c->addr);
	pthread_mutex_lock(&c->r->mu);
	c->rc = change_rc(status);
	c->done = 1;
	pthread_cond_broadcast(&c->r->cv);
	pthread_mutex_unlock(&c->r->mu);
}

static void change_cb(struct raft_change *req, int status)
{
	change_done(req->data, status);
}

/* An added replica joins as a spare, then becomes a voter: libraft promotes it only once it
 * caught up with the log, so the group never counts a voter that has nothing. */
static void added_cb(struct raft_change *req, int status)
{
	struct mchange *c = req->data;
	int rc = status ? status : raft_assign(&c->r->raft, &c->req, c->id, RAFT_VOTER, change_cb);
	if (rc)
		change_done(c, rc);
}

static void change_start(struct mraft *r, struct mchange *c)
{
	c->req.data = c;
	int rc = c->add ? raft_add(&r->raft, &c->req, c->id, c->addr, added_cb)
			: raft_remove(&r->raft, &c->req, c->id, change_cb);
	if (rc)
		change_done(c, rc);
}

/* Proposals queued by other threads go to libraft here; a stop closes libraft. */
static void on_async(uv_async_t *a)
{
	struct mraft *r = a->data;
	pthread_mutex_lock(&r->mu);
	struct mprop *q = r->queue;
	r->queue = r->queue_tail = NULL;
	struct mchange *ch = r->changes;
	r->changes = NULL;
	int close = r->stop && !r->closing;
	if (close)
		r->closing = 1;
	pthread_mutex_unlock(&r->mu);
	while (q) {
		struct mprop *p = q;
		q = q->next;
		int rc =
		    close ? RAFT_SHUTDOWN : raft_apply(&r->raft, &p->req, &p->buf, 1, apply_cb);
		if (rc) {
			raft_free(p->buf.base);
			prop_done(r, p, rc == RAFT_NOTLEADER ? -EREMCHG : -ECONNABORTED);
		}
	}
	while (ch) {
		struct mchange *c = ch;
		ch = ch->next;
		if (close)
			change_done(c, RAFT_SHUTDOWN);
		else
			change_start(r, c);
	}
	if (close) {
		uv_timer_stop(&r->timer);
		raft_close(&r->raft, raft_closed);
	}
}

static void *loop_main(void *arg)
{
	struct mraft *r = arg;
	uv_run(&r->loop, UV_RUN_DEFAULT);
	return NULL;
}

/* ---- the watcher: meta serves only after it rebuilt its state as leader ---- */

static void *watch_main(void *arg)
{
	struct mraft *r = arg;
	pthread_mutex_lock(&r->mu);
	while (!r->stop) {
		if (r->st.state != RAFT_LEADER || r->st.term != r->serving_term)
			r->serving_term = 0;
		if (r->st.state == RAFT_LEADER && r->barrier_term == r->st.term &&
		    r->serving_term != r->st.term) {
			uint64_t term = r->st.term;
			pthread_mutex_unlock(&r->mu);
			int rc = r->o.on_lead(r->o.ctx);
			pthread_mutex_lock(&r->mu);
			if (!rc && r->st.term == term && r->st.state == RAFT_LEADER) {
				r->serving_term = term;
				klog_info("leader of term %llu: serving", (unsigned long long)term);
			} else if (rc)
				klog_warn("leader of term %llu cannot load its state: %d",
					  (unsigned long long)term, rc);
		}
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 5 * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&r->cv, &r->mu, &ts);
	}
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

/* ---- the API ---- */

static int parse_peers(struct mraft *r, const char *text)
{
	char buf[1024], *save = NULL;
	if (!text || strlen(text) >= sizeof(buf))
		return -EINVAL;
	snprintf(buf, sizeof(buf), "%s", text);
	for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(t, '='), *end;
		if (!eq || r->n == MRAFT_MAX_PEERS || strlen(eq + 1) >= MRAFT_ADDR_MAX ||
		    !strchr(eq + 1, ':'))
			return -EINVAL;
		unsigned long long id = strtoull(t, &end, 10);
		if (end != eq || id == 0 || id > 1000000)
			return -EINVAL;
		for (unsigned i = 0; i < r->n; i++)
			if (r->ids[i] == id || !strcmp(r->addrs[i], eq + 1))
				return -EINVAL;
		r->ids[r->n] = id;
		snprintf(r->addrs[r->n], MRAFT_ADDR_MAX, "%s", eq + 1);
		if (id == r->o.id)
			snprintf(r->self, sizeof(r->self), "%s", eq + 1);
		r->n++;
	}
	return r->n && r->self[0] ? 0 : -EINVAL;
}

static void free_unstarted(struct mraft *r)
{
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->mu);
	if (r->wo)
		rocksdb_writeoptions_destroy(r->wo);
	free(r);
}

int mraft_start(const struct mraft_opts *o, struct mraft **out)
{
	struct mraft *r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->o = *o;
	pthread_mutex_init(&r->mu, NULL);
	kvfs_cond_init_mono(&r->cv);
	if (parse_peers(r, o->peers)) {
		klog_error("bad --raft-peers \"%s\": want ID=HOST:PORT,... (ids 1-1000000, at "
			   "most %d, this replica's id %llu among them)",
			   o->peers ? o->peers : "", MRAFT_MAX_PEERS, (unsigned long long)o->id);
		free_unstarted(r);
		return -EINVAL;
	}
	if (mkdir(o->dir, 0755) && errno != EEXIST) {
		int e = -errno;
		klog_error("cannot create %s: %s", o->dir, strerror(errno));
		free_unstarted(r);
		return e;
	}
	/* The Raft log is fsync'd before an entry counts as stored, so applying it to RocksDB
	 * needs no fsync: a crash replays the log over the last snapshot. */
	r->wo = rocksdb_writeoptions_create();
	r->fsm = (struct raft_fsm){.version = 1,
				   .data = r,
				   .apply = fsm_apply,
				   .snapshot = fsm_snapshot,
				   .restore = fsm_restore};
	int rc = uv_loop_init(&r->loop);
	if (rc) {
		free_unstarted(r);
		return -EIO;
	}
	const char *step = "transport";
	rc = raft_uv_tcp_init(&r->tr, &r->loop);
	if (!rc && (step = "log", 1))
		rc = raft_uv_init(&r->io, &r->loop, o->dir, &r->tr);
	if (!rc && (step = "init", 1))
		rc = raft_init(&r->raft, &r->io, &r->fsm, o->id, r->self);
	if (rc) {
		klog_error("raft %s: %s", step, raft_strerror(rc));
		/* libraft's partial setup is left to process exit: meta exits on this error. */
		return -EIO;
	}
	r->raft.data = r;
	unsigned el = o->election_ms ? o->election_ms : 1000;
	raft_set_election_timeout(&r->raft, el);
	raft_set_heartbeat_timeout(&r->raft, el / 10 ? el / 10 : 1);
	raft_set_pre_vote(&r->raft, true);
	/* A snapshot is the whole database: taken rarely, with a long tail of log kept so a
	 * follower that fell a little behind catches up from the log. */
	unsigned every = o->snapshot_every ? o->snapshot_every : 100000;
	raft_set_snapshot_threshold(&r->raft, every);
	raft_set_snapshot_trailing(&r->raft, every / 5 ? every / 5 : 1);
	/* libraft resends a snapshot only after this long without an answer (30 s by default):
	 * one sent to a replica that was just restarting is lost, and the replica would wait. */
	raft_set_install_snapshot_timeout(&r->raft, 5000);

	struct raft_configuration conf;
	raft_configuration_init(&conf);
	for (unsigned i = 0; i < r->n && !rc; i++)
		rc = raft_configuration_add(&conf, r->ids[i], r->addrs[i], RAFT_VOTER);
	if (!rc && !o->join) {
		rc = raft_bootstrap(&r->raft, &conf);
		if (rc == 0)
			klog_info("bootstrapped a new Raft log in %s with %u voters", o->dir, r->n);
		else if (rc == RAFT_CANTBOOTSTRAP)
			rc = 0; /* a log exists: its configuration rules */
	}
	raft_configuration_close(&conf);
	if (!rc && (step = "start", 1))
		rc = raft_start(&r->raft);
	if (rc) {
		klog_error("raft %s: %s", step, raft_strerror(rc));
		return -EIO;
	}
	uv_async_init(&r->loop, &r->async, on_async);
	r->async.data = r;
	uv_timer_init(&r->loop, &r->timer);
	r->timer.data = r;
	uv_timer_start(&r->timer, tick, TICK_MS, TICK_MS);
	r->st.id = o->id;
	if ((rc = pthread_create(&r->loop_thr, NULL, loop_main, r)) == 0)
		r->loop_started = 1;
	if (!rc && (rc = pthread_create(&r->watch_thr, NULL, watch_main, r)) == 0)
		r->watch_started = 1;
	if (rc) {
		mraft_stop(r);
		return -rc;
	}
	klog_info("replica %llu of %u, Raft on %s, log in %s", (unsigned long long)o->id, r->n,
		  r->self, o->dir);
	*out = r;
	return 0;
}

void mraft_stop(struct mraft *r)
{
	if (!r)
		return;
	pthread_mutex_lock(&r->mu);
	r->stop = 1;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	if (r->watch_started)
		pthread_join(r->watch_thr, NULL);
	if (r->loop_started) {
		uv_async_send(&r->async);
		pthread_join(r->loop_thr, NULL);
		/* raft_close closed the log and the transport; this frees their memory. */
		raft_uv_close(&r->io);
		raft_uv_tcp_close(&r->tr);
	}
	uv_loop_close(&r->loop);
	free_unstarted(r);
}

int mraft_propose(struct mraft *r, const char *data, size_t len)
{
	struct mprop p = {.r = r};
	if (len > UINT32_MAX - 16)
		return -EFBIG;
	size_t padded = (8 + len + 7) & ~(size_t)7;
	uint8_t *e = raft_calloc(1, padded);
	if (!e)
		return -ENOMEM;
	put32(e, (uint32_t)len);
	put32(e + 4, 1);
	memcpy(e + 8, data, len);
	p.buf.base = e;
	p.buf.len = padded;
	p.req.data = &p;
	pthread_mutex_lock(&r->mu);
	if (r->stop || r->st.state != RAFT_LEADER || r->serving_term != r->st.term ||
	    !r->serving_term) {
		pthread_mutex_unlock(&r->mu);
		raft_free(p.buf.base);
		return -EREMCHG;
	}
	if (r->queue_tail)
		r->queue_tail->next = &p;
	else
		r->queue = &p;
	r->queue_tail = &p;
	pthread_mutex_unlock(&r->mu);
	uv_async_send(&r->async);
	pthread_mutex_lock(&r->mu);
	while (!p.done)
		pthread_cond_wait(&r->cv, &r->mu);
	pthread_mutex_unlock(&r->mu);
	return p.rc;
}

int mraft_change(struct mraft *r, int add, uint64_t id, const char *addr)
{
	struct mchange c = {.r = r, .add = add, .id = id};
	if (id == 0 ||
	    (add && (!addr || !*addr || strlen(addr) >= sizeof(c.addr) || !strchr(addr, ':'))))
		return -EINVAL;
	if (add)
		snprintf(c.addr, sizeof(c.addr), "%s", addr);
	pthread_mutex_lock(&r->mu);
	if (r->stop || r->st.state != RAFT_LEADER) {
		pthread_mutex_unlock(&r->mu);
		return -EREMCHG;
	}
	c.next = r->changes;
	r->changes = &c;
	pthread_mutex_unlock(&r->mu);
	uv_async_send(&r->async);
	pthread_mutex_lock(&r->mu);
	while (!c.done)
		pthread_cond_wait(&r->cv, &r->mu);
	pthread_mutex_unlock(&r->mu);
	return c.rc;
}

int mraft_serving(struct mraft *r)
{
	pthread_mutex_lock(&r->mu);
	int s = r->st.state == RAFT_LEADER && r->serving_term && r->serving_term == r->st.term;
	pthread_mutex_unlock(&r->mu);
	return s;
}

void mraft_status(struct mraft *r, struct mraft_status *s)
{
	pthread_mutex_lock(&r->mu);
	*s = r->st;
	s->id = r->o.id;
	s->serving = r->st.state == RAFT_LEADER && r->serving_term && r->serving_term == r->st.term;
	pthread_mutex_unlock(&r->mu);
}
