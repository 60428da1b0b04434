/* Redirects of a replicated meta against real daemons on loopback (docs/meta.md,
 * "Redirects"): three kvfs-meta replicas (Raft) and three kvfs-node given only one follower's
 * address; libkvfs and the kvfs CLI given only that follower's address create and read files.
 * Then the leader is killed: a client given only one surviving follower's address works again
 * once a new leader serves. Without redirects a follower only ever says -EREMCHG, so a client
 * (or node) that knows one follower never reaches the leader. */
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "ret_tutil.h"

#define NREP   3
#define NNODES 3

static struct kvh_raft G; /* the replicas' addresses, directory and secret */
static pid_t g_mpid[NREP], g_npid[NNODES];
static const char *g_advertise; /* --advertise for every replica, or NULL */

static void meta_start(int i)
{
	const char *extra[] = {
	    "--gc-interval", "0.2s", "--node-timeout", "2s", g_advertise ? "--advertise" : NULL,
	    g_advertise,     NULL};
	g_mpid[i] = kvh_raft_spawn(&G, i, extra);
	assert_true(g_mpid[i] > 0);
}

static void node_start(int i, const char *meta)
{
	g_npid[i] = kvh_raft_node_spawn(&G, i, meta);
	assert_true(g_npid[i] > 0);
}

/* The replica that serves as leader, waiting up to 15 s; -1 if none. */
static int leader(struct kvp_pool *pool)
{
	return kvh_raft_leader(pool, &G, g_mpid, -1, 15000);
}

/* A client given only addr: opens (STATFS), writes path and reads it back exact. The first
 * request may meet an election, so kvc_open is tried for up to 15 s. */
static void put_and_check(const char *addr, const char *path, uint64_t seed)
{
	struct kvc_opts o = {.meta_addr = addr, .secret = &G.sec, .timeout_ms = 3000};
	struct kvc *c = NULL;
	int rc = -1;
	for (int t = 0; t < 30 && rc; t++)
		if ((rc = kvc_open(&o, &c)))
			rt_sleep_ms(500);
	if (rc)
		fail_msg("a client given only %s cannot open: %s", addr, kvp_strerror(rc));
	size_t n = 70001;
	uint8_t *b = malloc(n);
	rt_fill(b, n, seed);
	rc = kvc_put(c, path, b, n, 1);
	free(b);
	if (rc)
		fail_msg("a client given only %s cannot write %s: %s", addr, path,
			 kvp_strerror(rc));
	assert_int_equal(rt_check(c, path, n, seed), 0);
	kvc_close(c);
}

/* A fresh directory, secret and addresses; the replicas started. */
static void group_start(void)
{
	srandom((unsigned)getpid() ^ (unsigned)rt_now_ms());
	assert_int_equal(kvh_raft_init(&G, "/tmp/kvfs-redirect-XXXXXX", NREP), 0);
	for (int i = 0; i < NREP; i++)
		meta_start(i);
}

static void group_stop(void)
{
	for (int i = 0; i < NREP; i++)
		if (g_mpid[i] > 0)
			kvh_stop_pid(g_mpid[i], SIGTERM, 5000);
	memset(g_mpid, 0, sizeof(g_mpid));
	rt_rm_dir(G.dir);
}

static void test_follower_redirects(void **state)
{
	(void)state;
	g_advertise = NULL;
	group_start();
	struct kvp_pool *pool;
	assert_int_equal(kvp_pool_create(&G.sec, 1000, &pool), 0);
	int lead = leader(pool);
	assert_true(lead >= 0);
	int f = (lead + 1) % NREP;
	/* Nodes know only the follower too: their heartbeats must reach the leader. */
	for (int i = 0; i < NNODES; i++)
		node_start(i, G.meta[f]);

	struct kvc_opts o = {.meta_addr = G.meta[f], .secret = &G.sec, .timeout_ms = 3000};
	struct kvc *c = NULL;
	int rc = kvc_open(&o, &c);
	if (rc)
		fail_msg("a client given only follower %s cannot open: %s", G.meta[f],
			 kvp_strerror(rc));
	struct kvc_statfs st = {0};
	for (int t = 0; t < 200; t++) {
		if (kvc_statfs(c, &st) == 0 && st.nodes_up == NNODES)
			break;
		rt_sleep_ms(50);
	}
	assert_int_equal(st.nodes_up, NNODES);
	kvc_close(c);
	put_and_check(G.meta[f], "/before", 11);
	printf("replica %d leads; a client and %d nodes given only follower %d's address "
	       "work\n",
	       lead + 1, NNODES, f + 1);

	/* The CLI with one follower address. */
	char cli[600];
	assert_int_equal(kvh_bin("kvfs", cli, sizeof(cli)), 0);
	assert_int_equal(kvh_sh("head -c 50000 /dev/urandom > %s/in && %s --meta %s --secret-file "
				"%s put %s/in /cli && %s --meta %s --secret-file %s get /cli "
				"%s/out && cmp %s/in %s/out",
				G.dir, cli, G.meta[f], G.secret, G.dir, cli, G.meta[f], G.secret,
				G.dir, G.dir, G.dir),
			 0);

	/* The leader killed: a client given one surviving follower's address, once a new leader
	 * serves (it may be that follower's own leader or the follower itself was elected). */
	assert_int_equal(kvh_stop_pid(g_mpid[lead], SIGKILL, 5000), 0);
	g_mpid[lead] = 0;
	int lead2 = leader(pool);
	assert_true(lead2 >= 0 && lead2 != lead);
	int f2 = -1;
	for (int i = 0; i < NREP; i++)
		if (i != lead && i != lead2)
			f2 = i;
	put_and_check(G.meta[f2], "/after", 22);
	put_and_check(G.meta[f], "/after2", 33);
	/* What was written before the kill is still there, read through the follower. */
	o.meta_addr = G.meta[f2];
	assert_int_equal(kvc_open(&o, &c), 0);
	assert_int_equal(rt_check(c, "/before", 70001, 11), 0);
	kvc_close(c);
	printf("leader %d killed, replica %d leads: a client given only follower %d's address "
	       "works\n",
	       lead + 1, lead2 + 1, f2 + 1);

	kvp_pool_destroy(pool);
	for (int i = 0; i < NNODES; i++)
		kvh_stop_pid(g_npid[i], SIGTERM, 5000);
	group_stop();
}

/* --advertise names the address followers hand out; here one no client reaches (127.0.0.2:
 * nothing listens there). A client with every replica, followers first, must still reach the
 * leader: after the named address fails it goes on past the follower that named it, instead
 * of back to it (which would pass the request between those two until it gave up). */
static void test_unreachable_name(void **state)
{
	(void)state;
	g_advertise = "127.0.0.2";
	group_start();
	struct kvp_pool *pool;
	assert_int_equal(kvp_pool_create(&G.sec, 1000, &pool), 0);
	int lead = leader(pool);
	assert_true(lead >= 0);
	int f = (lead + 1) % NREP, g = (lead + 2) % NREP;
	/* The follower's -EREMCHG names 127.0.0.2 and the leader's port once the leader's
	 * record is applied there. */
	char want[64], got[KVP_ADDR_MAX] = "";
	snprintf(want, sizeof(want), "127.0.0.2%s", strchr(G.meta[lead], ':'));
	for (int t = 0; t < 100 && strcmp(got, want); t++) {
		struct kvp_client *cl;
		uint8_t *b = NULL;
		uint32_t len = 0;
		if (kvp_pool_get(pool, G.meta[f], &cl) == 0) {
			if (kvp_call_detail(cl, KVP_OP_STATFS, NULL, 0, NULL, 0, 1000, &b, &len) ==
			    -EREMCHG)
				kvp_redirect_parse(b, len, got);
			kvp_pool_put(pool, cl);
		}
		free(b);
		if (strcmp(got, want))
			rt_sleep_ms(50);
	}
	assert_string_equal(got, want);
	char list[256];
	snprintf(list, sizeof(list), "%s,%s,%s", G.meta[f], G.meta[g], G.meta[lead]);
	struct kvc_opts o = {.meta_addr = list, .secret = &G.sec, .timeout_ms = 3000};
	struct kvc *c = NULL;
	int rc = kvc_open(&o, &c);
	if (rc)
		fail_msg("followers name an unreachable leader address: a client with %s cannot "
			 "open: %s",
			 list, kvp_strerror(rc));
	assert_int_equal(kvc_mkdir_p(c, "/d", 0755), 0);
	kvc_close(c);
	kvp_pool_destroy(pool);
	group_stop();
}

int main(void)
{
	int rc = rt_main_bins();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_follower_redirects),
					   cmocka_unit_test(test_unreachable_name)};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
