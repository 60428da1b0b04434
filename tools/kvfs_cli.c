/* kvfs — admin and scripting CLI for a kvfs cluster, on libkvfs.
 *
 *   kvfs [--cluster DIR | --meta ADDR --secret-file FILE] COMMAND ...
 *   status | put LOCAL|- PATH | get PATH LOCAL|- | ls [-l] PATH | stat PATH | rm [-r] PATH |
 *   mkdir [-p] PATH
 *
 * --cluster DIR (or $KVFS_CLUSTER) reads the meta address and secret a local cluster started by
 * tools/kvfs-cluster.sh keeps in DIR/meta.addr and DIR/secret. Exit status: 0 ok, 1 failure
 * (the message names the path and the reason), 2 usage. */
#define KVFS_LOG_TAG "kvfs"
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cfg.h"
#include "kvc.h"
#include "kvfs_admin.h"
#include "log.h"

struct cli_cfg {
	char cluster[CFG_STR_MAX];
	char meta[CFG_STR_MAX];
	char secret_file[CFG_STR_MAX];
	double timeout;
	int64_t log_level;
};

#define F(x) offsetof(struct cli_cfg, x)
static const struct cfg_opt opts[] = {
    {"cluster", CFG_STR, F(cluster), 0, 0, NULL,
     "local cluster dir (meta.addr + secret inside; default $KVFS_CLUSTER)"},
    {"meta", CFG_STR, F(meta), 0, 0, NULL, "metadata server HOST:PORT (overrides --cluster)"},
    {"secret-file", CFG_STR, F(secret_file), 0, 0, NULL, "cluster secret file"},
    {"timeout", CFG_SECS, F(timeout), 0.1, 3600, "5s", "per-request timeout"},
    {"log-level", CFG_INT, F(log_level), 0, 3, "1", "0 error, 1 warn, 2 info, 3 debug"},
    CFG_END};

static const char *usage =
    "COMMAND ...\n"
    "commands:\n"
    "  status                 nodes (state, capacity, used, chunks), files, capacity\n"
    "  put LOCAL|- PATH       store a local file (or stdin) at PATH, replacing it\n"
    "  get PATH LOCAL|-       read PATH into a local file (or stdout)\n"
    "  ls [-l] PATH           list a directory\n"
    "  stat PATH              attributes and, for a file, its stripe layout\n"
    "  rm [-r] PATH           remove a file (or a directory tree with -r)\n"
    "  mkdir [-p] PATH        make a directory (and its parents with -p)\n"
    "  meta status            every meta replica's Raft state: term, leader, log index, "
    "lag\n" KVFS_ADMIN_USAGE;

static int fail(const char *what, const char *path, int rc)
{
	fprintf(stderr, "kvfs: %s%s%s: %s\n", what, path ? " " : "", path ? path : "",
		kvp_strerror(rc));
	return 1;
}

static const char *human(uint64_t v, char *buf, size_t cap)
{
	const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double d = (double)v;
	int i = 0;
	while (d >= 1024 && i < 5) {
		d /= 1024;
		i++;
	}
	snprintf(buf, cap, i ? "%.1f %s" : "%.0f %s", d, u[i]);
	return buf;
}

/* The retention / GC / repair / scrub counters of meta (MSTATUS), in one glance; nothing when
 * meta does not answer MSTATUS. Per-op request counts and latencies: meta's /metrics. */
static void status_counters(struct kvc *c)
{
	uint8_t *rb = NULL;
	uint32_t rl = 0;
	if (kvc_admin(c, KVP_OP_MSTATUS, NULL, 0, &rb, &rl))
		return;
	struct kvp_rbuf r;
	kvp_r_init(&r, rb, rl);
	kvp_r_u8(&r), kvp_r_u8(&r), kvp_r_u32(&r); /* job kind, running, node */
	for (int i = 0; i < 5; i++)		   /* total, done, failed, bytes, elapsed */
		kvp_r_u64(&r);
	uint64_t v[KVP_MST_COUNT] = {0};
	uint32_t n = kvp_r_u32(&r);
	for (uint32_t i = 0; i < n && !r.err; i++) {
		uint64_t x = kvp_r_u64(&r);
		if (i < KVP_MST_COUNT)
			v[i] = x;
	}
	int bad = kvp_r_end(&r);
	free(rb);
	if (bad)
		return;
	char b1[32], b2[32];
	printf("counters: expired %" PRIu64 ", evicted %" PRIu64 " (%s), gc orphans %" PRIu64
	       ", repaired %" PRIu64 " chunks (%s), repair failed %" PRIu64
	       ", scrub corrupt %" PRIu64 " missing %" PRIu64 ", ENOSPC %" PRIu64 "\n",
	       v[KVP_MST_EXPIRED], v[KVP_MST_EVICTED], human(v[KVP_MST_EVICTED_BYTES], b1, 32),
	       v[KVP_MST_GC_ORPHANS], v[KVP_MST_REPAIRED], human(v[KVP_MST_REPAIR_BYTES], b2, 32),
	       v[KVP_MST_REPAIR_FAILED], v[KVP_MST_SCRUB_CORRUPT], v[KVP_MST_SCRUB_MISSING],
	       v[KVP_MST_ENOSPC]);
	/* Written while nodes were down or unreachable: one failure from loss with m = 1. */
	printf("degraded: %" PRIu64 " stripes in %" PRIu64 " files to repair (%" PRIu64
	       " stripes written degraded since meta started)\n",
	       v[KVP_MST_DEGR_STRIPES], v[KVP_MST_DEGR_FILES], v[KVP_MST_DEGR_WRITES]);
}

/* Failure domains among the registered nodes, as placement counts them: a node without a
 * zone is one of its own. */
static size_t count_zones(const struct kvc_node *v, size_t n)
{
	size_t z = 0;
	for (size_t i = 0; i < n; i++) {
		size_t j = 0;
		while (v[i].zone[0] && j < i && strcmp(v[j].zone, v[i].zone) != 0)
			j++;
		z += !v[i].zone[0] || j == i;
	}
	return z;
}

static int cmd_status(struct kvc *c, const char *meta)
{
	struct kvc_statfs st;
	struct kvc_node *nodes;
	size_t n;
	int rc = kvc_statfs(c, &st);
	if (rc || (rc = kvc_nodes(c, &nodes, &n)))
		return fail("status", NULL, rc);
	char b1[32], b2[32], b3[32];
	printf("meta %s: k=%d m=%d chunk %s\n", meta, st.k, st.m, human(st.chunk_size, b1, 32));
	printf("nodes: %u up of %u\n", st.nodes_up, st.nodes);
	printf("zones: %zu\n", count_zones(nodes, n));
	printf("  %-4s %-5s %-21s %12s %12s %5s %8s %8s  %s\n", "id", "state", "addr", "capacity",
	       "used", "use%", "chunks", "seen", "zone");
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	int64_t now_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
	for (size_t i = 0; i < n; i++) {
		double age =
		    nodes[i].heartbeat_ns ? (double)(now_ns - nodes[i].heartbeat_ns) / 1e9 : -1;
		char seen[32];
		if (age < 0)
			snprintf(seen, sizeof(seen), "never");
		else
			snprintf(seen, sizeof(seen), "%.1fs", age);
		double pct = nodes[i].capacity
				 ? 100.0 * (double)nodes[i].used / (double)nodes[i].capacity
				 : 0;
		printf("  %-4u %-5s %-21s %12s %12s %4.0f%% %8" PRIu64 " %8s  %s\n", nodes[i].id,
		       nodes[i].state == KVP_NODE_UP	     ? "up"
		       : nodes[i].state == KVP_NODE_DRAINING ? "drain"
							     : "down",
		       nodes[i].addr, human(nodes[i].capacity, b1, 32),
		       human(nodes[i].used, b2, 32), pct, nodes[i].chunks, seen,
		       nodes[i].zone[0] ? nodes[i].zone : "-");
	}
	free(nodes);
	uint64_t usable = st.k + st.m ? st.raw_capacity / (uint64_t)(st.k + st.m) * st.k : 0;
	printf("files: %" PRIu64 "  dirs: %" PRIu64 "\n", st.files, st.dirs);
	printf("raw: %s capacity, %s used (%.0f%%); usable (x %d/%d): %s\n",
	       human(st.raw_capacity, b1, 32), human(st.raw_used, b2, 32),
	       st.raw_capacity ? 100.0 * (double)st.raw_used / (double)st.raw_capacity : 0, st.k,
	       st.k + st.m, human(usable, b3, 32));
	status_counters(c);
	return 0;
}

static int read_all(FILE *f, uint8_t **out, size_t *len)
{
	size_t cap = 1 << 20, n = 0;
	uint8_t *b = malloc(cap);
	while (b) {
		size_t r = fread(b + n, 1, cap - n, f);
		n += r;
		if (r == 0)
			break;
		if (n == cap) {
			uint8_t *nb = realloc(b, cap *= 2);
			if (!nb)
				free(b);
			b = nb;
		}
	}
	if (!b)
		return -ENOMEM;
	if (ferror(f)) {
		free(b);
		return -EIO;
	}
	*out = b;
	*len = n;
	return 0;
}

static int cmd_put(struct kvc *c, const char *local, const char *path)
{
	FILE *f = strcmp(local, "-") ? fopen(local, "rb") : stdin;
	if (!f)
		return fail("cannot open", local, -errno);
	uint8_t *b;
	size_t n;
	int rc = read_all(f, &b, &n);
	if (f != stdin)
		fclose(f);
	if (rc)
		return fail("cannot read", local, rc);
	rc = kvc_put(c, path, b, n, 1);
	free(b);
	return rc ? fail("put", path, rc) : 0;
}

static int cmd_get(struct kvc *c, const char *path, const char *local)
{
	void *b;
	size_t n;
	int rc = kvc_get(c, path, &b, &n);
	if (rc)
		return fail("get", path, rc);
	FILE *f = strcmp(local, "-") ? fopen(local, "wb") : stdout;
	if (!f) {
		rc = -errno;
		free(b);
		return fail("cannot create", local, rc);
	}
	int ok = fwrite(b, 1, n, f) == n;
	ok = (f == stdout ? fflush(f) : fclose(f)) == 0 && ok;
	free(b);
	return ok ? 0 : fail("cannot write", local, -EIO);
}

static void print_long(const char *name, const struct kvp_attr *a)
{
	char t[32];
	time_t s = (time_t)(a->mtime_ns / 1000000000);
	struct tm tm;
	localtime_r(&s, &tm);
	strftime(t, sizeof(t), "%Y-%m-%d %H:%M", &tm);
	printf("%c%04o %3u %12" PRIu64 " %s %s%s\n", S_ISDIR(a->mode) ? 'd' : '-', a->mode & 07777,
	       a->nlink, a->size, t, name, S_ISDIR(a->mode) ? "/" : "");
}

static int cmd_ls(struct kvc *c, const char *path, int lng)
{
	struct kvp_attr a;
	int rc = kvc_resolve(c, path, &a);
	if (rc)
		return fail("ls", path, rc);
	if (!S_ISDIR(a.mode)) {
		if (lng)
			print_long(path, &a);
		else
			printf("%s\n", path);
		return 0;
	}
	struct kvc_dirent *e;
	size_t n;
	if ((rc = kvc_readdir(c, a.ino, &e, &n)))
		return fail("ls", path, rc);
	for (size_t i = 0; i < n; i++) {
		if (lng)
			print_long(e[i].name, &e[i].attr);
		else
			printf("%s%s\n", e[i].name, S_ISDIR(e[i].attr.mode) ? "/" : "");
	}
	free(e);
	return 0;
}

static void print_time(const char *label, int64_t ns)
{
	char t[64];
	time_t s = (time_t)(ns / 1000000000);
	struct tm tm;
	localtime_r(&s, &tm);
	strftime(t, sizeof(t), "%Y-%m-%d %H:%M:%S", &tm);
	printf("%s: %s.%09lld\n", label, t, (long long)(ns % 1000000000));
}

static int cmd_stat(struct kvc *c, const char *path)
{
	struct kvp_attr a;
	int rc = kvc_resolve(c, path, &a);
	if (rc)
		return fail("stat", path, rc);
	printf("path: %s\ninode: %" PRIu64 "\ntype: %s\nmode: %04o\nnlink: %u\nsize: %" PRIu64
	       "\nstored: %" PRIu64 "\n",
	       path, a.ino, S_ISDIR(a.mode) ? "directory" : "file", a.mode & 07777, a.nlink, a.size,
	       a.stored);
	print_time("mtime", a.mtime_ns);
	print_time("atime", a.atime_ns);
	print_time("ctime", a.ctime_ns);
	if (S_ISDIR(a.mode))
		return 0;
	print_time("access", a.access_ns); /* kvfs's own: what retention and eviction use */
	struct kvc_file *f;
	if ((rc = kvc_file_open(c, a.ino, &f)))
		return fail("layout of", path, rc);
	struct kvc_layout_info li;
	uint32_t *slots = NULL;
	rc = kvc_file_layout(f, &li, &slots);
	kvc_file_close(f);
	if (rc)
		return fail("layout of", path, rc);
	printf("layout: k=%d m=%d chunk_size=%u stripes=%u\n", li.k, li.m, li.chunk_size,
	       li.nstripes);
	for (uint32_t s = 0; s < li.nstripes; s++) {
		printf("  stripe %u nodes:", s);
		for (int i = 0; i < li.k + li.m; i++)
			printf(" %u%s", slots[(size_t)s * (li.k + li.m) + i],
			       i == li.k - 1 ? " |" : "");
		printf("\n");
	}
	free(slots);
	return 0;
}

static int rm_tree(struct kvc *c, uint64_t parent, const char *name, const struct kvp_attr *a,
		   const char *path)
{
	if (!S_ISDIR(a->mode))
		return kvc_unlink(c, parent, name);
	struct kvc_dirent *e;
	size_t n;
	int rc = kvc_readdir(c, a->ino, &e, &n);
	for (size_t i = 0; i < n && rc == 0; i++)
		rc = rm_tree(c, a->ino, e[i].name, &e[i].attr, path);
	if (rc == 0)
		free(e);
	return rc ? rc : kvc_rmdir(c, parent, name);
}

static int cmd_rm(struct kvc *c, const char *path, int rec)
{
	uint64_t parent;
	const char *name;
	struct kvp_attr a;
	int rc = kvc_resolve_parent(c, path, &parent, &name);
	if (rc == 0)
		rc = kvc_lookup(c, parent, name, &a);
	if (rc == 0) {
		if (S_ISDIR(a.mode) && !rec)
			rc = -EISDIR;
		else
			rc = rm_tree(c, parent, name, &a, path);
	}
	return rc ? fail("rm", path, rc) : 0;
}

static int cmd_mkdir(struct kvc *c, const char *path, int parents)
{
	int rc;
	if (parents) {
		rc = kvc_mkdir_p(c, path, 0755);
	} else {
		uint64_t parent;
		const char *name;
		rc = kvc_resolve_parent(c, path, &parent, &name);
		if (rc == 0)
			rc = kvc_mkdir(c, parent, name, 0755, NULL);
	}
	return rc ? fail("mkdir", path, rc) : 0;
}

/* meta.addr: one address a line (every replica of a replicated meta), joined as "A,B,C". */
static int read_line(const char *path, char *out, size_t cap)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -errno;
	char line[CFG_STR_MAX];
	size_t len = 0;
	int rc = 0;
	out[0] = 0;
	while (!rc && fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\r\n")] = 0;
		size_t ll = strlen(line);
		if (!ll)
			continue;
		if (len + ll + 2 > cap)
			rc = -ENAMETOOLONG;
		else
			len += (size_t)snprintf(out + len, cap - len, "%s%s", len ? "," : "", line);
	}
	fclose(f);
	return rc ? rc : *out ? 0 : -EINVAL;
}

/* One replica's RSTATUS (kvp.h), or, for a replica seen only in the leader's configuration,
 * what the leader knows of it (asked = 0: st.id, st.applied = its match index, addr = its Raft
 * address). */
struct mstat {
	int rc, asked;
	char addr[KVP_ADDR_MAX + 8];
	struct kvp_rstatus st;
};

static int mstat_get(struct kvp_pool *pool, const char *addr, int timeout_ms, struct mstat *s)
{
	memset(s, 0, sizeof(*s));
	s->asked = 1;
	snprintf(s->addr, sizeof(s->addr), "%s", addr);
	struct kvp_client *cl;
	uint8_t *rb = NULL;
	uint32_t rl = 0;
	int rc = kvp_pool_get(pool, addr, &cl);
	if (!rc) {
		rc = kvp_call(cl, KVP_OP_RSTATUS, NULL, 0, NULL, 0, timeout_ms, &rb, &rl);
		kvp_pool_put(pool, cl);
	}
	if (!rc)
		rc = kvp_rstatus_parse(rb, rl, &s->st);
	free(rb);
	s->rc = rc;
	return rc;
}

/* `kvfs meta status`: asks every address of the list (RSTATUS), leader or not, so it works
 * during an election too; then the leader, if none of them is it (a replica names its client
 * address); then every replica of the leader's configuration not asked yet is shown as the
 * leader sees it (its Raft address and how far its log matches), so one address shows the
 * whole group. Lag: the leader's last index minus what the replica applied (asked) or what
 * the leader knows it holds (not asked). */
static int cmd_meta_status(const char *list, const struct kvp_secret *sec, int timeout_ms)
{
	char addrs[KVC_MAX_METAS][KVP_ADDR_MAX];
	int n = kvc_meta_list(list, addrs, KVC_MAX_METAS);
	if (n < 0)
		return fail("bad meta address list", list, n);
	struct kvp_pool *pool;
	int rc = kvp_pool_create(sec, timeout_ms, &pool);
	if (rc)
		return fail("cannot create a connection pool", "", rc);
	enum { MAXROWS = 2 * KVC_MAX_METAS + 1 };
	struct mstat *s = calloc(MAXROWS, sizeof(*s));
	if (!s) {
		kvp_pool_destroy(pool);
		return fail("out of memory", "", -ENOMEM);
	}
	int rows = 0, ok = 0, single = 0, lead = -1;
	for (int i = 0; i < n; i++) {
		rc = mstat_get(pool, addrs[i], timeout_ms, &s[rows]);
		ok += rc == 0;
		single |= rc == -EOPNOTSUPP;
		if (!rc && s[rows].st.state == 3 && lead < 0)
			lead = rows;
		rows++;
	}
	/* The leader, when none of the list is it: any replica that follows it names it. */
	for (int i = 0; i < rows && lead < 0; i++) {
		if (s[i].rc || !s[i].st.leader_client[0])
			continue;
		int known = 0;
		for (int j = 0; j < rows; j++)
			known |= !strcmp(s[j].addr, s[i].st.leader_client);
		if (!known && mstat_get(pool, s[i].st.leader_client, timeout_ms, &s[rows]) == 0 &&
		    s[rows].st.state == 3) {
			lead = rows++;
			ok++;
		}
	}
	/* Every replica of the configuration not asked: the leader's view of it, else only its
	 * id and Raft address (no leader known). */
	int from = lead;
	for (int i = 0; i < rows && from < 0; i++)
		if (!s[i].rc)
			from = i;
	for (uint32_t p = 0; from >= 0 && p < s[from].st.npeers && rows < MAXROWS; p++) {
		int known = 0;
		for (int j = 0; j < rows; j++)
			known |= !s[j].rc && s[j].asked && s[j].st.id == s[from].st.peers[p].id;
		if (known)
			continue;
		struct mstat *t = &s[rows++];
		memset(t, 0, sizeof(*t));
		t->st.id = s[from].st.peers[p].id;
		t->st.applied = s[from].st.peers[p].match;
		snprintf(t->addr, sizeof(t->addr), "raft=%s", s[from].st.peers[p].raft);
	}
	kvp_pool_destroy(pool);
	uint64_t lead_last = lead >= 0 ? s[lead].st.last : 0;
	static const char *states[] = {"unavailable", "follower", "candidate", "leader"};
	/* lag last, applied before it: scripts read them as $NF and $(NF - 1). */
	printf("%-22s %4s %-11s %-7s %6s %8s %10s %8s %8s %10s %10s %10s %6s\n", "meta", "id",
	       "state", "serving", "term", "leader", "snapshot", "log_MiB", "in_mem", "last",
	       "commit", "applied", "lag");
	for (int i = 0; i < rows; i++) {
		if (s[i].rc == -EOPNOTSUPP) {
			printf("%-22s single meta (no Raft)\n", s[i].addr);
			continue;
		}
		if (s[i].rc) {
			printf("%-22s unreachable: %s\n", s[i].addr, kvp_strerror(s[i].rc));
			continue;
		}
		char lag[24] = "-";
		if (lead_last && (s[i].asked || lead >= 0))
			snprintf(lag, sizeof(lag), "%lld",
				 (long long)(lead_last > s[i].st.applied
						 ? lead_last - s[i].st.applied
						 : 0));
		if (!s[i].asked) {
			/* Seen in the configuration only: not asked, so no state of its own. */
			char match[24] = "-";
			if (lead >= 0)
				snprintf(match, sizeof(match), "%llu",
					 (unsigned long long)s[i].st.applied);
			printf("%-22s %4llu %-11s %-7s %6s %8s %10s %8s %8s %10s %10s %10s %6s\n",
			       s[i].addr, (unsigned long long)s[i].st.id,
			       lead >= 0 ? "(leader's)" : "(config)", "-", "-", "-", "-", "-", "-",
			       "-", "-", match, lag);
			continue;
		}
		char snap[24] = "-", mib[24] = "-", mem[24] = "-";
		if (s[i].st.has_snap) {
			snprintf(snap, sizeof(snap), "%llu",
				 (unsigned long long)s[i].st.snap_index);
			snprintf(mib, sizeof(mib), "%.1f", (double)s[i].st.log_bytes / 1048576.0);
			snprintf(mem, sizeof(mem), "%llu", (unsigned long long)s[i].st.log_mem);
		}
		printf("%-22s %4llu %-11s %-7s %6llu %8llu %10s %8s %8s %10llu %10llu %10llu %6s\n",
		       s[i].addr, (unsigned long long)s[i].st.id, states[s[i].st.state & 3],
		       s[i].st.serving ? "yes" : "no", (unsigned long long)s[i].st.term,
		       (unsigned long long)s[i].st.leader_id, snap, mib, mem,
		       (unsigned long long)s[i].st.last, (unsigned long long)s[i].st.commit,
		       (unsigned long long)s[i].st.applied, lag);
	}
	if (!lead_last && ok && !single)
		printf("no leader: an election is on, or too few replicas are up\n");
	free(s);
	return ok ? 0 : 1;
}

/* `kvfs meta add ID ADDR` / `kvfs meta remove ID`: RCONF to the leader. */
static int cmd_meta_conf(struct kvc *c, int add, const char *id_s, const char *addr)
{
	char *end;
	unsigned long long id = strtoull(id_s, &end, 10);
	if (*end || id == 0 || id > 1000000 || strlen(addr) > 63) {
		fprintf(stderr, "kvfs: meta %s: bad replica id %s or address\n",
			add ? "add" : "remove", id_s);
		return 2;
	}
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u8(&w, add ? 1 : 2);
	kvp_w_u64(&w, id);
	kvp_w_cstr(&w, addr);
	int rc = w.err ? w.err : kvc_admin(c, KVP_OP_RCONF, w.p, w.len, NULL, NULL);
	kvp_w_free(&w);
	if (rc)
		return fail(add ? "cannot add meta replica" : "cannot remove meta replica", id_s,
			    rc);
	printf("meta replica %llu %s\n", id, add ? "added (a voter, caught up)" : "removed");
	return 0;
}

int main(int argc, char **argv)
{
	struct cli_cfg cfg;
	int npos = 0;
	int rc = cfg_parse(opts, &cfg, argc, argv, usage, &npos);
	if (rc)
		return rc > 0 ? 0 : 2;
	kvfs_log_set_level((int)cfg.log_level);
	if (npos < 1) {
		fprintf(stderr, "usage: kvfs [options] %s\n(see --help)\n", usage);
		return 2;
	}
	const char *cluster = cfg.cluster[0] ? cfg.cluster : getenv("KVFS_CLUSTER");
	char meta[CFG_STR_MAX + 16], secret_path[CFG_STR_MAX + 16];
	snprintf(meta, sizeof(meta), "%s", cfg.meta);
	snprintf(secret_path, sizeof(secret_path), "%s", cfg.secret_file);
	if (cluster && *cluster) {
		char p[CFG_STR_MAX + 16];
		snprintf(p, sizeof(p), "%s/meta.addr", cluster);
		if (!meta[0] && (rc = read_line(p, meta, sizeof(meta))))
			return fail("cannot read", p, rc);
		if (!secret_path[0])
			snprintf(secret_path, sizeof(secret_path), "%s/secret", cluster);
	}
	if (!meta[0] || !secret_path[0]) {
		fprintf(stderr, "kvfs: say where the cluster is: --cluster DIR, $KVFS_CLUSTER, or "
				"--meta ADDR --secret-file FILE\n");
		return 2;
	}
	struct kvp_secret sec;
	if ((rc = kvp_secret_load(secret_path, &sec)))
		return fail("cannot load secret", secret_path, rc);
	if (!strcmp(argv[1], "meta") && npos == 2 && !strcmp(argv[2], "status"))
		return cmd_meta_status(meta, &sec, (int)(cfg.timeout * 1000));
	struct kvc_opts o = {
	    .meta_addr = meta, .secret = &sec, .timeout_ms = (int)(cfg.timeout * 1000)};
	struct kvc *c;
	if ((rc = kvc_open(&o, &c)))
		return fail("cannot reach meta at", meta, rc);
	const char *cmd = argv[1];
	char **a = argv + 2;
	int na = npos - 1;
	char flag = 0;
	if (na > 0 && a[0][0] == '-' && a[0][1] && !a[0][2]) {
		flag = a[0][1];
		a++;
		na--;
	}
	int ret = 2;
	if (!strcmp(cmd, "meta") && !flag && na >= 2 &&
	    ((!strcmp(a[0], "add") && na == 3) || (!strcmp(a[0], "remove") && na == 2)))
		ret = cmd_meta_conf(c, !strcmp(a[0], "add"), a[1], na == 3 ? a[2] : "");
	else if (!strcmp(cmd, "status") && na == 0 && !flag)
		ret = cmd_status(c, meta);
	else if (!strcmp(cmd, "put") && na == 2 && !flag)
		ret = cmd_put(c, a[0], a[1]);
	else if (!strcmp(cmd, "get") && na == 2 && !flag)
		ret = cmd_get(c, a[0], a[1]);
	else if (!strcmp(cmd, "ls") && na <= 1 && (!flag || flag == 'l'))
		ret = cmd_ls(c, na ? a[0] : "/", flag);
	else if (!strcmp(cmd, "stat") && na == 1 && !flag)
		ret = cmd_stat(c, a[0]);
	else if (!strcmp(cmd, "rm") && na == 1 && (!flag || flag == 'r'))
		ret = cmd_rm(c, a[0], flag);
	else if (!strcmp(cmd, "mkdir") && na == 1 && (!flag || flag == 'p'))
		ret = cmd_mkdir(c, a[0], flag);
	else if (!flag && (ret = kvfs_admin_cmd(c, cmd, a, na)) >= 0)
		;
	else {
		ret = 2;
		fprintf(stderr, "usage: kvfs [options] %s\n", usage);
	}
	kvc_close(c);
	return ret;
}
