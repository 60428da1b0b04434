/* kvfs compact (MAINT COMPACT, docs/meta.md "Compaction after a bulk load") against a real
 * kvfs-meta: directories made over three runs of meta leave level-0 table files (at each
 * start RocksDB flushes the log it recovers into one, below its trigger of 4 for a
 * compaction), which MSTATUS counts; a full compaction, started by MAINT and then by the
 * CLI, leaves no level-0 file, counts its runs, and every directory still resolves. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

#include <cmocka.h>

#include "ret_tutil.h"

#define ROUNDS 3
#define PER    200

/* Table files (*.sst) in meta's database directory. */
static int sst_files(const struct kvh_cluster *cl)
{
	DIR *d = opendir(cl->meta_db);
	assert_non_null(d);
	int n = 0;
	for (struct dirent *e; (e = readdir(d));) {
		size_t l = strlen(e->d_name);
		n += l > 4 && !strcmp(e->d_name + l - 4, ".sst");
	}
	closedir(d);
	return n;
}

static struct kvc *open_client(struct kvh_cluster *cl)
{
	struct kvc_opts o = {.meta_addr = cl->meta_addr, .secret = &cl->secret};
	struct kvc *c = NULL;
	assert_int_equal(kvc_open(&o, &c), 0);
	return c;
}

/* Waits up to 60 s until meta counts `want` finished compactions; returns MSTATUS then. */
static struct rt_status wait_compacts(struct kvc *c, uint64_t want)
{
	struct rt_status s = {0};
	for (int t = 0; t < 600; t++) {
		assert_int_equal(rt_mstatus(c, &s), 0);
		if (s.st[KVP_MST_DB_COMPACTS] >= want)
			return s;
		rt_sleep_ms(100);
	}
	fail_msg("compaction %llu not finished in 60 s", (unsigned long long)want);
	return s;
}

static void test_compact(void **state)
{
	(void)state;
	struct kvh_cluster cl;
	assert_int_equal(kvh_cluster_start(&cl, 0, NULL, NULL), 0);
	struct kvc *c = NULL;
	for (int r = 0; r < ROUNDS; r++) {
		c = open_client(&cl);
		for (int i = 0; i < PER; i++) {
			char name[32];
			snprintf(name, sizeof(name), "r%d-%d", r, i);
			assert_int_equal(kvc_mkdir(c, KVP_ROOT_INO, name, 0755, NULL), 0);
		}
		kvc_close(c);
		assert_int_equal(kvh_meta_kill(&cl, SIGTERM), 0);
		assert_int_equal(kvh_meta_restart(&cl), 0);
	}
	c = open_client(&cl);
	struct rt_status s = {0};
	assert_int_equal(rt_mstatus(c, &s), 0);
	printf("before: %llu level-0 files, %d table files, %llu compactions\n",
	       (unsigned long long)s.st[KVP_MST_DB_L0_FILES], sst_files(&cl),
	       (unsigned long long)s.st[KVP_MST_DB_COMPACTS]);
	assert_true(s.st[KVP_MST_DB_L0_FILES] >= 2);
	assert_int_equal(s.st[KVP_MST_DB_COMPACTS], 0);

	assert_int_equal(rt_maint(c, KVP_MAINT_COMPACT, 0), 0);
	s = wait_compacts(c, 1);
	printf("after: %llu level-0 files, %d table files\n",
	       (unsigned long long)s.st[KVP_MST_DB_L0_FILES], sst_files(&cl));
	assert_int_equal(s.st[KVP_MST_DB_L0_FILES], 0);
	assert_true(sst_files(&cl) >= 1);
	for (int r = 0; r < ROUNDS; r++)
		for (int i = 0; i < PER; i += 37) {
			char name[32];
			struct kvp_attr a;
			snprintf(name, sizeof(name), "r%d-%d", r, i);
			assert_int_equal(kvc_lookup(c, KVP_ROOT_INO, name, &a), 0);
		}

	/* The CLI: starts one and waits for it. */
	char bin[600];
	assert_int_equal(kvh_bin("kvfs", bin, sizeof(bin)), 0);
	assert_int_equal(kvh_sh("%s --meta %s --secret-file %s compact | grep -q '^compact: done'",
				bin, cl.meta_addr, cl.secret_file),
			 0);
	s = wait_compacts(c, 2);
	assert_int_equal(s.st[KVP_MST_DB_COMPACTS], 2);
	kvc_close(c);
	kvh_cluster_stop(&cl);
}

int main(void)
{
	int rc = rt_main_bins();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_compact)};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
