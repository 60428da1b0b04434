/* Raft between meta replicas runs over kvfs's TLS (fs/meta/meta_rtls.h; docs/meta.md, "Raft
 * transport"). Three loopback replicas: a process without the cluster secret forges libraft's
 * own wire format in plaintext (its connection preamble, then a RequestVote with a term 1000
 * ahead and the disrupt-leader flag, which over libraft's plaintext TCP transport makes every
 * replica jump to that term and depose its leader), tries a TLS handshake with a wrong secret,
 * and sends junk: every replica stays in its term, the leader keeps serving writes, and each
 * replica logs the refusals. The Raft port answers a TLS handshake made with the right
 * secret. A flood of silent connections from one address (more than the handshakes the
 * transport runs at once) neither stops writes nor keeps another address from connecting. Then the
 * leader is killed: a new one is elected over TLS, writes go on, and the old leader, restarted,
 * catches up. Every replica then stops on SIGTERM within 10 s (closing the transport waits for its
 * threads). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "ret_tutil.h"

#define NREP	3
#define NFLOOD	80
#define BIGJUMP 1000

static struct kvh_raft G;
static pid_t g_pid[NREP];

static void put64(uint8_t **p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		*(*p)++ = (uint8_t)(v >> (8 * i));
}

/* libraft 0.15's TCP transport, as a peer that never proved anything would speak it: the
 * preamble (protocol 1, server id, address buffer size, address NUL-padded to 8 bytes), then
 * one RequestVote message (type 3; its header: term, candidate, last index, last term,
 * flags with disrupt_leader). Returns the length written into out. */
static size_t forge_request_vote(uint8_t *out, uint64_t id, const char *addr, uint64_t term)
{
	uint8_t *p = out;
	size_t al = (strlen(addr) + 1 + 7) / 8 * 8;
	put64(&p, 1);
	put64(&p, id);
	put64(&p, al);
	memset(p, 0, al);
	memcpy(p, addr, strlen(addr));
	p += al;
	put64(&p, 3);	     /* RAFT_IO_REQUEST_VOTE */
	put64(&p, 5 * 8);    /* its header's size */
	put64(&p, term);     /* term */
	put64(&p, id);	     /* candidate */
	put64(&p, 1u << 30); /* last log index: ahead of anyone */
	put64(&p, term);     /* last log term */
	put64(&p, 1u << 0);  /* flags: disrupt_leader */
	return (size_t)(p - out);
}

static uint64_t term_of(struct kvp_pool *pool, int i)
{
	struct kvp_rstatus s;
	for (int t = 0; t < 40; t++) {
		if (kvh_raft_rstatus(pool, &G, i, &s) == 0)
			return s.term;
		rt_sleep_ms(50);
	}
	fail_msg("replica %d does not answer RSTATUS", i + 1);
	return 0;
}

/* MKDIR name under the root through whichever replica serves, up to 15 s; 0 or an error. */
static int mkdir_any(struct kvp_pool *pool, const char *name)
{
	int rc = -ETIMEDOUT;
	for (int t = 0; t < 30; t++) {
		int lead = kvh_raft_leader(pool, &G, g_pid, -1, 500);
		if (lead < 0)
			continue;
		struct kvp_client *cl;
		if ((rc = kvp_pool_get(pool, G.meta[lead], &cl)) != 0)
			continue;
		struct kvp_wbuf w;
		kvp_w_init(&w);
		kvp_w_u64(&w, KVP_ROOT_INO);
		kvp_w_cstr(&w, name);
		kvp_w_u32(&w, 0755);
		rc = kvp_call(cl, KVP_OP_MKDIR, w.p, w.len, NULL, 0, 3000, NULL, NULL);
		kvp_w_free(&w);
		kvp_pool_put(pool, cl);
		if (rc == 0)
			return 0;
	}
	return rc;
}

/* A TCP connection to addr from the local address src (a loopback address other than
 * 127.0.0.1 stands for another host). The fd, or -1. */
static int connect_from(const char *src, const char *addr)
{
	char host[64];
	uint16_t port;
	if (kvp_addr_parse(addr, host, sizeof(host), &port))
		return -1;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in me = {.sin_family = AF_INET}, to = {.sin_family = AF_INET};
	inet_pton(AF_INET, src, &me.sin_addr);
	inet_pton(AF_INET, host, &to.sin_addr);
	to.sin_port = htons(port);
	if (fd < 0 || bind(fd, (struct sockaddr *)&me, sizeof(me)) ||
	    connect(fd, (struct sockaddr *)&to, sizeof(to))) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	return fd;
}

static int log_has(int i, const char *what)
{
	return kvh_sh("grep -q '%s' %s/meta%d.log", what, G.dir, i + 1) == 0;
}

static void test_raft_tls(void **state)
{
	(void)state;
	assert_int_equal(kvh_raft_init(&G, "/tmp/test_raft_tls-XXXXXX", NREP), 0);
	for (int i = 0; i < NREP; i++) {
		g_pid[i] = kvh_raft_spawn(&G, i, NULL);
		assert_true(g_pid[i] > 0);
	}
	struct kvp_pool *pool;
	assert_int_equal(kvp_pool_create(&G.sec, 2000, &pool), 0);
	int lead = kvh_raft_leader(pool, &G, g_pid, -1, 20000);
	assert_true(lead >= 0);
	assert_int_equal(mkdir_any(pool, "before"), 0);
	uint64_t t0[NREP];
	for (int i = 0; i < NREP; i++)
		t0[i] = term_of(pool, i);

	/* Forged plaintext Raft to every replica, claiming to be each of the other ids. */
	uint8_t msg[512];
	for (int i = 0; i < NREP; i++) {
		int other = (i + 1) % NREP;
		size_t n =
		    forge_request_vote(msg, (uint64_t)other + 1, G.raft[other], t0[i] + BIGJUMP);
		int fd = kvp_connect(G.raft[i], 2000);
		assert_true(fd >= 0);
		assert_int_equal(send(fd, msg, n, MSG_NOSIGNAL), (ssize_t)n);
		rt_sleep_ms(200);
		close(fd);
		/* Junk, and a TLS handshake made with another secret. */
		fd = kvp_connect(G.raft[i], 2000);
		assert_true(fd >= 0);
		static const char junk[] = "GET / HTTP/1.0\r\n\r\n\x16\x03\x01garbage";
		assert_true(send(fd, junk, sizeof(junk), MSG_NOSIGNAL) > 0);
		rt_sleep_ms(100);
		close(fd);
		struct kvp_secret bad;
		assert_int_equal(kvp_secret_from_string("not-the-cluster-secret-0123", &bad), 0);
		struct kvp_sock *k = NULL;
		int rc = kvp_sock_open(G.raft[i], &bad, 2000, &k);
		kvp_sock_close(k);
		assert_int_not_equal(rc, 0);
	}
	rt_sleep_ms(1500);
	for (int i = 0; i < NREP; i++) {
		uint64_t t = term_of(pool, i);
		if (t >= t0[i] + BIGJUMP)
			fail_msg("replica %d jumped from term %llu to %llu: a forged RequestVote "
				 "went through",
				 i + 1, (unsigned long long)t0[i], (unsigned long long)t);
		assert_true(log_has(i, "refused a Raft connection"));
	}
	assert_int_equal(mkdir_any(pool, "after-forgery"), 0);

	/* The Raft port is kvfs TLS: a handshake with the cluster secret completes. */
	struct kvp_sock *k = NULL;
	assert_int_equal(kvp_sock_open(G.raft[lead], &G.sec, 2000, &k), 0);
	assert_int_equal(kvp_sock_tls(k), 1);
	kvp_sock_close(k);

	/* Silent connections from one host (127.0.0.2) hold handshake slots until their
	 * deadline: more than the transport runs at once. Another host (127.0.0.1) still gets
	 * its handshake through (the per-address cap), and writes go on. */
	lead = kvh_raft_leader(pool, &G, g_pid, -1, 15000);
	assert_true(lead >= 0);
	int flood[NFLOOD];
	for (int j = 0; j < NFLOOD; j++) {
		flood[j] = connect_from("127.0.0.2", G.raft[lead]);
		assert_true(flood[j] >= 0);
	}
	rt_sleep_ms(300); /* every one accepted: the slots are taken */
	k = NULL;
	assert_int_equal(kvp_sock_open(G.raft[lead], &G.sec, 2000, &k), 0);
	kvp_sock_close(k);
	assert_int_equal(mkdir_any(pool, "during-flood"), 0);
	for (int j = 0; j < NFLOOD; j++)
		close(flood[j]);
	assert_true(log_has(lead, "too many handshakes from this address"));

	/* The leader killed: a new one over TLS, writes go on, the old one catches up. */
	lead = kvh_raft_leader(pool, &G, g_pid, -1, 15000);
	assert_true(lead >= 0);
	kill(g_pid[lead], SIGKILL);
	waitpid(g_pid[lead], NULL, 0);
	g_pid[lead] = 0;
	int nl = kvh_raft_leader(pool, &G, g_pid, lead, 20000);
	assert_true(nl >= 0 && nl != lead);
	assert_int_equal(mkdir_any(pool, "after-kill"), 0);
	g_pid[lead] = kvh_raft_spawn(&G, lead, NULL);
	assert_true(g_pid[lead] > 0);
	uint64_t want = 0, got = 0;
	int st, sv;
	assert_int_equal(kvh_raft_status(pool, &G, nl, &st, &sv, &want), 0);
	for (int t = 0; t < 300 && got < want; t++) {
		if (kvh_raft_status(pool, &G, lead, &st, &sv, &got))
			got = 0;
		rt_sleep_ms(50);
	}
	assert_true(got >= want);
	printf("forged Raft refused, leader %d killed, replica %d leads, old leader caught up to "
	       "index %llu over TLS\n",
	       lead + 1, nl + 1, (unsigned long long)got);

	/* An orderly stop closes the transport: its threads end and libraft hears back. */
	for (int i = 0; i < NREP; i++)
		assert_int_equal(kvh_stop_pid(g_pid[i], SIGTERM, 10000), 0);
	kvp_pool_destroy(pool);
	rt_rm_dir(G.dir);
}

int main(void)
{
	int rc = rt_main_bins();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_raft_tls)};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
