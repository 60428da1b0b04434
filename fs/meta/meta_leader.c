/* Redirects of a replicated meta (docs/meta.md, "Redirects"): a replica that does not serve
 * answers -EREMCHG with the serving leader's client address, so a client that knows any one
 * replica finds the leader. Raft knows only the leader's Raft address; its client address
 * goes through the log like every change: each serving leader writes MK_LEADER (its replica
 * id, its term, its address) once per term, and a follower names it only while Raft's leader
 * and term are the record's, so a record left by an earlier leader is never handed out. */
#define KVFS_LOG_TAG "meta"
#include "log.h"
#include "meta_int.h"
#include "meta_raft.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int meta_set_addr(struct meta *m, const char *addr)
{
	char host[KVP_ADDR_MAX];
	uint16_t port;
	if (!addr || strlen(addr) >= KVP_ADDR_MAX ||
	    kvp_addr_parse(addr, host, sizeof(host), &port) || port == 0)
		return -EINVAL;
	pthread_mutex_lock(&m->bg_mu);
	snprintf(m->client_addr, sizeof(m->client_addr), "%s", addr);
	m->kicked = 1; /* a leader already serving announces it now */
	pthread_cond_signal(&m->bg_cv);
	pthread_mutex_unlock(&m->bg_mu);
	return 0;
}

int mleader_announce(struct meta *m)
{
	if (!m->raft)
		return 0;
	struct mraft_status s;
	mraft_status(m->raft, &s);
	if (!s.serving || s.term == m->announced_term)
		return 0;
	char addr[KVP_ADDR_MAX];
	pthread_mutex_lock(&m->bg_mu);
	memcpy(addr, m->client_addr, sizeof(addr));
	pthread_mutex_unlock(&m->bg_mu);
	if (!addr[0])
		return 0;
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, s.id);
	kvp_w_u64(&w, s.term);
	kvp_w_cstr(&w, addr);
	int rc = w.err;
	if (!rc) {
		rocksdb_writebatch_t *b = rocksdb_writebatch_create();
		uint8_t k = MK_LEADER;
		rocksdb_writebatch_put(b, (const char *)&k, 1, (const char *)w.p, w.len);
		/* Under mu like every other change, though no read precedes this blind put. */
		pthread_mutex_lock(&m->mu);
		rc = mdb_write(m, b);
		pthread_mutex_unlock(&m->mu);
		rocksdb_writebatch_destroy(b);
	}
	kvp_w_free(&w);
	if (!rc) {
		m->announced_term = s.term;
		klog_info("leader of term %llu at %s: followers redirect clients here",
			  (unsigned long long)s.term, addr);
	} else
		klog_warn("cannot record the leader's address: %s (tried again)", kvp_strerror(rc));
	return rc;
}

int mleader_addr(struct meta *m, int self, char *addr, size_t cap)
{
	addr[0] = 0;
	if (!m->raft)
		return -ENOENT;
	struct mraft_status s;
	mraft_status(m->raft, &s);
	if (!s.leader_id || (s.leader_id == s.id && !self))
		return -ENOENT; /* an election, or this replica leads and does not serve yet */
	uint8_t k = MK_LEADER;
	char *v = NULL;
	size_t vl = 0;
	if (mdb_get(m, NULL, &k, 1, &v, &vl))
		return -ENOENT;
	struct kvp_rbuf r;
	kvp_r_init(&r, v, vl);
	uint64_t id = kvp_r_u64(&r), term = kvp_r_u64(&r);
	char a[KVP_ADDR_MAX];
	kvp_r_str(&r, a, sizeof(a));
	int rc =
	    kvp_r_end(&r) == 0 && id == s.leader_id && term == s.term && a[0] && strlen(a) < cap
		? 0
		: -ENOENT;
	if (!rc)
		memcpy(addr, a, strlen(a) + 1);
	free(v);
	return rc;
}

void mleader_redirect(struct meta *m, struct kvp_wbuf *out)
{
	char addr[KVP_ADDR_MAX];
	if (mleader_addr(m, 0, addr, sizeof(addr)) == 0)
		kvp_w_cstr(out, addr);
}

int mleader_pending(struct meta *m)
{
	if (!m->raft)
		return 0;
	struct mraft_status s;
	mraft_status(m->raft, &s);
	return s.state == 3 && (!s.serving || s.term != m->announced_term);
}
