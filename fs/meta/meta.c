/* kvfs-meta service object: open/close, the background thread and the request dispatcher. */
#define KVFS_LOG_TAG "meta"
#include "ktime.h"
#include "log.h"
#include "meta_int.h"
#include "meta_lease.h"
#include "meta_raft.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the background thread: node states, deletion queue, write expiry, retention ---- */

#define DEL_ROUNDS 64 /* deletion-queue rounds per pass */

static int stopping(struct meta *m)
{
	pthread_mutex_lock(&m->bg_mu);
	int s = m->stopping;
	pthread_mutex_unlock(&m->bg_mu);
	return s;
}

static void bg_sleep(struct meta *m)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	int64_t ns = t.tv_nsec + (int64_t)(m->o.gc_interval_s * 1e9);
	t.tv_sec += ns / 1000000000;
	t.tv_nsec = ns % 1000000000;
	pthread_mutex_lock(&m->bg_mu);
	if (!m->stopping && !m->kicked)
		pthread_cond_timedwait(&m->bg_cv, &m->bg_mu, &t);
	m->kicked = 0;
	pthread_mutex_unlock(&m->bg_mu);
}

static void *bg_main(void *arg)
{
	struct meta *m = arg;
	while (!stopping(m)) {
		if (m->raft && !mraft_serving(m->raft)) {
			/* A follower changes nothing on its own: the leader's passes do. A new
			 * leader about to serve looks again soon: it then records its address. */
			if (mleader_pending(m))
				nanosleep(&(struct timespec){0, 5000000}, NULL);
			else
				bg_sleep(m);
			continue;
		}
		mleader_announce(m);
		mnodes_check(m);
		uint32_t from = 0;
		for (int i = 0; i < DEL_ROUNDS && !stopping(m) && mnodes_delq_round(m, &from); i++)
			;
		mfile_expire(m);
		mlife_tick(m);
		bg_sleep(m);
	}
	return NULL;
}

static int bg_start(struct meta *m)
{
	int rc = pthread_create(&m->bg, NULL, bg_main, m);
	if (rc)
		return -rc;
	m->bg_started = 1;
	return 0;
}

static void bg_stop(struct meta *m)
{
	if (!m->bg_started)
		return;
	pthread_mutex_lock(&m->bg_mu);
	m->stopping = 1;
	pthread_cond_signal(&m->bg_cv);
	pthread_mutex_unlock(&m->bg_mu);
	pthread_join(m->bg, NULL);
	m->bg_started = 0;
}

/* Called by mraft when this replica becomes leader, every earlier entry applied: the
 * in-memory state (counters, id reservations, node registry) is rebuilt from RocksDB exactly
 * as a restart does, before the first request is served. */
static int meta_lead(void *ctx)
{
	struct meta *m = ctx;
	pthread_mutex_lock(&m->mu);
	pthread_mutex_lock(&m->nodes_mu);
	int rc = mdb_load_counters(m);
	m->nnodes = 0;
	if (!rc)
		rc = mnodes_load(m);
	pthread_mutex_unlock(&m->nodes_mu);
	pthread_mutex_unlock(&m->mu);
	/* A lease the previous leader granted ends at most its length after that leader stopped
	 * serving, which is at most an election timeout (+ libraft's 20 ms sampling) after this
	 * one was elected: namespace changes wait that long (docs/meta.md, "Directory leases"). */
	mlease_lead(m->lease, (int64_t)(m->o.raft_election_s * 1e9) +
				  (int64_t)KVP_LEASE_MAX_MS * 1000000 + 100000000);
	if (!rc)
		klog_info("leading: %llu files, %llu dirs, %zu nodes", (unsigned long long)m->files,
			  (unsigned long long)m->dirs, m->nnodes);
	/* The background thread records this leader's address as soon as it serves. */
	pthread_mutex_lock(&m->bg_mu);
	m->kicked = 1;
	pthread_cond_signal(&m->bg_cv);
	pthread_mutex_unlock(&m->bg_mu);
	return rc;
}

static int meta_raft_start(struct meta *m)
{
	if (!m->o.raft_id)
		return 0;
	struct mraft_opts ro = {.id = (uint64_t)m->o.raft_id,
				.peers = m->o.raft_peers,
				.dir = m->o.raft_dir,
				.db = m->db,
				.election_ms = (unsigned)(m->o.raft_election_s * 1000),
				.snapshot_every = (unsigned)m->o.raft_snapshot_every,
				.snapshot_bytes = m->o.raft_snapshot_bytes,
				.join = m->o.raft_join,
				.secret = m->o.secret,
				.no_compress = !m->o.raft_snapshot_compress,
				.on_lead = meta_lead,
				.ctx = m};
	return mraft_start(&ro, &m->raft);
}

int meta_open(const struct meta_opts *o, struct meta **out)
{
	struct meta *m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->o = *o;
	pthread_mutex_init(&m->mu, NULL);
	pthread_mutex_init(&m->nodes_mu, NULL);
	pthread_mutex_init(&m->bg_mu, NULL);
	pthread_mutex_init(&m->job_mu, NULL);
	pthread_mutex_init(&m->evict_mu, NULL);
	kvfs_cond_init_mono(&m->bg_cv);
	kvfs_cond_init_mono(&m->job_cv);
	kvfs_cond_init_mono(&m->freed_cv);
	srandom((unsigned)meta_now_ns());

	/* No hold at start (unlike a new Raft leader, mlease_lead): a previous run of this meta
	 * ended with its process, whose connections the kernel closed, and a holder drops every
	 * lease as soon as its watch connection ends (docs/meta.md, "Directory leases"). */
	int rc = mlease_create(&m->lease);
	if (!rc)
		rc = mdb_open(m);
	if (!rc)
		rc = mnodes_load(m);
	if (!rc)
		rc = mdb_rev_build(m);
	/* Before the parent pass: it rewrites records in the new version, which this one skips. */
	if (!rc)
		rc = mdb_access_fix(m);
	if (!rc)
		rc = mdb_parents_fix(m);
	if (!rc)
		rc = kvp_pool_create(o->secret, 2000, &m->pool);
	/* After the one-time passes above, which write locally: a fresh replica's own changes
	 * are then replaced by the leader's snapshot or log. */
	if (!rc)
		rc = meta_raft_start(m);
	/* The first orphan pass waits one interval: nodes re-register first, and a restart
	 * loop must not LIST every node each time. */
	m->last_orphan_mono = meta_mono_ns();
	if (!rc)
		rc = bg_start(m);
	if (!rc)
		rc = mrep_start(m);
	if (rc) {
		meta_close(m);
		return rc;
	}
	klog_info("database %s: %llu files, %llu dirs, %zu nodes", o->db_path,
		  (unsigned long long)m->files, (unsigned long long)m->dirs, m->nnodes);
	*out = m;
	return 0;
}

void meta_close(struct meta *m)
{
	if (!m)
		return;
	mrep_stop(m);
	bg_stop(m);
	mraft_stop(m->raft);
	m->raft = NULL;
	if (m->pool)
		kvp_pool_destroy(m->pool);
	mdb_close(m);
	mlease_destroy(m->lease);
	free(m->nodes);
	pthread_cond_destroy(&m->bg_cv);
	pthread_cond_destroy(&m->job_cv);
	pthread_cond_destroy(&m->freed_cv);
	pthread_mutex_destroy(&m->job_mu);
	pthread_mutex_destroy(&m->evict_mu);
	pthread_mutex_destroy(&m->bg_mu);
	pthread_mutex_destroy(&m->nodes_mu);
	pthread_mutex_destroy(&m->mu);
	free(m);
}

typedef int (*op_fn)(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);
static int raft_conf(struct meta *m, const struct mreq *q, struct kvp_wbuf *out);

static op_fn op_table(uint16_t op)
{
	switch (op) {
	case KVP_OP_HEARTBEAT:
		return mnodes_heartbeat;
	case KVP_OP_LOOKUP:
		return mns_lookup;
	case KVP_OP_GETATTR:
		return mns_getattr;
	case KVP_OP_READDIR:
		return mns_readdir;
	case KVP_OP_MKDIR:
		return mns_mkdir;
	case KVP_OP_RMDIR:
		return mns_rmdir;
	case KVP_OP_UNLINK:
		return mns_unlink;
	case KVP_OP_RENAME:
		return mns_rename;
	case KVP_OP_ALLOC:
		return mfile_alloc;
	case KVP_OP_COMMIT:
		return mfile_commit;
	case KVP_OP_ABORT:
		return mfile_abort;
	case KVP_OP_LAYOUT:
		return mfile_layout;
	case KVP_OP_STATFS:
		return mnodes_statfs;
	case KVP_OP_NODES:
		return mnodes_list;
	case KVP_OP_SETATTR:
		return mns_setattr;
	case KVP_OP_TOUCH:
		return mns_touch;
	case KVP_OP_MAINT:
		return mlife_maint;
	case KVP_OP_MSTATUS:
		return mlife_status;
	case KVP_OP_RCONF:
		return raft_conf;
	case KVP_OP_BFILL:
		return mfile_bfill;
	case KVP_OP_LEASE:
		return mlease_grant;
	default:
		return NULL;
	}
}

static int mutates(uint16_t op)
{
	switch (op) {
	case KVP_OP_LOOKUP:
	case KVP_OP_GETATTR:
	case KVP_OP_READDIR:
	case KVP_OP_LAYOUT:
	case KVP_OP_STATFS:
	case KVP_OP_NODES:
	case KVP_OP_MSTATUS:
	case KVP_OP_LEASE:
		return 0;
	default:
		return 1;
	}
}

/* RCONF (kvp.h): adds or removes a replica. Not under mu: a change waits for the new
 * replica to catch up, and requests go on meanwhile. */
static int raft_conf(struct meta *m, const struct mreq *q, struct kvp_wbuf *out)
{
	(void)out;
	if (!m->raft)
		return -EOPNOTSUPP;
	char addr[MRAFT_ADDR_MAX];
	if ((q->action != 1 && q->action != 2) || q->addr.len >= sizeof(addr))
		return -EINVAL;
	memcpy(addr, q->addr.p, q->addr.len);
	addr[q->addr.len] = 0;
	if (strlen(addr) != q->addr.len)
		return -EINVAL;
	return mraft_change(m->raft, q->action == 1, q->uuid, addr);
}

/* RSTATUS (kvp.h): this replica's view of the Raft group. */
static int raft_status(struct meta *m, struct kvp_wbuf *out)
{
	if (!m->raft)
		return -EOPNOTSUPP;
	struct mraft_status s;
	mraft_status(m->raft, &s);
	kvp_w_u64(out, s.id);
	kvp_w_u8(out, s.state);
	kvp_w_u8(out, s.serving);
	kvp_w_u64(out, s.term);
	kvp_w_u64(out, s.leader_id);
	kvp_w_cstr(out, s.leader_addr);
	kvp_w_u64(out, s.last_index);
	kvp_w_u64(out, s.applied);
	kvp_w_u64(out, s.commit);
	kvp_w_u32(out, s.npeers);
	for (uint32_t i = 0; i < s.npeers; i++) {
		kvp_w_u64(out, s.peers[i].id);
		kvp_w_cstr(out, s.peers[i].addr);
		kvp_w_u64(out, s.peers[i].match);
	}
	kvp_w_u64(out, s.snap_index);
	kvp_w_u64(out, s.snapshots);
	kvp_w_u64(out, s.log_bytes);
	kvp_w_u64(out, s.log_mem);
	char laddr[KVP_ADDR_MAX];
	mleader_addr(m, 1, laddr, sizeof(laddr));
	kvp_w_cstr(out, laddr);
	kvp_w_u64(out, s.snap_size);
	return 0;
}

int meta_handle(void *ctx, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body)
{
	struct meta *m = ctx;
	struct mreq q;
	int rc = mreq_parse(h->op, body, h->len, &q);
	if (rc == -EBADMSG) {
		free(body);
		return rc; /* closes the connection */
	}
	struct kvp_wbuf out;
	kvp_w_init(&out);
	/* Replicated: only the serving leader answers (reads too: docs/meta.md, "Reads"); the
	 * others say -EREMCHG, naming the leader when they know it (docs/meta.md, "Redirects"). */
	if (rc == 0 && h->op == KVP_OP_RSTATUS) {
		rc = raft_status(m, &out);
		goto reply;
	}
	if (rc == 0 && m->raft && !mraft_serving(m->raft))
		rc = -EREMCHG;
	else if (rc == 0 && h->op == KVP_OP_WATCH) {
		mlease_watch(m, c, h, &q); /* answers now or later */
		kvp_w_free(&out);
		free(body);
		return 0;
	} else if (rc == 0) {
		/* Pipelined writes: the op's writes are applied here at once and replicated
		 * while later requests run; before this reply shows anything (its own writes,
		 * or others' it read), everything applied so far must be committed. */
		mdb_defer = 1;
		rc = op_table(h->op)(m, &q, &out);
		mdb_defer = 0;
		if (m->raft && mdb_settle(m))
			rc = mutates(h->op) ? -ECONNABORTED : -EREMCHG;
		/* Leases on what it changed are revoked before anyone is told of the change. */
		if (rc == 0 || rc == -ECONNABORTED)
			mlease_after(m, h->op, &q);
	}
	/* --sync: the change is made durable before it is acknowledged (reads need nothing). */
	if (rc == 0 && m->o.sync && mutates(h->op))
		rc = mdb_sync(m);
reply:
	if (rc == 0 && out.err)
		rc = out.err;
	if (rc && rc != -ENOENT && rc != -EEXIST)
		klog_debug("op 0x%x from %s: %s", h->op, kvp_conn_peer(c), kvp_strerror(rc));
	if (rc == -EREMCHG) {
		struct kvp_wbuf to;
		kvp_w_init(&to);
		mleader_redirect(m, &to);
		if (!to.err && to.len)
			kvp_reply_err(c, h, rc, to.p, to.len);
		else
			kvp_reply(c, h, rc, NULL, 0, NULL, 0);
		kvp_w_free(&to);
	} else
		kvp_reply(c, h, rc, rc ? NULL : out.p, rc ? 0 : out.len, NULL, 0);
	kvp_w_free(&out);
	free(body);
	return 0;
}
