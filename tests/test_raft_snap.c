/* Raft log compaction by bytes against real daemons on loopback (docs/meta.md, "Snapshots and log
 * compaction"): three kvfs-meta replicas with --raft-snapshot-bytes 256K and the entry trigger
 * far away (--raft-snapshot-every 100000) take BFILL batches of ~100-200 KB each. Every
 * replica must have taken snapshots by bytes (RSTATUS: snapshots taken, last snapshot's
 * index) and hold fewer entries in memory than its log has, with at most the byte threshold
 * plus one entry applied since its last snapshot. libraft triggers snapshots by entry count
 * only, so without the byte trigger no replica snapshots here and each holds its whole log.
 * Then `kvfs meta status` given one follower's address alone shows all three replicas, and the
 * replica started with --raft-snapshot-compress=false stored its snapshots as they are while
 * the others stored LZ4 frames (libraft's default). And replicated writes skip RocksDB's WAL
 * (docs/meta.md, "Replicated metadata": a start rebuilds the database from the Raft log): each
 * replica's WAL holds far less than the ~2.5 MB of batches it applied. */
#include <dirent.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "ret_tutil.h"

#define NREP	 3
#define BATCHES	 16
#define PER	 512
#define SNAP_MAX (256 * 1024)

static struct kvh_raft G;
static pid_t g_mpid[NREP];

static void heartbeat_fake_nodes(struct kvp_client *c)
{
	for (int i = 0; i < 3; i++) {
		struct kvp_wbuf w;
		kvp_w_init(&w);
		kvp_w_u64(&w, 100 + (uint64_t)i);
		kvp_w_cstr(&w, "127.0.0.1:1"); /* holds nothing: BFILL writes metadata only */
		kvp_w_u64(&w, 1ull << 40);
		kvp_w_u64(&w, 0);
		kvp_w_u64(&w, 0);
		assert_int_equal(
		    kvp_call(c, KVP_OP_HEARTBEAT, w.p, w.len, NULL, 0, 5000, NULL, NULL), 0);
		kvp_w_free(&w);
	}
}

static void bfill(struct kvp_client *c, int batch)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u8(&w, 2);
	kvp_w_u8(&w, 1);
	kvp_w_u32(&w, 4096);
	kvp_w_u64(&w, 8192);
	kvp_w_u32(&w, PER);
	for (int i = 0; i < PER; i++) {
		char name[96];
		snprintf(name, sizeof(name), "%08x%056d.kvb",
			 (unsigned)(batch * PER + i) * 2654435761u, batch * PER + i);
		kvp_w_u64(&w, KVP_ROOT_INO);
		kvp_w_cstr(&w, name);
	}
	uint8_t *b = NULL;
	uint32_t l = 0;
	assert_int_equal(w.err, 0);
	int rc = kvp_call(c, KVP_OP_BFILL, w.p, w.len, NULL, 0, 30000, &b, &l);
	kvp_w_free(&w);
	free(b);
	if (rc)
		fail_msg("BFILL batch %d: %s", batch, kvp_strerror(rc));
}

/* Bytes of replica i's RocksDB write-ahead log (the *.log files of its database). */
static long long wal_bytes(int i)
{
	char d[600];
	snprintf(d, sizeof(d), "%s/meta%d", G.dir, i + 1);
	DIR *dir = opendir(d);
	if (!dir)
		return -1;
	long long t = 0;
	struct dirent *de;
	while ((de = readdir(dir))) {
		size_t l = strlen(de->d_name);
		char f[900];
		struct stat st;
		snprintf(f, sizeof(f), "%s/%s", d, de->d_name);
		if (l > 4 && !strcmp(de->d_name + l - 4, ".log") && stat(f, &st) == 0)
			t += st.st_size;
	}
	closedir(dir);
	return t;
}

/* How many of replica i's snapshot data files (libraft's snapshot-TERM-INDEX-TIME, beside
 * its .meta) begin with the 4 or 8 bytes magic: KVMSNAP1 stored as it is, or an LZ4 frame. */
static int snap_files(int i, const char *magic)
{
	char d[600];
	snprintf(d, sizeof(d), "%s/raft%d", G.dir, i + 1);
	DIR *dir = opendir(d);
	if (!dir)
		return -1;
	size_t ml = strlen(magic);
	int n = 0;
	struct dirent *de;
	while ((de = readdir(dir))) {
		size_t l = strlen(de->d_name);
		if (strncmp(de->d_name, "snapshot-", 9) ||
		    (l > 5 && !strcmp(de->d_name + l - 5, ".meta")))
			continue;
		char f[900], head[8];
		snprintf(f, sizeof(f), "%s/%s", d, de->d_name);
		FILE *fp = fopen(f, "rb");
		if (fp && fread(head, 1, ml, fp) == ml && !memcmp(head, magic, ml))
			n++;
		if (fp)
			fclose(fp);
	}
	closedir(dir);
	return n;
}

static void test_snapshot_by_bytes(void **state)
{
	(void)state;
	assert_int_equal(kvh_raft_init(&G, "/tmp/kvfs-raftsnap-XXXXXX", NREP), 0);
	/* The last replica stores its snapshots as they are, the others LZ4-compressed. */
	const char *extra[] = {"--bench-fill",
			       "--raft-snapshot-bytes",
			       "256K",
			       "--raft-snapshot-every",
			       "100000",
			       NULL,
			       NULL};
	for (int i = 0; i < NREP; i++) {
		extra[5] = i == NREP - 1 ? "--raft-snapshot-compress=false" : NULL;
		g_mpid[i] = kvh_raft_spawn(&G, i, extra);
		assert_true(g_mpid[i] > 0);
	}
	struct kvp_pool *pool;
	assert_int_equal(kvp_pool_create(&G.sec, 1000, &pool), 0);
	int lead = kvh_raft_leader(pool, &G, NULL, -1, 15000);
	assert_true(lead >= 0);
	struct kvp_client *c;
	assert_int_equal(kvp_client_open(G.meta[lead], &G.sec, 5000, &c), 0);
	heartbeat_fake_nodes(c);
	for (int b = 0; b < BATCHES; b++)
		bfill(c, b);
	kvp_client_close(c);

	/* Every replica applies what the leader has, then reports. */
	struct kvp_rstatus ls, s[NREP];
	assert_int_equal(kvh_raft_rstatus(pool, &G, lead, &ls), 0);
	for (int i = 0; i < NREP; i++) {
		int t = 0;
		while (t++ < 600 &&
		       (kvh_raft_rstatus(pool, &G, i, &s[i]) || s[i].applied < ls.last))
			rt_sleep_ms(50);
		assert_true(s[i].applied >= ls.last);
	}
	for (int i = 0; i < NREP; i++) {
		printf(
		    "replica %d: last %llu, snapshots %llu (last at %llu, %llu bytes), %llu bytes "
		    "since, %llu entries in memory\n",
		    i + 1, (unsigned long long)s[i].last, (unsigned long long)s[i].snapshots,
		    (unsigned long long)s[i].snap_index, (unsigned long long)s[i].snap_size,
		    (unsigned long long)s[i].log_bytes, (unsigned long long)s[i].log_mem);
		if (!s[i].has_snap_size)
			fail_msg("replica %d: RSTATUS carries no snapshot fields", i + 1);
		/* The entry trigger could not have fired. */
		assert_true(s[i].last < 100000);
		if (s[i].snapshots < 2 || s[i].snap_index == 0)
			fail_msg("replica %d took %llu snapshots after ~%d KiB of entries", i + 1,
				 (unsigned long long)s[i].snapshots, BATCHES * 100);
		/* Each snapshot waits for as many log bytes as the last one held (the database
		 * grows by about what is logged), so from 256 KiB to ~2.4 MiB they are at least
		 * doubling apart: about log2(10) + 2. A fixed 256 KiB threshold takes 7-8. */
		if (s[i].snapshots > 5)
			fail_msg("replica %d took %llu snapshots: not spaced by their size", i + 1,
				 (unsigned long long)s[i].snapshots);
		/* At most the threshold (the last snapshot's size where that is larger) plus the
		 * entry that crossed it (a batch, < 1 MiB). */
		uint64_t lim = s[i].snap_size > SNAP_MAX ? s[i].snap_size : SNAP_MAX;
		if (s[i].log_bytes >= lim + (1u << 20))
			fail_msg("replica %d: %llu bytes since its last snapshot of %llu", i + 1,
				 (unsigned long long)s[i].log_bytes,
				 (unsigned long long)s[i].snap_size);
		assert_true(s[i].snap_size > 0);
		/* Entries before the snapshot's trailing ones are gone from memory. */
		if (s[i].log_mem >= s[i].last)
			fail_msg("replica %d holds %llu entries of %llu in memory", i + 1,
				 (unsigned long long)s[i].log_mem, (unsigned long long)s[i].last);
	}

	/* The batches (~160 KB each, every replica applied all of them) are not in any WAL:
	 * what is there is meta's own first writes, before Raft started. */
	for (int i = 0; i < NREP; i++) {
		long long w = wal_bytes(i);
		printf("replica %d: RocksDB WAL %lld bytes\n", i + 1, w);
		if (w < 0 || w > 256 * 1024)
			fail_msg("replica %d: RocksDB WAL of %lld bytes after %d batches", i + 1, w,
				 BATCHES);
	}

	/* `kvfs meta status` given one follower alone shows every replica of the group. */
	int fol = (lead + 1) % NREP;
	char bin[600];
	assert_int_equal(kvh_bin("kvfs", bin, sizeof(bin)), 0);
	char out[600];
	snprintf(out, sizeof(out), "%s/status.txt", G.dir);
	assert_int_equal(kvh_sh("%s --meta %s --secret-file %s meta status > %s", bin, G.meta[fol],
				G.secret, out),
			 0);
	FILE *f = fopen(out, "r");
	assert_non_null(f);
	char line[512];
	int seen[NREP + 1] = {0}, leaders = 0;
	while (fgets(line, sizeof(line), f)) {
		fputs(line, stdout);
		char addr[128], st[32];
		unsigned id;
		if (sscanf(line, "%127s %u %31s", addr, &id, st) == 3 && id >= 1 && id <= NREP) {
			seen[id]++;
			leaders += !strcmp(st, "leader");
		}
	}
	fclose(f);
	for (int i = 1; i <= NREP; i++)
		if (seen[i] != 1)
			fail_msg("meta status through replica %d alone: replica %d shown %d times",
				 fol + 1, i, seen[i]);
	assert_int_equal(leaders, 1);

	kvp_pool_destroy(pool);
	for (int i = 0; i < NREP; i++)
		kvh_stop_pid(g_mpid[i], SIGTERM, 5000);
	for (int i = 0; i < NREP; i++) {
		int raw = snap_files(i, "KVMSNAP1"), lz4 = snap_files(i, "\x04\x22\x4d\x18");
		printf("replica %d: %d snapshot files as they are, %d LZ4 frames\n", i + 1, raw,
		       lz4);
		if (i == NREP - 1 ? raw < 1 || lz4 : lz4 < 1 || raw)
			fail_msg("replica %d: %d snapshots stored as they are, %d compressed",
				 i + 1, raw, lz4);
	}
	rt_rm_dir(G.dir);
}

int main(void)
{
	int rc = rt_main_bins();
	if (rc)
		return rc;
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_snapshot_by_bytes)};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
