/* Tests for fs/proto: codec bounds, header checks, the handshake with right and wrong
 * secrets, pipelined calls answered out of order, and bad frames closing only their
 * connection. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <linux/tcp.h> /* struct tcp_info with tcpi_segs_out (glibc's lacks it) */
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvp.h"

static void test_codec_roundtrip(void **state)
{
	(void)state;
	struct kvp_wbuf w;
	kvp_w_init(&w);
	struct kvp_attr a = {.ino = 7,
			     .mode = 0100644,
			     .nlink = 1,
			     .size = 1234567,
			     .mtime_ns = -5,
			     .atime_ns = 9,
			     .ctime_ns = 11,
			     .stored = 99,
			     .chunk_size = 65536,
			     .k = 10,
			     .m = 1,
			     .access_ns = 13},
			b;
	kvp_w_u8(&w, 0xAB);
	kvp_w_u16(&w, 0xBEEF);
	kvp_w_u32(&w, 0xDEADBEEF);
	kvp_w_u64(&w, 0x0123456789ABCDEFull);
	kvp_w_cstr(&w, "hello");
	kvp_w_attr(&w, &a);
	assert_int_equal(w.err, 0);
	assert_int_equal(w.len, 1 + 2 + 4 + 8 + 2 + 5 + KVP_ATTR_SIZE);
	/* Explicit little-endian on the wire. */
	assert_int_equal(w.p[1], 0xEF);
	assert_int_equal(w.p[2], 0xBE);

	struct kvp_rbuf r;
	char s[16];
	kvp_r_init(&r, w.p, w.len);
	assert_int_equal(kvp_r_u8(&r), 0xAB);
	assert_int_equal(kvp_r_u16(&r), 0xBEEF);
	assert_int_equal(kvp_r_u32(&r), 0xDEADBEEF);
	assert_true(kvp_r_u64(&r) == 0x0123456789ABCDEFull);
	assert_int_equal(kvp_r_str(&r, s, sizeof(s)), 5);
	assert_string_equal(s, "hello");
	kvp_r_attr(&r, &b);
	assert_int_equal(kvp_r_end(&r), 0);
	assert_memory_equal(&a, &b, sizeof(a));

	/* Every truncation is caught and never reads past the end. */
	for (size_t cut = 0; cut < w.len; cut++) {
		kvp_r_init(&r, w.p, cut);
		kvp_r_u8(&r), kvp_r_u16(&r), kvp_r_u32(&r), kvp_r_u64(&r);
		kvp_r_str(&r, s, sizeof(s));
		kvp_r_attr(&r, &b);
		assert_int_equal(kvp_r_end(&r), -EBADMSG);
	}
	/* Trailing bytes are an error too. */
	kvp_r_init(&r, w.p, w.len);
	kvp_r_u8(&r);
	assert_int_equal(kvp_r_end(&r), -EBADMSG);
	/* A string longer than the destination. */
	kvp_r_init(&r, w.p + 15, w.len - 15);
	kvp_r_str(&r, s, 4);
	assert_int_equal(r.err, -ENAMETOOLONG);
	kvp_w_free(&w);
}

static void test_header_checks(void **state)
{
	(void)state;
	struct kvp_hdr h = {.magic = KVP_MAGIC,
			    .version = KVP_VERSION,
			    .op = KVP_OP_GET,
			    .id = 42,
			    .len = 100},
		       d;
	uint8_t b[KVP_HDR_SIZE];
	kvp_hdr_encode(&h, b);
	assert_int_equal(kvp_hdr_decode(b, &d, 1000), 0);
	assert_int_equal(d.id, 42);
	assert_int_equal(kvp_hdr_decode(b, &d, 99), -EMSGSIZE);
	b[0] ^= 1;
	assert_int_equal(kvp_hdr_decode(b, &d, 1000), -EPROTO);
	b[0] ^= 1;
	b[4] = 9; /* version */
	assert_int_equal(kvp_hdr_decode(b, &d, 1000), -EPROTO);
	h.status = 5; /* positive status is garbage */
	kvp_hdr_encode(&h, b);
	assert_int_equal(kvp_hdr_decode(b, &d, 1000), -EPROTO);
}

static struct kvp_secret secret(const char *s)
{
	struct kvp_secret k;
	assert_int_equal(kvp_secret_from_string(s, &k), 0);
	return k;
}

/* Echo server: replies with the request body reversed; op 0x7F replies later from another
 * thread after a delay, so responses arrive out of order. */
struct later {
	struct kvp_conn *c;
	struct kvp_hdr h;
	uint8_t *body;
};

static void *late_reply(void *arg)
{
	struct later *l = arg;
	usleep(50000);
	kvp_reply(l->c, &l->h, 0, l->body, l->h.len, NULL, 0);
	kvp_conn_unref(l->c);
	free(l->body);
	free(l);
	return NULL;
}

static atomic_int g_hold; /* op 0x7D holds its connection's thread (no reads) while set */

static int echo_handler(void *ctx, struct kvp_conn *c, const struct kvp_hdr *h, uint8_t *body)
{
	(void)ctx;
	if (h->op == 0x7D) {
		for (int i = 0; i < 2000 && atomic_load(&g_hold); i++)
			usleep(5000);
		kvp_reply(c, h, 0, NULL, 0, NULL, 0);
		free(body);
		return 0;
	}
	if (h->op == 0x66) { /* a "malformed request": the handler asks to close */
		free(body);
		return -EBADMSG;
	}
	if (h->op == 0x7F) {
		struct later *l = malloc(sizeof(*l));
		l->c = c;
		l->h = *h;
		l->body = body;
		kvp_conn_ref(c);
		pthread_t t;
		pthread_create(&t, NULL, late_reply, l);
		pthread_detach(t);
		return 0;
	}
	if (h->op == 0x7E) {
		kvp_reply(c, h, -ENOENT, NULL, 0, NULL, 0);
		free(body);
		return 0;
	}
	if (h->op == 0x7C) { /* an error with a body: the request's (kvp_reply_err) */
		int rc = kvp_reply_err(c, h, -EREMCHG, body, h->len);
		if (rc)
			kvp_reply(c, h, rc, NULL, 0, NULL, 0);
		free(body);
		return 0;
	}
	if (h->op == 0x7B) { /* kvp_reply drops an error's body */
		kvp_reply(c, h, -ENOENT, body, h->len, NULL, 0);
		free(body);
		return 0;
	}
	for (uint32_t i = 0; i < h->len / 2; i++) {
		uint8_t t = body[i];
		body[i] = body[h->len - 1 - i];
		body[h->len - 1 - i] = t;
	}
	kvp_reply(c, h, 0, body, h->len, NULL, 0);
	free(body);
	return 0;
}

static struct kvp_server *start_echo(const struct kvp_secret *k, char *addr)
{
	struct kvp_server_opts o = {.name = "echo",
				    .host = "127.0.0.1",
				    .secret = k,
				    .handler = echo_handler,
				    .max_body = 1 << 20};
	struct kvp_server *s;
	assert_int_equal(kvp_server_start(&o, &s), 0);
	sprintf(addr, "127.0.0.1:%u", kvp_server_port(s));
	return s;
}

static void test_auth_and_calls(void **state)
{
	(void)state;
	struct kvp_secret good = secret("0123456789abcdef-cluster"),
			  bad = secret("not-the-secret!!!");
	char addr[64];
	struct kvp_server *s = start_echo(&good, addr);

	struct kvp_client *c;
	assert_int_equal(kvp_client_open(addr, &bad, 2000, &c), -EACCES);
	assert_int_equal(kvp_client_open(addr, &good, 2000, &c), 0);

	/* A slow call and many fast ones in flight together; the fast ones finish first. */
	struct kvp_call *slow, *fast[20];
	assert_int_equal(kvp_call_start(c, 0x7F, "slow", 4, NULL, 0, &slow), 0);
	for (int i = 0; i < 20; i++) {
		char msg[16];
		int n = sprintf(msg, "ab%d", i);
		assert_int_equal(
		    kvp_call_start(c, 0x10, msg, (size_t)n - 1, msg + n - 1, 1, &fast[i]), 0);
	}
	for (int i = 0; i < 20; i++) {
		uint8_t *b;
		uint32_t len;
		assert_int_equal(kvp_call_wait(fast[i], 2000, &b, &len), 0);
		char want[16];
		int n = sprintf(want, "ab%d", i);
		for (int j = 0; j < n; j++)
			assert_int_equal(b[j], want[n - 1 - j]);
		free(b);
	}
	uint8_t *b;
	uint32_t len;
	assert_int_equal(kvp_call_wait(slow, 2000, &b, &len), 0);
	assert_memory_equal(b, "slow", 4); /* the late path echoes as is */
	free(b);
	assert_int_equal(kvp_call(c, 0x7E, NULL, 0, NULL, 0, 2000, NULL, NULL), -ENOENT);
	/* A call that times out, then the connection still works. */
	assert_int_equal(kvp_call(c, 0x7F, "x", 1, NULL, 0, 5, NULL, NULL), -ETIMEDOUT);
	assert_int_equal(kvp_call(c, 0x10, "xy", 2, NULL, 0, 2000, &b, &len), 0);
	assert_memory_equal(b, "yx", 2);
	free(b);
	usleep(100000);

	/* The handler rejects a request: only this connection closes. */
	assert_int_equal(kvp_call(c, 0x66, "z", 1, NULL, 0, 2000, NULL, NULL), -ECONNRESET);
	assert_false(kvp_client_alive(c));
	kvp_client_close(c);

	/* Raw garbage and an oversized frame from an authenticated peer: closed, server lives. */
	struct kvp_sock *rk;
	assert_int_equal(kvp_sock_open(addr, &good, 1000, &rk), 0);
	struct kvp_hdr h = {.op = 0x10, .id = 1};
	uint8_t big[16];
	memset(big, 0, sizeof(big));
	h.magic = KVP_MAGIC;
	h.version = KVP_VERSION;
	h.len = (2u << 20); /* over this server's 1 MiB max */
	uint8_t hb[KVP_HDR_SIZE];
	kvp_hdr_encode(&h, hb);
	assert_int_equal(kvp_sock_write(rk, hb, sizeof(hb)), 0);
	char tmp;
	assert_int_equal(kvp_sock_read(rk, &tmp, 1, 5000), 0); /* server closed it */
	kvp_sock_close(rk);

	int fd = kvp_connect(addr, 1000);
	assert_int_equal(write(fd, "GET / HTTP/1.0\r\n\r\n", 18), 18); /* no handshake at all */
	uint8_t junk[256];
	ssize_t n;
	while ((n = read(fd, junk, sizeof(junk))) > 0)
		;
	close(fd);

	/* Pool: reuses a live connection, reopens a dead one. */
	struct kvp_pool *p;
	assert_int_equal(kvp_pool_create(&good, 1000, &p), 0);
	struct kvp_client *c1, *c2;
	assert_int_equal(kvp_pool_get(p, addr, &c1), 0);
	assert_int_equal(kvp_pool_get(p, addr, &c2), 0);
	assert_ptr_equal(c1, c2);
	assert_int_equal(kvp_call(c1, 0x66, NULL, 0, NULL, 0, 2000, NULL, NULL), -ECONNRESET);
	kvp_pool_put(p, c1);
	kvp_pool_put(p, c2);
	assert_int_equal(kvp_pool_get(p, addr, &c1), 0);
	assert_true(kvp_client_alive(c1));
	assert_int_equal(kvp_call(c1, 0x10, "ok", 2, NULL, 0, 2000, &b, &len), 0);
	free(b);
	/* Abort: a call in flight fails at once instead of waiting for its reply or timeout,
	 * the next get reconnects; an address without a connection is left alone. */
	struct kvp_call *k;
	assert_int_equal(kvp_call_start(c1, 0x7F, "late", 4, NULL, 0, &k), 0);
	kvp_pool_abort(p, addr);
	kvp_pool_abort(p, "127.0.0.1:1");
	assert_int_equal(kvp_call_wait(k, 60000, NULL, NULL), -ECONNRESET);
	assert_false(kvp_client_alive(c1));
	kvp_pool_put(p, c1);
	assert_int_equal(kvp_pool_get(p, addr, &c1), 0);
	assert_true(kvp_client_alive(c1));
	assert_int_equal(kvp_call(c1, 0x10, "ok", 2, NULL, 0, 2000, &b, &len), 0);
	free(b);
	kvp_pool_put(p, c1);
	kvp_pool_destroy(p);

	/* A peer that stops reading: a send that makes no progress for the send timeout fails
	 * and takes the connection down (it blocked for as long as the peer did, holding the
	 * send lock every other call on the connection waits for). */
	assert_int_equal(kvp_client_open(addr, &good, 2000, &c), 0);
	kvp_client_set_send_timeout(c, 300);
	atomic_store(&g_hold, 1);
	struct kvp_call *held;
	assert_int_equal(kvp_call_start(c, 0x7D, NULL, 0, NULL, 0, &held), 0);
	uint8_t *blob = calloc(1, 512 << 10);
	int sent = 0, src = 0;
	struct kvp_call *bk[128];
	while (sent < 128 &&
	       (src = kvp_call_start(c, 0x10, blob, 512 << 10, NULL, 0, &bk[sent])) == 0)
		sent++;
	atomic_store(&g_hold, 0);
	assert_int_equal(src, -ECONNRESET); /* 64 MiB never fit the buffers: a send timed out */
	assert_false(kvp_client_alive(c));
	for (int i = 0; i < sent; i++)
		kvp_call_wait(bk[i], 2000, NULL, NULL);
	kvp_call_wait(held, 2000, NULL, NULL);
	free(blob);
	kvp_client_close(c);

	kvp_server_stop(s);
	assert_int_equal(kvp_client_open(addr, &good, 500, &c), -ECONNREFUSED);
}

/* kvp_call_into: a response of the announced length lands in the caller's buffer past its
 * head; anything else (other length, an error, an answer already in, a call that timed out)
 * comes as before and leaves the buffer alone. */
static void test_call_into(void **state)
{
	(void)state;
	struct kvp_secret good = secret("0123456789abcdef-cluster");
	char addr[64];
	struct kvp_server *s = start_echo(&good, addr);
	struct kvp_client *c;
	assert_int_equal(kvp_client_open(addr, &good, 2000, &c), 0);
	const char *msg = "0123456789abcdef", *rev = "fedcba9876543210";
	uint8_t dst[32], *b;
	uint32_t len;
	struct kvp_call *k;

	/* op 0x7F answers after 50 ms (as is): the destination is set well before. */
	memset(dst, 'x', sizeof(dst));
	assert_int_equal(kvp_call_start(c, 0x7F, msg, 16, NULL, 0, &k), 0);
	assert_int_equal(kvp_call_into(k, 4, dst, 12), 0);
	assert_int_equal(kvp_call_wait(k, 2000, &b, &len), 0);
	assert_int_equal(len, 4);
	assert_memory_equal(b, msg, 4);
	assert_memory_equal(dst, msg + 4, 12);
	assert_int_equal(dst[12], 'x');
	free(b);

	/* Another length: the whole body as usual. */
	memset(dst, 'x', sizeof(dst));
	assert_int_equal(kvp_call_start(c, 0x7F, msg, 16, NULL, 0, &k), 0);
	assert_int_equal(kvp_call_into(k, 4, dst, 20), 0);
	assert_int_equal(kvp_call_wait(k, 2000, &b, &len), 0);
	assert_int_equal(len, 16);
	assert_memory_equal(b, msg, 16);
	assert_int_equal(dst[0], 'x');
	free(b);

	/* An error answer (it may be in already: either way it is the error). */
	assert_int_equal(kvp_call_start(c, 0x7E, NULL, 0, NULL, 0, &k), 0);
	int irc = kvp_call_into(k, 0, dst, 0);
	assert_true(irc == 0 || irc == -EALREADY);
	assert_int_equal(kvp_call_wait(k, 2000, NULL, NULL), -ENOENT);

	/* The answer is in before the caller asks: -EALREADY, delivered as usual. */
	assert_int_equal(kvp_call_start(c, 0x10, msg, 16, NULL, 0, &k), 0);
	usleep(100000);
	memset(dst, 'x', sizeof(dst));
	assert_int_equal(kvp_call_into(k, 4, dst, 12), -EALREADY);
	assert_int_equal(kvp_call_wait(k, 2000, &b, &len), 0);
	assert_int_equal(len, 16);
	assert_memory_equal(b, rev, 16);
	assert_int_equal(dst[0], 'x');
	free(b);

	/* Timed out before the answer came: the late answer never touches dst. */
	assert_int_equal(kvp_call_start(c, 0x7F, "late", 4, NULL, 0, &k), 0);
	assert_int_equal(kvp_call_into(k, 0, dst, 4), 0);
	assert_int_equal(kvp_call_wait(k, 5, NULL, NULL), -ETIMEDOUT);
	usleep(150000);
	assert_int_equal(dst[0], 'x');
	assert_true(kvp_client_alive(c));
	assert_int_equal(kvp_call(c, 0x10, "xy", 2, NULL, 0, 2000, &b, &len), 0);
	assert_memory_equal(b, "yx", 2);
	free(b);

	kvp_client_close(c);
	kvp_server_stop(s);
}

/* An error that carries a body (meta's -EREMCHG naming the leader): kvp_call_detail hands it
 * over, kvp_call drops it, kvp_reply never sends one; kvp_redirect_parse takes only one str
 * holding a usable HOST:PORT. */
static void test_error_body(void **state)
{
	(void)state;
	struct kvp_secret good = secret("0123456789abcdef-cluster");
	char addr[64], got[KVP_ADDR_MAX];
	struct kvp_server *s = start_echo(&good, addr);
	struct kvp_client *c;
	assert_int_equal(kvp_client_open(addr, &good, 2000, &c), 0);
	struct kvp_wbuf w;
	kvp_w_init(&w);
	kvp_w_cstr(&w, "127.0.0.1:7070");
	uint8_t *b = NULL;
	uint32_t len = 0;
	assert_int_equal(kvp_call_detail(c, 0x7C, w.p, w.len, NULL, 0, 2000, &b, &len), -EREMCHG);
	assert_int_equal(len, w.len);
	assert_int_equal(kvp_redirect_parse(b, len, got), 0);
	assert_string_equal(got, "127.0.0.1:7070");
	free(b);
	/* The same answer to kvp_call: the error alone, the connection fine. */
	b = (uint8_t *)"untouched";
	assert_int_equal(kvp_call(c, 0x7C, w.p, w.len, NULL, 0, 2000, &b, &len), -EREMCHG);
	assert_string_equal((char *)b, "untouched");
	/* kvp_reply with an error sends no body; no body is NULL and 0. */
	assert_int_equal(kvp_call_detail(c, 0x7B, "abc", 3, NULL, 0, 2000, &b, &len), -ENOENT);
	assert_null(b);
	assert_int_equal(len, 0);
	/* Longer than KVP_ERR_BODY_MAX: refused by kvp_reply_err. */
	uint8_t big[KVP_ERR_BODY_MAX + 1] = {0};
	assert_int_equal(kvp_call_detail(c, 0x7C, big, sizeof(big), NULL, 0, 2000, &b, &len),
			 -EINVAL);
	assert_null(b);
	assert_int_equal(kvp_call_detail(c, 0x7C, big, KVP_ERR_BODY_MAX, NULL, 0, 2000, &b, &len),
			 -EREMCHG);
	assert_int_equal(len, KVP_ERR_BODY_MAX);
	assert_int_equal(kvp_redirect_parse(b, len, got), -EBADMSG);
	assert_string_equal(got, "");
	free(b);
	assert_true(kvp_client_alive(c));
	kvp_client_close(c);
	kvp_server_stop(s);

	/* The parser alone: empty, trailing bytes, not an address, port 0, too long. */
	assert_int_equal(kvp_redirect_parse(NULL, 0, got), -ENOENT);
	assert_int_equal(kvp_redirect_parse(w.p, w.len - 1, got), -EBADMSG);
	uint8_t more[64];
	memcpy(more, w.p, w.len);
	more[w.len] = 0;
	assert_int_equal(kvp_redirect_parse(more, w.len + 1, got), -EBADMSG);
	const char *bad[] = {
	    "nohost",
	    "example.com:70",
	    "127.0.0.1:0",
	    "127.0.0.1:65536",
	    "127.0.0.1:7070:1",
	    "",
	    "1.2.3.4:5xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct kvp_wbuf x;
		kvp_w_init(&x);
		kvp_w_cstr(&x, bad[i]);
		if (kvp_redirect_parse(x.p, x.len, got) != -EBADMSG || got[0])
			fail_msg("\"%s\" taken as a leader address", bad[i]);
		kvp_w_free(&x);
	}
	assert_int_equal(kvp_redirect_parse(w.p + 2, 0, got), -ENOENT);
	kvp_w_free(&w);
	kvp_w_init(&w);
	kvp_w_cstr(&w, "localhost:9");
	assert_int_equal(kvp_redirect_parse(w.p, w.len, got), 0);
	assert_string_equal(got, "localhost:9");
	kvp_w_free(&w);
}

/* An RSTATUS body as meta writes it (fs/meta/meta.c), with npeers peers; *base and *snap get
 * the lengths where an older meta's body ends (before the snapshot fields, before snap_size). */
static void rstatus_body(struct kvp_wbuf *w, uint32_t npeers, uint8_t state, const char *laddr,
			 size_t *base, size_t *snap)
{
	kvp_w_init(w);
	kvp_w_u64(w, 2);
	kvp_w_u8(w, state);
	kvp_w_u8(w, 1);
	kvp_w_u64(w, 7);
	kvp_w_u64(w, 3);
	kvp_w_cstr(w, laddr);
	kvp_w_u64(w, 1000);
	kvp_w_u64(w, 990);
	kvp_w_u64(w, 995);
	kvp_w_u32(w, npeers);
	for (uint32_t i = 0; i < npeers; i++) {
		char a[32];
		snprintf(a, sizeof(a), "127.0.0.1:%u", 9000 + i);
		kvp_w_u64(w, i + 1);
		kvp_w_cstr(w, a);
		kvp_w_u64(w, 900 + i);
	}
	*base = w->len;
	kvp_w_u64(w, 512);
	kvp_w_u64(w, 4);
	kvp_w_u64(w, 65536);
	kvp_w_u64(w, 488);
	kvp_w_cstr(w, "127.0.0.1:7000");
	*snap = w->len;
	kvp_w_u64(w, 123456);
}

/* kvp_rstatus_parse: every field of a whole body; an older meta's shorter bodies; every other
 * cut refused (an optional group comes whole); what comes after the known fields ignored;
 * peers past KVP_RSTATUS_PEERS dropped; bad state, serving flag, over-long string refused. */
static void test_rstatus_parse(void **state)
{
	(void)state;
	struct kvp_wbuf w;
	size_t base, snap;
	rstatus_body(&w, 3, 3, "127.0.0.1:8003", &base, &snap);
	struct kvp_rstatus s;
	assert_int_equal(kvp_rstatus_parse(w.p, w.len, &s), 0);
	assert_int_equal(s.id, 2);
	assert_int_equal(s.state, 3);
	assert_int_equal(s.serving, 1);
	assert_int_equal(s.term, 7);
	assert_int_equal(s.leader_id, 3);
	assert_string_equal(s.leader_raft, "127.0.0.1:8003");
	assert_int_equal(s.last, 1000);
	assert_int_equal(s.applied, 990);
	assert_int_equal(s.commit, 995);
	assert_int_equal(s.npeers, 3);
	assert_int_equal(s.peers[2].id, 3);
	assert_string_equal(s.peers[2].raft, "127.0.0.1:9002");
	assert_int_equal(s.peers[2].match, 902);
	assert_true(s.has_snap && s.has_snap_size);
	assert_int_equal(s.snap_index, 512);
	assert_int_equal(s.snapshots, 4);
	assert_int_equal(s.log_bytes, 65536);
	assert_int_equal(s.log_mem, 488);
	assert_string_equal(s.leader_client, "127.0.0.1:7000");
	assert_int_equal(s.snap_size, 123456);

	/* Cut at every byte: only an older meta's two lengths parse. */
	for (size_t l = 0; l < w.len; l++) {
		int rc = kvp_rstatus_parse(w.p, l, &s);
		int want = l == base || l == snap ? 0 : -EBADMSG;
		if (rc != want)
			fail_msg("a body cut to %zu of %zu bytes: %d, want %d", l, w.len, rc, want);
		if (rc == 0 && (s.has_snap != (l == snap) || s.has_snap_size || s.applied != 990))
			fail_msg("a body cut to %zu bytes: fields taken that did not come", l);
		if (rc && (s.id || s.npeers))
			fail_msg("a body cut to %zu bytes: refused but not zeroed", l);
	}
	assert_int_equal(kvp_rstatus_parse(w.p, base, &s), 0);
	assert_int_equal(s.npeers, 3);
	assert_string_equal(s.leader_client, "");
	/* A newer meta's appended field. */
	kvp_w_u32(&w, 99);
	assert_int_equal(kvp_rstatus_parse(w.p, w.len, &s), 0);
	assert_int_equal(s.snap_size, 123456);
	kvp_w_free(&w);

	/* More peers than kept: the rest is still read past. */
	rstatus_body(&w, KVP_RSTATUS_PEERS + 3, 1, "", &base, &snap);
	assert_int_equal(kvp_rstatus_parse(w.p, w.len, &s), 0);
	assert_int_equal(s.npeers, KVP_RSTATUS_PEERS);
	assert_int_equal(s.peers[KVP_RSTATUS_PEERS - 1].id, KVP_RSTATUS_PEERS);
	assert_int_equal(s.snap_size, 123456);
	kvp_w_free(&w);

	/* A peer count the body cannot hold. */
	rstatus_body(&w, 0, 1, "", &base, &snap);
	w.p[base - 4] = 0xff;
	assert_int_equal(kvp_rstatus_parse(w.p, w.len, &s), -EBADMSG);
	kvp_w_free(&w);

	rstatus_body(&w, 1, 4, "", &base, &snap);
	assert_int_equal(kvp_rstatus_parse(w.p, w.len, &s), -EBADMSG);
	kvp_w_free(&w);
	rstatus_body(&w, 1, 1, "", &base, &snap);
	w.p[9] = 2; /* serving */
	assert_int_equal(kvp_rstatus_parse(w.p, w.len, &s), -EBADMSG);
	kvp_w_free(&w);
	char longaddr[KVP_ADDR_MAX + 1];
	memset(longaddr, 'a', KVP_ADDR_MAX);
	longaddr[KVP_ADDR_MAX] = 0;
	rstatus_body(&w, 1, 1, longaddr, &base, &snap);
	assert_int_equal(kvp_rstatus_parse(w.p, w.len, &s), -EBADMSG);
	kvp_w_free(&w);
}

/* Both transports, and ends that disagree: a TLS client against a plaintext server fails at
 * once with -EPROTO (and a log line naming the cause); a plaintext client against a TLS server
 * gets no HELLO and times out. */
static void test_transport_modes(void **state)
{
	(void)state;
	struct kvp_secret tls = secret("0123456789abcdef-cluster"), plain = tls;
	plain.insecure_plaintext = 1;
	char taddr[64], paddr[64];
	struct kvp_server *ts = start_echo(&tls, taddr), *ps = start_echo(&plain, paddr);

	struct kvp_sock *k;
	assert_int_equal(kvp_sock_open(taddr, &tls, 2000, &k), 0);
	assert_int_equal(kvp_sock_tls(k), 1);
	print_message("kernel TLS for sends: %s\n",
		      kvp_sock_ktls_send(k) ? "active" : "not offered by this kernel");
	kvp_sock_close(k);
	assert_int_equal(kvp_sock_open(paddr, &plain, 2000, &k), 0);
	assert_int_equal(kvp_sock_tls(k), 0);
	kvp_sock_close(k);

	struct kvp_client *c;
	assert_int_equal(kvp_client_open(paddr, &tls, 2000, &c), -EPROTO);
	assert_int_equal(kvp_client_open(taddr, &plain, 500, &c), -ETIMEDOUT);
	assert_int_equal(kvp_client_open(paddr, &plain, 2000, &c), 0);
	uint8_t *b;
	uint32_t len;
	assert_int_equal(kvp_call(c, 0x10, "ab", 2, NULL, 0, 2000, &b, &len), 0);
	assert_memory_equal(b, "ba", 2);
	free(b);
	kvp_client_close(c);
	kvp_server_stop(ts);
	kvp_server_stop(ps);
}

struct hammer {
	struct kvp_client *c;
	int seed, bad;
};

static void *hammer_main(void *arg)
{
	struct hammer *h = arg;
	enum { SZ = 200000 };
	uint8_t *d = malloc(SZ);
	for (int i = 0; i < 30 && !h->bad; i++) {
		size_t n = 1 + (size_t)((h->seed * 7919 + i * 104729) % SZ);
		for (size_t j = 0; j < n; j++)
			d[j] = (uint8_t)(j * 31 + (size_t)h->seed + (size_t)i);
		uint8_t *b = NULL;
		uint32_t len = 0;
		/* body and bulk split unevenly: coalesced header + body, then a bulk of records */
		size_t body = n / 3;
		if (kvp_call(h->c, 0x10, d, body, d + body, n - body, 5000, &b, &len) || len != n) {
			h->bad = 1;
		} else {
			for (size_t j = 0; j < n && !h->bad; j++)
				h->bad = b[j] != d[n - 1 - j];
		}
		free(b);
	}
	free(d);
	return NULL;
}

/* Several threads send through one TLS client while its reader thread decrypts replies: the
 * connection's OpenSSL object is shared by the reader and the senders (under its lock), and
 * every reply comes back whole and in order of bytes. */
static void test_tls_concurrent(void **state)
{
	(void)state;
	struct kvp_secret tls = secret("0123456789abcdef-cluster");
	char addr[64];
	struct kvp_server *s = start_echo(&tls, addr);
	struct kvp_client *c;
	assert_int_equal(kvp_client_open(addr, &tls, 2000, &c), 0);
	enum { NT = 6 };
	struct hammer h[NT];
	pthread_t th[NT];
	for (int i = 0; i < NT; i++) {
		h[i] = (struct hammer){.c = c, .seed = i + 1};
		assert_int_equal(pthread_create(&th[i], NULL, hammer_main, &h[i]), 0);
	}
	for (int i = 0; i < NT; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(h[i].bad, 0);
	}
	assert_true(kvp_client_alive(c));
	kvp_client_close(c);
	kvp_server_stop(s);
}

/* A receiver for test_big_frames: accepts one connection, receives FRAMES frames, checks them
 * (ok: how many were right). */
enum { FRAMES = 4 };
struct sink {
	int lfd, rcvbuf, ok;
	const struct kvp_secret *secret;
	const uint8_t *want;
	size_t len;
};

static void *sink_main(void *arg)
{
	struct sink *s = arg;
	int fd = accept(s->lfd, NULL, NULL);
	if (fd < 0)
		return NULL;
	if (s->rcvbuf)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &s->rcvbuf, sizeof(s->rcvbuf));
	struct kvp_sock *k;
	if (kvp_sock_accept(fd, s->secret, 5000, &k)) {
		close(fd);
		return NULL;
	}
	struct kvp_hdr h;
	uint8_t *body = NULL;
	for (int i = 0; i < FRAMES; i++) {
		int ok = kvp_recv(k, &h, &body, KVP_MAX_BODY) == 0 && h.op == 0x10 &&
			 h.len == s->len && memcmp(body, s->want, s->len) == 0;
		free(body);
		if (!ok)
			break;
		s->ok++;
	}
	kvp_sock_close(k);
	return NULL;
}

static uint32_t segs_out(int fd)
{
	struct tcp_info ti;
	socklen_t l = sizeof(ti);
	memset(&ti, 0, sizeof(ti));
	assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &l), 0);
	return ti.tcpi_segs_out;
}

/* One frame of a header, a 16-byte body and a bulk, as a chunk PUT sends it: whole through
 * send and receive buffers too small for it (every write comes back short and resumes where it
 * stopped), several on one connection, on both transports. Over TLS a large frame goes out
 * corked (kvp_send_dl): the socket must be uncorked after it, or the next small frame would
 * wait for the kernel's 200 ms cork timeout. */
static void send_big(const struct kvp_secret *sec, int tiny, uint32_t *segs)
{
	enum { BODY = 16, BULK = 208 << 10 }; /* a 2 MiB file's chunk: corked over TLS */
	uint8_t *d = malloc(BODY + BULK);
	for (size_t i = 0; i < BODY + BULK; i++)
		d[i] = (uint8_t)(i * 131 + (i >> 9));
	uint16_t port;
	int lfd = kvp_listen("127.0.0.1", 0, &port);
	assert_true(lfd >= 0);
	struct sink s = {
	    .lfd = lfd, .rcvbuf = tiny ? 4096 : 0, .secret = sec, .want = d, .len = BODY + BULK};
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, sink_main, &s), 0);
	char addr[64];
	sprintf(addr, "127.0.0.1:%u", port);
	struct kvp_sock *k;
	assert_int_equal(kvp_sock_open(addr, sec, 5000, &k), 0);
	int fd = kvp_sock_fd(k), v = 4096;
	if (tiny)
		assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v)), 0);
	struct kvp_hdr h = {.op = 0x10, .id = 7};
	uint32_t s0 = segs_out(fd);
	for (int i = 0; i < FRAMES; i++)
		assert_int_equal(kvp_send(k, &h, d, BODY, d + BODY, BULK), 0);
	*segs = segs_out(fd) - s0;
	socklen_t l = sizeof(v);
	assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_CORK, &v, &l), 0);
	assert_int_equal(v, 0);
	pthread_join(th, NULL);
	assert_int_equal(s.ok, FRAMES);
	kvp_sock_close(k);
	close(lfd);
	free(d);
}

static void test_big_frames(void **state)
{
	(void)state;
	struct kvp_secret tls = secret("0123456789abcdef-cluster"), plain = tls;
	plain.insecure_plaintext = 1;
	uint32_t segs;
	send_big(&plain, 1, &segs);
	send_big(&tls, 1, &segs);
	send_big(&plain, 0, &segs);
	send_big(&tls, 0, &segs);
	/* Not asserted: uncorked, how many records TCP merges depends on timing (8 to 67 here). */
	print_message("TLS, %d frames of 208 KiB: %u segments\n", FRAMES, segs);
}

static void test_addr_parse(void **state)
{
	(void)state;
	char host[64];
	uint16_t port;
	assert_int_equal(kvp_addr_parse("127.0.0.1:80", host, sizeof(host), &port), 0);
	assert_int_equal(port, 80);
	assert_int_equal(kvp_addr_parse("localhost:7", host, sizeof(host), &port), 0);
	assert_string_equal(host, "127.0.0.1");
	assert_int_equal(kvp_addr_parse("127.0.0.1", host, sizeof(host), &port), -EINVAL);
	assert_int_equal(kvp_addr_parse("127.0.0.1:99999", host, sizeof(host), &port), -EINVAL);
	assert_int_equal(kvp_addr_parse("example.com:80", host, sizeof(host), &port), -EINVAL);
	assert_int_equal(kvp_addr_parse(":80", host, sizeof(host), &port), -EINVAL);
}

/* The framing layer's messages are transport-generic (it serves the engine too): no status
 * reads as a filesystem one. */
static void test_strerror_generic(void **state)
{
	(void)state;
	const char *fs_words[] = {"storage", "chunk", "cluster", "node", "CRC32C", "file"};
	int st[] = {0, -EHOSTDOWN, -EILSEQ, -EPROTO, -EACCES, -ECONNREFUSED}; /* ours, and libc's */
	for (size_t i = 0; i < sizeof(st) / sizeof(st[0]); i++) {
		const char *msg = kvp_strerror(st[i]);
		assert_non_null(msg);
		assert_true(msg[0] != 0);
		for (size_t j = 0; j < sizeof(fs_words) / sizeof(fs_words[0]); j++)
			if (strstr(msg, fs_words[j]))
				fail_msg("kvp_strerror(%d) = \"%s\" names \"%s\"", st[i], msg,
					 fs_words[j]);
	}
	assert_string_equal(kvp_strerror(-EACCES), kvp_strerror(EACCES));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_codec_roundtrip), cmocka_unit_test(test_header_checks),
	    cmocka_unit_test(test_addr_parse),	    cmocka_unit_test(test_strerror_generic),
	    cmocka_unit_test(test_auth_and_calls),  cmocka_unit_test(test_call_into),
	    cmocka_unit_test(test_error_body),	    cmocka_unit_test(test_rstatus_parse),
	    cmocka_unit_test(test_transport_modes), cmocka_unit_test(test_tls_concurrent),
	    cmocka_unit_test(test_big_frames),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
