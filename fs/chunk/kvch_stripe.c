/* kvch: the parallel stripe read. The data chunks first (a healthy stripe never touches
 * parity); any that is missing, late or corrupt: parity, then the rest, until k chunks are
 * present; then one patient retry of the merely slow ones; then decode. Used by the client's
 * reads and by meta's repair rebuild. */
#include "kvch.h"

#include <errno.h>
#include <string.h>

static int usable(const struct kvch_stripe *st, int i)
{
	return !st->usable || st->usable(st->arg, i);
}

static void failed(const struct kvch_stripe *st, int i, int rc)
{
	if (st->failed)
		st->failed(st->arg, i, rc);
}

static int popcount(uint64_t v)
{
	return __builtin_popcountll(v);
}

/* Starts the whole-chunk GET of chunk i. A slot with no node stores nothing: -ENOENT. */
static int get_start(const struct kvch_stripe *st, int i, struct kvch_call *c)
{
	const struct kvch_slot *sl = &st->slot[i];
	if (sl->node_id == 0 || !sl->addr)
		return -ENOENT; /* written degraded: nothing to ask */
	int rc = kvch_get_start(st->pool, sl->addr, sl->chunk_id, 0, sl->len, c);
	if (rc)
		failed(st, i, rc);
	return rc;
}

static int get_finish(const struct kvch_stripe *st, int i, struct kvch_call *c, uint8_t *dst,
		      int timeout_ms)
{
	const struct kvch_slot *sl = &st->slot[i];
	int rc = kvch_get_finish(c, timeout_ms, dst, sl->len, &sl->crc);
	if (rc)
		failed(st, i, rc);
	return rc;
}

/* Points every GET of `which` at its chunk's place before waiting on any: they arrive in
 * parallel, and one not yet pointed would be received into a fresh buffer and copied. */
static void into_all(const struct kvch_stripe *st, struct kvch_fetch *f, uint8_t *const *ptr,
		     uint64_t which)
{
	for (int i = 0; i < st->k + st->m; i++)
		if ((which >> i) & 1 && ptr[i] && f->call[i].call && !f->call[i].into)
			kvch_get_into(&f->call[i], ptr[i], st->slot[i].len);
}

void kvch_fetch_start(const struct kvch_stripe *st, struct kvch_fetch *f, uint64_t which)
{
	for (int i = 0; i < st->k + st->m; i++)
		if ((which >> i) & 1 && !((f->started >> i) & 1) && st->slot[i].len &&
		    usable(st, i) && get_start(st, i, &f->call[i]) == 0)
			f->started |= 1ull << i;
}

void kvch_fetch_cancel(struct kvch_fetch *f)
{
	for (int i = 0; i < KVEC_MAX_N; i++)
		kvch_cancel(&f->call[i]);
	f->started = 0;
}

/* Gathers chunks until k are present: parity first, then data not yet tried; on the first
 * pass only usable nodes. Updates *present, *tried, *slow. */
static void gather(const struct kvch_stripe *st, struct kvch_fetch *f, uint8_t *const *ptr,
		   uint64_t *present, uint64_t *tried, uint64_t *slow)
{
	int k = st->k, n = st->k + st->m;
	while (popcount(*present) < k) {
		uint64_t batch = 0;
		int need = k - popcount(*present);
		/* need counts only GETs started: a chunk already present (an empty one of the
		 * last stripe) or one whose GET cannot start (its node just died) must not use up
		 * a turn, or the round ends with parity never asked: -EIO with m nodes down. */
		for (int pass = 0; pass < 2 && need > 0; pass++) {
			for (int i = k; i < n + k && need > 0; i++) {
				int c = i < n ? i : i - n; /* parity, then data */
				if ((*tried >> c) & 1 || (*present >> c) & 1 ||
				    (pass == 0 && !usable(st, c)))
					continue;
				*tried |= 1ull << c;
				if (st->slot[c].len == 0) {
					*present |= 1ull << c;
					need--;
				} else if (get_start(st, c, &f->call[c]) == 0) {
					batch |= 1ull << c;
					need--;
				}
			}
		}
		if (!batch && popcount(*present) < k)
			break;
		into_all(st, f, ptr, batch);
		for (int i = 0; i < n; i++) {
			if (!((batch >> i) & 1))
				continue;
			int rc = get_finish(st, i, &f->call[i], ptr[i], st->timeout_ms);
			if (rc == 0)
				*present |= 1ull << i;
			else if (rc == -ETIMEDOUT)
				*slow |= 1ull << i;
		}
	}
}

int kvch_stripe_read(const struct kvch_stripe *st, struct kvch_fetch *f, uint8_t *const *ptr,
		     uint64_t want, uint64_t avoid, int direct, uint64_t *failed_out)
{
	int k = st->k, n = st->k + st->m;
	uint64_t present = 0, asked = f->started, tried = f->started | avoid;
	for (int i = 0; i < n; i++)
		if (st->slot[i].len == 0)
			present |= 1ull << i; /* empty: known zeros */
	uint64_t slow = 0; /* timed out: maybe only overloaded, worth a patient last try */
	into_all(st, f, ptr, asked);
	for (int i = 0; i < n; i++) {
		if (!((asked >> i) & 1))
			continue;
		int rc = get_finish(st, i, &f->call[i], ptr[i], st->timeout_ms);
		if (rc == 0)
			present |= 1ull << i;
		else if (rc == -ETIMEDOUT)
			slow |= 1ull << i;
	}
	f->started = 0;
	uint64_t missing = want & ~present;
	if (!missing)
		return 0;
	if (direct) {
		/* Only chunks that were asked and failed: one never asked (its node on the bad
		 * list) must stay a candidate of the degraded read; slow ones may be asked again.
		 */
		*failed_out = missing & (asked | avoid) & ~slow;
		return -EAGAIN;
	}
	gather(st, f, ptr, &present, &tried, &slow);
	/* Still short: ask the nodes that were only slow again, with the patient timeout,
	 * rather than fail a read because a node was busy for longer than the short timeout. */
	if (popcount(present) < k && slow && st->retry_timeout_ms > 0) {
		uint64_t batch = 0;
		for (int i = 0; i < n; i++)
			if ((slow >> i) & 1 && get_start(st, i, &f->call[i]) == 0)
				batch |= 1ull << i;
		into_all(st, f, ptr, batch);
		for (int i = 0; i < n; i++)
			if ((batch >> i) & 1 &&
			    get_finish(st, i, &f->call[i], ptr[i], st->retry_timeout_ms) == 0)
				present |= 1ull << i;
	}
	if (popcount(present) < k)
		return -EIO;
	uint32_t plen = st->slot[0].len;
	for (int i = 0; i < k; i++)
		if ((present >> i) & 1 && st->slot[i].len < plen)
			memset(ptr[i] + st->slot[i].len, 0, plen - st->slot[i].len);
	int rc = kvec_reconstruct(st->codec, ptr, present, missing, plen);
	return rc ? rc : 1;
}
