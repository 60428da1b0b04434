/* Attacks on the cluster transport, against real daemons (meta + nodes from tests/harness.h):
 * a TCP relay without the secret forwards a real handshake, then injects a frame, flips a byte,
 * replays or reorders records; a peer trickles its handshake a byte a second; 450 silent
 * connections hold a daemon limited to 400 descriptors. Each attack must be refused with the
 * connection closed and nothing applied, and service must be back within 5 s of the attacker
 * leaving. On the plaintext transport with a per-read() handshake timeout and an accept loop
 * that only reaped after a successful accept, every one of these succeeded.
 *
 * Uses only the client API (kvp_client_open / kvp_call) and raw sockets, so the same file
 * shows the attacks working on the old transport. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "kvp.h"
#include "prom_parse.h"

#define TMO 3000

static struct kvh_cluster g_cl;
static int g_up;

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- a relay between one client and one daemon, with a hand on the client's bytes ---- */

enum relay_mode {
	R_PASS,	       /* forward as is */
	R_FLIP_NEXT,   /* flip one byte of the next client chunk */
	R_RECORD_NEXT, /* forward the next client chunk and keep a copy */
	R_HOLD_NEXT,   /* keep the next client chunk; send it after the one that follows */
};

struct relay {
	int lfd, cfd, ufd;
	uint16_t port;
	char addr[KVP_ADDR_MAX], upstream[KVP_ADDR_MAX];
	pthread_t th;
	pthread_mutex_t mu; /* protects mode, rec, held and writes to ufd */
	enum relay_mode mode;
	uint8_t rec[65536], held[65536];
	size_t rec_len, held_len;
	atomic_int up_closed; /* the daemon closed its side */
	atomic_int stop;
};

static int write_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n) {
		ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

/* One chunk from the client, through the mode. Called with r->mu held. */
static void relay_client_chunk(struct relay *r, uint8_t *b, size_t n)
{
	switch (r->mode) {
	case R_FLIP_NEXT:
		/* 5 from the end: in a TLS record, inside its tag; in a plaintext MKDIR, the last
		 * character of the name (then mode, u32), so there the frame still parses. */
		b[n > 5 ? n - 5 : 0] ^= 1;
		r->mode = R_PASS;
		break;
	case R_RECORD_NEXT:
		memcpy(r->rec, b, n);
		r->rec_len = n;
		r->mode = R_PASS;
		break;
	case R_HOLD_NEXT:
		if (!r->held_len) {
			memcpy(r->held, b, n);
			r->held_len = n;
			return;
		}
		write_all(r->ufd, b, n);
		write_all(r->ufd, r->held, r->held_len);
		r->held_len = 0;
		r->mode = R_PASS;
		return;
	case R_PASS:
		break;
	}
	write_all(r->ufd, b, n);
}

static void *relay_main(void *arg)
{
	struct relay *r = arg;
	static uint8_t buf[65536];
	struct pollfd p = {.fd = r->lfd, .events = POLLIN};
	while (!atomic_load(&r->stop) && poll(&p, 1, 100) == 0)
		;
	if (atomic_load(&r->stop))
		return NULL;
	r->cfd = accept(r->lfd, NULL, NULL);
	r->ufd = kvp_connect(r->upstream, TMO);
	if (r->cfd < 0 || r->ufd < 0) {
		atomic_store(&r->up_closed, 1);
		return NULL;
	}
	while (!atomic_load(&r->stop)) {
		struct pollfd f[2] = {{.fd = r->cfd, .events = POLLIN},
				      {.fd = r->ufd, .events = POLLIN}};
		if (poll(f, 2, 100) <= 0)
			continue;
		if (f[1].revents) {
			ssize_t n = recv(r->ufd, buf, sizeof(buf), 0);
			if (n <= 0) {
				atomic_store(&r->up_closed, 1);
				shutdown(r->cfd, SHUT_RDWR);
				break;
			}
			write_all(r->cfd, buf, (size_t)n);
		}
		if (f[0].revents) {
			ssize_t n = recv(r->cfd, buf, sizeof(buf), 0);
			if (n <= 0) {
				shutdown(r->ufd, SHUT_WR);
				break;
			}
			pthread_mutex_lock(&r->mu);
			relay_client_chunk(r, buf, (size_t)n);
			pthread_mutex_unlock(&r->mu);
		}
	}
	return NULL;
}

static struct relay *relay_start(const char *upstream)
{
	struct relay *r = calloc(1, sizeof(*r));
	assert_non_null(r);
	snprintf(r->upstream, sizeof(r->upstream), "%s", upstream);
	r->cfd = r->ufd = -1;
	pthread_mutex_init(&r->mu, NULL);
	r->lfd = kvp_listen("127.0.0.1", 0, &r->port);
	assert_true(r->lfd >= 0);
	snprintf(r->addr, sizeof(r->addr), "127.0.0.1:%u", r->port);
	assert_int_equal(pthread_create(&r->th, NULL, relay_main, r), 0);
	return r;
}

static void relay_set(struct relay *r, enum relay_mode m)
{
	pthread_mutex_lock(&r->mu);
	r->mode = m;
	pthread_mutex_unlock(&r->mu);
}

/* Bytes of the attacker's own, into the client's stream to the daemon. */
static void relay_inject(struct relay *r, const void *p, size_t n)
{
	pthread_mutex_lock(&r->mu);
	assert_int_equal(write_all(r->ufd, p, n), 0);
	pthread_mutex_unlock(&r->mu);
}

/* 1 when the daemon closed its side within ms. */
static int relay_wait_closed(struct relay *r, int ms)
{
	int64_t end = now_ms() + ms;
	while (!atomic_load(&r->up_closed) && now_ms() < end)
		usleep(10000);
	return atomic_load(&r->up_closed);
}

static void relay_stop(struct relay *r)
{
	atomic_store(&r->stop, 1);
	pthread_join(r->th, NULL);
	if (r->cfd >= 0)
		close(r->cfd);
	if (r->ufd >= 0)
		close(r->ufd);
	close(r->lfd);
	pthread_mutex_destroy(&r->mu);
	free(r);
}

/* ---- meta requests ---- */

static void name_body(struct kvp_wbuf *w, const char *name, int with_mode)
{
	kvp_w_init(w);
	kvp_w_u64(w, KVP_ROOT_INO);
	kvp_w_cstr(w, name);
	if (with_mode)
		kvp_w_u32(w, 0755);
}

static int call_name(struct kvp_client *c, uint16_t op, const char *name)
{
	struct kvp_wbuf w;
	name_body(&w, name, op == KVP_OP_MKDIR);
	uint8_t *b = NULL;
	int rc = kvp_call(c, op, w.p, w.len, NULL, 0, TMO, &b, NULL);
	free(b);
	kvp_w_free(&w);
	return rc;
}

/* Whether /name exists, asked on a connection of our own. */
static int exists(const char *name)
{
	struct kvp_client *c;
	assert_int_equal(kvp_client_open(g_cl.meta_addr, &g_cl.secret, TMO, &c), 0);
	int rc = call_name(c, KVP_OP_LOOKUP, name);
	kvp_client_close(c);
	assert_true(rc == 0 || rc == -ENOENT);
	return rc == 0;
}

static int statfs_on(struct kvp_client *c)
{
	uint8_t *b = NULL;
	int rc = kvp_call(c, KVP_OP_STATFS, NULL, 0, NULL, 0, TMO, &b, NULL);
	free(b);
	return rc;
}

/* A client whose connection to meta runs through a fresh relay, proven to work. */
static struct kvp_client *via_relay(struct relay **rout)
{
	struct relay *r = relay_start(g_cl.meta_addr);
	struct kvp_client *c;
	assert_int_equal(kvp_client_open(r->addr, &g_cl.secret, TMO, &c), 0);
	assert_int_equal(statfs_on(c), 0);
	*rout = r;
	return c;
}

static double metric(const char *addr, const char *name)
{
	char *body = NULL;
	struct prom_doc d;
	double v = -1;
	assert_int_equal(prom_http_get(addr, "/metrics", &body), 200);
	assert_int_equal(prom_parse(body, &d), 0);
	if (prom_get(&d, name, "", &v))
		v = -1; /* absent: the caller's check fails */
	prom_free(&d);
	free(body);
	return v;
}

/* ---- the relay attacks ---- */

/* The attack from the report: after a real handshake, the relay adds a MKDIR of its own. */
static void test_inject_frame(void **state)
{
	(void)state;
	struct relay *r;
	struct kvp_client *c = via_relay(&r);
	struct kvp_wbuf w;
	name_body(&w, "pwned", 1);
	struct kvp_hdr h = {.magic = KVP_MAGIC,
			    .version = KVP_VERSION,
			    .op = KVP_OP_MKDIR,
			    .id = 1u << 30,
			    .len = (uint32_t)w.len};
	uint8_t frame[256];
	kvp_hdr_encode(&h, frame);
	memcpy(frame + KVP_HDR_SIZE, w.p, w.len);
	relay_inject(r, frame, KVP_HDR_SIZE + w.len);
	kvp_w_free(&w);
	assert_true(relay_wait_closed(r, 5000));
	assert_int_not_equal(statfs_on(c), 0); /* the connection is gone with it */
	kvp_client_close(c);
	relay_stop(r);
	assert_false(exists("pwned"));
}

/* One byte of the client's own MKDIR changed on the way. */
static void test_flip_byte(void **state)
{
	(void)state;
	struct relay *r;
	struct kvp_client *c = via_relay(&r);
	relay_set(r, R_FLIP_NEXT);
	assert_int_not_equal(call_name(c, KVP_OP_MKDIR, "flipped"), 0);
	assert_true(relay_wait_closed(r, 5000));
	kvp_client_close(c);
	relay_stop(r);
	assert_false(exists("flipped"));
	assert_false(exists("flippee")); /* the name with its last byte flipped */
}

/* The client makes and removes a directory; the relay replays the MKDIR's bytes. */
static void test_replay_record(void **state)
{
	(void)state;
	struct relay *r;
	struct kvp_client *c = via_relay(&r);
	relay_set(r, R_RECORD_NEXT);
	assert_int_equal(call_name(c, KVP_OP_MKDIR, "replayed"), 0);
	assert_int_equal(call_name(c, KVP_OP_RMDIR, "replayed"), 0);
	pthread_mutex_lock(&r->mu);
	assert_true(r->rec_len > 0);
	size_t n = r->rec_len;
	uint8_t *copy = malloc(n);
	memcpy(copy, r->rec, n);
	pthread_mutex_unlock(&r->mu);
	relay_inject(r, copy, n);
	free(copy);
	assert_true(relay_wait_closed(r, 5000));
	assert_int_not_equal(statfs_on(c), 0);
	kvp_client_close(c);
	relay_stop(r);
	assert_false(exists("replayed"));
}

/* Two pipelined MKDIRs arrive in the other order. */
static void test_reorder_records(void **state)
{
	(void)state;
	struct relay *r;
	struct kvp_client *c = via_relay(&r);
	relay_set(r, R_HOLD_NEXT);
	struct kvp_wbuf wa, wb;
	name_body(&wa, "order-a", 1);
	name_body(&wb, "order-b", 1);
	struct kvp_call *ka, *kb;
	assert_int_equal(kvp_call_start(c, KVP_OP_MKDIR, wa.p, wa.len, NULL, 0, &ka), 0);
	usleep(200000); /* its own chunk at the relay */
	assert_int_equal(kvp_call_start(c, KVP_OP_MKDIR, wb.p, wb.len, NULL, 0, &kb), 0);
	kvp_w_free(&wa);
	kvp_w_free(&wb);
	int ra = kvp_call_wait(ka, TMO, NULL, NULL), rb = kvp_call_wait(kb, TMO, NULL, NULL);
	assert_true(relay_wait_closed(r, 5000));
	assert_int_not_equal(ra, 0);
	assert_int_not_equal(rb, 0);
	kvp_client_close(c);
	relay_stop(r);
	assert_false(exists("order-a"));
	assert_false(exists("order-b"));
}

/* ---- slow and many unauthenticated peers ---- */

/* A raw connection to addr from src (e.g. "127.0.0.2"), non-blocking; -errno on failure. */
static int raw_from(const char *src, const char *addr)
{
	char host[KVP_ADDR_MAX];
	uint16_t port;
	assert_int_equal(kvp_addr_parse(addr, host, sizeof(host), &port), 0);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	struct sockaddr_in sa = {.sin_family = AF_INET};
	inet_pton(AF_INET, src, &sa.sin_addr);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	sa.sin_port = htons(port);
	inet_pton(AF_INET, host, &sa.sin_addr);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
		int e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

/* 1 when the peer has closed fd (EOF or reset; bytes it sent first are drained). */
static int peer_closed(int fd)
{
	uint8_t b[4096];
	for (;;) {
		ssize_t n = recv(fd, b, sizeof(b), MSG_DONTWAIT);
		if (n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE)))
			return 1;
		if (n < 0)
			return 0;
	}
}

/* The start of a TLS ClientHello record, then zeros: what a slow client could send. */
static uint8_t trickle_byte(int i)
{
	static const uint8_t hdr[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03};
	return i < (int)sizeof(hdr) ? hdr[i] : 0;
}

static void trickle_at(const char *addr, const char *metrics, const char *fam)
{
	double t0 = metric(metrics, fam);
	int fd = raw_from("127.0.0.3", addr);
	assert_true(fd >= 0);
	int64_t start = now_ms(), closed_at = -1;
	for (int i = 0; i < 12 && closed_at < 0; i++) {
		uint8_t b = trickle_byte(i);
		if (send(fd, &b, 1, MSG_NOSIGNAL) != 1 || peer_closed(fd)) {
			closed_at = now_ms();
			break;
		}
		for (int j = 0; j < 10 && closed_at < 0; j++) {
			usleep(100000);
			if (peer_closed(fd))
				closed_at = now_ms();
		}
	}
	close(fd);
	/* One deadline of 5 s for the whole handshake; 12 s of trickling would have outlived a
	 * timeout per read(). */
	assert_true(closed_at >= 0);
	print_message("trickling peer closed after %lld ms\n", (long long)(closed_at - start));
	assert_true(closed_at - start <= 7000);
	assert_true(metric(metrics, fam) >= t0 + 1);
}

static void test_trickle_handshake(void **state)
{
	(void)state;
	trickle_at(g_cl.meta_addr, g_cl.meta_metrics, "kvfs_meta_handshake_timeouts_total");
	trickle_at(g_cl.nodes[0].addr, g_cl.nodes[0].metrics, "kvfs_node_handshake_timeouts_total");
}

/* A listener on 127.0.0.1 that accepts one connection and then either writes `reply` (not
 * TLS) or, with reply NULL, stays silent; addr gets "127.0.0.1:port". */
struct fake_peer {
	int lfd;
	const char *reply;
	pthread_t th;
};

static void *fake_peer_run(void *arg)
{
	struct fake_peer *f = arg;
	int fd = accept(f->lfd, NULL, NULL);
	if (fd >= 0) {
		if (f->reply)
			(void)!write(fd, f->reply, strlen(f->reply));
		/* read and drop what comes until the client gives up: closing with unread bytes
		 * would reset the connection, a failure rather than a timeout */
		struct pollfd p = {.fd = fd, .events = POLLIN};
		char b[4096];
		while (poll(&p, 1, 5000) > 0 && read(fd, b, sizeof(b)) > 0)
			;
		close(fd);
	}
	return NULL;
}

static void fake_peer_start(struct fake_peer *f, const char *reply, char addr[KVP_ADDR_MAX])
{
	f->reply = reply;
	f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(f->lfd >= 0);
	struct sockaddr_in sa = {.sin_family = AF_INET};
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(f->lfd, 4), 0);
	socklen_t sl = sizeof(sa);
	assert_int_equal(getsockname(f->lfd, (struct sockaddr *)&sa, &sl), 0);
	snprintf(addr, KVP_ADDR_MAX, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
	assert_int_equal(pthread_create(&f->th, NULL, fake_peer_run, f), 0);
}

static void fake_peer_stop(struct fake_peer *f)
{
	pthread_join(f->th, NULL);
	close(f->lfd);
}

/* A client's failed handshakes are counted on its side too (kvfs_client_/kvfs_node_client_
 * handshake_failures_total): a wrong secret, a peer that is not kvfs, one that never answers.
 * Before, only a log line said so. */
static void test_client_handshake_counted(void **state)
{
	(void)state;
	const struct kvp_conn_stats *st = kvp_client_conn_stats();
	uint64_t f0 = atomic_load(&st->hs_failed), t0 = atomic_load(&st->hs_timeout);
	struct kvp_client *c = NULL;
	struct kvp_secret wrong = g_cl.secret;
	wrong.key[0] ^= 1;
	assert_true(kvp_client_open(g_cl.meta_addr, &wrong, TMO, &c) < 0);
	assert_int_equal(atomic_load(&st->hs_failed), f0 + 1);
	char addr[KVP_ADDR_MAX];
	struct fake_peer fp;
	fake_peer_start(&fp, "HTTP/1.1 400 Bad Request\r\n\r\n", addr);
	assert_true(kvp_client_open(addr, &g_cl.secret, TMO, &c) < 0);
	fake_peer_stop(&fp);
	assert_int_equal(atomic_load(&st->hs_failed), f0 + 2);
	fake_peer_start(&fp, NULL, addr);
	assert_int_equal(kvp_client_open(addr, &g_cl.secret, 500, &c), -ETIMEDOUT);
	fake_peer_stop(&fp);
	assert_int_equal(atomic_load(&st->hs_timeout), t0 + 1);
	assert_int_equal(atomic_load(&st->hs_failed), f0 + 2);
	/* A refused connection is no handshake. */
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET};
	socklen_t sl = sizeof(sa);
	inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
	snprintf(addr, sizeof(addr), "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
	assert_int_equal(kvp_client_open(addr, &g_cl.secret, TMO, &c), -ECONNREFUSED);
	close(lfd);
	assert_int_equal(atomic_load(&st->hs_failed), f0 + 2);
	/* A node that cannot reach meta counts it in its /metrics (family present, promtool-clean
	 * in test_metrics_cluster). */
	assert_true(metric(g_cl.nodes[0].metrics, "kvfs_node_client_handshake_failures_total") >=
		    0);
}

/* 450 silent connections against a daemon limited to 400 descriptors, from another address;
 * a real client still gets in meanwhile, and within 5 s of the attacker leaving. */
static void exhaust(pid_t pid, const char *addr, const char *metrics, const char *refused_fam)
{
	enum { N = 450 };
	struct rlimit old, lim;
	assert_int_equal(prlimit(pid, RLIMIT_NOFILE, NULL, &old), 0);
	lim = (struct rlimit){.rlim_cur = 400, .rlim_max = old.rlim_max};
	assert_int_equal(prlimit(pid, RLIMIT_NOFILE, &lim, NULL), 0);
	int *fds = malloc(N * sizeof(int));
	for (int i = 0; i < N; i++) {
		fds[i] = raw_from("127.0.0.2", addr);
		assert_true(fds[i] >= 0);
		uint8_t b = 0x16;
		send(fds[i], &b, 1, MSG_NOSIGNAL); /* may not be connected yet: then nothing */
	}
	usleep(1500000); /* the daemon has seen them all */
	/* Meanwhile, a client from 127.0.0.1 is served. */
	struct kvp_client *c;
	assert_int_equal(kvp_client_open(addr, &g_cl.secret, TMO, &c), 0);
	kvp_client_close(c);
	for (int i = 0; i < N; i++)
		close(fds[i]);
	free(fds);
	int64_t left = now_ms();
	int ok = 0;
	while (!ok && now_ms() - left < 5000) {
		if (kvp_client_open(addr, &g_cl.secret, 1000, &c) == 0) {
			int rc = statfs_on(c); /* a node answers STATFS with -EOPNOTSUPP */
			ok = rc == 0 || rc == -EOPNOTSUPP;
			kvp_client_close(c);
		} else {
			usleep(100000);
		}
	}
	print_message("%s: serving again %lld ms after the attacker left\n", addr,
		      (long long)(now_ms() - left));
	assert_true(ok);
	assert_true(metric(metrics, refused_fam) >= 1);
	prlimit(pid, RLIMIT_NOFILE, &old, NULL);
}

static void test_descriptor_exhaustion(void **state)
{
	(void)state;
	exhaust(g_cl.meta_pid, g_cl.meta_addr, g_cl.meta_metrics,
		"kvfs_meta_connections_refused_total");
	exhaust(g_cl.nodes[0].pid, g_cl.nodes[0].addr, g_cl.nodes[0].metrics,
		"kvfs_node_connections_refused_total");
	/* And the cluster as a whole still works. */
	struct kvp_client *c;
	assert_int_equal(kvp_client_open(g_cl.meta_addr, &g_cl.secret, TMO, &c), 0);
	assert_int_equal(statfs_on(c), 0);
	kvp_client_close(c);
}

static int setup(void **state)
{
	(void)state;
	struct rlimit lim;
	getrlimit(RLIMIT_NOFILE, &lim);
	lim.rlim_cur = lim.rlim_max; /* the exhaustion test holds 450 sockets */
	setrlimit(RLIMIT_NOFILE, &lim);
	g_up = kvh_cluster_start_flags(&g_cl, 3, NULL, NULL, KVH_METRICS) == 0;
	return g_up ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	kvh_cluster_stop(&g_cl);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_inject_frame),
	    cmocka_unit_test(test_flip_byte),
	    cmocka_unit_test(test_replay_record),
	    cmocka_unit_test(test_reorder_records),
	    cmocka_unit_test(test_trickle_handshake),
	    cmocka_unit_test(test_descriptor_exhaustion),
	    cmocka_unit_test(test_client_handshake_counted),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
