/* The inode table: every node id the kernel holds a reference to (lookup count), with the
 * metadata inode it stands for and the name it was last seen under. The name is what an
 * open(O_TRUNC) of a committed file needs to create its replacement; the mapping node id ->
 * inode is what keeps a new file's temporary id (and a replaced file's old id) working after a
 * commit. One mutex; chained hash on the node id, grown at load 1. It also
 * owns the release of the writer references it and the handles hold (mnt_wfile_put). */
#include "ktime.h"
#include "mount.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct ient {
	struct ient *next;
	uint64_t nodeid, ino, nlookup, parent;
	uint32_t mode;
	int replacing, replaced, readers, known;
	int paged;	      /* a page-cache read open happened since the kernel's first lookup */
	struct kvp_attr old;  /* replaced: the file this node id was */
	struct kvp_attr last; /* known: the attributes last answered for it */
	struct mnt_wfile *wf; /* a new file's writer (referenced), or NULL */
	char name[KVP_NAME_MAX + 1];
};

struct mnt_itab {
	pthread_mutex_t lock;
	pthread_cond_t readers_gone; /* lock; broadcast when an entry's readers drop to 0 */
	struct ient **b;	     /* lock */
	size_t nb, n;		     /* lock */
};

static size_t slot(const struct mnt_itab *t, uint64_t id)
{
	id ^= id >> 33;
	id *= 0xff51afd7ed558ccdull;
	id ^= id >> 33;
	return (size_t)(id & (t->nb - 1));
}

int mnt_itab_create(struct mnt_itab **out)
{
	struct mnt_itab *t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->nb = 1024;
	t->b = calloc(t->nb, sizeof(*t->b));
	if (!t->b) {
		free(t);
		return -ENOMEM;
	}
	pthread_mutex_init(&t->lock, NULL);
	kvfs_cond_init_mono(&t->readers_gone);
	*out = t;
	return 0;
}

void mnt_itab_destroy(struct mnt_itab *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->nb; i++)
		for (struct ient *e = t->b[i], *nx; e; e = nx) {
			nx = e->next;
			if (e->wf)
				mnt_wfile_put(e->wf);
			free(e);
		}
	free(t->b);
	pthread_cond_destroy(&t->readers_gone);
	pthread_mutex_destroy(&t->lock);
	free(t);
}

static struct ient *find(struct mnt_itab *t, uint64_t nodeid)
{
	for (struct ient *e = t->b[slot(t, nodeid)]; e; e = e->next)
		if (e->nodeid == nodeid)
			return e;
	return NULL;
}

static void grow(struct mnt_itab *t)
{
	size_t nb = t->nb * 2;
	struct ient **b = calloc(nb, sizeof(*b));
	if (!b)
		return; /* keep the longer chains */
	struct ient **old = t->b;
	size_t onb = t->nb;
	t->b = b;
	t->nb = nb;
	for (size_t i = 0; i < onb; i++)
		for (struct ient *e = old[i], *nx; e; e = nx) {
			nx = e->next;
			size_t s = slot(t, e->nodeid);
			e->next = b[s];
			b[s] = e;
		}
	free(old);
}

int mnt_itab_ref(struct mnt_itab *t, uint64_t nodeid, uint64_t ino, uint32_t mode, uint64_t parent,
		 const char *name, struct mnt_wfile *wf)
{
	pthread_mutex_lock(&t->lock);
	struct ient *e = find(t, nodeid);
	if (!e) {
		e = calloc(1, sizeof(*e));
		if (!e) {
			pthread_mutex_unlock(&t->lock);
			return -ENOMEM;
		}
		e->nodeid = nodeid;
		e->ino = ino;
		if (wf) {
			atomic_fetch_add(&wf->refs, 1);
			e->wf = wf;
		}
		size_t s = slot(t, nodeid);
		e->next = t->b[s];
		t->b[s] = e;
		if (++t->n > t->nb)
			grow(t);
	}
	e->nlookup++;
	if (mode)
		e->mode = mode;
	/* A lookup of a replaced file's old id cannot happen (meta answers with the new inode),
	 * so a known entry keeps its mapping; only the name is refreshed. */
	if (name) {
		e->parent = parent;
		snprintf(e->name, sizeof(e->name), "%s", name);
	}
	pthread_mutex_unlock(&t->lock);
	return 0;
}

void mnt_itab_forget(struct mnt_itab *t, uint64_t nodeid, uint64_t n)
{
	struct mnt_wfile *drop = NULL;
	pthread_mutex_lock(&t->lock);
	struct ient **pp = &t->b[slot(t, nodeid)];
	while (*pp && (*pp)->nodeid != nodeid)
		pp = &(*pp)->next;
	struct ient *e = *pp;
	if (e) {
		e->nlookup = e->nlookup > n ? e->nlookup - n : 0;
		if (e->nlookup == 0) {
			*pp = e->next;
			t->n--;
			drop = e->wf;
			free(e);
		}
	}
	pthread_mutex_unlock(&t->lock);
	if (drop)
		mnt_wfile_put(drop);
}

int mnt_itab_get(struct mnt_itab *t, uint64_t nodeid, struct mnt_inode_info *out)
{
	memset(out, 0, sizeof(*out));
	pthread_mutex_lock(&t->lock);
	struct ient *e = find(t, nodeid);
	if (e) {
		out->ino = e->ino;
		out->mode = e->mode;
		out->parent = e->parent;
		memcpy(out->name, e->name, sizeof(out->name));
		out->redirected = e->ino != nodeid;
		out->replacing = e->replacing;
		out->cached_readers = e->readers;
		out->replaced = e->replaced;
		out->old = e->old;
		out->known = e->known;
		out->last = e->last;
		if (e->wf) {
			atomic_fetch_add(&e->wf->refs, 1);
			out->wf = e->wf;
		}
	}
	pthread_mutex_unlock(&t->lock);
	return e ? 0 : -ENOENT;
}

void mnt_itab_set_ino(struct mnt_itab *t, uint64_t nodeid, uint64_t ino)
{
	pthread_mutex_lock(&t->lock);
	struct ient *e = find(t, nodeid);
	if (e)
		e->ino = ino;
	pthread_mutex_unlock(&t->lock);
}

/* Adds delta to one of an entry's counters (never below 0); no-op without an entry. */
static void count_add(struct mnt_itab *t, uint64_t nodeid, int readers, int delta)
{
	pthread_mutex_lock(&t->lock);
	struct ient *e = find(t, nodeid);
	int *c = e ? (readers ? &e->readers : &e->replacing) : NULL;
	if (c && *c + delta >= 0)
		*c += delta;
	if (c && readers && *c == 0)
		pthread_cond_broadcast(&t->readers_gone);
	pthread_mutex_unlock(&t->lock);
}

int mnt_itab_wait_readers(struct mnt_itab *t, uint64_t nodeid, int timeout_ms)
{
	struct timespec until;
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += timeout_ms / 1000;
	until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&t->lock);
	struct ient *e;
	int rc = 0;
	while ((e = find(t, nodeid)) && e->readers > 0 && rc == 0)
		rc = pthread_cond_timedwait(&t->readers_gone, &t->lock, &until);
	int left = e ? e->readers : 0;
	pthread_mutex_unlock(&t->lock);
	return left;
}

void mnt_itab_replacing(struct mnt_itab *t, uint64_t nodeid, int delta)
{
	count_add(t, nodeid, 0, delta);
}

void mnt_itab_readers(struct mnt_itab *t, uint64_t nodeid, int delta)
{
	count_add(t, nodeid, 1, delta);
}

int mnt_itab_is_replacing(struct mnt_itab *t, uint64_t nodeid)
{
	pthread_mutex_lock(&t->lock);
	struct ient *e = find(t, nodeid);
	int r = e && e->replacing > 0;
	pthread_mutex_unlock(&t->lock);
	return r;
}

int mnt_itab_reader_open(struct mnt_itab *t, uint64_t nodeid)
{
	pthread_mutex_lock(&t->lock);
	struct ient *e = find(t, nodeid);
	int cached = !e || e->replacing == 0;
	if (e && cached)
		e->readers++;
	pthread_mutex_unlock(&t->lock);
	return cached;
}

int mnt_itab_first_read(struct mnt_itab *t, uint64_t nodeid)
{
	pthread_mutex_lock(&t->lock);
	struct ient *e = find(t, nodeid);
	int first = !e || !e->paged;
	if (e)
		e->paged = 1;
	pthread_mutex_unlock(&t->lock);
	return first;
}

void mnt_itab_set_replaced(struct mnt_itab *t, uint64_t nodeid, uint64_t ino,
			   const struct kvp_attr *old)
{
	pthread_mutex_lock(&t->lock);
	struct ient *e = find(t, nodeid);
	if (e) {
		e->ino = ino;
		/* The first replacement's "old" is what the kernel's inode still describes. */
		if (!e->replaced)
			e->old = *old;
		e->replaced = 1;
	}
	pthread_mutex_unlock(&t->lock);
}

void mnt_itab_set_attr(struct mnt_itab *t, uint64_t nodeid, const struct kvp_attr *a)
{
	pthread_mutex_lock(&t->lock);
	struct ient *e = find(t, nodeid);
	if (e && e->ino == a->ino) {
		e->last = *a;
		e->known = 1;
	}
	pthread_mutex_unlock(&t->lock);
}

void mnt_itab_rename(struct mnt_itab *t, uint64_t ino, uint64_t newparent, const char *newname)
{
	pthread_mutex_lock(&t->lock);
	struct ient *e = find(t, ino);
	if (e && e->ino == ino) {
		e->parent = newparent;
		snprintf(e->name, sizeof(e->name), "%s", newname);
	}
	pthread_mutex_unlock(&t->lock);
}

size_t mnt_itab_count(struct mnt_itab *t)
{
	pthread_mutex_lock(&t->lock);
	size_t n = t->n;
	pthread_mutex_unlock(&t->lock);
	return n;
}

void mnt_wfile_put(struct mnt_wfile *wf)
{
	if (!wf || atomic_fetch_sub(&wf->refs, 1) != 1)
		return;
	if (wf->w)
		kvc_abort(wf->w);
	if (wf->repl_itab)
		mnt_itab_replacing(wf->repl_itab, wf->nodeid, -1);
	pthread_mutex_destroy(&wf->lock);
	free(wf);
}
