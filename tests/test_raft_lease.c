/* A new Raft leader holds namespace changes until its predecessor's directory leases have run
 * out (docs/meta.md, "Directory leases", "Connections and leaders"). Three kvfs-meta replicas
 * (election timeout 0.3 s); client A holds a lease on a directory from the leader, which is
 * then stopped (SIGSTOP: cut off, A's watch connection stays open, so A goes on trusting the
 * lease until its end). Once a new leader serves, client B removes a name there through it:
 * the removal must not be acknowledged before A's lease has ended (A would answer the name
 * from it meanwhile), and A, once the old leader is gone, sees the name removed. Without the
 * hold the removal is acknowledged ~0.6 s after the stop, while A's lease has ~0.4 s left;
 * a round whose election took longer than the lease tells nothing, and another is run. */
#include <signal.h>
#include <time.h>

#include "ret_tutil.h"

#define NREP  3
#define NSUBS 40

static struct kvh_raft G;
static pid_t g_mpid[NREP];

static int64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static struct kvc *open_on(const char *addrs)
{
	struct kvc_opts o = {.meta_addr = addrs, .secret = &G.sec, .timeout_ms = 3000};
	struct kvc *c = NULL;
	assert_int_equal(kvc_open(&o, &c), 0);
	return c;
}

static void test_new_leader_holds(void **state)
{
	(void)state;
	char list[512];
	assert_int_equal(kvh_raft_init(&G, "/tmp/kvfs-raftlease-XXXXXX", NREP), 0);
	size_t ll = 0;
	for (int i = 0; i < NREP; i++)
		ll +=
		    (size_t)snprintf(list + ll, sizeof(list) - ll, "%s%s", i ? "," : "", G.meta[i]);
	const char *extra[] = {"--raft-election-timeout", "0.3s", NULL};
	for (int i = 0; i < NREP; i++) {
		g_mpid[i] = kvh_raft_spawn(&G, i, extra);
		assert_true(g_mpid[i] > 0);
	}
	struct kvp_pool *pool;
	assert_int_equal(kvp_pool_create(&G.sec, 1000, &pool), 0);
	int lead = kvh_raft_leader(pool, &G, g_mpid, -1, 15000);
	assert_true(lead >= 0);

	struct kvc *b = open_on(list), *a = open_on(list);
	struct kvp_attr d, x;
	assert_int_equal(kvc_mkdir(b, KVP_ROOT_INO, "d", 0755, &d), 0);
	char name[16];
	for (int i = 0; i < NSUBS; i++) {
		snprintf(name, sizeof(name), "s%02d", i);
		assert_int_equal(kvc_mkdir(b, d.ino, name, 0755, &x), 0);
	}
	struct kvc_lease *l;
	struct kvc_lease_opts lo = {.after = 2, .ms = 1000};
	assert_int_equal(kvc_lease_open(a, &lo, &l), 0);
	/* A round tells only when the new leader serves before A's lease ends (a loaded machine
	 * may take longer to elect one): up to 4 rounds, one name each, until one does. */
	int conclusive = 0;
	for (int round = 0; round < 4 && !conclusive; round++) {
		char victim[16];
		snprintf(victim, sizeof(victim), "s%02d", 30 + round);
		lead = kvh_raft_leader(pool, &G, g_mpid, -1, 15000);
		assert_true(lead >= 0);
		/* A looks names up as the mount does until its lease answers for the victim. */
		int64_t left = -1, held_at = 0;
		for (int i = 0; i < 400 && left < 0; i++) {
			snprintf(name, sizeof(name), "s%02d", i % 20);
			if (kvc_lookup(a, d.ino, name, &x) != 0) { /* A's meta moving */
				rt_sleep_ms(50);
				continue;
			}
			kvc_lease_note(l, d.ino);
			if (kvc_lease_lookup(l, d.ino, victim, &x, &left) != 0)
				left = -1, rt_sleep_ms(10);
			held_at = mono_ns(); /* after: held_at + left is past A's own end */
		}
		assert_true(left > 0);
		int64_t a_end = held_at + left; /* A answers from its lease until then */
		assert_int_equal(kill(g_mpid[lead], SIGSTOP), 0);
		int64_t stop = mono_ns();
		int nl = kvh_raft_leader(pool, &G, g_mpid, lead, 20000);
		assert_true(nl >= 0);
		struct kvc *b2 = open_on(G.meta[nl]);
		int64_t t0 = mono_ns();
		int rc = kvc_rmdir(b2, d.ino, victim);
		int64_t done = mono_ns();
		/* Is A still answering from its lease now that the removal is acknowledged? */
		int stale = kvc_lease_lookup(l, d.ino, victim, &x, &left) == 0;
		conclusive = t0 < a_end;
		printf("round %d, after the stop: A's lease ends at %lld ms, the new leader serves "
		       "(rmdir sent) at %lld ms, rmdir acknowledged at %lld ms; A still answering "
		       "from its lease: %s%s\n",
		       round, (long long)((a_end - stop) / 1000000),
		       (long long)((t0 - stop) / 1000000), (long long)((done - stop) / 1000000),
		       stale ? "yes" : "no", conclusive ? "" : " (elected too late to tell)");
		kvc_close(b2);
		assert_int_equal(rc, 0);
		assert_false(stale);
		assert_true(done >= a_end);

		/* The old leader gone (restarted as a follower): A's watch moves, and its
		 * lookups reach the new leader and see the removal. */
		assert_int_equal(kvh_stop_pid(g_mpid[lead], SIGKILL, 5000), 0);
		g_mpid[lead] = kvh_raft_spawn(&G, lead, extra);
		assert_true(g_mpid[lead] > 0);
		rc = -EAGAIN;
		for (int i = 0; i < 100 && rc != -ENOENT; i++) {
			rc = kvc_lease_lookup(l, d.ino, victim, &x, &left);
			if (rc == -EAGAIN)
				rc = kvc_lookup(a, d.ino, victim, &x);
			if (rc != -ENOENT)
				rt_sleep_ms(100);
		}
		assert_int_equal(rc, -ENOENT);
	}
	assert_true(conclusive);

	kvc_lease_close(l);
	kvc_close(a);
	kvc_close(b);
	kvp_pool_destroy(pool);
	for (int i = 0; i < NREP; i++)
		if (g_mpid[i] > 0)
			kvh_stop_pid(g_mpid[i], SIGTERM, 5000);
	rt_rm_dir(G.dir);
}

int main(void)
{
	int rc = rt_main_bins();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_new_leader_holds)};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
