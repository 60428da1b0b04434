/* The cross-host harness's link shaping (tests/netns_tutil.h) delays real packets: three
 * hosts (0: this test, 1: shaped, 2: not), no daemons. Host 1 shaped to 50 ms each way: the
 * round trip to it (a TCP connect to a closed port) takes at least 100 ms, to host 2 it does
 * not change; 4 MiB sent over TCP to host 1 through the delayed link arrive exact and in
 * order; with a rate of 8 Mbit/s too, 1 MiB takes at least 1 s; unshaped, the round trip is
 * back under 50 ms and the delayer's devices are gone. Without netem the delay is the TAP
 * delayer (tests/link_delay.h). Prints "skipped: <reason>" where namespaces cannot be made. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "link_delay.h"
#include "netns_tutil.h"
#include "ret_tutil.h"

#define PORT 7999

static struct kvn_net g_net;

struct sink {
	int lfd;
	size_t got;
	uint64_t sum; /* position-weighted: a reordered or altered byte changes it */
	int rc;
};

static uint64_t weigh(uint64_t sum, const unsigned char *b, size_t n, size_t at)
{
	for (size_t i = 0; i < n; i++)
		sum = sum * 1099511628211ULL + (b[i] ^ (unsigned char)(at + i));
	return sum;
}

static void *sink_main(void *arg)
{
	struct sink *s = arg;
	int fd = accept(s->lfd, NULL, NULL);
	if (fd < 0) {
		s->rc = -errno;
		return NULL;
	}
	unsigned char b[65536];
	ssize_t n;
	while ((n = read(fd, b, sizeof(b))) > 0) {
		s->sum = weigh(s->sum, b, (size_t)n, s->got);
		s->got += (size_t)n;
	}
	s->rc = n < 0 ? -errno : 0;
	close(fd);
	return NULL;
}

/* Sends size bytes from this host to a sink on host 1; returns the ms it took (the sink has
 * read everything), asserting every byte arrived exact and in order. */
static int64_t send_to_host1(size_t size)
{
	/* The listener lives in host 1: made by a thread moved there. */
	static struct sink s;
	memset(&s, 0, sizeof(s));
	int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	assert_true(self >= 0);
	assert_int_equal(kvn_enter(&g_net, 1), 0);
	s.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	int one = 1;
	setsockopt(s.lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(PORT)};
	inet_pton(AF_INET, g_net.ip[1], &sa.sin_addr);
	assert_int_equal(bind(s.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(s.lfd, 1), 0);
	assert_int_equal(setns(self, CLONE_NEWNET), 0);
	close(self);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, sink_main, &s), 0);

	int64_t t0 = rt_now_ms();
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	unsigned char *b = malloc(size);
	assert_non_null(b);
	uint64_t x = 0x9e3779b97f4a7c15ULL;
	for (size_t i = 0; i < size; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		b[i] = (unsigned char)x;
	}
	uint64_t want = weigh(0, b, size, 0);
	for (size_t off = 0; off < size;) {
		ssize_t n = write(fd, b + off, size - off);
		assert_true(n > 0);
		off += (size_t)n;
	}
	shutdown(fd, SHUT_WR);
	pthread_join(t, NULL);
	int64_t took = rt_now_ms() - t0;
	close(fd);
	close(s.lfd);
	free(b);
	assert_int_equal(s.rc, 0);
	assert_int_equal(s.got, size);
	assert_true(s.sum == want);
	return took;
}

static void test_delay(void **state)
{
	(void)state;
	double r1, r2, d1, d2;
	assert_int_equal(kvn_rtt_ms(&g_net, 1, &r1), 0);
	assert_int_equal(kvn_rtt_ms(&g_net, 2, &r2), 0);
	assert_int_equal(kvn_shape(&g_net, 1, 50, NULL), 0);
	assert_int_equal(kvn_rtt_ms(&g_net, 1, &d1), 0);
	assert_int_equal(kvn_rtt_ms(&g_net, 2, &d2), 0);
	fprintf(stderr,
		"%s 50 ms each way on host 1: RTT to it %.3f ms (%.3f ms before); to host 2 "
		"%.3f ms (%.3f ms before)\n",
		g_net.have_netem ? "netem" : "TAP delayer", d1, r1, d2, r2);
	assert_true(d1 >= 100.0);
	int64_t ms = send_to_host1(4u << 20);
	uint64_t passed = 0, dropped = 0;
	if (g_net.delay[1])
		lkd_counts(g_net.delay[1], &passed, &dropped);
	fprintf(stderr,
		"4 MiB over TCP to host 1: exact, in order, %lld ms (delayer: %llu frames "
		"passed, %llu dropped)\n",
		(long long)ms, (unsigned long long)passed, (unsigned long long)dropped);

	assert_int_equal(kvn_shape(&g_net, 1, 50, "8mbit"), 0);
	ms = send_to_host1(1u << 20);
	fprintf(stderr, "1 MiB to host 1 at 8 Mbit/s + 50 ms: exact, %lld ms\n", (long long)ms);
	assert_true(ms >= 1000); /* 8 Mbit of payload alone is 1 s at 8 Mbit/s */

	assert_int_equal(kvn_shape(&g_net, 1, 0, NULL), 0);
	assert_int_equal(kvn_rtt_ms(&g_net, 1, &d1), 0);
	fprintf(stderr, "unshaped: RTT to host 1 %.2f ms\n", d1);
	assert_true(d1 < 50.0);
	if (!g_net.have_netem)
		assert_int_not_equal(kvh_sh("ip -n %s link show dl1 >/dev/null 2>&1", g_net.sw), 0);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	char why[160];
	if (kvn_probe(why, sizeof(why))) {
		printf("skipped: %s\n", why);
		return 77;
	}
	int rc = kvn_net_create(&g_net, 3, 0, NULL);
	if (rc) {
		printf("skipped: cannot build the test network: %s\n", strerror(-rc));
		return 77;
	}
	if (!g_net.have_delay) {
		kvn_net_destroy(&g_net);
		printf("skipped: no sch_netem and no /dev/net/tun: links cannot be delayed here\n");
		return 77;
	}
	if ((rc = kvn_enter(&g_net, 0))) {
		kvn_net_destroy(&g_net);
		printf("skipped: cannot enter host 0: %s\n", strerror(-rc));
		return 77;
	}
	const struct CMUnitTest tests[] = {cmocka_unit_test(test_delay)};
	rc = cmocka_run_group_tests(tests, NULL, NULL);
	kvn_net_destroy(&g_net);
	return rc;
}
