/* The operator's view: a read-only <mnt>/.kvfs/ directory of status files generated on open
 * (nodes, cluster, stats, config), and user.kvfs.* extended attributes on every committed
 * file (layout, nodes holding its chunks, stored bytes, last access).
 *
 * .kvfs is reachable by name but not listed in the root, so find/du/cp -r of the mount see
 * only cluster data. */
#define KVFS_LOG_TAG "mount"
#include "log.h"
#include "mount.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { V_NODES = 0, V_CLUSTER, V_STATS, V_CONFIG, V_COUNT };
static const char *const vnames[V_COUNT] = {"nodes", "cluster", "stats", "config"};
#define VFILE(i) (MNT_VIRT_BASE + 2 + (uint64_t)(i))

int mnt_virt_is(uint64_t nodeid)
{
	return (nodeid & MNT_VIRT_BASE) && !(nodeid & MNT_TEMP_BASE);
}

static void fmt_time(int64_t ns, char *out, size_t cap)
{
	time_t s = (time_t)(ns / 1000000000);
	struct tm tm;
	gmtime_r(&s, &tm);
	size_t n = strftime(out, cap, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out + n, cap - n, ".%09lldZ", (long long)(ns % 1000000000));
}

static const char *human(uint64_t b, char *out, size_t cap)
{
	const char *u = "BKMGTP";
	double v = (double)b;
	while (v >= 1024 && u[1]) {
		v /= 1024;
		u++;
	}
	snprintf(out, cap, *u == 'B' ? "%.0f%c" : "%.1f%c", v, *u);
	return out;
}

static int gen_nodes(struct mnt *m, FILE *f)
{
	struct kvc_node *nd;
	size_t n;
	int rc = kvc_nodes(m->c, &nd, &n);
	if (rc)
		return rc;
	int64_t now = mnt_now_ns();
	fprintf(f, "%-4s %-22s %-5s %10s %10s %10s %9s\n", "id", "addr", "state", "capacity",
		"used", "chunks", "heartbeat");
	for (size_t i = 0; i < n; i++) {
		char c[16], u[16], hb[32];
		if (nd[i].heartbeat_ns > 0)
			snprintf(hb, sizeof(hb), "%.1fs ago",
				 (double)(now - nd[i].heartbeat_ns) / 1e9);
		else
			snprintf(hb, sizeof(hb), "never");
		fprintf(f, "%-4u %-22s %-5s %10s %10s %10" PRIu64 " %9s\n", nd[i].id, nd[i].addr,
			nd[i].state == KVP_NODE_UP ? "up" : "down",
			human(nd[i].capacity, c, sizeof(c)), human(nd[i].used, u, sizeof(u)),
			nd[i].chunks, hb);
	}
	free(nd);
	return 0;
}

static int gen_cluster(struct mnt *m, FILE *f)
{
	struct kvc_statfs s;
	int rc = kvc_statfs(m->c, &s);
	if (rc)
		return rc;
	unsigned k = s.k > 0 ? (unsigned)s.k : 1, mm = s.m > 0 ? (unsigned)s.m : 0;
	uint64_t rawfree = s.raw_capacity > s.raw_used ? s.raw_capacity - s.raw_used : 0;
	fprintf(f, "meta = %s\n", m->meta_addr);
	fprintf(f, "mountpoint = %s\n", m->mountpoint);
	fprintf(f, "k = %d\nm = %d\nchunk_size = %u\n", s.k, s.m, s.chunk_size);
	fprintf(f, "nodes_up = %u\nnodes = %u\n", s.nodes_up, s.nodes);
	fprintf(f, "raw_capacity = %" PRIu64 "\nraw_used = %" PRIu64 "\n", s.raw_capacity,
		s.raw_used);
	fprintf(f, "usable_capacity = %" PRIu64 "\nusable_free = %" PRIu64 "\n",
		(uint64_t)((unsigned __int128)s.raw_capacity * k / (k + mm)),
		(uint64_t)((unsigned __int128)rawfree * k / (k + mm)));
	fprintf(f, "files = %" PRIu64 "\ndirs = %" PRIu64 "\n", s.files, s.dirs);
	return 0;
}

static int gen_stats(struct mnt *m, FILE *f)
{
	struct kvc_stats s;
	kvc_get_stats(m->c, &s);
	const struct mnt_counters *n = &m->n;
	fprintf(f, "uptime_s = %.1f\n", (double)(mnt_now_ns() - m->start_ns) / 1e9);
	fprintf(f, "inodes_cached = %zu\n", mnt_itab_count(m->itab));
#define C(x) fprintf(f, #x " = %llu\n", (unsigned long long)atomic_load(&n->x))
	C(lookups);
	C(opens);
	C(reads);
	C(open_prefetches);
	C(read_bytes);
	C(writes);
	C(write_bytes);
	C(commits);
	C(commit_errors);
	C(aborted);
	C(erofs);
	C(foreign_flushes);
	C(retries);
	C(inval_waits);
	C(inval_wait_us);
	C(lease_invals);
#undef C
	struct kvc_lease_stats ls;
	kvc_lease_get_stats(m->lease, &ls);
	fprintf(f, "lease_renewed = %" PRIu64 "\n", ls.renewed);
	fprintf(f,
		"lease_pinned = %" PRIu64 "\nlease_lost = %" PRIu64 "\nlease_expired = %" PRIu64
		"\n",
		ls.pinned, ls.lost, ls.expired);
	fprintf(f,
		"lease_granted = %" PRIu64 "\nlease_hits = %" PRIu64 "\nlease_negatives = %" PRIu64
		"\nlease_revoked = %" PRIu64 "\nlease_dropped = %" PRIu64
		"\nlease_refused = %" PRIu64 "\n",
		ls.granted, ls.hits, ls.negatives, ls.revoked, ls.dropped, ls.refused);
	fprintf(f, "client_bytes_written = %" PRIu64 "\nclient_bytes_read = %" PRIu64 "\n",
		s.bytes_written, s.bytes_read);
	fprintf(f, "client_files_committed = %" PRIu64 "\n", s.files_committed);
	fprintf(f, "client_degraded_reads = %" PRIu64 "\nclient_crc_errors = %" PRIu64 "\n",
		s.degraded_reads, s.crc_errors);
	return 0;
}

static int virt_index(uint64_t nodeid)
{
	if (nodeid < VFILE(0) || nodeid >= VFILE(V_COUNT))
		return -1;
	return (int)(nodeid - VFILE(0));
}

int mnt_virt_read_all(struct mnt *m, uint64_t nodeid, char **buf, size_t *len)
{
	int i = virt_index(nodeid);
	if (i < 0)
		return -EISDIR;
	*buf = NULL;
	*len = 0;
	FILE *f = open_memstream(buf, len);
	if (!f)
		return -ENOMEM;
	int rc = 0;
	switch (i) {
	case V_NODES:
		rc = gen_nodes(m, f);
		break;
	case V_CLUSTER:
		rc = gen_cluster(m, f);
		break;
	case V_STATS:
		rc = gen_stats(m, f);
		break;
	case V_CONFIG: {
		fprintf(f, "meta = %s\nmountpoint = %s\n", m->meta_addr, m->mountpoint);
		cfg_dump(mnt_cfg_opts, &m->cfg, f);
		/* 0 is not a geometry: say what it stands for. */
		struct kvc_statfs s;
		if ((!m->cfg.k || !m->cfg.m || !m->cfg.chunk) && kvc_statfs(m->c, &s) == 0)
			fprintf(
			    f,
			    "# k, m or chunk = 0: not set for this mount, so new files take the "
			    "cluster's defaults\n# (kvfs-meta --k/--m/--chunk-size; now k = %d, "
			    "m = %d, chunk_size = %u: .kvfs/cluster)\n# as read when the mount "
			    "started. The same in every directory: there is no\n# per-directory "
			    "geometry. -o k=N,m=N,chunk=SIZE sets them for this mount.\n",
			    s.k, s.m, s.chunk_size);
		break;
	}
	}
	fclose(f);
	if (rc) {
		free(*buf);
		*buf = NULL;
		*len = 0;
	}
	return rc;
}

static void virt_stat(uint64_t nodeid, size_t size, const struct mnt *m, struct stat *st)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = nodeid;
	st->st_uid = m->uid;
	st->st_gid = m->gid;
	st->st_blksize = 4096;
	if (nodeid == MNT_VIRT_DIR) {
		st->st_mode = S_IFDIR | 0555;
		st->st_nlink = 2;
	} else {
		st->st_mode = S_IFREG | 0444;
		st->st_nlink = 1;
		st->st_size = (off_t)size;
	}
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	st->st_mtim = st->st_atim = st->st_ctim = now;
}

int mnt_virt_getattr(struct mnt *m, uint64_t nodeid, struct stat *st)
{
	if (nodeid == MNT_VIRT_DIR) {
		virt_stat(nodeid, 0, m, st);
		return 0;
	}
	char *buf;
	size_t len;
	int rc = mnt_virt_read_all(m, nodeid, &buf, &len);
	if (rc)
		return rc == -EISDIR ? -ENOENT : rc;
	free(buf);
	virt_stat(nodeid, len, m, st);
	return 0;
}

int mnt_virt_lookup(struct mnt *m, uint64_t parent, const char *name, struct stat *st)
{
	if (parent == FUSE_ROOT_ID && strcmp(name, MNT_STATUS_NAME) == 0)
		return mnt_virt_getattr(m, MNT_VIRT_DIR, st);
	if (parent != MNT_VIRT_DIR)
		return -ENOENT;
	for (int i = 0; i < V_COUNT; i++)
		if (strcmp(name, vnames[i]) == 0)
			return mnt_virt_getattr(m, VFILE(i), st);
	return -ENOENT;
}

size_t mnt_virt_readdir(struct mnt *m, fuse_req_t req, char *buf, size_t size, off_t off, int plus)
{
	size_t pos = 0;
	for (off_t i = off; i < V_COUNT + 2; i++) {
		struct fuse_entry_param e;
		memset(&e, 0, sizeof(e));
		const char *name = i == 0 ? "." : i == 1 ? ".." : vnames[i - 2];
		uint64_t id = i == 0 ? MNT_VIRT_DIR : i == 1 ? FUSE_ROOT_ID : VFILE(i - 2);
		virt_stat(id, 0, m, &e.attr);
		if (i == 1)
			e.attr.st_mode = S_IFDIR | 0755;
		size_t rem = size - pos, sz;
		if (plus) {
			/* Status files: no cached attributes (their size changes), and the kernel's
			 * references to them need no bookkeeping (forget is a no-op). */
			e.ino = i >= 2 ? id : 0;
			sz = fuse_add_direntry_plus(req, buf + pos, rem, name, &e, i + 1);
		} else {
			sz = fuse_add_direntry(req, buf + pos, rem, name, &e.attr, i + 1);
		}
		if (sz > rem)
			break;
		pos += sz;
	}
	return pos;
}

/* ---- extended attributes ---- */

static const char *const xnames[] = {"user.kvfs.layout", "user.kvfs.nodes", "user.kvfs.stored",
				     "user.kvfs.atime"};
#define NX	  (sizeof(xnames) / sizeof(xnames[0]))
#define XATTR_MAX 65536

/* "stripe S: data n,n,... parity n,..." per stripe, then "node N ADDR STATE" for each node
 * used; capped to fit an xattr. */
static int layout_nodes(struct mnt *m, struct kvc_file *f, FILE *out)
{
	struct kvc_layout_info li;
	uint32_t *slots = NULL;
	int rc = kvc_file_layout(f, &li, &slots);
	if (rc)
		return rc;
	struct kvc_node *nd = NULL;
	size_t nn = 0;
	if (kvc_nodes(m->c, &nd, &nn))
		nn = 0;
	uint32_t w = (uint32_t)(li.k + li.m);
	uint32_t shown = li.nstripes;
	if ((uint64_t)shown * w * 6 > XATTR_MAX / 2)
		shown = (XATTR_MAX / 2) / (w * 6);
	for (uint32_t s = 0; s < shown; s++) {
		fprintf(out, "stripe %u: data", s);
		for (uint32_t j = 0; j < w; j++)
			fprintf(out, "%s%u",
				j == 0		      ? " "
				: j == (uint32_t)li.k ? " parity "
						      : ",",
				slots[(size_t)s * w + j]);
		fputc('\n', out);
	}
	if (shown < li.nstripes)
		fprintf(out, "... %u more stripes\n", li.nstripes - shown);
	for (size_t i = 0; i < nn; i++) {
		int used = 0;
		for (size_t j = 0; j < (size_t)li.nstripes * w && !used; j++)
			used = slots[j] == nd[i].id;
		if (used)
			fprintf(out, "node %u %s %s\n", nd[i].id, nd[i].addr,
				nd[i].state == KVP_NODE_UP ? "up" : "down");
	}
	free(nd);
	free(slots);
	return 0;
}

static int xattr_value(struct mnt *m, uint64_t ino, int which, char **buf, size_t *len)
{
	struct kvp_attr a;
	int rc = kvc_getattr(m->c, ino, &a);
	if (rc)
		return rc;
	if (!S_ISREG(a.mode))
		return -ENODATA;
	FILE *out = open_memstream(buf, len);
	if (!out)
		return -ENOMEM;
	if (which == 0 || which == 1) {
		struct kvc_file *f;
		rc = kvc_file_open(m->c, ino, &f);
		if (!rc) {
			if (which == 0) {
				struct kvc_layout_info li;
				uint32_t *slots = NULL;
				rc = kvc_file_layout(f, &li, &slots);
				free(slots);
				if (!rc)
					fprintf(out,
						"k=%d m=%d chunk_size=%u stripes=%u size=%" PRIu64,
						li.k, li.m, li.chunk_size, li.nstripes, a.size);
			} else {
				rc = layout_nodes(m, f, out);
			}
			kvc_file_close(f);
		}
	} else if (which == 2) {
		fprintf(out, "%" PRIu64, a.stored);
	} else {
		char t[64];
		fmt_time(a.access_ns, t, sizeof(t));
		fputs(t, out);
	}
	fclose(out);
	if (rc) {
		free(*buf);
		*buf = NULL;
	}
	return rc;
}

/* The metadata inode of a committed regular file at nodeid, or 0. */
static uint64_t xattr_ino(struct mnt *m, uint64_t nodeid)
{
	if (mnt_virt_is(nodeid))
		return 0;
	struct mnt_inode_info ii;
	if (mnt_itab_get(m->itab, nodeid, &ii) != 0)
		return (nodeid & MNT_TEMP_BASE) ? 0 : nodeid;
	int writing = 0;
	if (ii.wf) {
		pthread_mutex_lock(&ii.wf->lock);
		writing = ii.wf->w != NULL && (nodeid & MNT_TEMP_BASE);
		pthread_mutex_unlock(&ii.wf->lock);
		mnt_wfile_put(ii.wf);
	}
	return writing ? 0 : ii.ino;
}

void mnt_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct mnt *m = mnt_of(req);
	int which = -1;
	if (!m->cfg.xattr) {
		fuse_reply_err(req, ENOSYS); /* the kernel remembers: no more getxattr requests */
		return;
	}
	/* ACLs (system.posix_acl_*, system.nfs4_acl) and SELinux labels are not kept here: say
	 * "not supported", not "none set". ls -l asks two of these of every file (gnulib's
	 * file_has_acl), and remembers EOPNOTSUPP for the whole device after the first file,
	 * where ENODATA cost a round trip per name and file. */
	if (strncmp(name, "system.", 7) == 0 || strcmp(name, "security.selinux") == 0) {
		fuse_reply_err(req, EOPNOTSUPP);
		return;
	}
	/* Cheap refusal first: the kernel asks security.* on every write. */
	if (strncmp(name, "user.kvfs.", 10) == 0)
		for (size_t i = 0; i < NX; i++)
			if (strcmp(name, xnames[i]) == 0)
				which = (int)i;
	uint64_t mino = which < 0 ? 0 : xattr_ino(m, ino);
	if (which < 0 || mino == 0) {
		fuse_reply_err(req, ENODATA);
		return;
	}
	char *buf = NULL;
	size_t len = 0;
	int rc = xattr_value(m, mino, which, &buf, &len);
	if (rc)
		fuse_reply_err(req, -rc);
	else if (size == 0)
		fuse_reply_xattr(req, len);
	else if (len > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, buf, len);
	free(buf);
}

void mnt_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct mnt *m = mnt_of(req);
	if (!m->cfg.xattr) {
		fuse_reply_err(req, ENOSYS);
		return;
	}
	/* `ls -l` asks this of every file: answer from the inode table, without a request to
	 * meta, whenever the type is known. */
	int reg = 0;
	struct mnt_inode_info ii;
	if (!mnt_virt_is(ino) && mnt_itab_get(m->itab, ino, &ii) == 0) {
		int writing = 0;
		if (ii.wf) {
			pthread_mutex_lock(&ii.wf->lock);
			writing = ii.wf->w != NULL && (ino & MNT_TEMP_BASE);
			pthread_mutex_unlock(&ii.wf->lock);
			mnt_wfile_put(ii.wf);
		}
		reg = !writing && ii.ino && S_ISREG(ii.mode);
		if (!ii.mode && ii.ino) {
			struct kvp_attr a;
			reg = kvc_getattr(m->c, ii.ino, &a) == 0 && S_ISREG(a.mode);
		}
	} else if (!mnt_virt_is(ino) && !(ino & MNT_TEMP_BASE)) {
		struct kvp_attr a;
		reg = kvc_getattr(m->c, ino, &a) == 0 && S_ISREG(a.mode);
	}
	char list[256];
	size_t len = 0;
	for (size_t i = 0; reg && i < NX; i++) {
		size_t n = strlen(xnames[i]) + 1;
		memcpy(list + len, xnames[i], n);
		len += n;
	}
	if (size == 0)
		fuse_reply_xattr(req, len);
	else if (len > size)
		fuse_reply_err(req, ERANGE);
	else
		fuse_reply_buf(req, list, len);
}
