/* mraft: meta's Raft replication on libraft + libuv (meta_raft.h). */
#define KVFS_LOG_TAG "meta-raft"
#include "meta_raft.h"
#include "meta_rtls.h"

#include "ktime.h"
#include "log.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <raft.h>
#include <raft/uv.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#define SNAP_MAGIC "KVMSNAP1"
#define TICK_MS	   20

/* One proposal, queued for the loop thread: rec is its record of an entry (below), malloc'd;
 * both are freed once copied into an entry. */
struct mprop {
	uint8_t *rec;
	size_t len;
	struct mprop *next;
};

/* One Raft entry in flight: freed by apply_cb (its outcome is in the spec_* counters). */
struct mentry {
	struct raft_apply req;
	struct mraft *r;
};

/* A thread in mraft_wait, on its stack. state: 0 while undecided, then 1 (committed) or 2
 * (rolled back), stored by spec_wake after it unlinked the waiter; the waiter sleeps on it as
 * a futex word, so a woken thread does not take spec_mu again (with a condition variable, a
 * waiter woken by fsm_apply queued on spec_mu behind the loop thread that woke it). */
struct mwaiter {
	uint64_t seq;
	_Atomic uint32_t state;
	uint32_t res; /* the state to store, once decided (spec_decided) */
	struct mwaiter *next;
};

/* A speculatively applied entry not yet known committed: the RocksDB snapshot taken right
 * after its write (the state a Raft snapshot at its index must show). FIFO in seq order. */
struct mspec {
	uint64_t seq;
	const rocksdb_snapshot_t *snap;
	struct mspec *next;
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
	int tls; /* tr is mrtls (else libraft's plaintext TCP) */
	struct raft_fsm fsm;
	struct raft_barrier barrier;
	rocksdb_writeoptions_t *wo;
	/* Loop thread: the snapshot trigger by bytes (snap_account). */
	unsigned every;		       /* the entry-count threshold */
	uint64_t since_bytes, since_n; /* applied since the last snapshot */
	uint64_t nsnap;		       /* snapshots taken */
	uint64_t snap_size; /* bytes of the last snapshot taken or installed (loop thread) */
	int by_bytes;	    /* the threshold is lowered until the next snapshot */
	pthread_t loop_thr, watch_thr;
	int loop_started, watch_started;

	/* Speculation (docs/meta.md, "Pipelined writes"). spec_mu orders every write to the
	 * database (speculative ones, applies, rollbacks) and protects the fields below; lock
	 * order: spec_mu, then mu. waiters: the threads in mraft_wait, each woken alone once
	 * its seq is decided (a broadcast would wake every waiter at every commit). */
	pthread_mutex_t spec_mu;
	struct mwaiter *waiters;
	uint64_t nonce;	      /* random per mraft_start: marks the entries this process applied */
	uint64_t spec_term;   /* speculating as the serving leader of this term; 0 = not */
	uint64_t spec_seq;    /* seqs handed out (atomic reads: mraft_settle's fast path) */
	uint64_t done_seq;    /* every speculative entry up to it is committed (and kept) */
	uint64_t rolled_upto; /* entries after done_seq up to it were rolled back */
	struct mspec *pend, *pend_tail;
	const rocksdb_snapshot_t *view; /* the committed state while entries are pending */
	/* The state the snapshot being taken serialises off the loop thread (fsm_snap_async):
	 * its own (snap_own), or the view at the time, which stays alive until
	 * fsm_snap_finalize even if the view moves on (view_set). */
	const rocksdb_snapshot_t *snap_read;
	int snap_own;
	rocksdb_readoptions_t *ro;

	/* mu protects everything below; cv wakes change waiters and the watcher (stop). */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct mprop *queue, *queue_tail;
	/* Entries appended, apply_cb not yet called (written by the loop thread): proposers
	 * wake the loop thread only when it can take their batch now (mraft_propose_async). */
	unsigned in_flight;
	struct mchange *changes;
	int stop, closing;
	struct mraft_status st;	 /* copied from libraft every tick */
	uint64_t barrier_term;	 /* a barrier of this term has been applied */
	uint64_t barrier_issued; /* term of the barrier in flight, 0 = none */
	uint64_t serving_term;	 /* on_lead succeeded in this term */
};

/* ---- the state machine: runs on the loop thread ---- */

static uint32_t get32(const uint8_t *p);

/* ---- speculation: the leader's writes are in its database before they commit ---- */

/* Every speculative write carries its undo (the before-image of each key it touches) under
 * UNDO_PREFIX + be64 seq, in the same RocksDB batch: a crash, a lost leadership or a failed
 * append can then put back exactly the committed state. The prefix sorts after every meta
 * key family (one ASCII byte), so snapshots (bounded by "\xff") never carry undo records. */
#define UNDO_PREFIX "\xffU"
#define UNDO_KEY    10

static void undo_key(uint8_t *k, uint64_t seq)
{
	k[0] = 0xff;
	k[1] = 'U';
	for (int i = 0; i < 8; i++)
		k[2 + i] = (uint8_t)(seq >> (56 - 8 * i));
}

/* Undoes every speculative write still recorded, newest first, each with the removal of its
 * record in one batch (a crash midway leaves the rest recorded). Caller holds spec_mu or is
 * alone. Returns how many; a database that cannot be rolled back aborts the process (a restart
 * rolls back again, then replays the log). */
static size_t undo_all(rocksdb_t *db, rocksdb_writeoptions_t *wo)
{
	uint8_t last[UNDO_KEY];
	memset(last, 0xff, sizeof(last));
	last[1] = 'U';
	rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
	rocksdb_iterator_t *it = rocksdb_create_iterator(db, ro);
	size_t n = 0;
	char *err = NULL;
	for (rocksdb_iter_seek_for_prev(it, (const char *)last, sizeof(last));
	     rocksdb_iter_valid(it) && !err; rocksdb_iter_prev(it)) {
		size_t kl, vl;
		const char *k = rocksdb_iter_key(it, &kl);
		if (kl != UNDO_KEY || memcmp(k, UNDO_PREFIX, 2))
			break;
		const char *v = rocksdb_iter_value(it, &vl);
		rocksdb_writebatch_t *b = rocksdb_writebatch_create_from(v, vl);
		if (!b) {
			klog_error("undo record of %zu bytes unreadable", vl);
			abort();
		}
		rocksdb_writebatch_delete(b, k, kl);
		rocksdb_write(db, wo, b, &err);
		rocksdb_writebatch_destroy(b);
		n++;
	}
	if (!err)
		rocksdb_iter_get_error(it, &err);
	rocksdb_iter_destroy(it);
	rocksdb_readoptions_destroy(ro);
	if (err) {
		klog_error("cannot roll back speculative writes: %s", err);
		abort();
	}
	return n;
}

/* Unlinks the waiters whose seq is committed or rolled back and returns them as a list, each
 * with its outcome in res; caller holds spec_mu. They stay asleep until waiters_wake, which
 * may run after spec_mu is released. */
static struct mwaiter *spec_decided(struct mraft *r)
{
	struct mwaiter *out = NULL;
	for (struct mwaiter **w = &r->waiters; *w;) {
		struct mwaiter *x = *w;
		if (r->done_seq >= x->seq || r->rolled_upto >= x->seq) {
			*w = x->next;
			x->res = r->done_seq >= x->seq ? 1 : 2;
			x->next = out;
			out = x;
		} else
			w = &x->next;
	}
	return out;
}

/* Wakes a list from spec_decided. A waiter may return (and its stack be reused) as soon as
 * its state is stored, so its next is read first; a futex wake on a reused word is at worst
 * a spurious wake-up, which every futex user tolerates. */
static void waiters_wake(struct mwaiter *l)
{
	while (l) {
		struct mwaiter *x = l;
		l = x->next;
		atomic_store_explicit(&x->state, x->res, memory_order_release);
		syscall(SYS_futex, &x->state, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
	}
}

/* Wakes the waiters whose seq is committed or rolled back. Caller holds spec_mu. */
static void spec_wake(struct mraft *r)
{
	waiters_wake(spec_decided(r));
}

/* Replaces the view (caller holds spec_mu); the old one is released unless a snapshot in
 * progress reads it (fsm_snap_finalize releases it then). */
static void view_set(struct mraft *r, const rocksdb_snapshot_t *v)
{
	if (r->view && r->view != r->snap_read)
		rocksdb_release_snapshot(r->o.db, r->view);
	r->view = v;
}

static void spec_release(struct mraft *r)
{
	while (r->pend) {
		struct mspec *e = r->pend;
		r->pend = e->next;
		rocksdb_release_snapshot(r->o.db, e->snap);
		free(e);
	}
	r->pend_tail = NULL;
	view_set(r, NULL);
}

/* The replica stops speculating and serving: its database goes back to the committed state
 * (entries rolled back that do commit later are applied like any other), and meta serves
 * again only after a new barrier and on_lead rebuilt its in-memory state. Caller holds
 * spec_mu, not mu. */
static void spec_rollback(struct mraft *r, const char *why)
{
	size_t n = r->pend ? undo_all(r->o.db, r->wo) : 0;
	if (n)
		klog_warn("rolled back %zu speculative entries (%s)", n, why);
	r->rolled_upto = r->spec_seq;
	spec_release(r);
	int was = r->spec_term != 0;
	r->spec_term = 0;
	spec_wake(r);
	if (n || was) {
		pthread_mutex_lock(&r->mu);
		r->serving_term = 0;
		r->barrier_term = 0;
		pthread_mutex_unlock(&r->mu);
	}
}

/* Entries. Format 1 (older logs): u32 batch length, u32 1, the WriteBatch bytes. Format 3:
 * u32 record count, u32 3, u64 nonce, then records: u64 seq, u32 batch length, u32 0, the
 * bytes, zeros to a multiple of 8. One entry carries every proposal queued while the loop
 * thread was busy (group commit); (nonce, seq) name a speculative write of the process that
 * proposed it. Entries are padded to a multiple of 8 bytes: libraft's segment loader misreads
 * entries whose length is not one. */
#define ENTRY_HDR  16
#define REC_HDR	   16
#define ENTRY_MAX  (1 << 20) /* a drain closes an entry past this many bytes */
#define ENTRY_RECS 512
/* Entries appended and not yet applied, at most: what arrives meanwhile waits in the queue
 * and goes as one entry. libraft's pipelined replication was measured slower with many
 * small entries in flight (followers falling back to probing) than with one large one. */
#define ENTRY_WINDOW 1

static void put32(uint8_t *p, uint32_t v);
static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)v);
	put32(p + 4, (uint32_t)(v >> 32));
}

static uint64_t get64(const uint8_t *p)
{
	return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* One batch of a committed entry; caller holds spec_mu. drops collects the undo records of
 * our batches, now committed. */
static void apply_batch(struct mraft *r, int ours, uint64_t seq, const char *data, size_t len,
			rocksdb_writebatch_t *drops)
{
	char *err = NULL;
	if (ours && seq > r->rolled_upto && seq > r->done_seq) {
		/* In the database since it was proposed: now it is committed. */
		r->done_seq = seq;
		while (r->pend && r->pend->seq <= seq) {
			struct mspec *e = r->pend;
			r->pend = e->next;
			view_set(r, e->snap);
			free(e);
		}
		if (!r->pend)
			r->pend_tail = NULL;
		uint8_t k[UNDO_KEY];
		undo_key(k, seq);
		rocksdb_writebatch_delete(drops, (const char *)k, sizeof(k));
		return;
	}
	/* Another leader's batch, or one of ours rolled back: whatever is speculative here goes
	 * first. */
	if (r->pend) {
		/* The undo records of the batches committed just before must be gone first. */
		if (drops && rocksdb_writebatch_count(drops)) {
			rocksdb_write(r->o.db, r->wo, drops, &err);
			rocksdb_writebatch_clear(drops);
			if (err) {
				klog_error("cannot drop undo records: %s", err);
				abort();
			}
		}
		spec_rollback(r, "an entry not ours to skip");
	}
	rocksdb_writebatch_t *b = rocksdb_writebatch_create_from(data, len);
	if (b) {
		rocksdb_write(r->o.db, r->wo, b, &err);
		rocksdb_writebatch_destroy(b);
	}
	if (!b || err) {
		/* A replica that cannot apply a committed entry has diverged: it must not go on
		 * answering. A restart replays the log from the last snapshot. */
		klog_error("cannot apply a committed batch of %zu bytes: %s", len,
			   err ? err : "not a kvfs-meta entry");
		abort();
	}
}

/* The batches of a format-3 entry joined into one: a batch's encoding is u64 sequence, u32
 * count, then its records, so the join is one header with the summed count and every
 * batch's records in order. Caller holds spec_mu; nothing speculative is pending. */
static void apply_joined(struct mraft *r, const uint8_t *d, size_t len, uint32_t n)
{
	const uint8_t *p = d + ENTRY_HDR, *end = d + len;
	uint8_t *j = malloc(len + 12);
	size_t jl = 12;
	uint64_t count = 0;
	for (uint32_t i = 0; i < n && j; i++) {
		uint32_t bl = (size_t)(end - p) >= REC_HDR ? get32(p + 8) : UINT32_MAX;
		if (bl > (size_t)(end - p) - REC_HDR || bl < 12) {
			klog_error("cannot apply a committed entry of %zu bytes: truncated", len);
			abort();
		}
		count += get32(p + REC_HDR + 8);
		memcpy(j + jl, p + REC_HDR + 12, bl - 12);
		jl += bl - 12;
		p += (REC_HDR + bl + 7) & ~(size_t)7;
		if (p > end)
			p = end;
	}
	char *err = NULL;
	rocksdb_writebatch_t *b = NULL;
	if (j && count <= UINT32_MAX) {
		memset(j, 0, 8);
		put32(j + 8, (uint32_t)count);
		b = rocksdb_writebatch_create_from((const char *)j, jl);
	}
	free(j);
	if (b) {
		rocksdb_write(r->o.db, r->wo, b, &err);
		rocksdb_writebatch_destroy(b);
	}
	if (!b || err) {
		klog_error("cannot apply a committed entry of %zu bytes: %s", len,
			   err ? err : "out of memory or not a kvfs-meta entry");
		abort();
	}
}

/* Snapshots by bytes (docs/meta.md, "Snapshots and log compaction"): libraft takes one when
 * last_applied minus the last snapshot's index reaches its threshold, checked after each
 * round of applies, and offers no other trigger; so once the entries applied since the last
 * snapshot hold snapshot_bytes, or the last snapshot's size if that is larger, the threshold
 * drops to 1 and the next check takes one. snap_taken puts it back. The larger of the two:
 * a snapshot copies the whole database, so waiting for as many log bytes as it holds keeps
 * snapshots at most one byte copied per byte logged, where a fixed 64 MiB at 10^6 files
 * (a 480 MB database) copied 7.5 bytes per byte logged and halved bulk creates. */
static void snap_account(struct mraft *r, size_t len)
{
	r->since_bytes += len;
	r->since_n++;
	uint64_t lim = r->o.snapshot_bytes;
	if (lim && r->snap_size > lim)
		lim = r->snap_size;
	if (lim && !r->by_bytes && r->since_bytes >= lim) {
		r->by_bytes = 1;
		raft_set_snapshot_threshold(&r->raft, 1);
	}
}

/* A snapshot is being taken at the last applied entry: the count starts again, and the
 * entries kept behind it (for followers a little behind) are a fifth of those since the last
 * one, or fewer, so that they hold about a fifth of snapshot_bytes. */
static void snap_taken(struct mraft *r)
{
	unsigned trail = r->every / 5 ? r->every / 5 : 1;
	if (r->o.snapshot_bytes && r->since_bytes) {
		double t =
		    (double)r->since_n * ((double)r->o.snapshot_bytes / 5) / (double)r->since_bytes;
		if (t < trail)
			trail = t < 1 ? 1 : (unsigned)t;
	}
	raft_set_snapshot_trailing(&r->raft, trail);
	raft_set_snapshot_threshold(&r->raft, r->every);
	r->by_bytes = 0;
	r->since_bytes = r->since_n = 0;
}

static int fsm_apply(struct raft_fsm *fsm, const struct raft_buffer *buf, void **result)
{
	struct mraft *r = fsm->data;
	const uint8_t *d = buf->base, *end = d + buf->len;
	uint32_t fmt = buf->len >= 8 ? get32(d + 4) : 0;
	*result = NULL;
	snap_account(r, buf->len);
	if (fmt == 1 && get32(d) <= buf->len - 8) {
		pthread_mutex_lock(&r->spec_mu);
		apply_batch(r, 0, 0, (const char *)d + 8, get32(d), NULL);
		pthread_mutex_unlock(&r->spec_mu);
		return 0;
	}
	if (fmt != 3 || buf->len < ENTRY_HDR) {
		klog_error("cannot apply a committed entry of %zu bytes: not a kvfs-meta entry",
			   buf->len);
		abort();
	}
	uint32_t n = get32(d);
	pthread_mutex_lock(&r->spec_mu);
	int ours = get64(d + 8) == r->nonce;
	if (!ours) {
		/* A follower (or a replica rolled back since): the whole entry as one RocksDB
		 * write, one WAL append for all its batches. */
		if (r->pend)
			spec_rollback(r, "an entry not ours to skip");
		apply_joined(r, d, buf->len, n);
		pthread_mutex_unlock(&r->spec_mu);
		return 0;
	}
	rocksdb_writebatch_t *drops = rocksdb_writebatch_create();
	const uint8_t *p = d + ENTRY_HDR;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t bl = (size_t)(end - p) >= REC_HDR ? get32(p + 8) : UINT32_MAX;
		if (bl > (size_t)(end - p) - REC_HDR) {
			klog_error("cannot apply a committed entry of %zu bytes: truncated",
				   buf->len);
			abort();
		}
		apply_batch(r, ours, get64(p), (const char *)p + REC_HDR, bl, drops);
		p += (REC_HDR + bl + 7) & ~(size_t)7;
		if (p > end)
			p = end;
	}
	/* The wake-ups (a futex syscall per waiter, dozens per entry) and the drop of the undo
	 * records happen after spec_mu is released: proposers queue on it meanwhile. The drop
	 * needs no order against their writes (other keys), and every rollback, which must
	 * not see a committed batch's undo record, runs on this thread. */
	struct mwaiter *wl = spec_decided(r);
	pthread_mutex_unlock(&r->spec_mu);
	waiters_wake(wl);
	char *err = NULL;
	if (rocksdb_writebatch_count(drops))
		rocksdb_write(r->o.db, r->wo, drops, &err);
	rocksdb_writebatch_destroy(drops);
	if (err) {
		klog_error("cannot drop undo records: %s", err);
		abort();
	}
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

/* The whole key space as of snap: magic, then (u32 klen, u32 vlen, key, value) in key order,
 * into one raft_malloc'd buffer. Reads only the database: any thread. */
static int serialise(struct mraft *r, const rocksdb_snapshot_t *snap, struct raft_buffer *bufs[],
		     unsigned *n_bufs)
{
	size_t cap = 1 << 20, len = 8;
	uint8_t *p = raft_malloc(cap);
	if (!p)
		return RAFT_NOMEM;
	memcpy(p, SNAP_MAGIC, 8);
	rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
	rocksdb_readoptions_set_iterate_upper_bound(ro, "\xff", 1);
	rocksdb_readoptions_set_snapshot(ro, snap);
	/* One pass over the whole database: keep it out of the block cache the reads use. */
	rocksdb_readoptions_set_fill_cache(ro, 0);
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

/* The state a snapshot at the last applied entry must show, taken on the loop thread (which
 * alone applies entries): on a leader with speculative writes pending the RocksDB snapshot of
 * the last committed one (view), else one taken now under spec_mu, so no uncommitted write
 * is ever in a Raft snapshot. Sets snap_read and snap_own; counts the snapshot. */
static void snap_pick(struct mraft *r)
{
	pthread_mutex_lock(&r->spec_mu);
	r->snap_own = !r->pend;
	r->snap_read = r->pend ? r->view : rocksdb_create_snapshot(r->o.db);
	pthread_mutex_unlock(&r->spec_mu);
	klog_info("snapshot at entry %llu, after %llu entries of %llu bytes%s",
		  (unsigned long long)raft_last_applied(&r->raft), (unsigned long long)r->since_n,
		  (unsigned long long)r->since_bytes, r->by_bytes ? " (by bytes)" : "");
	snap_taken(r);
	r->nsnap++;
}

static void snap_unpick(struct mraft *r)
{
	pthread_mutex_lock(&r->spec_mu);
	if (r->snap_read && (r->snap_own || r->snap_read != r->view))
		rocksdb_release_snapshot(r->o.db, r->snap_read);
	r->snap_read = NULL;
	pthread_mutex_unlock(&r->spec_mu);
}

static uint64_t snap_bytes(const struct raft_buffer *b, unsigned n)
{
	uint64_t t = 0;
	for (unsigned i = 0; b && i < n; i++)
		t += b[i].len;
	return t;
}

/* libraft without async work (fsm version 1): the whole serialisation on the loop thread. */
static int fsm_snapshot(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
	struct mraft *r = fsm->data;
	snap_pick(r);
	int rc = serialise(r, r->snap_read, bufs, n_bufs);
	snap_unpick(r);
	if (rc == 0)
		r->snap_size = snap_bytes(*bufs, *n_bufs);
	return rc;
}

/* Fsm version 3: libraft calls fsm_snap_begin on the loop thread, fsm_snap_async on a worker
 * thread (io->async_work), then fsm_snap_finalize on the loop thread, whatever happened. A
 * snapshot is the whole database (hundreds of MB at 10^6 files): serialised on the loop
 * thread it stopped heartbeats for seconds, and followers elected another leader. */
static int fsm_snap_begin(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
	struct mraft *r = fsm->data;
	snap_pick(r);
	*bufs = NULL;
	*n_bufs = 0;
	return 0;
}

static int fsm_snap_async(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
	struct mraft *r = fsm->data;
	return serialise(r, r->snap_read, bufs, n_bufs);
}

static int fsm_snap_finalize(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
	struct mraft *r = fsm->data;
	if (*bufs) {
		r->snap_size = snap_bytes(*bufs, *n_bufs);
		for (unsigned i = 0; i < *n_bufs; i++)
			raft_free((*bufs)[i].base);
		raft_free(*bufs);
	}
	*bufs = NULL;
	*n_bufs = 0;
	snap_unpick(r);
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
	pthread_mutex_lock(&r->spec_mu);
	if (r->pend)
		spec_rollback(r, "a snapshot installed");
	rocksdb_write(r->o.db, r->wo, b, &err);
	pthread_mutex_unlock(&r->spec_mu);
	rocksdb_writebatch_destroy(b);
	if (err) {
		klog_error("restore: %s", err);
		rocksdb_free(err);
		return RAFT_IOERR;
	}
	klog_info("restored a snapshot: %zu keys", nkeys);
	r->snap_size = buf->len;
	raft_free(buf->base);
	/* libraft drops the log up to the snapshot: the byte count starts again. */
	r->by_bytes = 0;
	r->since_bytes = r->since_n = 0;
	raft_set_snapshot_threshold(&r->raft, r->every);
	return 0;
}

/* ---- the loop thread ---- */

/* An entry left the window (applied, failed, or never appended): what queued meanwhile goes
 * as the next entry, since its proposers did not wake the loop thread while the window was
 * full (a batch left in the queue would otherwise wait for the next proposal, or be proposed
 * in a later term after its rollback). */
static void window_release(struct mraft *r)
{
	pthread_mutex_lock(&r->mu);
	r->in_flight--;
	int kick = r->queue && r->in_flight < ENTRY_WINDOW;
	pthread_mutex_unlock(&r->mu);
	if (kick)
		uv_async_send(&r->async);
}

/* The outcome of a speculative entry is in done_seq (fsm_apply); a failure means it may never
 * commit, so everything speculative is rolled back. */
static void apply_cb(struct raft_apply *req, int status, void *result)
{
	(void)result;
	struct mentry *en = req->data;
	struct mraft *r = en->r;
	free(en);
	window_release(r);
	if (status == 0)
		return;
	if (status != RAFT_NOTLEADER)
		klog_debug("entry not applied: %s", raft_strerror(status));
	pthread_mutex_lock(&r->spec_mu);
	if (r->pend)
		spec_rollback(r, raft_strerror(status));
	pthread_mutex_unlock(&r->spec_mu);
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
	s->snap_index = rf->log.snapshot.last_index;
	s->snapshots = r->nsnap;
	s->log_bytes = r->since_bytes;
	s->snap_size = r->snap_size;
	/* libraft's in-memory log is a ring of entries [front, back). */
	const struct raft_log *lg = &rf->log;
	s->log_mem = lg->back >= lg->front ? lg->back - lg->front : lg->size - lg->front + lg->back;
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
	/* No longer the leader that speculated: undo what is not known committed (fsm_apply
	 * would also do it before applying anything else). */
	pthread_mutex_lock(&r->spec_mu);
	if (r->spec_term && (state != RAFT_LEADER || rf->current_term != r->spec_term))
		spec_rollback(r, "leadership lost");
	pthread_mutex_unlock(&r->spec_mu);
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
	struct mchange *ch = r->changes;
	r->changes = NULL;
	int close = r->stop && !r->closing;
	if (close)
		r->closing = 1;
	struct mprop *q = NULL;
	if (close || r->in_flight < ENTRY_WINDOW) {
		q = r->queue;
		r->queue = r->queue_tail = NULL;
	}
	pthread_mutex_unlock(&r->mu);
	while (q) {
		/* Everything queued meanwhile goes as one entry (or a few, ENTRY_MAX each). */
		size_t len = ENTRY_HDR;
		uint32_t n = 0;
		struct mprop *last = q;
		for (struct mprop *p = q;
		     p && (n == 0 || (len + p->len <= ENTRY_MAX && n < ENTRY_RECS)); p = p->next) {
			len += p->len;
			n++;
			last = p;
		}
		struct mprop *rest = last->next;
		struct mentry *en = malloc(sizeof(*en));
		struct raft_buffer buf = {.base = raft_malloc(len), .len = len};
		int rc = close ? RAFT_SHUTDOWN : en && buf.base ? 0 : RAFT_NOMEM;
		if (buf.base) {
			uint8_t *e = buf.base;
			put32(e, n);
			put32(e + 4, 3);
			put64(e + 8, r->nonce);
			size_t off = ENTRY_HDR;
			for (struct mprop *p = q; p != rest; p = p->next) {
				memcpy(e + off, p->rec, p->len);
				off += p->len;
			}
		}
		while (q != rest) {
			struct mprop *p = q;
			q = q->next;
			free(p->rec);
			free(p);
		}
		if (!rc) {
			en->r = r;
			en->req.data = en;
			/* Counted before raft_apply: a proposer that sees the window full
			 * leaves the wake-up to apply_cb. */
			pthread_mutex_lock(&r->mu);
			r->in_flight++;
			pthread_mutex_unlock(&r->mu);
			rc = raft_apply(&r->raft, &en->req, &buf, 1, apply_cb);
			if (rc)
				window_release(r);
		}
		if (rc) {
			if (buf.base)
				raft_free(buf.base);
			free(en);
			pthread_mutex_lock(&r->spec_mu);
			if (r->pend)
				spec_rollback(r, raft_strerror(rc));
			pthread_mutex_unlock(&r->spec_mu);
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
			pthread_mutex_lock(&r->spec_mu);
			pthread_mutex_lock(&r->mu);
			if (!rc && r->st.term == term && r->st.state == RAFT_LEADER &&
			    r->barrier_term == term) {
				r->serving_term = term;
				r->spec_term = term;
				klog_info("leader of term %llu: serving", (unsigned long long)term);
			}
			pthread_mutex_unlock(&r->spec_mu);
			if (rc)
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
	spec_release(r);
	if (r->snap_read) /* a snapshot libraft never finalised */
		rocksdb_release_snapshot(r->o.db, r->snap_read);
	if (r->ro)
		rocksdb_readoptions_destroy(r->ro);
	pthread_mutex_destroy(&r->spec_mu);
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
	pthread_mutex_init(&r->spec_mu, NULL);
	/* Marks this process's speculative entries: after a restart the log's older ones are
	 * applied like anyone's. */
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	r->nonce = ((uint64_t)(uint32_t)random() << 32 | (uint32_t)random()) ^
		   (uint64_t)now.tv_nsec ^ (uint64_t)now.tv_sec << 32 ^ (uint64_t)getpid() << 40;
	if (!r->nonce)
		r->nonce = 1;
	r->ro = rocksdb_readoptions_create();
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
	/* The Raft log is fsync'd before an entry counts as stored, and a start rebuilds the
	 * database from it (libraft restores the last snapshot, which replaces every key, and
	 * applies every entry after it again; without a snapshot, every entry from the first,
	 * blind writes over whatever the database held). So RocksDB's own WAL adds nothing to
	 * what survives a crash, and replicated writes skip it: what a crash takes from the
	 * memtable comes back from the log. A speculative write and its undo record are one
	 * batch, so one memtable: a crash keeps both or neither. Skipping the WAL saved ~7 us
	 * of the leader's CPU per file create and ~2.5 us of each follower's (docs/benchmarks.md);
	 * meta's local writes before Raft starts (mdb_write without Raft) keep their WAL. */
	r->wo = rocksdb_writeoptions_create();
	rocksdb_writeoptions_disable_WAL(r->wo, 1);
	/* Speculative writes a crash or a stop left behind: the log replays what committed. */
	size_t undone = undo_all(o->db, r->wo);
	if (undone)
		klog_warn("rolled back %zu speculative writes left by the last run", undone);
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
	r->tls = o->secret && !o->secret->insecure_plaintext;
	if (r->tls)
		rc = mrtls_init(&r->tr, &r->loop, o->secret);
	else
		rc = raft_uv_tcp_init(&r->tr, &r->loop);
	if (!rc && (step = "log", 1))
		rc = raft_uv_init(&r->io, &r->loop, o->dir, &r->tr);
	if (!rc && o->no_compress && (step = "snapshot compression", 1))
		rc = raft_uv_set_snapshot_compression(&r->io, false);
	/* Snapshots serialised off the loop thread where libraft's I/O can run work
	 * (async_work, an io version 2 field), else on it. libraft 0.15's raft_uv_init sets
	 * async_work but says version 1, and raft_init refuses an async fsm on version 1: the
	 * field is there, so the version is raised to what it provides. */
	if (!rc && r->io.version == 1 && r->io.async_work)
		r->io.version = 2;
	if (!rc && r->io.version >= 2 && r->io.async_work) {
		r->fsm.version = 3;
		r->fsm.snapshot = fsm_snap_begin;
		r->fsm.snapshot_async = fsm_snap_async;
		r->fsm.snapshot_finalize = fsm_snap_finalize;
	}
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
	r->every = o->snapshot_every ? o->snapshot_every : 100000;
	raft_set_snapshot_threshold(&r->raft, r->every);
	raft_set_snapshot_trailing(&r->raft, r->every / 5 ? r->every / 5 : 1);
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
	klog_info("replica %llu of %u, Raft on %s (%s), log in %s, snapshots serialised %s",
		  (unsigned long long)o->id, r->n, r->self,
		  r->tls ? "TLS" : "PLAINTEXT, unauthenticated", o->dir,
		  r->fsm.version == 3 ? "off the loop thread" : "on the loop thread");
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
		if (r->tls)
			mrtls_free(&r->tr);
		else
			raft_uv_tcp_close(&r->tr);
	}
	/* Proposals libraft never answered: undone like a lost leadership. */
	pthread_mutex_lock(&r->spec_mu);
	spec_rollback(r, "stopping");
	pthread_mutex_unlock(&r->spec_mu);
	uv_loop_close(&r->loop);
	free_unstarted(r);
}

/* ---- building the undo of a batch: the before-image of every key it touches ---- */

struct undo_ctx {
	struct mraft *r;
	rocksdb_writebatch_t *undo;
	int rc;
};

static void undo_key_of(struct undo_ctx *u, const char *k, size_t kl)
{
	char *err = NULL;
	size_t vl;
	char *v = rocksdb_get(u->r->o.db, u->r->ro, k, kl, &vl, &err);
	if (err) {
		klog_error("rocksdb get (undo): %s", err);
		rocksdb_free(err);
		u->rc = -EIO;
		return;
	}
	if (v)
		rocksdb_writebatch_put(u->undo, k, kl, v, vl);
	else
		rocksdb_writebatch_delete(u->undo, k, kl);
	rocksdb_free(v);
}

static int varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
	*v = 0;
	for (int sh = 0; sh < 64 && *p < end; sh += 7) {
		uint8_t c = *(*p)++;
		*v |= (uint64_t)(c & 0x7f) << sh;
		if (!(c & 0x80))
			return 0;
	}
	return -EINVAL;
}

static int slice(const uint8_t **p, const uint8_t *end, const char **s, size_t *n)
{
	uint64_t l;
	if (varint(p, end, &l) || l > (uint64_t)(end - *p))
		return -EINVAL;
	*s = (const char *)*p;
	*n = (size_t)l;
	*p += l;
	return 0;
}

/* Walks RocksDB's batch encoding (u64 sequence, u32 count, then records: a type byte and
 * length-prefixed slices) for Put, Delete, SingleDelete and DeleteRange on the default column
 * family, the kinds meta writes; any other kind: -EINVAL (such a batch is not proposed). */
static int undo_build(struct undo_ctx *u, const char *data, size_t len)
{
	const uint8_t *p = (const uint8_t *)data + 12, *end = (const uint8_t *)data + len;
	if (len < 12)
		return -EINVAL;
	while (p < end && !u->rc) {
		uint8_t t = *p++;
		const char *k, *v, *e;
		size_t kl, vl, el;
		if (t == 0x1) { /* Put */
			if (slice(&p, end, &k, &kl) || slice(&p, end, &v, &vl))
				return -EINVAL;
			undo_key_of(u, k, kl);
		} else if (t == 0x0 || t == 0x7) { /* Delete, SingleDelete */
			if (slice(&p, end, &k, &kl))
				return -EINVAL;
			undo_key_of(u, k, kl);
		} else if (t == 0xF) { /* DeleteRange: every key now in [k, e) */
			if (slice(&p, end, &k, &kl) || slice(&p, end, &e, &el))
				return -EINVAL;
			rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
			rocksdb_readoptions_set_iterate_upper_bound(ro, e, el);
			rocksdb_iterator_t *it = rocksdb_create_iterator(u->r->o.db, ro);
			for (rocksdb_iter_seek(it, k, kl); rocksdb_iter_valid(it);
			     rocksdb_iter_next(it)) {
				size_t a, b;
				const char *ik = rocksdb_iter_key(it, &a);
				const char *iv = rocksdb_iter_value(it, &b);
				rocksdb_writebatch_put(u->undo, ik, a, iv, b);
			}
			char *err = NULL;
			rocksdb_iter_get_error(it, &err);
			rocksdb_iter_destroy(it);
			rocksdb_readoptions_destroy(ro);
			if (err) {
				klog_error("rocksdb iterator (undo): %s", err);
				rocksdb_free(err);
				u->rc = -EIO;
			}
		} else {
			klog_error("a write batch with record type 0x%x cannot be speculated", t);
			return -EINVAL;
		}
	}
	return u->rc;
}

int mraft_propose_async(struct mraft *r, const char *data, size_t len, uint64_t *seq)
{
	if (len > ENTRY_MAX)
		return -EFBIG;
	size_t padded = (REC_HDR + len + 7) & ~(size_t)7;
	uint8_t *e = calloc(1, padded);
	struct mprop *p = calloc(1, sizeof(*p));
	struct mspec *sp = calloc(1, sizeof(*sp));
	struct undo_ctx u = {.r = r, .undo = rocksdb_writebatch_create()};
	rocksdb_writebatch_t *b = rocksdb_writebatch_create_from(data, len);
	int rc = e && p && sp && b ? 0 : -ENOMEM, kick = 0;
	if (!rc) {
		put32(e + 8, (uint32_t)len);
		memcpy(e + REC_HDR, data, len);
		p->rec = e;
		p->len = padded;
	}
	/* spec_mu makes the order of local writes the order of the log: the queue below is
	 * handed to libraft in that order, on one thread. */
	pthread_mutex_lock(&r->spec_mu);
	if (!rc) {
		pthread_mutex_lock(&r->mu);
		int ok = !r->stop && r->st.state == RAFT_LEADER && r->serving_term &&
			 r->serving_term == r->st.term && r->spec_term == r->serving_term;
		pthread_mutex_unlock(&r->mu);
		rc = ok ? 0 : -EREMCHG;
	}
	if (!rc)
		rc = undo_build(&u, data, len);
	uint64_t s = r->spec_seq + 1;
	if (!rc) {
		uint8_t k[UNDO_KEY];
		size_t ul;
		const char *ud = rocksdb_writebatch_data(u.undo, &ul);
		undo_key(k, s);
		rocksdb_writebatch_put(b, (const char *)k, sizeof(k), ud, ul);
		put64(e, s);
		if (!r->pend) /* the committed state, for a Raft snapshot meanwhile */
			view_set(r, rocksdb_create_snapshot(r->o.db));
		char *err = NULL;
		rocksdb_write(r->o.db, r->wo, b, &err);
		if (err) {
			klog_error("rocksdb write: %s", err);
			rocksdb_free(err);
			rc = -EIO;
		}
	}
	if (!rc) {
		r->spec_seq = s;
		sp->seq = s;
		sp->snap = rocksdb_create_snapshot(r->o.db);
		if (r->pend_tail)
			r->pend_tail->next = sp;
		else
			r->pend = sp;
		r->pend_tail = sp;
		/* The loop thread needs a wake-up only if this batch is the first it will find
		 * and the window has room: a batch already queued had its own wake-up, or waits
		 * for apply_cb's (window full), which takes everything queued by then. One
		 * eventfd write and one loop wake-up per batch cost the leader ~19 us of CPU per
		 * file create (docs/benchmarks.md). */
		pthread_mutex_lock(&r->mu);
		kick = !r->queue && r->in_flight < ENTRY_WINDOW;
		if (r->queue_tail)
			r->queue_tail->next = p;
		else
			r->queue = p;
		r->queue_tail = p;
		pthread_mutex_unlock(&r->mu);
	}
	pthread_mutex_unlock(&r->spec_mu);
	if (b)
		rocksdb_writebatch_destroy(b);
	rocksdb_writebatch_destroy(u.undo);
	if (rc) {
		free(e);
		free(p);
		free(sp);
		return rc;
	}
	if (kick)
		uv_async_send(&r->async);
	*seq = s;
	return 0;
}

int mraft_wait(struct mraft *r, uint64_t seq)
{
	pthread_mutex_lock(&r->spec_mu);
	if (r->done_seq >= seq || r->rolled_upto >= seq) {
		int rc = r->done_seq >= seq ? 0 : -ECONNABORTED;
		pthread_mutex_unlock(&r->spec_mu);
		return rc;
	}
	struct mwaiter w = {.seq = seq, .next = r->waiters};
	atomic_init(&w.state, 0);
	r->waiters = &w;
	pthread_mutex_unlock(&r->spec_mu);
	uint32_t st;
	while ((st = atomic_load_explicit(&w.state, memory_order_acquire)) == 0)
		syscall(SYS_futex, &w.state, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
	return st == 1 ? 0 : -ECONNABORTED;
}

int mraft_settle(struct mraft *r)
{
	/* Under spec_mu: a write that a reader saw is counted in spec_seq by then. */
	pthread_mutex_lock(&r->spec_mu);
	uint64_t seq = r->spec_seq;
	pthread_mutex_unlock(&r->spec_mu);
	return mraft_wait(r, seq);
}

int mraft_propose(struct mraft *r, const char *data, size_t len)
{
	uint64_t seq;
	int rc = mraft_propose_async(r, data, len, &seq);
	return rc ? rc : mraft_wait(r, seq);
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
