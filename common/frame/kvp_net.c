/* Sockets and framed I/O over a kvp_sock: non-blocking sockets, waits in poll(2) outside the
 * connection's lock, TLS records or (insecure mode) plain bytes underneath. */
#define KVFS_LOG_TAG "net"
#include "kvp_int.h"
#include "log.h"

#include <openssl/err.h>
#include <time.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

int kvp_addr_parse(const char *addr, char *host, size_t hostcap, uint16_t *port)
{
	if (!addr)
		return -EINVAL;
	const char *colon = strrchr(addr, ':');
	if (!colon || colon == addr || (size_t)(colon - addr) >= hostcap)
		return -EINVAL;
	char *end;
	errno = 0;
	unsigned long p = strtoul(colon + 1, &end, 10);
	if (errno || *end || end == colon + 1 || p > 65535)
		return -EINVAL;
	memcpy(host, addr, (size_t)(colon - addr));
	host[colon - addr] = 0;
	if (strcmp(host, "localhost") == 0)
		snprintf(host, hostcap, "127.0.0.1");
	struct in_addr ia;
	if (inet_pton(AF_INET, host, &ia) != 1)
		return -EINVAL;
	*port = (uint16_t)p;
	return 0;
}

static int fill_sa(const char *host, uint16_t port, struct sockaddr_in *sa)
{
	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	sa->sin_port = htons(port);
	if (strcmp(host, "localhost") == 0)
		host = "127.0.0.1";
	return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -EINVAL;
}

int kvp_listen(const char *host, uint16_t port, uint16_t *bound)
{
	struct sockaddr_in sa;
	if (fill_sa(host, port, &sa))
		return -EINVAL;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	socklen_t sl = sizeof(sa);
	getsockname(fd, (struct sockaddr *)&sa, &sl);
	if (bound)
		*bound = ntohs(sa.sin_port);
	return fd;
}

static void tune(int fd)
{
	int one = 1, buf = 4 << 20;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

int kvp_connect(const char *addr, int timeout_ms)
{
	char host[KVP_ADDR_MAX];
	uint16_t port;
	struct sockaddr_in sa;
	if (kvp_addr_parse(addr, host, sizeof(host), &port) || fill_sa(host, port, &sa))
		return -EINVAL;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	tune(fd);
	int rc = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
	if (rc < 0 && errno != EINPROGRESS) {
		rc = -errno;
		goto fail;
	}
	if (rc < 0) {
		struct pollfd pfd = {.fd = fd, .events = POLLOUT};
		rc = poll(&pfd, 1, timeout_ms);
		if (rc == 0) {
			rc = -ETIMEDOUT;
			goto fail;
		}
		int err = 0;
		socklen_t el = sizeof(err);
		getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
		if (rc < 0 || err) {
			rc = err ? -err : -errno;
			goto fail;
		}
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	return fd;
fail:
	close(fd);
	return rc;
}

int64_t kvp_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* io_once: would block, *want says on what. Below every -errno, and no count. */
#define IO_WAIT (-4096L - 1)

/* One non-blocking read or write: a count (0: end of stream on a read), IO_WAIT, or -errno. */
static long io_once(struct kvp_sock *k, int wr, void *p, size_t n, short *want)
{
	if (!k->ssl) {
		ssize_t r = wr ? send(k->fd, p, n, MSG_NOSIGNAL) : read(k->fd, p, n);
		if (r >= 0)
			return r;
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
			*want = wr ? POLLOUT : POLLIN;
			return IO_WAIT;
		}
		return -errno;
	}
	size_t done = 0;
	pthread_mutex_lock(&k->io_mu);
	ERR_clear_error();
	int r = wr ? SSL_write_ex(k->ssl, p, n, &done) : SSL_read_ex(k->ssl, p, n, &done);
	int e = r > 0 ? SSL_ERROR_NONE : SSL_get_error(k->ssl, r);
	int saved = errno;
	unsigned long ee = e == SSL_ERROR_SSL ? ERR_peek_error() : 0;
	ERR_clear_error();
	pthread_mutex_unlock(&k->io_mu);
	switch (e) {
	case SSL_ERROR_NONE:
		return (long)done;
	case SSL_ERROR_WANT_READ:
		*want = POLLIN;
		return IO_WAIT;
	case SSL_ERROR_WANT_WRITE:
		*want = POLLOUT;
		return IO_WAIT;
	case SSL_ERROR_ZERO_RETURN:
		return wr ? -EPIPE : 0;
	case SSL_ERROR_SYSCALL:
		if (saved == EAGAIN || saved == EINTR) {
			*want = wr ? POLLOUT : POLLIN;
			return IO_WAIT;
		}
		return saved ? -saved : (wr ? -EPIPE : 0);
	default:
		/* A record that fails its tag (changed, replayed, reordered, injected), or an
		 * alert. The connection is over: TLS state cannot resynchronise. */
		if (!wr)
			klog_debug("TLS record refused: %s", ERR_reason_error_string(ee));
		return -EBADMSG;
	}
}

/* Waits for the socket; timeout_ms < 0 = forever. 0, -ETIMEDOUT or -errno. */
static int io_wait(struct kvp_sock *k, short ev, int timeout_ms)
{
	struct pollfd pfd = {.fd = k->fd, .events = ev};
	for (;;) {
		int r = poll(&pfd, 1, timeout_ms);
		if (r > 0)
			return 0;
		if (r == 0)
			return -ETIMEDOUT;
		if (errno != EINTR)
			return -errno;
	}
}

static int left_ms(int64_t deadline)
{
	if (deadline < 0)
		return -1;
	int64_t l = deadline - kvp_now_ms();
	return l < 0 ? 0 : (int)(l > 1 << 30 ? 1 << 30 : l);
}

int kvp_io_read(struct kvp_sock *k, void *p, size_t n, int64_t deadline)
{
	size_t got = 0;
	while (got < n) {
		short want = 0;
		long r = io_once(k, 0, (char *)p + got, n - got, &want);
		if (r == 0)
			return -ECONNRESET;
		if (r == IO_WAIT) {
			int rc = io_wait(k, want, left_ms(deadline));
			if (rc)
				return rc;
			continue;
		}
		if (r < 0)
			return (int)r;
		got += (size_t)r;
	}
	return 0;
}

/* TLS has no writev: a header and a small body go out as one record instead of two. */
#define COALESCE_MAX 16384
/* Bounds how long one SSL_write holds the lock a reader on the same connection waits for. */
#define WRITE_SLICE (256u << 10)

int kvp_io_writev(struct kvp_sock *k, struct iovec *v, int n, int64_t deadline)
{
	while (n > 0 && v->iov_len == 0) {
		v++;
		n--;
	}
	while (n > 0) {
		short want = 0;
		long w;
		if (!k->ssl) {
			struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)n};
			ssize_t r = sendmsg(k->fd, &mh, MSG_NOSIGNAL);
			if (r >= 0)
				w = r;
			else if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
				w = IO_WAIT, want = POLLOUT;
			else
				w = -errno;
		} else {
			size_t len = v->iov_len < WRITE_SLICE ? v->iov_len : WRITE_SLICE;
			w = io_once(k, 1, v->iov_base, len, &want);
		}
		if (w == IO_WAIT) {
			int t = deadline >= 0		 ? left_ms(deadline)
				: k->send_timeout_ms > 0 ? k->send_timeout_ms
							 : -1;
			int rc = io_wait(k, want, t);
			if (rc == -ETIMEDOUT && deadline < 0)
				return -EAGAIN; /* no progress for the send timeout */
			if (rc)
				return rc;
			continue;
		}
		if (w < 0)
			return (int)w;
		while (n > 0 && (size_t)w >= v->iov_len) {
			w -= (long)v->iov_len;
			v++;
			n--;
		}
		if (n > 0) {
			v->iov_base = (char *)v->iov_base + w;
			v->iov_len -= (size_t)w;
		}
	}
	return 0;
}

/* A frame of this many bytes spans several TLS records: sent corked (kvp_send_dl). Measured
 * with kvfs-transport-bench (docs/benchmarks.md, "Writes with fewer copies"): corked, frames
 * of 208-240 KiB (a 2 MiB file's chunks) cost 13-18 % less CPU, but from 256 KiB on 40-50 %
 * more, for a reason not found; so larger frames go uncorked. */
#define CORK_MIN (32u << 10)
#define CORK_MAX (240u << 10)

/* Failure only costs the segments it would have saved. */
static void tcp_cork(int fd, int on)
{
	setsockopt(fd, IPPROTO_TCP, TCP_CORK, &on, sizeof(on));
}

int kvp_send_dl(struct kvp_sock *k, struct kvp_hdr *h, const void *body, size_t body_len,
		const void *bulk, size_t bulk_len, int64_t deadline)
{
	if (body_len + bulk_len > UINT32_MAX)
		return -EMSGSIZE;
	uint8_t hb[KVP_HDR_SIZE + COALESCE_MAX];
	h->magic = KVP_MAGIC;
	h->version = KVP_VERSION;
	h->reserved = 0;
	h->len = (uint32_t)(body_len + bulk_len);
	kvp_hdr_encode(h, hb);
	struct iovec iov[3] = {
	    {hb, KVP_HDR_SIZE}, {(void *)body, body_len}, {(void *)bulk, bulk_len}};
	if (k->ssl && body_len && body_len <= COALESCE_MAX) {
		memcpy(hb + KVP_HDR_SIZE, body, body_len);
		iov[0].iov_len += body_len;
		iov[1].iov_len = 0;
	}
	/* TLS writes a frame as one write(2) per 16 KiB record, and with TCP_NODELAY each went
	 * out as its own segment: on loopback every one ran the peer's receive path and woke its
	 * reader, 14 times for one 208 KiB chunk. Corked, TCP sends full segments (64 KiB on
	 * loopback) and the uncork pushes the rest at once: no delay is added. Plaintext needs
	 * none: its frame is one sendmsg(2). */
	int cork = k->ssl && body_len + bulk_len >= CORK_MIN && body_len + bulk_len <= CORK_MAX;
	if (cork)
		tcp_cork(k->fd, 1);
	int rc = kvp_io_writev(k, iov, 3, deadline);
	if (cork)
		tcp_cork(k->fd, 0);
	return rc;
}

int kvp_send(struct kvp_sock *k, struct kvp_hdr *h, const void *body, size_t body_len,
	     const void *bulk, size_t bulk_len)
{
	return kvp_send_dl(k, h, body, body_len, bulk, bulk_len, -1);
}

int kvp_recv_dl(struct kvp_sock *k, struct kvp_hdr *h, uint8_t **body, uint32_t max_body,
		int64_t deadline)
{
	uint8_t hb[KVP_HDR_SIZE];
	*body = NULL;
	int rc = kvp_io_read(k, hb, sizeof(hb), deadline);
	if (rc)
		return rc;
	rc = kvp_hdr_decode(hb, h, max_body);
	if (rc)
		return rc;
	if (h->len == 0)
		return 0;
	uint8_t *b = malloc(h->len);
	if (!b)
		return -ENOMEM;
	rc = kvp_io_read(k, b, h->len, deadline);
	if (rc) {
		free(b);
		return rc;
	}
	*body = b;
	return 0;
}

int kvp_recv(struct kvp_sock *k, struct kvp_hdr *h, uint8_t **body, uint32_t max_body)
{
	return kvp_recv_dl(k, h, body, max_body, -1);
}

int kvp_sock_write(struct kvp_sock *k, const void *p, size_t n)
{
	struct iovec v = {(void *)p, n};
	return kvp_io_writev(k, &v, 1, -1);
}

long kvp_sock_read(struct kvp_sock *k, void *p, size_t n, int timeout_ms)
{
	int64_t dl = timeout_ms < 0 ? -1 : kvp_now_ms() + timeout_ms;
	for (;;) {
		short want = 0;
		long r = io_once(k, 0, p, n, &want);
		if (r != IO_WAIT)
			return r;
		int rc = io_wait(k, want, left_ms(dl));
		if (rc)
			return rc;
	}
}

/* ---- connection objects ---- */

static int sock_new(int fd, struct kvp_sock **out)
{
	struct kvp_sock *k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	k->fd = fd;
	pthread_mutex_init(&k->io_mu, NULL);
	*out = k;
	return 0;
}

static void sock_free(struct kvp_sock *k, int close_fd)
{
	if (k->ssl)
		SSL_free(k->ssl);
	if (close_fd)
		close(k->fd);
	pthread_mutex_destroy(&k->io_mu);
	free(k);
}

static int handshake(struct kvp_sock *k, const struct kvp_secret *s, int server, int64_t dl)
{
	if (s->insecure_plaintext)
		return server ? kvp_auth_server(k, s, dl) : kvp_auth_client(k, s, dl);
	return kvp_tls_handshake(k, s, server, dl);
}

static struct kvp_conn_stats g_out_stats;

const struct kvp_conn_stats *kvp_client_conn_stats(void)
{
	return &g_out_stats;
}

int kvp_sock_open(const char *addr, const struct kvp_secret *s, int timeout_ms,
		  struct kvp_sock **out)
{
	int64_t dl = kvp_now_ms() + timeout_ms;
	int fd = kvp_connect(addr, timeout_ms);
	if (fd < 0)
		return fd;
	struct kvp_sock *k;
	int rc = sock_new(fd, &k);
	if (rc) {
		close(fd);
		return rc;
	}
	rc = handshake(k, s, 0, dl);
	if (rc) {
		atomic_fetch_add(
		    rc == -ETIMEDOUT ? &g_out_stats.hs_timeout : &g_out_stats.hs_failed, 1);
		sock_free(k, 1);
		return rc;
	}
	*out = k;
	return 0;
}

int kvp_sock_accept(int fd, const struct kvp_secret *s, int timeout_ms, struct kvp_sock **out)
{
	int64_t dl = kvp_now_ms() + timeout_ms;
	struct kvp_sock *k;
	int rc = sock_new(fd, &k);
	if (rc)
		return rc;
	rc = handshake(k, s, 1, dl);
	if (rc) {
		sock_free(k, 0);
		return rc;
	}
	*out = k;
	return 0;
}

void kvp_sock_close(struct kvp_sock *k)
{
	if (k)
		sock_free(k, 1);
}

void kvp_sock_shutdown(struct kvp_sock *k)
{
	shutdown(k->fd, SHUT_RDWR);
}

int kvp_sock_fd(const struct kvp_sock *k)
{
	return k->fd;
}

void kvp_sock_set_send_timeout(struct kvp_sock *k, int ms)
{
	k->send_timeout_ms = ms;
}

int kvp_sock_ktls_send(const struct kvp_sock *k)
{
	return k->ktls_send;
}

int kvp_sock_tls(const struct kvp_sock *k)
{
	return k->ssl != NULL;
}
