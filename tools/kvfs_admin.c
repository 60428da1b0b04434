/* The maintenance commands of `kvfs`: start a job on meta's repair worker and draw its
 * progress (done/total, rate, ETA) until it ends; one-shot passes print what they did. */
#include "kvfs_admin.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct status {
	uint8_t kind, running;
	uint32_t node;
	uint64_t total, done, failed, bytes;
	int64_t elapsed_ns;
	uint64_t st[KVP_MST_COUNT];
};

static int fail(const char *what, int rc)
{
	fprintf(stderr, "kvfs: %s: %s\n", what, kvp_strerror(rc));
	return 1;
}

static int get_status(struct kvc *c, struct status *s)
{
	uint8_t *rb = NULL;
	uint32_t rl = 0;
	int rc = kvc_admin(c, KVP_OP_MSTATUS, NULL, 0, &rb, &rl);
	if (rc)
		return rc;
	struct kvp_rbuf r;
	kvp_r_init(&r, rb, rl);
	memset(s, 0, sizeof(*s));
	s->kind = kvp_r_u8(&r);
	s->running = kvp_r_u8(&r);
	s->node = kvp_r_u32(&r);
	s->total = kvp_r_u64(&r);
	s->done = kvp_r_u64(&r);
	s->failed = kvp_r_u64(&r);
	s->bytes = kvp_r_u64(&r);
	s->elapsed_ns = kvp_r_i64(&r);
	uint32_t n = kvp_r_u32(&r);
	for (uint32_t i = 0; i < n && !r.err; i++) {
		uint64_t v = kvp_r_u64(&r);
		if (i < KVP_MST_COUNT)
			s->st[i] = v;
	}
	rc = kvp_r_end(&r) ? -EPROTO : 0;
	free(rb);
	return rc;
}

static int maint(struct kvc *c, uint8_t action, uint32_t node)
{
	uint8_t b[5] = {action, (uint8_t)node, (uint8_t)(node >> 8), (uint8_t)(node >> 16),
			(uint8_t)(node >> 24)};
	return kvc_admin(c, KVP_OP_MAINT, b, sizeof(b), NULL, NULL);
}

/* A node id meta does not know (-ENOENT from MAINT): say which. */
static int no_node(const char *what, uint32_t node)
{
	fprintf(stderr, "kvfs: %s: node %u: no such node (kvfs status lists them)\n", what, node);
	return 1;
}

/* The progress line, redrawn in place with \r: only ever written to a terminal. done counts
 * the chunks that succeeded; the bar advances over failed ones too. */
static void bar(const struct status *s, int final)
{
	double secs = (double)s->elapsed_ns / 1e9;
	double mib = (double)s->bytes / 1048576.0, rate = secs > 0 ? mib / secs : 0;
	uint64_t seen = s->done + s->failed;
	double frac = s->total ? (double)seen / (double)s->total : 1;
	if (frac > 1)
		frac = 1;
	char b[31];
	int fill = (int)(frac * 30);
	for (int i = 0; i < 30; i++)
		b[i] = i < fill ? '#' : '.';
	b[30] = 0;
	double eta = seen && seen < s->total ? secs / (double)seen * (double)(s->total - seen) : 0;
	char failed[40] = "";
	if (s->failed)
		snprintf(failed, sizeof(failed), ", %" PRIu64 " failed", s->failed);
	fprintf(stderr, "\r[%s] %" PRIu64 "/%" PRIu64 " chunks%s %3.0f%%  %.1f MiB/s  ETA %.0fs%s",
		b, s->done, s->total, failed, frac * 100, rate, eta, final ? "\n" : "  ");
	fflush(stderr);
}

static int same_job(const struct status *a, const struct status *b)
{
	return a->kind == b->kind && a->running == b->running && a->node == b->node &&
	       a->total == b->total && a->done == b->done && a->failed == b->failed &&
	       a->bytes == b->bytes && a->elapsed_ns == b->elapsed_ns;
}

/* Starts a job and follows it to its end. */
static int job(struct kvc *c, uint8_t action, uint32_t node, const char *what)
{
	struct status before, s;
	int rc = get_status(c, &before);
	if (!rc)
		rc = maint(c, action, node);
	if (rc == -EBUSY)
		return fail("another repair, drain or scrub is running (kvfs jobs)", rc);
	if (rc == -ENOENT && node)
		return no_node(what, node);
	if (rc)
		return fail(what, rc);
	int tty = isatty(2), drawn = 0;
	do {
		struct timespec t = {0, 200000000};
		nanosleep(&t, NULL);
		if ((rc = get_status(c, &s)))
			return fail(what, rc);
		if (tty && s.running)
			bar(&s, 0), drawn = 1;
	} while (s.running);
	/* A job with nothing to do leaves meta's record as it was (the last real job). */
	if (same_job(&before, &s)) {
		if (drawn)
			fputc('\n', stderr);
		printf("%s: nothing to do (%s)\n", what,
		       action == KVP_MAINT_SCRUB ? "no chunk stored"
		       : node			 ? "the node holds no chunk"
						 : "no node is down and no stripe is degraded");
		return 0;
	}
	if (tty)
		bar(&s, 1);
	double secs = (double)s.elapsed_ns / 1e9;
	printf("%s: %" PRIu64 " of %" PRIu64 " chunks, %" PRIu64 " failed, %.1f MiB in %.2f s "
	       "(%.1f MiB/s)\n",
	       what, s.done, s.total, s.failed, (double)s.bytes / 1048576.0, secs,
	       secs > 0 ? (double)s.bytes / 1048576.0 / secs : 0);
	if (action == KVP_MAINT_SCRUB)
		printf("checked %" PRIu64 ", corrupt %" PRIu64 ", missing %" PRIu64
		       ", repaired %" PRIu64 "\n",
		       s.st[KVP_MST_SCRUB_CHECKED] - before.st[KVP_MST_SCRUB_CHECKED],
		       s.st[KVP_MST_SCRUB_CORRUPT] - before.st[KVP_MST_SCRUB_CORRUPT],
		       s.st[KVP_MST_SCRUB_MISSING] - before.st[KVP_MST_SCRUB_MISSING],
		       s.st[KVP_MST_SCRUB_REPAIRED] - before.st[KVP_MST_SCRUB_REPAIRED]);
	return s.failed ? 1 : 0;
}

static int parse_node(const char *s, uint32_t *id)
{
	char *end;
	unsigned long v = strtoul(s, &end, 10);
	if (!*s || *end || v == 0 || v > UINT32_MAX) {
		fprintf(stderr, "kvfs: %s: not a node id (see kvfs status)\n", s);
		return -1;
	}
	*id = (uint32_t)v;
	return 0;
}

static int one_pass(struct kvc *c, uint8_t action)
{
	struct status a, b;
	int rc = get_status(c, &a);
	if (!rc)
		rc = maint(c, action, 0);
	if (!rc)
		rc = get_status(c, &b);
	if (rc)
		return fail(action == KVP_MAINT_GC ? "gc" : "expire", rc);
	if (action == KVP_MAINT_GC)
		printf("gc: %" PRIu64 " chunks listed, %" PRIu64 " orphans queued for deletion\n",
		       b.st[KVP_MST_GC_SCANNED] - a.st[KVP_MST_GC_SCANNED],
		       b.st[KVP_MST_GC_ORPHANS] - a.st[KVP_MST_GC_ORPHANS]);
	else
		printf("expire: %" PRIu64 " files expired, %" PRIu64 " evicted\n",
		       b.st[KVP_MST_EXPIRED] - a.st[KVP_MST_EXPIRED],
		       b.st[KVP_MST_EVICTED] - a.st[KVP_MST_EVICTED]);
	return 0;
}

/* MAINT COMPACT, then MSTATUS every second until the run finished (its counter moved). */
static int compact(struct kvc *c)
{
	struct status a, b;
	int rc = get_status(c, &a);
	if (!rc)
		rc = maint(c, KVP_MAINT_COMPACT, 0);
	if (rc == -EBUSY) {
		fprintf(stderr,
			"kvfs: compact: one is running (kvfs jobs: db_compactions_running)\n");
		return 1;
	}
	if (rc)
		return fail("compact", rc);
	printf("compact: started, %" PRIu64 " level-0 files, %.1f MiB pending\n",
	       a.st[KVP_MST_DB_L0_FILES], (double)a.st[KVP_MST_DB_PENDING] / 1048576.0);
	do {
		sleep(1);
		rc = get_status(c, &b);
	} while (!rc && b.st[KVP_MST_DB_COMPACTS] == a.st[KVP_MST_DB_COMPACTS]);
	if (rc)
		return fail("compact", rc);
	printf("compact: done, %" PRIu64 " level-0 files, %.1f MiB pending\n",
	       b.st[KVP_MST_DB_L0_FILES], (double)b.st[KVP_MST_DB_PENDING] / 1048576.0);
	return 0;
}

static int jobs(struct kvc *c)
{
	struct status s;
	int rc = get_status(c, &s);
	if (rc)
		return fail("jobs", rc);
	static const char *kinds[] = {"none", "repair", "drain", "scrub"};
	printf("job: %s%s", s.kind < 4 ? kinds[s.kind] : "?", s.running ? " (running)" : "");
	if (s.kind)
		printf(", node %u, %" PRIu64 "/%" PRIu64 " chunks, %" PRIu64
		       " failed, %.1f MiB in %.1f s",
		       s.node, s.done, s.total, s.failed, (double)s.bytes / 1048576.0,
		       (double)s.elapsed_ns / 1e9);
	printf("\n");
	static const char *names[KVP_MST_COUNT] = {"expired",
						   "evicted",
						   "evicted_bytes",
						   "enospc",
						   "gc_scanned",
						   "gc_orphans",
						   "repaired",
						   "repair_bytes",
						   "repair_failed",
						   "scrub_checked",
						   "scrub_corrupt",
						   "scrub_missing",
						   "scrub_repaired",
						   "degraded_writes",
						   "degraded_stripes",
						   "degraded_files",
						   "db_l0_files",
						   "db_pending_compaction_bytes",
						   "db_compactions_running",
						   "db_full_compactions"};
	for (int i = 0; i < KVP_MST_COUNT; i++)
		printf("%s %" PRIu64 "\n", names[i], s.st[i]);
	return 0;
}

int kvfs_admin_cmd(struct kvc *c, const char *cmd, char **a, int na)
{
	uint32_t id = 0;
	if (!strcmp(cmd, "repair") && na <= 1) {
		if (na && parse_node(a[0], &id))
			return 2;
		return job(c, KVP_MAINT_REPAIR, id, "repair");
	}
	if (!strcmp(cmd, "drain") && na == 1) {
		if (parse_node(a[0], &id))
			return 2;
		return job(c, KVP_MAINT_DRAIN, id, "drain");
	}
	if (!strcmp(cmd, "scrub") && na == 0)
		return job(c, KVP_MAINT_SCRUB, 0, "scrub");
	if (!strcmp(cmd, "gc") && na == 0)
		return one_pass(c, KVP_MAINT_GC);
	if (!strcmp(cmd, "expire") && na == 0)
		return one_pass(c, KVP_MAINT_RETENTION);
	if (!strcmp(cmd, "jobs") && na == 0)
		return jobs(c);
	if (!strcmp(cmd, "compact") && na == 0)
		return compact(c);
	if (!strcmp(cmd, "node") && na == 2 && !strcmp(a[0], "remove")) {
		if (parse_node(a[1], &id))
			return 2;
		int rc = maint(c, KVP_MAINT_NODE_REMOVE, id);
		if (rc == -ENOENT)
			return no_node("node remove", id);
		if (rc == -EBUSY) {
			fprintf(stderr,
				"kvfs: node %u is up or still holds chunks: kvfs drain %u "
				"first (or repair it if it is gone), then stop it\n",
				id, id);
			return 1;
		}
		if (rc)
			return fail("node remove", rc);
		printf("node %u removed\n", id);
		return 0;
	}
	if (!strcmp(cmd, "node") && na == 1 && !strcmp(a[0], "add")) {
		printf("A node joins by heartbeat: start kvfs-node --dir DIR --meta META_ADDR "
		       "--secret-file FILE\non the new machine (docs/operations.md). It takes new "
		       "stripes at once; existing ones stay where they are.\n");
		return 0;
	}
	return -1;
}
