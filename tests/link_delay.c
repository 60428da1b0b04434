/* link_delay — frames between two TAP devices, delayed (and rate limited) by one thread. */
#include "link_delay.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

/* A slot holds one frame: the TAP devices have MTU 1500 and no offloads, so the kernel
 * segments before they see a packet (1514 bytes, 1518 with a VLAN tag). A read that fills
 * the slot was truncated: dropped. */
#define SLOT	     2048
#define MAX_QUEUE_NS 2000000000LL /* 2 s waiting for the wire, as tbf's latency 2s */

struct slot {
	int64_t due_ns; /* when it leaves */
	uint32_t len;
	unsigned char b[SLOT];
};

/* One direction: read from in, written to out. Only the delayer's thread touches it, except
 * the counters (atomics, read by lkd_counts). */
struct dir {
	int in, out;
	struct slot *ring; /* LKD_QUEUE slots; head .. head+count-1 waiting, oldest first */
	unsigned head, count;
	int64_t wire_free_ns; /* when the last queued frame is off the (rate-limited) wire */
	atomic_uint_fast64_t passed, dropped;
};

struct lkd {
	pthread_t t;
	int stop_fd; /* eventfd: lkd_stop writes it */
	int64_t delay_ns;
	double ns_per_byte; /* 0: no rate limit */
	struct dir d[2];
};

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int lkd_tap_open(const char *name, int *fd)
{
	if (strlen(name) >= IFNAMSIZ)
		return -EINVAL;
	int f = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
	if (f < 0)
		return -errno;
	struct ifreq ifr;
	memset(&ifr, 0, sizeof(ifr));
	ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
	memcpy(ifr.ifr_name, name, strlen(name));
	if (ioctl(f, TUNSETIFF, &ifr) < 0) {
		int e = -errno;
		close(f);
		return e;
	}
	*fd = f;
	return 0;
}

/* Reads every frame waiting on dir->in, each stamped with when it leaves. */
static void dir_read(struct lkd *l, struct dir *d)
{
	for (;;) {
		struct slot scratch, *s = &scratch;
		if (d->count < LKD_QUEUE)
			s = &d->ring[(d->head + d->count) % LKD_QUEUE];
		ssize_t n = read(d->in, s->b, SLOT);
		if (n <= 0)
			return; /* EAGAIN: drained (an error: the device is going) */
		int64_t now = now_ns();
		int64_t start = d->wire_free_ns > now ? d->wire_free_ns : now;
		if (s == &scratch || n >= SLOT || start - now > MAX_QUEUE_NS) {
			atomic_fetch_add(&d->dropped, 1);
			continue;
		}
		d->wire_free_ns = start + (int64_t)(l->ns_per_byte * (double)n);
		s->due_ns = d->wire_free_ns + l->delay_ns;
		s->len = (uint32_t)n;
		d->count++;
	}
}

/* Writes every frame whose time has come; returns the next one's due time (INT64_MAX: none). */
static int64_t dir_send(struct dir *d, int64_t now)
{
	while (d->count) {
		struct slot *s = &d->ring[d->head];
		if (s->due_ns > now)
			return s->due_ns;
		/* A TAP write injects the frame as received on that device; it does not block. A
		 * failed one is a lost frame, as on a wire. */
		if (write(d->out, s->b, s->len) == (ssize_t)s->len)
			atomic_fetch_add(&d->passed, 1);
		else
			atomic_fetch_add(&d->dropped, 1);
		d->head = (d->head + 1) % LKD_QUEUE;
		d->count--;
	}
	return INT64_MAX;
}

static void *lkd_main(void *arg)
{
	struct lkd *l = arg;
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL); /* the test's signals are for its main thread */
	for (;;) {
		int64_t now = now_ns();
		int64_t next = dir_send(&l->d[0], now), n1 = dir_send(&l->d[1], now);
		next = n1 < next ? n1 : next;
		struct pollfd p[3] = {{.fd = l->d[0].in, .events = POLLIN},
				      {.fd = l->d[1].in, .events = POLLIN},
				      {.fd = l->stop_fd, .events = POLLIN}};
		struct timespec ts, *tp = NULL;
		if (next != INT64_MAX) {
			int64_t w = next - now_ns();
			w = w < 0 ? 0 : w;
			ts.tv_sec = (time_t)(w / 1000000000LL);
			ts.tv_nsec = (long)(w % 1000000000LL);
			tp = &ts;
		}
		if (ppoll(p, 3, tp, NULL) < 0 && errno != EINTR)
			break;
		if (p[2].revents)
			break;
		for (int i = 0; i < 2; i++)
			if (p[i].revents & POLLIN)
				dir_read(l, &l->d[i]);
	}
	return NULL;
}

int lkd_start(int a, int b, double delay_ms, double rate_bps, struct lkd **out)
{
	struct lkd *l = calloc(1, sizeof(*l));
	int rc = -ENOMEM;
	if (!l)
		goto fail;
	l->stop_fd = -1;
	l->delay_ns = (int64_t)(delay_ms * 1e6);
	l->ns_per_byte = rate_bps > 0 ? 8e9 / rate_bps : 0;
	l->d[0].in = a, l->d[0].out = b;
	l->d[1].in = b, l->d[1].out = a;
	for (int i = 0; i < 2; i++)
		if (!(l->d[i].ring = malloc(sizeof(struct slot) * LKD_QUEUE)))
			goto fail;
	if ((l->stop_fd = eventfd(0, EFD_CLOEXEC)) < 0) {
		rc = -errno;
		goto fail;
	}
	if ((rc = -pthread_create(&l->t, NULL, lkd_main, l)))
		goto fail;
	*out = l;
	return 0;
fail:
	if (l) {
		if (l->stop_fd >= 0)
			close(l->stop_fd);
		free(l->d[0].ring);
		free(l->d[1].ring);
		free(l);
	}
	close(a);
	close(b);
	return rc;
}

void lkd_counts(const struct lkd *d, uint64_t *passed, uint64_t *dropped)
{
	*passed = atomic_load(&d->d[0].passed) + atomic_load(&d->d[1].passed);
	*dropped = atomic_load(&d->d[0].dropped) + atomic_load(&d->d[1].dropped);
}

void lkd_stop(struct lkd *l)
{
	if (!l)
		return;
	uint64_t one = 1;
	if (write(l->stop_fd, &one, sizeof(one)) == sizeof(one))
		pthread_join(l->t, NULL);
	/* else the thread cannot be told to stop: leak it rather than free what it uses */
	else
		return;
	close(l->stop_fd);
	close(l->d[0].in);
	close(l->d[1].in);
	free(l->d[0].ring);
	free(l->d[1].ring);
	free(l);
}
