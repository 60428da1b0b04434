/* Access-time batching for retention: opens are recorded in memory and sent to meta as one
 * TOUCH at most every touch interval, so reads never cost a metadata write each. */
#include "kvc_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t wall_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

void kvc_set_touch_interval(struct kvc *c, int ms)
{
	c->touch_interval_ms = ms;
}

/* Takes the batch out under mu and sends it; on failure what was taken is put back as far
 * as there is room (access times are a hint: losing some only makes files look older). */
static int flush(struct kvc *c)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	pthread_mutex_lock(&c->mu);
	uint32_t n = c->ntouch;
	kvp_w_u32(&w, n);
	for (uint32_t i = 0; i < n; i++) {
		kvp_w_u64(&w, c->touch[i].ino);
		kvp_w_i64(&w, c->touch[i].atime_ns);
	}
	c->ntouch = 0;
	c->touch_last_ms = kvc__now_ms();
	pthread_mutex_unlock(&c->mu);
	if (n == 0) {
		kvp_w_free(&w);
		return 0;
	}
	int rc = kvc__meta_call(c, KVP_OP_TOUCH, &w, 2, NULL, NULL, NULL);
	if (rc) {
		pthread_mutex_lock(&c->mu);
		for (uint32_t i = 0; i < n && c->ntouch < KVC_TOUCH_MAX; i++) {
			const uint8_t *p = w.p + 4 + (size_t)i * 16;
			uint64_t ino = 0, at = 0;
			for (int b = 7; b >= 0; b--) {
				ino = ino << 8 | p[b];
				at = at << 8 | p[8 + b];
			}
			c->touch[c->ntouch].ino = ino;
			c->touch[c->ntouch++].atime_ns = (int64_t)at;
		}
		pthread_mutex_unlock(&c->mu);
	}
	kvp_w_free(&w);
	return rc;
}

int kvc_touch_flush(struct kvc *c)
{
	return flush(c);
}

void kvc__touch(struct kvc *c, uint64_t ino)
{
	if (c->touch_interval_ms < 0)
		return;
	int64_t iv = c->touch_interval_ms ? c->touch_interval_ms : KVC_TOUCH_MS;
	int64_t now = kvc__now_ms(), at = wall_ns();
	pthread_mutex_lock(&c->mu);
	uint32_t i = 0;
	while (i < c->ntouch && c->touch[i].ino != ino)
		i++;
	if (i == c->ntouch && c->ntouch < KVC_TOUCH_MAX)
		c->ntouch++;
	if (i < c->ntouch) {
		c->touch[i].ino = ino;
		c->touch[i].atime_ns = at;
	}
	if (c->touch_last_ms == 0)
		c->touch_last_ms = now; /* the first interval starts at the first access */
	int due = c->ntouch == KVC_TOUCH_MAX || now - c->touch_last_ms >= iv;
	pthread_mutex_unlock(&c->mu);
	if (due)
		flush(c);
}

int kvc_admin(struct kvc *c, uint16_t op, const void *body, size_t len, uint8_t **rb, uint32_t *rl)
{
	struct kvp_wbuf w;
	kvp_w_init(&w);
	if (len)
		kvp_w_bytes(&w, body, len);
	int rc = kvc__meta_call(c, op, &w, 2, rb, rl, NULL);
	kvp_w_free(&w);
	return rc;
}
