/* kvc: the read path. LAYOUT once per open; reads fetch the data chunks a request needs in
 * parallel, verify each against its CRC32C, and only when a chunk is missing, late or corrupt
 * fetch parity and decode. Whole stripes go straight into the caller's buffer when it covers
 * them; partial reads go through a two-stripe cache. A read spanning stripes has the next
 * stripe's GETs on the wire while it waits for the current one, and a sequential reader has
 * the stripe after its read on its way before it asks (one stripe of prefetch). */
#define KVFS_LOG_TAG "kvc"
#include "kvc_int.h"
#include "log.h"

#include <errno.h>
#include <stdlib.h>
#include <limits.h>
#include <string.h>
#include <sys/stat.h>

struct fnode {
	uint32_t id;
	int state;
	char addr[KVP_ADDR_MAX];
};

struct fslot {
	uint32_t node; /* index into kvc_file.nodes */
	uint64_t chunk_id;
	uint32_t crc;
};

/* The GETs of one stripe in flight. */
struct sfetch {
	int64_t s; /* -1: idle */
	struct kvch_fetch f;
};

struct kvc_file {
	struct kvc *c;
	uint64_t ino;
	struct kvec_layout l;
	int n;
	struct kvec_codec *codec;
	struct fnode *nodes;
	uint32_t nn;
	struct fslot *slots; /* nstripes * n */
	struct {
		int64_t s;    /* -1: empty */
		uint8_t *buf; /* n * chunk_size: k data chunks, then m parity */
		uint64_t tick;
	} cache[2];
	uint64_t tick;
	uint64_t next_off; /* where a sequential reader reads next */
	struct sfetch pf;  /* prefetch of the next stripe */
	int suspect;	   /* a node of this file was down or failed: refresh the table */
	int64_t refreshed_ms;
};

/* LAYOUT reply -> f's geometry, node table and slots. */
static int parse_layout(struct kvc_file *f, const uint8_t *b, uint32_t len)
{
	struct kvp_rbuf r;
	kvp_r_init(&r, b, len);
	uint64_t size = kvp_r_u64(&r);
	uint32_t cs = kvp_r_u32(&r);
	int k = kvp_r_u8(&r), m = kvp_r_u8(&r);
	uint32_t ns = kvp_r_u32(&r);
	uint32_t nn = kvp_r_u32(&r);
	if (r.err || kvec_layout_init(&f->l, size, cs, k, m) || f->l.nstripes != ns || nn > len / 7)
		return -EBADMSG;
	f->n = k + m;
	f->nn = nn;
	f->nodes = calloc(nn ? nn : 1, sizeof(*f->nodes));
	if (!f->nodes)
		return -ENOMEM;
	for (uint32_t i = 0; i < nn; i++) {
		f->nodes[i].id = kvp_r_u32(&r);
		kvp_r_str(&r, f->nodes[i].addr, KVP_ADDR_MAX);
		f->nodes[i].state = kvp_r_u8(&r);
	}
	size_t nslots = (size_t)ns * f->n;
	if (r.err || (len - r.off) / 16 < nslots)
		return -EBADMSG;
	f->slots = calloc(nslots + 1, sizeof(*f->slots));
	if (!f->slots)
		return -ENOMEM;
	for (size_t i = 0; i < nslots && !r.err; i++) {
		uint32_t id = kvp_r_u32(&r);
		f->slots[i].chunk_id = kvp_r_u64(&r);
		f->slots[i].crc = kvp_r_u32(&r);
		uint32_t j = 0;
		while (j < nn && f->nodes[j].id != id)
			j++;
		if (j == nn)
			return -EBADMSG;
		f->slots[i].node = j;
	}
	return kvp_r_end(&r);
}

static int layout_fetch(struct kvc *c, uint64_t ino, struct kvc_file *f)
{
	uint8_t *pb;
	uint32_t pl;
	if (kvc__prefetched_take(c, ino, &pb, &pl) == 0) {
		int rc = parse_layout(f, pb, pl);
		free(pb);
		if (rc == 0)
			return 0;
		free(f->slots); /* a bad one: ask meta as without it */
		free(f->nodes);
		f->slots = NULL;
		f->nodes = NULL;
	}
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_u64(&w, ino);
	uint8_t *b = NULL;
	uint32_t len = 0;
	int rc = kvc__meta_call(c, KVP_OP_LAYOUT, &w, KVC_META_ATTEMPTS, &b, &len, NULL);
	kvp_w_free(&w);
	if (rc == 0)
		rc = parse_layout(f, b, len);
	free(b);
	return rc;
}

void kvc_file_close(struct kvc_file *f)
{
	if (!f)
		return;
	kvch_fetch_cancel(&f->pf.f);
	free(f->cache[0].buf);
	free(f->cache[1].buf);
	free(f->slots);
	free(f->nodes);
	free(f);
}

static int file_open(struct kvc *c, uint64_t ino, struct kvc_file **out);

int kvc_file_open(struct kvc *c, uint64_t ino, struct kvc_file **out)
{
	uint64_t t0 = kvc__now_ns();
	int rc = file_open(c, ino, out);
	kvc__stage(c, KVC_ST_OPEN, t0);
	return rc;
}

static int file_open(struct kvc *c, uint64_t ino, struct kvc_file **out)
{
	struct kvc_file *f = calloc(1, sizeof(*f));
	if (!f)
		return -ENOMEM;
	f->c = c;
	f->ino = ino;
	f->cache[0].s = f->cache[1].s = -1;
	f->pf.s = -1;
	int rc = layout_fetch(c, ino, f);
	if (rc == 0)
		rc = kvc__codec(c, f->l.k, f->l.m, &f->codec);
	f->refreshed_ms = kvc__now_ms();
	for (uint32_t i = 0; rc == 0 && i < f->nn; i++)
		if (f->nodes[i].state == KVP_NODE_DOWN && f->nodes[i].id) /* 0: no node */
			f->suspect = 1;
	if (rc) {
		kvc_file_close(f);
		return rc;
	}
	kvc__touch(c, ino);
	*out = f;
	return 0;
}

int kvc__file_first_chunk(struct kvc *c, uint64_t ino, uint64_t *chunk_id)
{
	struct kvc_file f = {0};
	int rc = layout_fetch(c, ino, &f);
	if (rc == 0)
		*chunk_id = f.l.nstripes ? f.slots[0].chunk_id : 0;
	free(f.slots);
	free(f.nodes);
	return rc;
}

uint64_t kvc_file_size(const struct kvc_file *f)
{
	return f->l.length;
}

int kvc_file_layout(const struct kvc_file *f, struct kvc_layout_info *info, uint32_t **slots)
{
	info->k = f->l.k;
	info->m = f->l.m;
	info->chunk_size = f->l.chunk_size;
	info->nstripes = (uint32_t)f->l.nstripes;
	if (slots) {
		size_t n = (size_t)f->l.nstripes * f->n;
		uint32_t *v = malloc((n ? n : 1) * sizeof(*v));
		if (!v)
			return -ENOMEM;
		for (size_t i = 0; i < n; i++)
			v[i] = f->nodes[f->slots[i].node].id;
		*slots = v;
	}
	return 0;
}

static int usable(const struct kvc_file *f, const struct fslot *sl)
{
	const struct fnode *nd = &f->nodes[sl->node];
	return nd->state != KVP_NODE_DOWN && !kvc__node_is_bad(f->c, nd->id);
}

/* A GET of sl failed with rc: count a bad CRC; a node that failed goes on the bad list and
 * the file's node table is re-read soon. */
static void get_failed(struct kvc_file *f, const struct fslot *sl, int rc)
{
	if (rc == -EILSEQ)
		atomic_fetch_add(&f->c->st_crc, 1);
	if (kvch_is_transport(rc)) {
		kvc__node_mark_bad(f->c, f->nodes[sl->node].id);
		f->suspect = 1;
	}
	klog_debug("get chunk %llu from %s: %s", (unsigned long long)sl->chunk_id,
		   f->nodes[sl->node].addr, kvp_strerror(rc));
}

/* The stripe reader's view of stripe s: its slots and the client's bad-node list. */
struct sread {
	struct kvc_file *f;
	const struct fslot *ss;
	struct kvch_stripe st;
};

static int sread_usable(void *arg, int i)
{
	struct sread *r = arg;
	return usable(r->f, &r->ss[i]);
}

static void sread_failed(void *arg, int i, int rc)
{
	struct sread *r = arg;
	get_failed(r->f, &r->ss[i], rc);
}

static void sread_init(struct kvc_file *f, uint64_t s, struct sread *r)
{
	memset(r, 0, sizeof(*r));
	r->f = f;
	r->ss = f->slots + s * f->n;
	struct kvch_stripe *st = &r->st;
	st->pool = f->c->pool;
	st->codec = f->codec;
	st->k = f->l.k;
	st->m = f->l.m;
	st->timeout_ms = f->c->read_timeout_ms;
	st->retry_timeout_ms = f->c->timeout_ms;
	st->usable = sread_usable;
	st->failed = sread_failed;
	st->arg = r;
	for (int i = 0; i < f->n; i++) {
		const struct fnode *nd = &f->nodes[r->ss[i].node];
		st->slot[i] = (struct kvch_slot){.addr = nd->id ? nd->addr : NULL,
						 .node_id = nd->id,
						 .chunk_id = r->ss[i].chunk_id,
						 .crc = r->ss[i].crc,
						 .len = kvec_layout_slot_len(&f->l, s, i)};
	}
}

static void sf_cancel(struct sfetch *sf)
{
	kvch_fetch_cancel(&sf->f);
	sf->s = -1;
}

/* Starts the GETs of the data chunks of stripe s that are not empty, on usable nodes. */
static void sf_start_data(struct kvc_file *f, struct sfetch *sf, uint64_t s)
{
	if (sf->s >= 0)
		sf_cancel(sf); /* never drop calls in flight: they hold pool references */
	sf->s = (int64_t)s;
	struct sread r;
	sread_init(f, s, &r);
	kvch_fetch_start(&r.st, &sf->f, (1ull << f->l.k) - 1);
}

/* Reads stripe s whose GETs sf has (maybe) started: data chunk j to data + j*cs, parity i to
 * par + i*cs. direct: the caller's buffer has only the file's bytes, so on any failure return
 * -EAGAIN with *failed set instead of decoding; else decode as needed (par must then hold m
 * chunks and data k full chunks). avoid: chunks known bad from an earlier try. */
static int fetch_stripe(struct kvc_file *f, struct sfetch *sf, uint64_t s, uint8_t *data,
			uint8_t *par, int direct, uint64_t avoid, uint64_t *failed)
{
	int k = f->l.k;
	uint32_t cs = f->l.chunk_size;
	uint8_t *ptr[KVEC_MAX_N] = {0};
	uint64_t want = 0;
	struct sread r;
	sread_init(f, s, &r);
	for (int i = 0; i < f->n; i++) {
		ptr[i] = i < k ? data + (size_t)i * cs : par ? par + (size_t)(i - k) * cs : NULL;
		if (i < k && r.st.slot[i].len)
			want |= 1ull << i;
	}
	uint64_t t0 = kvc__now_ns();
	int rc = kvch_stripe_read(&r.st, &sf->f, ptr, want, avoid, direct, failed);
	kvc__stage(f->c, KVC_ST_STRIPE_GET, t0);
	sf->s = -1;
	if (rc == -EIO)
		klog_warn("file %llu stripe %llu: fewer than %d chunks readable",
			  (unsigned long long)f->ino, (unsigned long long)s, k);
	if (rc == 1)
		atomic_fetch_add(&f->c->st_degraded, 1);
	return rc < 0 ? rc : 0;
}

/* Reads stripe s into a cache entry (evicting the older one) and returns it. have: GETs of s
 * already started by the caller (may be NULL or another stripe's); else the prefetch's. */
static int cache_fill(struct kvc_file *f, uint64_t s, uint64_t avoid, uint8_t **out,
		      struct sfetch *have)
{
	int e = f->cache[0].tick <= f->cache[1].tick ? 0 : 1;
	size_t need = (size_t)f->n * f->l.chunk_size;
	if (!f->cache[e].buf && !(f->cache[e].buf = malloc(need)))
		return -ENOMEM;
	f->cache[e].s = -1;
	struct sfetch local = {.s = -1};
	struct sfetch *sf = &local;
	if (have && have->s == (int64_t)s)
		sf = have;
	else if (f->pf.s == (int64_t)s)
		sf = &f->pf;
	else if (!avoid)
		sf_start_data(f, sf, s);
	uint8_t *b = f->cache[e].buf;
	int rc = fetch_stripe(f, sf, s, b, b + (size_t)f->l.k * f->l.chunk_size, 0, avoid, NULL);
	if (rc)
		return rc;
	f->cache[e].s = (int64_t)s;
	f->cache[e].tick = ++f->tick;
	*out = b;
	return 0;
}

/* Whether stripe s is cached, without making it the most recent. */
static int cache_has(const struct kvc_file *f, uint64_t s)
{
	return f->cache[0].s == (int64_t)s || f->cache[1].s == (int64_t)s;
}

static uint8_t *cache_find(struct kvc_file *f, uint64_t s)
{
	for (int e = 0; e < 2; e++) {
		if (f->cache[e].s == (int64_t)s) {
			f->cache[e].tick = ++f->tick;
			return f->cache[e].buf;
		}
	}
	return NULL;
}

/* Bytes [off, off + len) of one chunk: started, then finished into dst. */
static int range_start(struct kvc_file *f, const struct fslot *sl, uint32_t off, uint32_t len,
		       struct kvch_call *c)
{
	const struct fnode *nd = &f->nodes[sl->node];
	if (nd->id == 0)
		return -ENOENT; /* a slot written degraded: no chunk stored, nothing to ask */
	int rc = kvch_get_start(f->c->pool, nd->addr, sl->chunk_id, off, len, c);
	if (rc)
		get_failed(f, sl, rc);
	return rc;
}

static int range_finish(struct kvc_file *f, const struct fslot *sl, struct kvch_call *c,
			uint32_t len, uint8_t *dst)
{
	int rc = kvch_get_finish(c, f->c->read_timeout_ms, dst, len, NULL);
	if (rc)
		get_failed(f, sl, rc);
	return rc;
}

/* A small read: only the chunk ranges it overlaps, in parallel. Any failure: -EAGAIN. */
static int range_read(struct kvc_file *f, uint64_t s, uint64_t soff, size_t len, uint8_t *out)
{
	uint32_t cs = f->l.chunk_size;
	const struct fslot *ss = f->slots + s * f->n;
	struct kvch_call rpc[KVEC_MAX_K] = {0};
	int j0 = (int)(soff / cs), j1 = (int)((soff + len - 1) / cs), rc = 0;
	uint8_t *dst = out;
	for (int j = j0; j <= j1 && !rc; j++) {
		uint64_t a = j == j0 ? soff % cs : 0;
		uint64_t b = j == j1 ? (soff + len - 1) % cs + 1 : cs;
		if (!usable(f, &ss[j]))
			rc = -EAGAIN;
		else
			rc = range_start(f, &ss[j], (uint32_t)a, (uint32_t)(b - a), &rpc[j]);
		if (!rc) /* received straight into the caller's buffer */
			kvch_get_into(&rpc[j], dst, (uint32_t)(b - a));
		dst += b - a;
	}
	dst = out;
	for (int j = j0; j <= j1; j++) {
		uint64_t a = j == j0 ? soff % cs : 0;
		uint64_t b = j == j1 ? (soff + len - 1) % cs + 1 : cs;
		if (rpc[j].call && range_finish(f, &ss[j], &rpc[j], (uint32_t)(b - a), dst) && !rc)
			rc = -EAGAIN;
		dst += b - a;
	}
	return rc ? -EAGAIN : 0;
}

/* Re-reads the addresses and states of the file's nodes (a node may have come back, or moved
 * to another address). Slots keep their indices into f->nodes. */
static void refresh_nodes(struct kvc_file *f)
{
	struct kvc_file t = {0};
	f->refreshed_ms = kvc__now_ms();
	f->suspect = 0;
	if (layout_fetch(f->c, f->ino, &t) == 0) {
		for (uint32_t i = 0; i < f->nn; i++) {
			for (uint32_t j = 0; j < t.nn; j++) {
				if (t.nodes[j].id != f->nodes[i].id)
					continue;
				memcpy(f->nodes[i].addr, t.nodes[j].addr, KVP_ADDR_MAX);
				f->nodes[i].state = t.nodes[j].state;
				if (t.nodes[j].state == KVP_NODE_DOWN && t.nodes[j].id)
					f->suspect = 1;
			}
		}
	}
	free(t.slots);
	free(t.nodes);
}

static ssize_t pread_once(struct kvc_file *f, void *buf, size_t len, uint64_t off);

ssize_t kvc_pread(struct kvc_file *f, void *buf, size_t len, uint64_t off)
{
	uint64_t t0 = kvc__now_ns();
	if (f->suspect && kvc__now_ms() - f->refreshed_ms > 5000)
		refresh_nodes(f);
	ssize_t n = pread_once(f, buf, len, off);
	if (n == -EIO && kvc__now_ms() - f->refreshed_ms > 500) {
		/* More than m chunks unreadable with what we knew: maybe nodes moved. */
		refresh_nodes(f);
		n = pread_once(f, buf, len, off);
	}
	kvc__stage(f->c, KVC_ST_PREAD, t0);
	return n;
}

static ssize_t pread_once(struct kvc_file *f, void *buf, size_t len, uint64_t off)
{
	uint64_t size = f->l.length;
	if (off >= size || len == 0)
		return 0;
	if (len > size - off)
		len = (size_t)(size - off);
	if (len > SSIZE_MAX)
		len = SSIZE_MAX;
	uint64_t sb = kvec_layout_stripe_bytes(&f->l);
	int seq = off == f->next_off;
	uint8_t *out = buf;
	size_t done = 0;
	int rc = 0;
	/* next: the GETs of the stripe after the one being read, when this read needs it too,
	 * started before the current one is waited for (two stripes on the wire). */
	struct sfetch next = {.s = -1};
	while (done < len && rc == 0) {
		uint64_t pos = off + done, s = pos / sb, soff = pos % sb;
		uint64_t sl = size - s * sb < sb ? size - s * sb : sb; /* file bytes in stripe */
		size_t take = len - done < sl - soff ? len - done : (size_t)(sl - soff);
		uint8_t *cb = cache_find(f, s);
		if (f->pf.s >= 0 && f->pf.s != (int64_t)s && !cb)
			sf_cancel(&f->pf);
		struct sfetch cur = {.s = -1};
		if (next.s == (int64_t)s) { /* its GETs move to cur */
			cur = next;
			next = (struct sfetch){.s = -1};
		} else if (f->pf.s == (int64_t)s) {
			cur = f->pf;
			f->pf = (struct sfetch){.s = -1};
		}
		uint64_t nx = s + 1;
		int want_next = !cb && nx < f->l.nstripes && nx * sb < off + len && next.s < 0 &&
				!cache_has(f, nx);
		if (!cb && soff == 0 && take == sl) {
			/* The caller wants the whole stripe: straight into its buffer, with the
			 * next stripe's GETs already on the wire. */
			if (cur.s != (int64_t)s)
				sf_start_data(f, &cur, s);
			if (want_next)
				sf_start_data(f, &next, nx);
			uint64_t failed = 0;
			rc = fetch_stripe(f, &cur, s, out + done, NULL, 1, 0, &failed);
			if (rc == -EAGAIN && (rc = cache_fill(f, s, failed, &cb, NULL)) == 0)
				memcpy(out + done, cb, take);
		} else if (cb || cur.s == (int64_t)s || seq || take * 4 >= sl) {
			if (!cb) {
				if (cur.s != (int64_t)s)
					sf_start_data(f, &cur, s);
				if (want_next)
					sf_start_data(f, &next, nx);
				rc = cache_fill(f, s, 0, &cb, &cur);
			}
			if (rc == 0)
				memcpy(out + done, cb + soff, take);
		} else if (range_read(f, s, soff, take, out + done)) {
			if ((rc = cache_fill(f, s, 0, &cb, NULL)) == 0)
				memcpy(out + done, cb + soff, take);
		}
		if (cur.s >= 0)
			sf_cancel(&cur); /* not consumed (an error before its wait) */
		done += take;
	}
	sf_cancel(&next);
	if (rc)
		return rc;
	f->next_off = off + len;
	/* A sequential reader: have the next stripe it has not got on its way while it uses
	 * this one (the one holding off + len, or the one after when that is cached). Not at
	 * the end of the file: the stripe holding the end is the one just read (a 2 MiB block
	 * ends inside its 2080 KiB stripe), and fetching it again doubled every whole-file
	 * read's GETs, answers thrown away at close. */
	uint64_t ns = (off + len) / sb;
	if (ns < f->l.nstripes && cache_has(f, ns))
		ns++;
	if (seq && off + len < size && ns < f->l.nstripes && f->pf.s < 0) {
		sf_start_data(f, &f->pf, ns);
		atomic_fetch_add(&f->c->st_prefetched, 1);
	}
	atomic_fetch_add(&f->c->st_read, len);
	return (ssize_t)len;
}

int kvc_file_prefetch(struct kvc_file *f, uint64_t off)
{
	if (off >= f->l.length)
		return -EINVAL;
	uint64_t s = off / kvec_layout_stripe_bytes(&f->l);
	if (f->pf.s == (int64_t)s || cache_has(f, s))
		return 0;
	sf_start_data(f, &f->pf, s);
	atomic_fetch_add(&f->c->st_prefetched, 1);
	return 0;
}

int kvc_get(struct kvc *c, const char *path, void **buf, size_t *len)
{
	struct kvp_attr a;
	int rc = kvc_resolve(c, path, &a);
	if (rc)
		return rc;
	if (!S_ISREG(a.mode))
		return -EISDIR;
	struct kvc_file *f;
	if ((rc = kvc_file_open(c, a.ino, &f)))
		return rc;
	uint64_t size = kvc_file_size(f);
	uint8_t *b = malloc(size ? size : 1);
	ssize_t n = b ? kvc_pread(f, b, size, 0) : -ENOMEM;
	kvc_file_close(f);
	if (n < 0 || (uint64_t)n != size) {
		free(b);
		return n < 0 ? (int)n : -EIO;
	}
	*buf = b;
	*len = size;
	return 0;
}
