/* Replicated meta against real daemons on loopback: three kvfs-meta replicas (Raft), three
 * kvfs-node, a libkvfs writer that only knows the list of meta addresses. A follower killed
 * with SIGKILL changes nothing; the leader killed during a write loop: writes resume on a new
 * leader, every acknowledged file reads back exact and no file is visible partial. Failover
 * (last acknowledged write before the kill -> first after) is printed per kill, with p50 and
 * max. A leader cut off with a speculative write pending (docs/meta.md, "Pipelined writes"):
 * a new leader wins without it, and the old one's database ends equal to the others', the
 * write gone, whether it rejoined after a pause or restarted after kill -9.
 * docs/meta.md, "Replicated metadata". */
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/wait.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <rocksdb/c.h>

#include "ret_tutil.h"

#define NREP	    3
#define NNODES	    3
#define KILLS	    4 /* leader kills; $KVFS_RAFT_KILLS (up to MAX_KILLS) for the 50 */
#define MAX_KILLS   200
#define MAX_FILES   100000
#define FAILOVER_MS 8000 /* per kill; the bar is 5 s (printed figures) */

static struct kvh_raft G; /* the replicas' addresses, directory and secret */
static char g_list[512];
static pid_t g_mpid[NREP], g_npid[NNODES];

/* The writer's record: file i acknowledged at ack_ms[i] (0: not acknowledged). */
static int64_t g_ack_ms[MAX_FILES];
static atomic_int g_nacked, g_next, g_stop, g_failures;

static void meta_start(int i)
{
	/* Snapshots every 1024 entries: log compaction, and restarts that restore one. */
	const char *extra[] = {"--gc-interval", "0.2s", "--raft-snapshot-every", "1024", NULL};
	g_mpid[i] = kvh_raft_spawn(&G, i, extra);
	assert_true(g_mpid[i] > 0);
}

static void node_start(int i)
{
	g_npid[i] = kvh_raft_node_spawn(&G, i, g_list);
	assert_true(g_npid[i] > 0);
}

/* Replica i's RSTATUS: 0 and its state (3 leader) and applied index, or an error. */
static int rstatus(struct kvp_pool *pool, int i, int *state, int *serving, uint64_t *applied)
{
	return kvh_raft_status(pool, &G, i, state, serving, applied);
}

/* The replica that serves as leader, waiting up to 15 s; -1 if none. */
static int leader(struct kvp_pool *pool)
{
	return kvh_raft_leader(pool, &G, g_mpid, -1, 15000);
}

/* Waits up to 30 s until replica i has applied at least what the leader has; 0 or
 * -ETIMEDOUT. */
static int caught_up(struct kvp_pool *pool, int i, int lead)
{
	for (int t = 0; t < 600; t++) {
		int st, sv;
		uint64_t a, b;
		if (rstatus(pool, lead, &st, &sv, &a) == 0 && rstatus(pool, i, &st, &sv, &b) == 0 &&
		    b >= a)
			return 0;
		rt_sleep_ms(50);
	}
	return -ETIMEDOUT;
}

static size_t fsize(int i)
{
	return 1000 + (size_t)(i % 7) * 20011;
}

static void *writer(void *arg)
{
	struct kvc *c = arg;
	while (!atomic_load(&g_stop)) {
		int i = atomic_load(&g_next);
		if (i >= MAX_FILES)
			break;
		char p[64];
		snprintf(p, sizeof(p), "/w/f%d", i);
		size_t n = fsize(i);
		uint8_t *b = malloc(n);
		rt_fill(b, n, 1000 + (uint64_t)i);
		int rc = kvc_put(c, p, b, n, 1);
		free(b);
		if (rc) { /* not acknowledged: written again (replace) */
			atomic_fetch_add(&g_failures, 1);
			continue;
		}
		g_ack_ms[i] = rt_now_ms();
		atomic_fetch_add(&g_nacked, 1);
		atomic_store(&g_next, i + 1);
	}
	return NULL;
}

/* Waits until `more` further acknowledgements came, up to ms; 0 or -ETIMEDOUT. */
static int wait_acks(int more, int ms)
{
	int want = atomic_load(&g_nacked) + more;
	for (int64_t end = rt_now_ms() + ms; rt_now_ms() < end; rt_sleep_ms(5))
		if (atomic_load(&g_nacked) >= want)
			return 0;
	return -ETIMEDOUT;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return (x > y) - (x < y);
}

static void test_failover(void **state)
{
	(void)state;
	srandom((unsigned)getpid() ^ (unsigned)rt_now_ms());
	assert_int_equal(kvh_raft_init(&G, "/tmp/kvfs-raft-XXXXXX", NREP), 0);
	size_t ll = 0;
	for (int i = 0; i < NREP; i++)
		ll += (size_t)snprintf(g_list + ll, sizeof(g_list) - ll, "%s%s", i ? "," : "",
				       G.meta[i]);
	for (int i = 0; i < NREP; i++)
		meta_start(i);
	for (int i = 0; i < NNODES; i++)
		node_start(i);
	struct kvp_pool *pool;
	assert_int_equal(kvp_pool_create(&G.sec, 1000, &pool), 0);
	int lead = leader(pool);
	assert_true(lead >= 0);

	struct kvc_opts o = {.meta_addr = g_list, .secret = &G.sec, .timeout_ms = 3000};
	struct kvc *c = NULL;
	assert_int_equal(kvc_open(&o, &c), 0);
	/* Nodes register through whichever replica leads: wait for all three. */
	for (int t = 0; t < 200; t++) {
		struct kvc_statfs st;
		if (kvc_statfs(c, &st) == 0 && st.nodes_up == NNODES)
			break;
		rt_sleep_ms(50);
	}
	assert_int_equal(kvc_mkdir_p(c, "/w", 0755), 0);
	pthread_t wt;
	assert_int_equal(pthread_create(&wt, NULL, writer, c), 0);
	assert_int_equal(wait_acks(20, 20000), 0);

	/* A follower killed: writes go on as before. */
	int f = (lead + 1) % NREP;
	int fails0 = atomic_load(&g_failures);
	assert_int_equal(kvh_stop_pid(g_mpid[f], SIGKILL, 5000), 0);
	g_mpid[f] = 0;
	assert_int_equal(wait_acks(30, 10000), 0);
	assert_int_equal(atomic_load(&g_failures), fails0);
	meta_start(f);
	assert_int_equal(caught_up(pool, f, lead), 0);
	printf("follower %d killed and back: %d files acknowledged, 0 failed writes meanwhile\n",
	       f + 1, atomic_load(&g_nacked));

	int kills = getenv("KVFS_RAFT_KILLS") ? atoi(getenv("KVFS_RAFT_KILLS")) : KILLS;
	if (kills < 1 || kills > MAX_KILLS)
		fail_msg("KVFS_RAFT_KILLS must be 1..%d", MAX_KILLS);
	int64_t fo[MAX_KILLS];
	for (int k = 0; k < kills; k++) {
		assert_int_equal(wait_acks(10, 20000), 0);
		int before = atomic_load(&g_next);
		assert_int_equal(kvh_stop_pid(g_mpid[lead], SIGKILL, 5000), 0);
		int64_t kill_ms = rt_now_ms();
		int dead = lead;
		g_mpid[dead] = 0;
		/* The last acknowledgement before the kill: the newest file acked before it. */
		int64_t last = 0;
		for (int i = 0; i < before; i++)
			if (g_ack_ms[i] && g_ack_ms[i] <= kill_ms && g_ack_ms[i] > last)
				last = g_ack_ms[i];
		if (wait_acks(1, 30000))
			fail_msg("kill %d: no write acknowledged 30 s after the leader died", k);
		int64_t first = INT64_MAX;
		for (int i = 0; i < MAX_FILES && i <= atomic_load(&g_next); i++)
			if (g_ack_ms[i] > kill_ms && g_ack_ms[i] < first)
				first = g_ack_ms[i];
		fo[k] = first - last;
		lead = leader(pool);
		assert_true(lead >= 0 && lead != dead);
		printf("leader kill %d: replica %d killed, replica %d leads; failover %lld ms "
		       "(last ack before the kill -> first after)\n",
		       k + 1, dead + 1, lead + 1, (long long)fo[k]);
		meta_start(dead);
		assert_int_equal(caught_up(pool, dead, lead), 0);
	}
	assert_int_equal(wait_acks(10, 20000), 0);
	atomic_store(&g_stop, 1);
	pthread_join(wt, NULL);

	int64_t s[MAX_KILLS];
	memcpy(s, fo, sizeof(fo[0]) * (size_t)kills);
	qsort(s, (size_t)kills, sizeof(s[0]), cmp_i64);
	printf("failover over %d leader kills: p50 %lld ms, max %lld ms; %d writes failed and "
	       "were retried\n",
	       kills, (long long)s[kills / 2], (long long)s[kills - 1], atomic_load(&g_failures));
	assert_true(s[kills - 1] <= FAILOVER_MS);

	/* Every acknowledged file exact; every visible file (also one whose write failed) whole. */
	int n = atomic_load(&g_next), checked = 0;
	for (int i = 0; i < n; i++) {
		char p[64];
		snprintf(p, sizeof(p), "/w/f%d", i);
		int rc = rt_check(c, p, fsize(i), 1000 + (uint64_t)i);
		if (rc)
			fail_msg("%s (acknowledged): %s", p, kvp_strerror(rc));
		checked++;
	}
	struct kvc_dirent *d = NULL;
	size_t nd = 0;
	struct kvp_attr wa;
	assert_int_equal(kvc_resolve(c, "/w", &wa), 0);
	assert_int_equal(kvc_readdir(c, wa.ino, &d, &nd), 0);
	for (size_t j = 0; j < nd; j++) {
		int i = atoi(d[j].name + 1);
		char p[KVP_NAME_MAX + 8];
		snprintf(p, sizeof(p), "/w/%s", d[j].name);
		if (rt_check(c, p, fsize(i), 1000 + (uint64_t)i))
			fail_msg("%s visible but not whole", p);
	}
	printf("%d acknowledged files exact, %zu visible files whole\n", checked, nd);
	assert_true(nd >= (size_t)checked);
	free(d);
	kvc_close(c);
	kvp_pool_destroy(pool);
	for (int i = 0; i < NNODES; i++)
		kvh_stop_pid(g_npid[i], SIGTERM, 5000);
	for (int i = 0; i < NREP; i++)
		if (g_mpid[i] > 0)
			kvh_stop_pid(g_mpid[i], SIGTERM, 5000);
	rt_rm_dir(G.dir);
}

/* Raft runs over TLS by default, so peers off loopback start as they are. With
 * KVFS_INSECURE_PLAINTEXT=1 the Raft transport is libraft's plaintext TCP: peers off loopback
 * are refused unless the operator says the network is private (--raft-insecure-network); with
 * it the replica starts. */
static void test_off_loopback_refused(void **state)
{
	(void)state;
	char bin[600], dir[300], db[400], rdir[400], log[400], sec[400], peers[128], listen[64],
	    buf[4096];
	assert_int_equal(kvh_bin("kvfs-meta", bin, sizeof(bin)), 0);
	unsetenv("KVFS_INSECURE_PLAINTEXT"); /* the default first, whatever this run was given */
	snprintf(dir, sizeof(dir), "/tmp/test_raft_offlo.%d", (int)getpid());
	snprintf(sec, sizeof(sec), "%s/secret", dir);
	assert_int_equal(
	    kvh_sh("mkdir -p %s && head -c 24 /dev/urandom | base64 > %s && chmod 600 %s", dir, sec,
		   sec),
	    0);
	snprintf(db, sizeof(db), "%s/db", dir);
	snprintf(rdir, sizeof(rdir), "%s/raft", dir);
	snprintf(log, sizeof(log), "%s/meta.log", dir);
	snprintf(peers, sizeof(peers), "1=127.0.0.1:%u,2=10.255.1.2:7000,3=10.255.1.3:7000",
		 kvh_free_port());
	snprintf(listen, sizeof(listen), "127.0.0.1:%u", kvh_free_port());
	char *argv[] = {bin,	"--db",	     db,  "--secret-file", sec,	  "--listen",
			listen, "--raft-id", "1", "--raft-peers",  peers, "--raft-dir",
			rdir,	NULL,	     NULL};
	pid_t p = kvh_spawn(bin, argv, log);
	assert_true(p > 0);
	int st = 0;
	usleep(500000);
	assert_int_equal(waitpid(p, &st, WNOHANG), 0); /* TLS: running, waiting for peers */
	kvh_stop_pid(p, SIGTERM, 5000);
	kvh_sh("rm -rf %s %s", db, rdir);
	setenv("KVFS_INSECURE_PLAINTEXT", "1", 1);
	p = kvh_spawn(bin, argv, log);
	assert_true(p > 0);
	assert_int_equal(waitpid(p, &st, 0), p);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
	FILE *f = fopen(log, "r");
	assert_non_null(f);
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	assert_non_null(strstr(buf, "--raft-insecure-network"));
	argv[13] = "--raft-insecure-network";
	p = kvh_spawn(bin, argv, log);
	assert_true(p > 0);
	usleep(500000);
	assert_int_equal(waitpid(p, &st, WNOHANG), 0); /* running: it waits for an election */
	kvh_stop_pid(p, SIGTERM, 5000);
	unsetenv("KVFS_INSECURE_PLAINTEXT");
	kvh_sh("rm -rf %s", dir);
}

/* ---- speculative writes never survive ---- */

/* MKDIR name under the root, sent to replica i only (no leader hunt). */
static int mkdir_on(struct kvp_pool *pool, int i, const char *name, int timeout_ms)
{
	struct kvp_client *cl;
	int rc = kvp_pool_get(pool, G.meta[i], &cl);
	if (rc)
		return rc;
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, KVP_ROOT_INO);
	kvp_w_cstr(&w, name);
	kvp_w_u32(&w, 0755);
	rc = kvp_call(cl, KVP_OP_MKDIR, w.p, w.len, NULL, 0, timeout_ms, NULL, NULL);
	kvp_w_free(&w);
	kvp_pool_put(pool, cl);
	return rc;
}

/* A serving leader other than replica `not`, waiting up to 20 s; -1 if none. */
static int leader_but(struct kvp_pool *pool, int not )
{
	return kvh_raft_leader(pool, &G, NULL, not, 20000);
}

/* Replica i's whole database (stopped), as "key=value" lines in key order, into a malloc'd
 * string. The root inode is left out: each replica creates it at its first start with its own
 * clock, before Raft, and only what Raft applied must agree. */
static char *db_dump(int i)
{
	char path[400], *err = NULL;
	snprintf(path, sizeof(path), "%s/meta%d", G.dir, i + 1);
	rocksdb_options_t *o = rocksdb_options_create();
	rocksdb_t *db = rocksdb_open_for_read_only(o, path, 0, &err);
	if (err)
		fail_msg("open %s: %s", path, err);
	rocksdb_readoptions_t *ro = rocksdb_readoptions_create();
	rocksdb_iterator_t *it = rocksdb_create_iterator(db, ro);
	size_t cap = 1 << 16, len = 0;
	char *out = malloc(cap);
	assert_non_null(out);
	const uint8_t root[9] = {'I', 0, 0, 0, 0, 0, 0, 0, KVP_ROOT_INO};
	for (rocksdb_iter_seek_to_first(it); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
		size_t kl, vl;
		const char *k = rocksdb_iter_key(it, &kl);
		const char *v = rocksdb_iter_value(it, &vl);
		if (kl == 9 && !memcmp(k, root, 9))
			continue;
		while (len + 2 * (kl + vl) + 4 >= cap) {
			cap *= 2;
			out = realloc(out, cap);
			assert_non_null(out);
		}
		for (size_t j = 0; j < kl; j++)
			len += (size_t)sprintf(out + len, "%02x", (uint8_t)k[j]);
		out[len++] = '=';
		for (size_t j = 0; j < vl; j++)
			len += (size_t)sprintf(out + len, "%02x", (uint8_t)v[j]);
		out[len++] = '\n';
	}
	out[len] = 0;
	rocksdb_iter_destroy(it);
	rocksdb_readoptions_destroy(ro);
	rocksdb_close(db);
	rocksdb_options_destroy(o);
	return out;
}

/* The hex of a directory entry key under the root: what db_dump shows for it. */
static void dirent_hex(const char *name, char *out)
{
	int n = sprintf(out, "%02x", 'D');
	for (int j = 0; j < 8; j++)
		n += sprintf(out + n, "%02x", j == 7 ? KVP_ROOT_INO : 0);
	for (const char *c = name; *c; c++)
		n += sprintf(out + n, "%02x", (uint8_t)*c);
	sprintf(out + n, "=");
}

/* One round: the leader's followers die (kill -9: nothing the leader sent is left in their
 * sockets), the leader takes a MKDIR it can apply only speculatively, then is cut off
 * (SIGSTOP, or kill -9 when crash), the followers come back and elect a leader that writes
 * `after`; the old leader rejoins (SIGCONT, or a restart) and catches up. Returns the old
 * leader. */
static int cut_off_round(struct kvp_pool *pool, const char *phantom, const char *after, int crash)
{
	int lead = leader(pool);
	assert_true(lead >= 0);
	int f[2], nf = 0;
	for (int i = 0; i < NREP; i++)
		if (i != lead)
			f[nf++] = i;
	for (int j = 0; j < 2; j++) {
		kvh_stop_pid(g_mpid[f[j]], SIGKILL, 5000);
		g_mpid[f[j]] = -1;
	}
	/* No majority: the write is applied on the leader only and never acknowledged. */
	int rc = mkdir_on(pool, lead, phantom, 600);
	assert_int_not_equal(rc, 0);
	if (crash) {
		kvh_stop_pid(g_mpid[lead], SIGKILL, 5000);
		g_mpid[lead] = -1;
	} else
		kill(g_mpid[lead], SIGSTOP);
	for (int j = 0; j < 2; j++)
		meta_start(f[j]);
	int nl = leader_but(pool, lead);
	assert_true(nl >= 0);
	for (int t = 0; t < 100 && (rc = mkdir_on(pool, nl, after, 3000)) != 0; t++)
		rt_sleep_ms(50);
	assert_int_equal(rc, 0);
	if (crash)
		meta_start(lead);
	else
		kill(g_mpid[lead], SIGCONT);
	nl = leader(pool);
	assert_true(nl >= 0);
	assert_int_equal(caught_up(pool, lead, nl), 0);
	return lead;
}

static void test_speculative_rollback(void **state)
{
	(void)state;
	srandom((unsigned)getpid() ^ (unsigned)rt_now_ms());
	assert_int_equal(kvh_raft_init(&G, "/tmp/kvfs-raftspec-XXXXXX", NREP), 0);
	for (int i = 0; i < NREP; i++)
		meta_start(i);
	struct kvp_pool *pool;
	assert_int_equal(kvp_pool_create(&G.sec, 1000, &pool), 0);
	int lead = leader(pool);
	assert_true(lead >= 0);
	assert_int_equal(mkdir_on(pool, lead, "before", 5000), 0);

	int a = cut_off_round(pool, "phantom1", "after1", 0);
	int b = cut_off_round(pool, "phantom2", "after2", 1);
	printf("paused leader: replica %d; killed leader: replica %d\n", a + 1, b + 1);
	lead = leader(pool);
	assert_true(lead >= 0);
	for (int i = 0; i < NREP; i++)
		assert_int_equal(caught_up(pool, i, lead), 0);
	kvp_pool_destroy(pool);
	for (int i = 0; i < NREP; i++)
		kvh_stop_pid(g_mpid[i], SIGTERM, 5000);

	char *d[NREP], want[128];
	for (int i = 0; i < NREP; i++) {
		d[i] = db_dump(i);
		const char *names[] = {"before", "after1", "after2"};
		for (int j = 0; j < 3; j++) {
			dirent_hex(names[j], want);
			if (!strstr(d[i], want))
				fail_msg("replica %d lacks /%s", i + 1, names[j]);
		}
		const char *ghosts[] = {"phantom1", "phantom2"};
		for (int j = 0; j < 2; j++) {
			dirent_hex(ghosts[j], want);
			if (strstr(d[i], want))
				fail_msg("replica %d kept the speculative /%s", i + 1, ghosts[j]);
		}
		if (strstr(d[i], "\nff55") || !strncmp(d[i], "ff55", 4))
			fail_msg("replica %d kept undo records", i + 1);
	}
	for (int i = 1; i < NREP; i++)
		if (strcmp(d[0], d[i]))
			fail_msg("replica %d's database differs from replica 1's", i + 1);
	for (int i = 0; i < NREP; i++)
		free(d[i]);
	rt_rm_dir(G.dir);
}

int main(void)
{
	int rc = rt_main_bins();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_failover),
					   cmocka_unit_test(test_speculative_rollback),
					   cmocka_unit_test(test_off_loopback_refused)};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
