/* The chunk store: directory layout, startup scan, the index and its capacity accounting, and
 * the two ends of every asynchronous request (admission on the connection thread, answer on a
 * completion worker). The middle, the disk I/O, is node_io.c. */
#define KVFS_LOG_TAG "node-store"
#include "node_int.h"
#include "kvec.h"
#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* ---- little-endian helpers for the chunk header ---- */

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n)
{
	uint64_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Chunk file header (docs/node.md): u32 magic, u16 version, u16 header size, u64 chunk id,
 * u32 data length, u32 data crc32c, i64 created_ns, 28 bytes zero, u32 crc32c of bytes 0..59. */
static void hdr_encode(uint8_t h[NODE_HDR_SIZE], uint64_t id, uint32_t len, uint32_t crc)
{
	memset(h, 0, NODE_HDR_SIZE);
	put_le(h, NODE_HDR_MAGIC, 4);
	put_le(h + 4, NODE_HDR_VERSION, 2);
	put_le(h + 6, NODE_HDR_SIZE, 2);
	put_le(h + 8, id, 8);
	put_le(h + 16, len, 4);
	put_le(h + 20, crc, 4);
	put_le(h + 24, (uint64_t)now_ns(), 8);
	put_le(h + 60, kvec_crc32c(0, h, 60), 4);
}

/* Checks a header against the chunk it should describe; returns the data crc via *crc. */
static int hdr_check(const uint8_t h[NODE_HDR_SIZE], uint64_t id, uint32_t len, uint32_t *crc)
{
	if (get_le(h + 60, 4) != kvec_crc32c(0, h, 60))
		return -EILSEQ;
	if (get_le(h, 4) != NODE_HDR_MAGIC || get_le(h + 4, 2) != NODE_HDR_VERSION ||
	    get_le(h + 6, 2) != NODE_HDR_SIZE || get_le(h + 8, 8) != id || get_le(h + 16, 4) != len)
		return -EILSEQ;
	*crc = (uint32_t)get_le(h + 20, 4);
	return 0;
}

static int shard_of(uint64_t id)
{
	return (int)(id & (NODE_SHARDS - 1));
}

/* ---- back-pressure ---- */

static void admit(struct node_store *s, uint64_t n)
{
	pthread_mutex_lock(&s->adm_mu);
	/* Always admit into an empty pipeline, so one request larger than the limit still runs. */
	while (s->adm_bytes && s->adm_bytes + n > s->o.max_inflight)
		pthread_cond_wait(&s->adm_cv, &s->adm_mu);
	s->adm_bytes += n;
	pthread_mutex_unlock(&s->adm_mu);
}

static void release(struct node_store *s, uint64_t n)
{
	pthread_mutex_lock(&s->adm_mu);
	s->adm_bytes -= n;
	pthread_cond_broadcast(&s->adm_cv);
	pthread_mutex_unlock(&s->adm_mu);
}

/* ---- opening: layout, identity, scan ---- */

static int load_uuid(struct node_store *s)
{
	char buf[64];
	int fd = openat(s->dir_fd, "node.id", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		buf[n > 0 ? n : 0] = 0;
		char *end;
		unsigned long long v = strtoull(buf, &end, 16);
		if (end != buf + 16 || (*end && *end != '\n') || v == 0) {
			klog_error("%s/node.id is malformed; refusing to start with a new identity",
				   s->dir);
			return -EINVAL;
		}
		s->uuid = v;
		return 0;
	}
	if (errno != ENOENT)
		return -errno;
	do {
		if (getrandom(&s->uuid, sizeof(s->uuid), 0) != sizeof(s->uuid))
			return -EIO;
	} while (s->uuid == 0);
	int n = snprintf(buf, sizeof(buf), "%016" PRIx64 "\n", s->uuid);
	fd = openat(s->dir_fd, "node.id.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	int ok = write(fd, buf, (size_t)n) == n && fsync(fd) == 0;
	close(fd);
	if (!ok || renameat(s->dir_fd, "node.id.tmp", s->dir_fd, "node.id") || fsync(s->dir_fd))
		return -EIO;
	klog_info("new node identity %016" PRIx64 " in %s", s->uuid, s->dir);
	return 0;
}

/* Removes every leftover temp file: a PUT interrupted by a crash never reached its rename, so
 * what it wrote is not a chunk. */
static int clean_tmp(struct node_store *s)
{
	int fd = dup(s->tmp_fd);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		if (unlinkat(s->tmp_fd, e->d_name, 0) == 0)
			n++;
	}
	closedir(d);
	if (n)
		klog_info("removed %d unfinished chunk file(s) from %s/tmp", n, s->dir);
	return 0;
}

static int parse_name(const char *name, uint64_t *id)
{
	if (strlen(name) != 16)
		return -1;
	uint64_t v = 0;
	for (int i = 0; i < 16; i++) {
		char c = name[i];
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
		if (d < 0)
			return -1;
		v = v << 4 | (uint64_t)d;
	}
	*id = v;
	return 0;
}

static int scan_shard(struct node_store *s, int sh)
{
	int fd = dup(s->shard_fd[sh]);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return -errno;
	}
	struct dirent *e;
	int rc = 0;
	while ((e = readdir(d))) {
		uint64_t id;
		struct stat st;
		if (e->d_name[0] == '.')
			continue;
		if (parse_name(e->d_name, &id) || shard_of(id) != sh) {
			klog_warn("ignoring unexpected file chunks/%02x/%s", sh, e->d_name);
			continue;
		}
		if (fstatat(s->shard_fd[sh], e->d_name, &st, AT_SYMLINK_NOFOLLOW) ||
		    !S_ISREG(st.st_mode)) {
			klog_warn("ignoring chunks/%02x/%s: not a regular file", sh, e->d_name);
			continue;
		}
		if (st.st_size < NODE_HDR_SIZE || st.st_size - NODE_HDR_SIZE > NODE_CHUNK_MAX) {
			/* Cannot be a whole chunk (e.g. a crash before the data reached the disk).
			 */
			klog_warn("removing chunks/%02x/%s: impossible size %lld", sh, e->d_name,
				  (long long)st.st_size);
			unlinkat(s->shard_fd[sh], e->d_name, 0);
			continue;
		}
		struct node_chunk *c = node_index_insert(s->idx, id);
		if (!c) {
			rc = -ENOMEM;
			break;
		}
		c->state = NODE_CHUNK_LIVE;
		c->len = (uint32_t)(st.st_size - NODE_HDR_SIZE);
		c->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
		s->live_bytes += c->len;
		s->live_count++;
	}
	closedir(d);
	return rc;
}

static int open_dir_at(int at, const char *name)
{
	if (mkdirat(at, name, 0755) && errno != EEXIST)
		return -errno;
	int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

static int store_layout(struct node_store *s)
{
	if (mkdir(s->dir, 0755) && errno != EEXIST) {
		klog_error("cannot create %s: %s", s->dir, strerror(errno));
		return -errno;
	}
	s->dir_fd = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (s->dir_fd < 0) {
		klog_error("cannot open %s: %s", s->dir, strerror(errno));
		return -errno;
	}
	s->lock_fd = openat(s->dir_fd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (s->lock_fd < 0 || flock(s->lock_fd, LOCK_EX | LOCK_NB)) {
		klog_error("cannot lock %s/lock (another kvfs-node on this directory?): %s", s->dir,
			   strerror(errno));
		return -EBUSY;
	}
	int rc = load_uuid(s);
	if (rc)
		return rc;
	s->tmp_fd = open_dir_at(s->dir_fd, "tmp");
	int cfd = open_dir_at(s->dir_fd, "chunks");
	if (s->tmp_fd < 0 || cfd < 0) {
		klog_error("cannot create %s/tmp or %s/chunks", s->dir, s->dir);
		if (cfd >= 0)
			close(cfd);
		return -EIO;
	}
	for (int i = 0; i < NODE_SHARDS; i++) {
		char nm[4];
		snprintf(nm, sizeof(nm), "%02x", i);
		s->shard_fd[i] = open_dir_at(cfd, nm);
		if (s->shard_fd[i] < 0) {
			rc = s->shard_fd[i];
			klog_error("cannot create %s/chunks/%s: %s", s->dir, nm, strerror(-rc));
			close(cfd);
			return rc;
		}
	}
	close(cfd);
	return 0;
}

/* ---- the disk ---- */

/* Disk bytes a chunk file of len data bytes takes at most: header, rounded up to 4 KiB
 * blocks (the usual filesystem block; an estimate, the check only needs to be safe). */
static uint64_t disk_need(uint32_t len)
{
	return ((uint64_t)NODE_HDR_SIZE + len + 4095) / 4096 * 4096;
}

/* The data directory's filesystem: size and free bytes for unprivileged writers (f_bavail:
 * the root reserve is not ours to fill). 0, or -errno when statvfs fails (logged once). */
static int disk_space(struct node_store *s, uint64_t *total, uint64_t *avail)
{
	struct statvfs v;
	if (fstatvfs(s->dir_fd, &v) != 0) {
		int rc = -errno;
		if (!atomic_exchange(&s->statvfs_logged, 1))
			klog_warn("statvfs %s: %s (capacity is --capacity alone)", s->dir,
				  strerror(-rc));
		*total = *avail = 0;
		return rc;
	}
	*total = (uint64_t)v.f_blocks * v.f_frsize;
	*avail = (uint64_t)v.f_bavail * v.f_frsize;
	return 0;
}

static uint64_t disk_room(const struct node_store *s, uint64_t avail)
{
	return avail > s->o.reserve ? avail - s->o.reserve : 0;
}

int node_store_open(const struct node_store_opts *o, struct node_store **out)
{
	if (!o->dir || !*o->dir || o->io_threads < 1 || o->workers < 1 || o->ring_depth < 8 ||
	    strlen(o->dir) >= sizeof(((struct node_store *)0)->dir))
		return -EINVAL;
	struct node_store *s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->o = *o;
	snprintf(s->dir, sizeof(s->dir), "%s", o->dir);
	s->o.dir = s->dir;
	s->dir_fd = s->tmp_fd = s->lock_fd = -1;
	for (int i = 0; i < NODE_SHARDS; i++)
		s->shard_fd[i] = -1;
	pthread_mutex_init(&s->mu, NULL);
	pthread_mutex_init(&s->adm_mu, NULL);
	pthread_cond_init(&s->adm_cv, NULL);
	int rc = node_index_create(&s->idx);
	if (!rc)
		rc = store_layout(s);
	if (!rc)
		rc = clean_tmp(s);
	for (int i = 0; !rc && i < NODE_SHARDS; i++)
		rc = scan_shard(s, i);
	if (rc) {
		klog_error("cannot open the store in %s: %s", s->dir, strerror(-rc));
		node_store_close(s);
		return rc;
	}
	uint64_t total, avail;
	disk_space(s, &total, &avail);
	klog_info("store %s: %" PRIu64 " chunks, %" PRIu64 " bytes; its disk: %" PRIu64
		  " bytes, %" PRIu64 " free, %" PRIu64 " kept free; --capacity %" PRIu64
		  " (0: none)",
		  s->dir, s->live_count, s->live_bytes, total, avail, s->o.reserve, s->o.capacity);
	if (s->o.capacity && s->live_bytes > s->o.capacity)
		klog_warn("store %s holds more than its capacity: new chunks are refused", s->dir);
	rc = node_io_start(s);
	if (rc) {
		klog_error("cannot start the I/O threads: %s", strerror(-rc));
		node_store_close(s);
		return rc;
	}
	*out = s;
	return 0;
}

void node_store_close(struct node_store *s)
{
	if (!s)
		return;
	node_io_stop(s);
	for (int i = 0; i < NODE_SHARDS; i++)
		if (s->shard_fd[i] >= 0)
			close(s->shard_fd[i]);
	if (s->tmp_fd >= 0)
		close(s->tmp_fd);
	if (s->lock_fd >= 0)
		close(s->lock_fd);
	if (s->dir_fd >= 0)
		close(s->dir_fd);
	node_index_destroy(s->idx);
	pthread_mutex_destroy(&s->mu);
	pthread_mutex_destroy(&s->adm_mu);
	pthread_cond_destroy(&s->adm_cv);
	free(s);
}

/* ---- synchronous requests ---- */

void node_store_set_disk_hist(struct node_store *s, struct met_hist *put, struct met_hist *get,
			      struct met_hist *del)
{
	s->disk_hist[NODE_OP_PUT] = put;
	s->disk_hist[NODE_OP_GET] = get;
	s->disk_hist[NODE_OP_DEL] = del;
}

void node_store_stats(struct node_store *s, struct node_stats *st)
{
	int disk = disk_space(s, &st->disk_total, &st->disk_avail) == 0;
	pthread_mutex_lock(&s->mu);
	st->used = s->live_bytes;
	st->chunks = s->live_count;
	uint64_t held = s->live_bytes + s->pending_bytes;
	pthread_mutex_unlock(&s->mu);
	/* A disk that cannot be measured takes nothing beyond --capacity (nothing without it). */
	uint64_t cap = s->o.capacity ? s->o.capacity : held;
	if (disk && (!s->o.capacity || held + disk_room(s, st->disk_avail) < cap))
		cap = held + disk_room(s, st->disk_avail);
	st->uuid = s->uuid;
	st->capacity = cap;
	st->crc_errors = atomic_load(&s->crc_errors);
}

int node_store_list(struct node_store *s, uint64_t after, uint32_t max, struct kvp_wbuf *out)
{
	struct node_chunk *v = max ? malloc((size_t)max * sizeof(*v)) : NULL;
	if (max && !v)
		return -ENOMEM;
	int more = 0;
	pthread_mutex_lock(&s->mu);
	long n = node_index_list(s->idx, after, max, v, &more);
	pthread_mutex_unlock(&s->mu);
	if (n < 0) {
		free(v);
		return (int)n;
	}
	kvp_w_u32(out, (uint32_t)n);
	for (long i = 0; i < n; i++) {
		kvp_w_u64(out, v[i].id);
		kvp_w_i64(out, v[i].mtime_ns);
	}
	kvp_w_u8(out, (uint8_t)more);
	free(v);
	return out->err;
}

/* ---- asynchronous requests ---- */

static struct node_op *op_new(struct node_store *s, enum node_op_type t, struct kvp_conn *c,
			      const struct kvp_hdr *h, uint8_t *body, const struct node_req *r)
{
	struct node_op *op = calloc(1, sizeof(*op));
	if (!op)
		return NULL;
	op->type = t;
	op->s = s;
	op->conn = c;
	op->hdr = *h;
	op->body = body;
	op->req = *r;
	op->fd = -1;
	kvp_conn_ref(c);
	return op;
}

static void answer_now(struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body, int err)
{
	kvp_reply(c, h, err, NULL, 0, NULL, 0);
	free(body);
}

void node_store_put(struct node_store *s, struct kvp_conn *c, const struct kvp_hdr *h,
		    uint8_t *body, const struct node_req *r)
{
	/* Verify what the client sent before anything touches the disk. */
	if (kvec_crc32c(0, r->data, r->len) != r->crc) {
		answer_now(c, h, body, -EBADMSG);
		return;
	}
	admit(s, r->len);
	int err = 0;
	/* The disk's free space now, less what PUTs in flight will still take (those partly
	 * written count twice: safe). A chunk never goes into the reserve, so the disk never
	 * fills under a write, whatever else shares it. */
	uint64_t total, avail, need = disk_need(r->len);
	int disk = disk_space(s, &total, &avail) == 0;
	pthread_mutex_lock(&s->mu);
	struct node_chunk *e = node_index_find(s->idx, r->id);
	if (e)
		err = -EEXIST;
	else if (s->o.capacity && s->live_bytes + s->pending_bytes + r->len > s->o.capacity)
		err = -ENOSPC;
	else if (disk ? s->writing_disk + need > disk_room(s, avail) : !s->o.capacity)
		err = -ENOSPC;
	else if (!(e = node_index_insert(s->idx, r->id)))
		err = -ENOMEM;
	if (!err) {
		e->state = NODE_CHUNK_WRITING;
		e->len = r->len;
		s->pending_bytes += r->len;
		s->writing_disk += need;
	}
	uint64_t live = s->live_bytes;
	pthread_mutex_unlock(&s->mu);
	struct node_op *op = err ? NULL : op_new(s, NODE_OP_PUT, c, h, body, r);
	if (!op) {
		if (!err) {
			err = -ENOMEM;
			pthread_mutex_lock(&s->mu);
			node_index_remove(s->idx, r->id);
			s->pending_bytes -= r->len;
			s->writing_disk -= need;
			pthread_mutex_unlock(&s->mu);
		}
		/* Logged once per episode of being full, not once per refused chunk. */
		if (err == -ENOSPC && !atomic_exchange(&s->full_logged, 1))
			klog_warn("store %s is full (%" PRIu64 " bytes of chunks, %" PRIu64
				  " free on its disk, %" PRIu64 " kept free): refusing PUTs",
				  s->dir, live, disk ? avail : 0, s->o.reserve);
		release(s, r->len);
		answer_now(c, h, body, err);
		return;
	}
	atomic_store(&s->full_logged, 0);
	op->charge = r->len;
	op->shard = shard_of(r->id);
	snprintf(op->name, sizeof(op->name), "%016" PRIx64, r->id);
	snprintf(op->tmp, sizeof(op->tmp), "%016" PRIx64 ".%" PRIu64, r->id,
		 (uint64_t)atomic_fetch_add(&s->tmp_seq, 1));
	hdr_encode(op->hbuf, r->id, r->len, r->crc);
	op->total = NODE_HDR_SIZE + (size_t)r->len;
	node_io_submit(s, op);
}

void node_store_get(struct node_store *s, struct kvp_conn *c, const struct kvp_hdr *h,
		    uint8_t *body, const struct node_req *r)
{
	pthread_mutex_lock(&s->mu);
	struct node_chunk *e = node_index_find(s->idx, r->id);
	int live = e && e->state == NODE_CHUNK_LIVE;
	uint32_t len = live ? e->len : 0;
	pthread_mutex_unlock(&s->mu);
	if (!live) {
		answer_now(c, h, body, -ENOENT);
		return;
	}
	uint32_t rlen = r->len == NODE_LEN_TO_END && r->off <= len ? len - r->off : r->len;
	if (r->off > len || rlen > len - r->off) {
		answer_now(c, h, body, -EINVAL);
		return;
	}
	uint64_t charge = NODE_HDR_SIZE + (uint64_t)len;
	int aligned = s->o.direct_read || s->o.direct_cold;
	size_t room =
	    aligned ? (charge + NODE_DIRECT_ALIGN - 1) & ~(size_t)(NODE_DIRECT_ALIGN - 1) : charge;
	admit(s, charge);
	struct node_op *op = op_new(s, NODE_OP_GET, c, h, body, r);
	uint8_t *buf = !op ? NULL : aligned ? aligned_alloc(NODE_DIRECT_ALIGN, room) : malloc(room);
	if (!buf) {
		if (op)
			kvp_conn_unref(c);
		free(op);
		release(s, charge);
		answer_now(c, h, body, -ENOMEM);
		return;
	}
	op->buf = buf;
	op->charge = charge;
	op->glen = len;
	op->roff = r->off;
	op->rlen = rlen;
	op->total = charge;
	op->room = room;
	op->direct = s->o.direct_read;
	op->cold_check = !s->o.direct_read && s->o.direct_cold;
	op->shard = shard_of(r->id);
	snprintf(op->name, sizeof(op->name), "%016" PRIx64, r->id);
	node_io_submit(s, op);
}

void node_store_del(struct node_store *s, struct kvp_conn *c, const struct kvp_hdr *h,
		    uint8_t *body, const struct node_req *r)
{
	struct node_op *op = op_new(s, NODE_OP_DEL, c, h, body, r);
	if (op && r->n) {
		op->dids = malloc((size_t)r->n * sizeof(*op->dids));
		op->dlens = malloc((size_t)r->n * sizeof(*op->dlens));
		op->dnames = malloc((size_t)r->n * sizeof(*op->dnames));
	}
	if (!op || (r->n && (!op->dids || !op->dlens || !op->dnames))) {
		if (op) {
			free(op->dids);
			free(op->dlens);
			free(op->dnames);
			kvp_conn_unref(c);
			free(op);
		}
		answer_now(c, h, body, -ENOMEM);
		return;
	}
	/* Ids leave the index now (they are no longer served or listed) but keep counting
	 * against capacity until their files are gone. Ids that are unknown, being written, or
	 * named twice are skipped. */
	pthread_mutex_lock(&s->mu);
	for (uint32_t i = 0; i < r->n; i++) {
		uint64_t id = node_req_del_id(r, i);
		struct node_chunk *e = node_index_find(s->idx, id);
		if (!e || e->state != NODE_CHUNK_LIVE)
			continue;
		e->state = NODE_CHUNK_DELETING;
		s->live_bytes -= e->len;
		s->live_count--;
		s->pending_bytes += e->len;
		op->dids[op->dn] = id;
		op->dlens[op->dn] = e->len;
		snprintf(op->dnames[op->dn], sizeof(op->dnames[0]), "%016" PRIx64, id);
		op->dn++;
	}
	pthread_mutex_unlock(&s->mu);
	if (op->dn == 0) {
		uint8_t zero[4] = {0};
		kvp_reply(c, h, 0, zero, sizeof(zero), NULL, 0);
		free(op->dids);
		free(op->dlens);
		free(op->dnames);
		kvp_conn_unref(c);
		free(op);
		free(body);
		return;
	}
	node_io_submit(s, op);
}

/* ---- answers (completion workers) ---- */

static void finish_put(struct node_op *op)
{
	struct node_store *s = op->s;
	pthread_mutex_lock(&s->mu);
	struct node_chunk *e = node_index_find(s->idx, op->req.id);
	s->pending_bytes -= op->req.len;
	s->writing_disk -= disk_need(op->req.len);
	if (op->err) {
		node_index_remove(s->idx, op->req.id);
	} else {
		e->state = NODE_CHUNK_LIVE;
		e->mtime_ns = now_ns();
		s->live_bytes += op->req.len;
		s->live_count++;
	}
	pthread_mutex_unlock(&s->mu);
	if (op->err) {
		klog_error("put %s: %s", op->name, strerror(-op->err));
		/* A full disk is "no room"; any other disk failure is an I/O error to the client.
		 */
		if (op->err != -ENOSPC && op->err != -EDQUOT)
			op->err = -EIO;
	}
	kvp_reply(op->conn, &op->hdr, op->err, NULL, 0, NULL, 0);
}

static void finish_get(struct node_op *op)
{
	struct node_store *s = op->s;
	int err = op->err;
	uint32_t crc = 0;
	if (!err)
		err = hdr_check(op->buf, op->req.id, op->glen, &crc);
	if (!err && kvec_crc32c(0, op->buf + NODE_HDR_SIZE, op->glen) != crc)
		err = -EILSEQ;
	if (err == -EILSEQ) {
		atomic_fetch_add(&s->crc_errors, 1);
		klog_error("chunk %s in %s/chunks/%02x fails its CRC32C: not served", op->name,
			   s->dir, op->shard);
	} else if (err == -ENOENT) {
		/* Either a DEL won the race (the entry is no longer LIVE) or someone removed the
		 * file behind the node's back: then forget it, so LIST and STAT stay true. */
		pthread_mutex_lock(&s->mu);
		struct node_chunk *e = node_index_find(s->idx, op->req.id);
		if (e && e->state == NODE_CHUNK_LIVE) {
			klog_warn("chunk %s vanished from %s/chunks/%02x", op->name, s->dir,
				  op->shard);
			s->live_bytes -= e->len;
			s->live_count--;
			node_index_remove(s->idx, op->req.id);
		}
		pthread_mutex_unlock(&s->mu);
	} else if (err) {
		klog_error("get %s: %s", op->name, strerror(-err));
		err = -EIO;
	}
	if (err) {
		kvp_reply(op->conn, &op->hdr, err, NULL, 0, NULL, 0);
		return;
	}
	const uint8_t *data = op->buf + NODE_HDR_SIZE + op->roff;
	if (op->req.op == KVP_OP_VERIFY) {
		uint8_t vb[8];
		put_le(vb, crc, 4);
		put_le(vb + 4, op->glen, 4);
		kvp_reply(op->conn, &op->hdr, 0, vb, sizeof(vb), NULL, 0);
		return;
	}
	uint32_t rcrc = op->rlen == op->glen ? crc : kvec_crc32c(0, data, op->rlen);
	uint8_t rb[8];
	put_le(rb, rcrc, 4);
	put_le(rb + 4, op->rlen, 4);
	kvp_reply(op->conn, &op->hdr, 0, rb, sizeof(rb), data, op->rlen);
}

static void finish_del(struct node_op *op)
{
	struct node_store *s = op->s;
	pthread_mutex_lock(&s->mu);
	for (uint32_t i = 0; i < op->dn; i++) {
		node_index_remove(s->idx, op->dids[i]);
		s->pending_bytes -= op->dlens[i];
	}
	pthread_mutex_unlock(&s->mu);
	uint8_t rb[4];
	put_le(rb, op->dn, 4);
	kvp_reply(op->conn, &op->hdr, 0, rb, sizeof(rb), NULL, 0);
}

void node_op_finish(struct node_op *op)
{
	switch (op->type) {
	case NODE_OP_PUT:
		finish_put(op);
		break;
	case NODE_OP_GET:
		finish_get(op);
		break;
	case NODE_OP_DEL:
		finish_del(op);
		break;
	}
	if (op->charge)
		release(op->s, op->charge);
	kvp_conn_unref(op->conn);
	free(op->body);
	free(op->buf);
	free(op->dids);
	free(op->dlens);
	free(op->dnames);
	free(op);
}
